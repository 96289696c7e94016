"""`trial-tool status`, `show`, `report` and `export`: the graders' commands over the view (view/).

They only read: no trial file is created, locked or changed. A report or
export written to `-o FILE` goes to a temporary file beside it first and is
renamed into place when whole, so an interrupted run leaves no half file.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, TypedDict

from ..errors import StateError, StorageError, UsageError
from .options import Arguments

if TYPE_CHECKING:
    from ..view.joins import Scores
    from ..view.summary import Integrity, Summary

#: `status` and `show` of a trial whose log or state fails verification (as `verify`).
EXIT_NOT_INTACT = 1
REPORT_FORMATS = ("table", "json", "csv", "markdown", "html")

#: `verify`'s and `report`'s exit code for each verdict (ledger/_verify.py); those of `unconfirmed`
#: and `in_flight`, a crash or a call under way, only with --strict (without it, 0).
EXIT_OF_VERDICT = {
    "clean": 0,
    "failed": 1,
    "unverified": 3,
    "unconfirmed": 4,
    "in_flight": 5,
    "signature_invalid": 6,
    "unsigned": 7,
}


def trusted_of(args: Arguments) -> dict[str, Any] | None:
    """The public keys --public-key names, by fingerprint (signing.PublicKey); None without it."""
    path = getattr(args, "public_key", None)
    if path is None:
        return None
    from ..signing import read_public_keys

    return dict(read_public_keys(path))


def _raw_trusted(args: Arguments) -> tuple[bytes, ...] | None:
    """--public-key's keys as bytes, for the report's worker processes."""
    found = trusted_of(args)
    return None if found is None else tuple(key.raw for key in found.values())


def verdict_exit(verdict: str, *, strict: bool) -> int:
    """The exit code that says `verdict` (the most serious of a report's)."""
    if not strict and verdict in ("unconfirmed", "in_flight"):
        return 0
    return EXIT_OF_VERDICT[verdict]


def _intact_exit(verdict: str) -> int:
    """`status`'s and `show`'s exit code: 1 for a trial that fails, by a bad record or (checked with
    --public-key) a signature that does not hold."""
    return EXIT_NOT_INTACT if verdict in ("failed", "signature_invalid") else 0


def status(args: Arguments, key: bytes | None) -> int:
    from ..view import render
    from ..view.summary import summarize

    if not os.path.lexists(args.state) and os.path.lexists(args.log):
        # What is left of a budget is the state's to say; a log alone cannot (verify and show read it).
        raise StateError(f"no such state file: {args.state}; its log is there: `trial-tool verify` checks it")
    summary = summarize(args.state, args.log, key, now=True, trusted=_raw_trusted(args))
    if args.json:
        print(json.dumps(_status_document(summary), indent=2))
    else:
        print(render.status_text(summary, summary["left"]))
    return _intact_exit(summary["integrity"]["verdict"])


def _status_document(summary: Summary) -> dict[str, object]:
    """`status --json`: the summary's fields a harness or grader reads (docs/graders.md)."""
    return {
        "trial_id": summary["trial_id"],
        "labels": summary["labels"],
        "state": summary["state"],
        "log": summary["log"],
        "limits": summary["limits"],
        "sandbox": summary["sandbox"],
        "used": summary["used"],
        "left": summary["left"],
        "in_flight": summary["in_flight"],
        "refused_calls": summary["refused_calls"],
        "ended_by": summary["ended_by"],
        "statuses": summary["statuses"],
        "grading_commands": summary.get("grading_commands", 0),
        "records": summary["records"],
        "chain": "hmac-sha256" if summary["keyed"] else "sha256",
        "head": summary["head"],
        "integrity": summary["integrity"],
        "signature": summary["signature"],
    }


def show(args: Arguments, key: bytes | None) -> int:
    from ..ledger import START, snapshot
    from ..view import render
    from ..view.calls import Replayer
    from ..view.summary import summarize_snapshot

    if not os.path.lexists(args.state) and not os.path.lexists(args.log):
        raise StateError(f"no trial at {args.state} (and no log at {args.log})")
    taken = snapshot.read(args.state, args.log)
    summary, records = summarize_snapshot(taken, args.state, args.log, key)
    if args.call is None and args.record is None:
        calls = [record for record in records if record.get("record_type") != START]
        if args.json:
            from ..view.calls import row

            print(json.dumps({"summary": summary, "calls": [row(record) for record in calls]}, indent=2))
        else:
            started = summary.get("started_at_utc")
            print(render.calls_table(calls, started if isinstance(started, str) else None))
        return _intact_exit(summary["integrity"]["verdict"])
    if args.record is not None:
        chosen = [record for record in records if record.get("record") == args.record]
        if not chosen:
            raise UsageError(f"no record {args.record} in this trial (it has records 1..{len(records)})")
    else:
        # A refusal has the number of the call it would have been: several records may share one.
        chosen = [record for record in records if record.get("sequence") == args.call]
    if not chosen:
        numbers = sorted({number for r in records if isinstance(number := r.get("sequence"), int)})
        known = f"calls {numbers[0]}..{numbers[-1]}" if numbers else "no calls"
        raise UsageError(f"no call {args.call} in this trial (it has {known})")
    replayer = Replayer(getattr(args, "o200k_file", None))
    integrity = summary["integrity"]
    delivered_of = [replayer.delivered(record) for record in chosen]
    shown = [
        {"record": record, "delivered": delivered._asdict(), "integrity": _said_of(record, integrity)}
        for record, delivered in zip(chosen, delivered_of, strict=True)
    ]
    if args.json:
        print(json.dumps(shown if len(shown) > 1 else shown[0], indent=2))
        return _intact_exit(integrity["verdict"])
    verdicts = {True: "matches the record", False: "DOES NOT match the record", None: "nothing was delivered"}
    for entry, delivered in zip(shown, delivered_of, strict=True):
        said = entry["integrity"]
        if said["verdict"] != "clean":
            # Matching its own hashes says nothing of a record someone appended: the trial's verdict first.
            print(render.visible(f"!!! the trial is {said['verdict']}: {said.get('why', '')}"))
        print(json.dumps(entry["record"], indent=2, sort_keys=True))
        if isinstance(entry["record"].get("network"), dict):
            from ..view import connections

            print("\n" + "\n".join(connections.lines(entry["record"]["network"])))
        print(f"\n--- what the agent read ({verdicts[delivered.matches]}) ---")
        for name, text in (("stdout", delivered.stdout), ("stderr", delivered.stderr)):
            print(f"--- {name} ---" + ("" if text else " (empty)"))
            if text:
                # What the command wrote, its control characters shown as escapes (render.visible).
                text = render.visible(text, block=True)
                print(text, end="" if text.endswith("\n") else "\n")
    return _intact_exit(integrity["verdict"])


def _said_of(record: Mapping[str, object], integrity: Integrity) -> dict[str, object]:
    """The trial's verdict as `show` puts it beside one record: `this_record` when it is the one named."""
    said: dict[str, object] = dict(integrity)
    said["this_record"] = record.get("record") == integrity.get("first_bad_record")
    return said


@contextmanager
def _temporary(path: str) -> Iterator[str]:
    """Where to write what `-o path` names: a temporary beside it, renamed to it when the block ends well.

    Only a regular file (or nothing) is replaced so. A device or a FIFO is written
    to directly, never replaced by a file (`-o /dev/null` keeps the node); a socket
    or a directory is refused. A symbolic link is followed: what it points to is
    written, by these same rules, and the link stays.
    """
    import stat

    path = os.path.realpath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)):
        yield path
        return
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file"
        raise StorageError(f"cannot write {path}: it is {kind}")
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


