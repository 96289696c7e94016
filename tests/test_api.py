"""The public API: what the package exports, and that importing it does nothing heavy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import trialtool
from trialtool import errors

EXPECTED = {
    "EXIT_INTERNAL",
    "EXIT_NOT_EXECUTABLE",
    "EXIT_NOT_FOUND",
    "EXIT_REFUSED",
    "EXIT_TIMEOUT",
    "Attestation",
    "Budget",
    "BudgetExhausted",
    "CallRequest",
    "CallResult",
    "EncoderError",
    "Interrupted",
    "LimitMismatch",
    "Limits",
    "LockTimeout",
    "Ran",
    "StateError",
    "StorageError",
    "Trial",
    "TrialState",
    "TrialToolError",
    "UsageError",
    "__version__",
    "ahandle_tool_call",
    "handle_tool_call",
    "openai_tool",
    "read_key_file",
    "read_signing_key",
    "remove_container",
    "seed_tiktoken_cache",
    "sweep_command",
    "toolreply",
}


def test_exported_members() -> None:
    assert set(trialtool.__all__) == EXPECTED
    assert len(trialtool.__all__) == len(EXPECTED)
    for name in trialtool.__all__:
        assert getattr(trialtool, name) is not None


def test_every_error_is_a_trialtool_error_with_an_exit_code() -> None:
    import pickle

    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type):
            assert issubclass(cls, errors.TrialToolError)
            assert cls.exit_code in (errors.EXIT_INTERNAL, errors.EXIT_REFUSED)
    refused = errors.BudgetExhausted("spent", "maximum_tool_calls")
    again = pickle.loads(pickle.dumps(refused))
    assert (again.message, again.status, again.exit_code) == ("spent", "maximum_tool_calls", 123)
    stopped = pickle.loads(pickle.dumps(errors.Interrupted("got SIGTERM", 15)))
    assert (stopped.signum, stopped.exit_code, stopped.status) == (15, 143, "interrupted")


def test_import_has_no_heavy_side_effects() -> None:
    code = "import sys, trialtool; print(sorted(m for m in ('tiktoken', 'psutil', 'filelock') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_a_call_with_no_output_imports_nothing_heavy(tmp_path: object) -> None:
    # The per-call cost (scripts/bench.py) depends on these staying out of trial-tool's
    # own process: each costs 5-40 ms to import here.
    # -S: no site-packages, so no editable install's finder loading pathlib ahead of us;
    # the package is found from the source tree (a call with no output needs nothing else).
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "before = set(sys.modules)\n"
        "from trialtool.doors import cli\n"
        f"sys.argv = ['trial-tool', '--state', '{tmp_path}/s.json', '--log', '{tmp_path}/l.jsonl', '--', 'true']\n"
        "assert cli.main() == 0\n"
        # ctypes is loaded on purpose: prctl makes trial-tool non-dumpable (docs/containment.md).
        "heavy = ('argparse', 'pathlib', 'subprocess', 'tiktoken', 'psutil', 'filelock', 'dataclasses')\n"
        "print(sorted(m for m in heavy if m in sys.modules and m not in before))\n"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
