"""The house's rules, read from the source: arrows point down, no cycles, verify reads only.

Imports under `if TYPE_CHECKING:` are for the type checker and do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trialtool"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


class _Imports(ast.NodeVisitor):
    def __init__(self, name: str, package: str) -> None:
        self.name, self.package, self.found = name, package, set[str]()

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        submodules = {f"{target}.{alias.name}" for alias in node.names} & MODULES.keys()
        self.found |= submodules
        if len(submodules) < len(node.names) and target in MODULES:
            self.found.add(target)

    def visit_Import(self, node: ast.Import) -> None:
        self.found |= {alias.name for alias in node.names} & MODULES.keys()


def _edges() -> dict[str, set[str]]:
    edges = {}
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        visitor = _Imports(name, package)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        edges[name] = visitor.found - {name}
    return edges


EDGES = _edges()


def _room(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ROOMS) else "top"


#: The rooms, each a folder with a face: docs/layout.md says what each holds and why.
ROOMS = (
    "types",
    "output",
    "signing",
    "trial",
    "ledger",
    "process",
    "sandbox",
    "server",
    "doors",
    "view",
    "integrations",
)
#: What lies at the top besides the rooms: the package's face, `python -m`, the version, and the two
#: modules every room stands on (the exception tree, and the writes and messages of plain bytes).
TOP = {"trialtool", "trialtool.__main__", "trialtool._version", "trialtool.errors", "trialtool.osio"}


def test_every_module_is_in_a_room_but_the_few_that_every_room_stands_on() -> None:
    assert {_room(name) for name in MODULES} == {"top", *ROOMS}
    assert {name for name in MODULES if _room(name) == "top"} == TOP


def test_every_room_has_a_face() -> None:
    for room in ROOMS:
        assert f"trialtool.{room}" in MODULES, f"{room}/ has no __init__.py"
        assert ast.get_docstring(ast.parse(MODULES[f"trialtool.{room}"].read_text(encoding="utf-8"))), room


def test_no_module_is_over_500_lines() -> None:
    """A module a maintainer can hold in mind: past this size, one has two jobs (and is split, never squeezed)."""
    long = {
        name: n for name, path in MODULES.items() if (n := len(path.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert not long, long


def test_no_import_cycle() -> None:
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(EDGES[node]):
            assert state.get(target) != 1, "import cycle: " + " -> ".join([*stack, node, target])
            if target not in state:
                visit(target, [*stack, node])
        state[node] = 2

    for name in sorted(MODULES):
        if name not in state:
            visit(name, [])


@pytest.mark.parametrize("room", ["ledger", "process"])
def test_the_rooms_below_import_no_door_and_not_trial(room: str) -> None:
    for name, targets in EDGES.items():
        if _room(name) == room:
            upward = {t for t in targets if _room(t) in ("doors", "trial", "server")}
            assert not upward, f"{name} imports {sorted(upward)}"
            other = "process" if room == "ledger" else "ledger"
            assert not {t for t in targets if _room(t) == other}, f"{name} reaches into {other}/"


WRITING = {
    "trialtool.ledger._ledger",
    "trialtool.ledger._store",
    "trialtool.ledger._mending",
    "trialtool.ledger._attest",
}


def test_verify_imports_nothing_of_the_ledgers_writing_side() -> None:
    assert not EDGES["trialtool.ledger._verify"] & WRITING


def test_the_graders_view_only_reads() -> None:
    """view/ never reaches the ledger's writing side, the processes, a door, or the Trial."""
    for name, targets in EDGES.items():
        if _room(name) == "view":
            wrong = {t for t in targets if t in WRITING or _room(t) in ("process", "doors") or t == "trialtool.trial"}
            assert not wrong, f"{name} imports {sorted(wrong)}"


def test_nothing_imports_an_integration() -> None:
    """The integrations are reached by their frameworks only (entry point, import path): never by trialtool."""
    for name, targets in EDGES.items():
        if _room(name) != "integrations":
            assert not {t for t in targets if _room(t) == "integrations"}, name


def test_the_top_imports_no_door() -> None:
    for name, targets in EDGES.items():
        if _room(name) == "top" and name not in ("trialtool", "trialtool.__main__"):
            assert not {t for t in targets if _room(t) == "doors"}, name


#: The faces (their packages) that are all that other rooms may import of theirs.
FACED = tuple(f"trialtool.{room}" for room in ROOMS if room not in ("doors", "view", "integrations"))
FACED += ("trialtool.sandbox.network",)
#: What a door may import besides the faces, view/ and the other doors: the Trial and the typed API's modules.
DOORS_MAY_IMPORT = {"trialtool", "trialtool.errors", "trialtool._version", "trialtool.osio"}


