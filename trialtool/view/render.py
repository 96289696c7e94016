"""The graders' view as text: a trial's status, its calls as a table, many trials as a report."""

from __future__ import annotations

import csv
import json
import os
import shutil
from typing import IO, TYPE_CHECKING, Any

from ..types import Limits
from .calls import command_text, instant

if TYPE_CHECKING:
    from .report import Report
    from .summary import Signature, Summary

#: Every pinned limit, in the order of `Limits`.
LIMIT_FIELDS = Limits._fields

#: The per-trial columns of a report's table, CSV and markdown.
TRIAL_COLUMNS = (
    "trial",
    "trial_id",
    "labels",
    "integrity",
    "why",
    "fairness_group",
    "differs",
    "calls",
    "tokens",
    "seconds",
    *LIMIT_FIELDS,
    "ended_by",
    "in_flight",
    "statuses",
    "sandbox",
    "network",
    "connections_allowed",
    "connections_denied",
    "sandbox_fallback",
    "keyed",
    "score",
)


#: Characters a terminal acts on rather than shows: C0 and C1 controls, DEL, and the bidirectional
#: overrides and isolates that reorder what follows them.
_ACTIVE = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    **{code: f"\\u{code:04x}" for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))},
}
_ACTIVE.update({ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r"})
#: The same, for a block of text shown as lines: its newlines and tabs stay.
_ACTIVE_IN_BLOCK = {code: text for code, text in _ACTIVE.items() if code not in (ord("\n"), ord("\t"))}


def visible(value: object, *, block: bool = False) -> str:
    """`value` as text that shows on a terminal as it is: every control character a visible escape.

    What a command wrote or named (its command line, a path, a reason) reaches the
    grader's terminal only so: no newline forges a row, no escape sequence moves the
    cursor, clears the screen or sets the window's title. A `block` (a call's
    output, shown as lines) keeps its newlines and tabs.
    """
    return str(value).translate(_ACTIVE_IN_BLOCK if block else _ACTIVE)


#: What a spreadsheet reads as the start of a formula (OWASP's CSV injection list).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: object) -> object:
    """A CSV cell a spreadsheet shows as text: one starting like a formula gets a leading apostrophe."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def status_text(summary: Summary, left: dict[str, Any]) -> str:
    """`trial-tool status` for people: what is used and left of each budget, and whether the trial is intact."""
    limits = summary["limits"]
    used = summary["used"]
    integrity = summary["integrity"]
    verdict = integrity["verdict"]
    # The verdict's own word (ledger/_verify.py), as every graders' command says it.
    intact = "FAILED" if verdict == "failed" else verdict
    lines = [
        f"trial     {summary['trial_id']}  ({summary['state']})",
        *([f"labels    {labels_text(summary['labels'])}"] if summary.get("labels") else []),
        f"calls     {used['calls']} of {limits.get('max_calls')} used, {left['calls']} left"
        + (f"; {summary['in_flight']} in flight" if summary["in_flight"] else ""),
        f"tokens    {used['tokens']} of {limits.get('max_tokens')} delivered, {left['tokens']} left",
        f"time      {left['seconds_used']:.1f} s of {limits.get('trial_timeout')} s used, {left['seconds']:.1f} s left",
        f"refused   {summary['refused_calls']}" + (f" (ended by {summary['ended_by']})" if summary["ended_by"] else ""),
        f"outcomes  {_statuses(summary['statuses']) or 'no calls yet'}",
        *(
            [f"grading   {summary['grading_commands']} commands of the harness (uncharged)"]
            if summary.get("grading_commands")
            else []
        ),
        f"sandbox   {summary['sandbox']['mode']} (network {network_text(summary['sandbox'])})"
        + (
            f", image {image} ({summary['sandbox'].get('image_id')})"
            if (image := summary["sandbox"].get("image"))
            else ""
        )
        + (f", runs as {who}" if (who := summary["sandbox"].get("run_as")) else "")
        + (f"; auto found no sandbox: {fallback}" if (fallback := summary.get("sandbox_fallback")) else ""),
        *(
            [f"network   {counted['allowed']} connections allowed, {counted['denied']} denied"]
            if summary["sandbox"]["network"] == "allow" and (counted := summary.get("connections") or {})
            else []
        ),
        f"log       {summary['records']} records, {'HMAC-SHA256 (keyed)' if summary['keyed'] else 'SHA-256'} chain",
        f"head      {summary['head']}",
        *([f"signed    {_signed_text(signed)}"] if (signed := summary["signature"])["signer"] else []),
        f"integrity {intact}" + (f": {integrity['why']}" if verdict not in ("clean",) and "why" in integrity else ""),
    ]
    return "\n".join(visible(line) for line in lines)


def _signed_text(signed: Signature) -> str:
    """Who signs the trial, and (checked with --public-key) what the signatures cover."""
    if signed["status"] == "not_checked":
        return f"by key {signed['signer']} (--public-key checks it)"
    return f"by key {signed['signer']}: {signed['status']}, {signed.get('signed_records')} records covered"


def network_text(sandbox: dict[str, Any], shown: int = 6) -> str:
    """A trial's network setting, with the first rules of an allowlist (a list may hold a thousand)."""
    rules = [str(rule) for rule in sandbox.get("allow") or ()]
    if sandbox.get("network") != "allow":
        return str(sandbox.get("network"))
    more = f" and {len(rules) - shown} more" if len(rules) > shown else ""
    return f"allow: {' '.join(rules[:shown]) or 'nothing'}{more}"


def _statuses(statuses: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(statuses.items(), key=lambda item: -item[1]))


def calls_table(records: list[dict[str, object]], started_at: str | None, width: int | None = None) -> str:
    """`trial-tool show`: one line a record."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    origin = instant(started_at) if started_at else None
    header = ("rec", "seq", "start", "secs", "status", "exit", "tokens", "clip", "command")
    rows: list[tuple[str, ...]] = []
    for record in records:
        start = instant(record.get("started_at_utc") or record.get("at_utc"))
        offset = f"+{(start - origin).total_seconds():.1f}s" if start and origin else "-"
        ran = record.get("elapsed_seconds")
        # What the agent got (124 for a deadline), with the command's own status beside it when it differs.
        command_code = record.get("command_exit_code")
        if command_code is None and record.get("command_signal") is not None:
            command_code = f"sig{record['command_signal']}"
        exit_code = record.get("return_code")
        if exit_code is None:
            exit_code = command_code
        elif command_code is not None and str(command_code) != str(exit_code):
            exit_code = f"{exit_code} ({command_code})"
        tokens = record.get("delivered_emitted_tokens")
        allowance = record.get("allowance_tokens")
        graded = record.get("record_type") == "trial_tool_grading"
        rows.append(
            (
                visible(record.get("record", "-")),
                "grading" if graded else visible(record.get("sequence", "-")),
                offset,
                f"{ran:.2f}" if isinstance(ran, (int, float)) else "-",
                visible(record.get("status") or record.get("record_type")),
                "-" if exit_code is None else visible(exit_code),
                "-" if tokens is None else visible(f"{tokens}" if graded else f"{tokens}/{allowance}"),
                "yes" if record.get("output_truncated") else "",
                visible(command_text(record)) if record.get("record_type") != "trial_tool_repair" else "(log repaired)",
            )
        )
    return _table(header, rows, width)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], width: int) -> str:
    """Aligned columns; the last one cut to the terminal's width."""
    widths = [max([len(header[i])] + [len(row[i]) for row in rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        fixed = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1]))
        room = max(10, width - len(fixed) - 2)
        last = row[-1] if len(row[-1]) <= room else row[-1][: room - 1] + "…"
        lines.append(f"{fixed}  {last}".rstrip())
    return "\n".join(lines)


def trial_row(summary: Summary, base: str | None = None) -> dict[str, Any]:
    """A trial as one flat row of TRIAL_COLUMNS."""
    limits = summary["limits"]
    path = summary["state"]
    if base:
        try:
            path = os.path.relpath(path, base)
        except ValueError:
            pass
    fairness = summary.get("fairness")
    return {
        "trial": path,
        "trial_id": summary["trial_id"],
        "labels": labels_text(summary.get("labels") or {}),
        "integrity": summary["integrity"]["verdict"],
        "why": summary["integrity"].get("why", ""),
        "fairness_group": fairness["group"] if fairness else "",
        "differs": differs_text(fairness["differs"] if fairness else {}),
        "calls": summary["used"]["calls"],
        "tokens": summary["used"]["tokens"],
        "seconds": summary["used"]["seconds"],
        **{name: limits.get(name, "") for name in LIMIT_FIELDS},
        "ended_by": summary["ended_by"] or "",
        "in_flight": summary.get("in_flight", 0),
        "statuses": _statuses(summary["statuses"]),
        "sandbox": summary["sandbox"]["mode"],
        "network": summary["sandbox"]["network"],
        "connections_allowed": (summary.get("connections") or {}).get("allowed", 0),
        "connections_denied": (summary.get("connections") or {}).get("denied", 0),
        "sandbox_fallback": summary.get("sandbox_fallback") or "",
        "keyed": summary["keyed"],
        "score": summary.get("score", ""),
    }


def labels_text(labels: dict[str, Any]) -> str:
    """`key=value` pairs, space-separated (a label's value holds no control character, but may hold spaces)."""
    return " ".join(f"{key}={value}" for key, value in sorted(labels.items()))


def differs_text(differs: dict[str, Any]) -> str:
    """What a trial's rules change from the majority's: `field majority -> theirs`, semicolon-separated."""
    return "; ".join(f"{name} {mine} -> {theirs}" for name, (mine, theirs) in differs.items())


def _trials(count: int) -> str:
    return f"{count} trial" if count == 1 else f"{count} trials"


def overview_lines(overview: dict[str, Any]) -> list[str]:
    """The report's overview, for the terminal and markdown alike (plain lines)."""
    fairness = overview["fairness"]
    majority = fairness["majority"]
    lines = [_trials(overview["trials"])]
    if fairness["same_rules"]:
        lines.append("fairness: every trial was held to the same rules")
    else:
        flagged = sum(other["trials"] for other in fairness["others"])
        differ = "differs" if flagged == 1 else "differ"
        lines.append(
            f"fairness: {_trials(flagged)} {differ} from the majority's rules ({_trials(majority['trials'])}):"
        )
        for other in fairness["others"]:
            lines.append(f"  group {other['group']}, {_trials(other['trials'])}: {differs_text(other['differs'])}")
    limits = majority["limits"]
    lines.append(
        f"rules: calls {limits.get('max_calls')}, tokens {limits.get('max_tokens')}, "
        f"call tokens {limits.get('max_call_tokens')}, trial {limits.get('trial_timeout')} s, "
        f"call {limits.get('call_timeout')} s, sandbox {majority['sandbox']['mode']} "
        f"(network {network_text(majority['sandbox'])}), tokenizer {', '.join(majority['tokenizer'])}"
    )
    lines.append("integrity: " + ", ".join(f"{name} {count}" for name, count in overview["integrity"].items()))
    ignored = len(overview.get("ignored_inside_workspaces") or ())
    if ignored:
        lines.append(f"{ignored} files inside trials' workspaces ignored (a command could write them)")
    if overview["duplicate_trial_ids"]:
        lines.append(f"duplicate trial ids (copies counted twice?): {len(overview['duplicate_trial_ids'])}")
    lines.append("ended by: " + ", ".join(f"{name} {count}" for name, count in overview["ended_by"].items()))
    for name in ("calls", "tokens", "seconds"):
        used, share = overview["used"][name], overview["share_of_limit"][name]
        lines.append(
            f"{name}: median {used['median']:g}, p90 {used['p90']:g}, max {used['max']:g} "
            f"({share['median']:.0%} / {share['p90']:.0%} / {share['max']:.0%} of the limit)"
        )
    lines.append("outcomes: " + _statuses(overview["statuses"]))
    network = overview.get("connections") or {}
    if network.get("trials"):
        lines.append(
            f"network: {_trials(network['trials'])} on an allowlist; {network['allowed']} connections allowed, "
            f"{network['denied']} denied (in {_trials(network['trials_with_denials'])})"
        )
    if "scores" in overview:
        groups = overview["scores"]["by_ended_by"]
        shown = ", ".join(f"{name}: {group['mean']:g} over {group['trials']}" for name, group in groups.items())
        lines.append(f"mean score by what ended the trial ({overview['scores']['matched']} scored): {shown}")
    return [visible(line) for line in lines]


def report_table(report: Report, out: IO[str], base: str | None) -> None:
    out.write("\n".join(overview_lines(report.overview)) + "\n\n")
    # The denials column where any trial had an allowlist: the other network modes make no attempt to count.
    denials = bool((report.overview.get("connections") or {}).get("trials"))
    header = ("rules", "calls", "tokens", "secs", *(("denied",) if denials else ()), "ended", "integrity", "score")
    header += ("trial",)
    width = shutil.get_terminal_size((160, 24)).columns
    batch: list[tuple[str, ...]] = []
    for summary in report.trials():
        row = trial_row(summary, base)
        labels = f"  [{row['labels']}]" if row["labels"] else ""
        batch.append(
            (
                "majority" if row["fairness_group"] in (1, "") else f"group {row['fairness_group']}",
                f"{row['calls']}/{row['max_calls']}",
                f"{row['tokens']}/{row['max_tokens']}",
                f"{row['seconds']:g}",
                *((str(row["connections_denied"]),) if denials else ()),
                visible(row["ended_by"] or "-"),
                visible(row["integrity"]),
                "" if row["score"] == "" else f"{row['score']:g}",
                visible(row["trial"] + labels + (f"  ({row['why']})" if row["why"] else "")),
            )
        )
        if len(batch) == 1000:  # aligned per thousand rows, so the table streams
            out.write(_table(header, batch, width) + "\n")
            batch = []
    if batch:
        out.write(_table(header, batch, width) + "\n")


def report_markdown(report: Report, out: IO[str], base: str | None) -> None:
    out.write("# Trials\n\n" + "\n".join(f"- {line.strip()}" for line in overview_lines(report.overview)) + "\n\n")
    out.write("| " + " | ".join(TRIAL_COLUMNS) + " |\n|" + " --- |" * len(TRIAL_COLUMNS) + "\n")
    for summary in report.trials():
        row = trial_row(summary, base)
        cells = [visible(row[column]).replace("|", "\\|") for column in TRIAL_COLUMNS]
        out.write("| " + " | ".join(cells) + " |\n")


def report_csv(report: Report, out: IO[str], base: str | None) -> None:
    writer = csv.DictWriter(out, fieldnames=TRIAL_COLUMNS)
    writer.writeheader()
    for summary in report.trials():
        writer.writerow({name: spreadsheet_safe(value) for name, value in trial_row(summary, base).items()})


def report_json(report: Report, out: IO[str], base: str | None) -> None:
    """One JSON document: {"overview": ..., "trials": [summary, ...]}, written as it is read."""
    del base
    out.write('{"overview": ' + json.dumps(report.overview) + ', "trials": [')
    for index, summary in enumerate(report.trials()):
        out.write(("," if index else "") + "\n" + json.dumps(summary))
    out.write("\n]}\n")


__all__ = [
    "TRIAL_COLUMNS",
    "calls_table",
    "overview_lines",
    "report_csv",
    "report_json",
    "report_markdown",
    "report_table",
    "spreadsheet_safe",
    "status_text",
    "trial_row",
    "visible",
]