@contextmanager
def _output(path: str | None) -> Iterator[IO[Any]]:
    """stdout, or a temporary file renamed to `path` once written whole."""
    if path is None:
        yield sys.stdout
        return
    with _temporary(path) as temporary:
        try:
            handle = open(temporary, "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc
        with handle:
            yield handle


def report(args: Arguments, key: bytes | None) -> int:
    from ..view import html, render
    from ..view import report as reports
    from ..view.trials import find

    chosen = args.format or "table"
    if chosen not in REPORT_FORMATS:
        raise UsageError(f"--format must be one of {', '.join(REPORT_FORMATS)}, not {chosen!r}")
    if chosen == "html":
        html.plotly_js()  # the extra is there, before any trial is read
    joined = _joined(args)
    found = find(args.paths)
    _tell(found.note())
    trusted = _raw_trusted(args)
    built = reports.build(
        found.pairs, key=key, workers=args.jobs, with_calls=chosen == "html", trusted=trusted, **joined
    )
    built.overview["ignored_inside_workspaces"] = found.ignored
    base = os.path.commonpath([os.path.abspath(p) for p in args.paths if "*" not in p] or [os.getcwd()])
    writers: dict[str, Callable[..., None]] = {
        "table": render.report_table,
        "json": render.report_json,
        "csv": render.report_csv,
        "markdown": render.report_markdown,
    }
    try:
        with _output(args.output) as out:
            if chosen == "html":
                html.write(built, out, details=args.details)
            else:
                writers[chosen](built, out, base if os.path.isdir(base) else os.path.dirname(base))
    finally:
        built.close()
    from ..ledger import verify

    counts = built.overview["integrity"]
    worst = next((verdict for verdict in verify.VERDICTS if counts.get(verdict)), "clean")
    return verdict_exit(worst, strict=args.strict)


class _Joined(TypedDict):
    scores: Scores | None
    heads: dict[str, str] | None


def _joined(args: Arguments) -> _Joined:
    """The scores and heads a grader brings (--scores, --heads), read before any trial is."""
    from ..view import joins

    return {
        "scores": joins.load_scores(args.scores) if args.scores else None,
        "heads": joins.load_heads(args.heads) if args.heads else None,
    }


def _tell(note: str | None) -> None:
    """A line for the grader on stderr, apart from the output (which may be a pipe to a parser)."""
    if note:
        print(f"trial-tool: {note}", file=sys.stderr)


def export(args: Arguments, key: bytes | None) -> int:
    from ..view import export as exports
    from ..view.trials import find

    chosen = args.format or "jsonl"
    if chosen not in exports.FORMATS:
        raise UsageError(f"--format must be one of {', '.join(exports.FORMATS)}, not {chosen!r}")
    if chosen == "parquet" and args.output is None:
        raise UsageError("--format parquet needs -o FILE")
    found = find(args.paths)
    _tell(found.note())
    workers = args.jobs or os.cpu_count() or 1
    if args.trials is not None:
        from ..view import report as reports

        built = reports.build(found.pairs, key=key, workers=workers, trusted=_raw_trusted(args), **_joined(args))
        try:
            _write_table(exports, chosen, args.trials, exports.trial_rows(built), exports.TRIALS_SCHEMA)
        finally:
            built.close()
    if args.connections is not None:
        from ..view import connections

        listed = exports.rows(found.pairs, workers=workers, of=connections.rows)
        _write_table(exports, chosen, args.connections, listed, connections.SCHEMA)
    source = exports.rows(found.pairs, with_text=args.text, workers=workers)
    _write_table(exports, chosen, args.output, source, exports.schema(args.text))
    return 0


def _write_table(
    exports: Any,
    chosen: str,
    path: str | None,
    source: Iterator[dict[str, object]],
    columns: tuple[tuple[str, str], ...],
) -> None:
    if chosen == "parquet":
        assert path is not None  # checked before anything was read
        with _temporary(path) as temporary:
            exports.write_parquet(source, temporary, columns)
        return
    with _output(path) as out:
        if chosen == "csv":
            exports.write_csv(source, out, columns)
        else:
            exports.write_jsonl(source, out)


__all__ = ["EXIT_NOT_INTACT", "EXIT_OF_VERDICT", "export", "report", "show", "status", "verdict_exit"]