def _statements(name: str) -> list[tuple[str, list[str]]]:
    """Every import of `name` (type-only ones too): (the module imported from, the names taken)."""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
    return [(target, names) for target, names in found if target.split(".")[0] == "trialtool"]


def _assigned(face: str, name: str) -> set[str] | None:
    """The literal a face assigns to `name` (its `__all__`, or a lazy face's `_FACE`), as a set; None without one."""
    tree = ast.parse(MODULES[face].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(getattr(t, "id", "") == name for t in targets) and node.value is not None:
                return set(ast.literal_eval(node.value))
    return None


def _face_exports(face: str) -> set[str]:
    """What a face exports: its `__all__`, written out (a lazy face's loads each from `_FACE`'s module)."""
    return _assigned(face, "__all__") or set()


def test_a_lazy_face_loads_what_it_exports_and_only_the_process_face_is_lazy() -> None:
    lazy = {face for face in ("trialtool", *FACED) if _assigned(face, "_FACE") is not None or face == "trialtool"}
    # The package's own face and the process room's: the two the CLI imports before it forks (docs/performance.md).
    assert lazy <= {"trialtool", "trialtool.process", "trialtool.ledger"}
    for face in lazy - {"trialtool"}:
        assert _assigned(face, "_FACE") == _face_exports(face), face


def test_only_a_rooms_face_is_imported_from_outside_it() -> None:
    import importlib

    for face in FACED:
        module = importlib.import_module(face)
        assert sorted(module.__all__) == sorted(_face_exports(face)), face
        assert all(hasattr(module, name) for name in module.__all__), face
    for name in MODULES:
        for target, names in _statements(name):
            for face in FACED:
                if name == face or name.startswith(face + "."):
                    continue  # the room's own
                inner = target.startswith(face + ".") and target not in FACED
                assert not inner, f"{name} reaches past {face}'s face into {target}"
                if target == face:
                    wrong = set(names) - _face_exports(face)
                    assert not wrong, f"{name} takes {sorted(wrong)}, which {face} does not export"


def test_a_rooms_inner_modules_are_private_by_name() -> None:
    """Behind a face (the ledger's, the process room's, its sandbox seam's), a module's name says it is the room's."""
    for name, path in MODULES.items():
        inner = any(name.startswith(face + ".") for face in FACED) and path.name != "__init__.py"
        if inner:
            assert path.name.startswith("_"), f"{name} sits behind a face: name it _{path.name}"


def test_doors_import_the_trial_the_faces_and_the_view() -> None:
    for name in MODULES:
        if _room(name) != "doors":
            continue
        for target, _ in _statements(name):
            allowed = target in DOORS_MAY_IMPORT or target in FACED or _room(target) in ("doors", "view")
            assert allowed, f"{name} imports {target}"


def test_integrations_import_only_the_public_api() -> None:
    import trialtool

    for name in MODULES:
        if _room(name) != "integrations":
            continue
        for target, names in _statements(name):
            if _room(target) == "integrations":
                continue
            assert target == "trialtool", f"{name} imports {target}, not the public API"
            assert set(names) <= set(trialtool.__all__), f"{name} takes {names} from trialtool"


def _backend_names() -> set[str]:
    from trialtool import sandbox

    return set(sandbox.BACKENDS)


def _constants(node: ast.AST) -> set[str]:
    """The strings a comparison's operand is made of (a literal, or a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_constants(item) for item in node.elts)) if node.elts else set()
    return set()


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the constants that are docstrings or bare strings (comments, not code)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def test_only_the_registry_decides_by_a_backends_name() -> None:
    """No `if mode == "docker"` anywhere: what differs between backends is each backend's to say."""
    names = _backend_names()
    for name, path in MODULES.items():
        if name == "trialtool.sandbox._backends":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            named = set().union(*(_constants(operand) for operand in operands)) & names
            about = " ".join(ast.unparse(operand) for operand in operands)
            # A mode, or the `sandbox` setting (`settings.get("sandbox")`): not a network's "none".
            about_mode = "mode" in about or "'sandbox'" in about
            assert not (named and about_mode), f"{name}:{node.lineno}: {about}"


def test_no_module_outside_the_sandbox_room_names_a_backend() -> None:
    """The registry row is the one list: adding a backend touches nothing in the ledger, the call or the doors.

    "none" is a network's name and a word too, so only the others are looked for here (the
    comparison test above catches a mode compared with "none"). The integrations name their
    harnesses' own sandboxes ("docker" is inspect's), not trial-tool's backends.
    """
    names = _backend_names() - {"none"}
    for name, path in MODULES.items():
        if _room(name) in ("sandbox", "integrations"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        comments = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in comments and node.value in names:
                raise AssertionError(f"{name}:{node.lineno} names the backend {node.value!r}")
