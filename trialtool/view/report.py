"""Many trials at once: each verified and summed up in parallel, then compared.

`build` summarises every trial found under the given paths in worker processes
and streams the summaries to a spool file on disk, keeping in memory only
what the comparison needs (a few numbers a trial, and a count per distinct
set of rules), so memory stays flat however many trials there are. The
overview it returns answers a grader's first questions: were all trials held
to the same rules (the fairness check), which are intact, how much of each
budget they used, which budget stopped them, and, given the benchmark's own
scores, whether the trials a budget stopped scored lower.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any, NotRequired, TypedDict

from ..errors import UsageError
from ..ledger import START
from . import summary as summaries
from .calls import Replayer, command_text, mapping
from .joins import Scores
from .summary import Group, Summary

#: Trials a worker takes at a time: large enough to keep the pipe busy, small enough for a smooth progress bar.
_CHUNK = 32
#: How much of each delivered stream the HTML report embeds per call.
TEXT_PREVIEW = 2000


class Report:
    """The overview of many trials, and their summaries streamed back from disk, flagged ones first.

    Each summary comes back with `fairness`: its group (1, the majority's rules;
    2, 3, ... the others, most trials first, as the overview lists them) and what
    its rules change from the majority's.
    """

    def __init__(
        self,
        spool: IO[bytes],
        overview: dict[str, Any],  # a JSON document for the views, built in this module
        flagged: set[int],
        rule_of: array[int] | None = None,
        groups: dict[int, Group] | None = None,
    ) -> None:
        self._spool = spool
        self.overview = overview
        self._flagged = flagged
        self._rule_of = rule_of if rule_of is not None else array("l")
        self._groups = groups or {}

    def trials(self, *, details: bool = False) -> Iterator[Summary]:
        """Every trial's summary (with `calls` when built with them and `details`), flagged trials first."""
        for want_flagged in (True, False):
            self._spool.seek(0)
            for index, line in enumerate(self._spool):
                if (index in self._flagged) != want_flagged:
                    continue
                entry: Summary = json.loads(line)  # this report's own spool
                if not details:
                    entry.pop("calls", None)
                if index < len(self._rule_of):
                    entry["fairness"] = self._groups[self._rule_of[index]]
                yield entry

    def close(self) -> None:
        self._spool.close()


def _against_head(summary: Summary, heads: dict[str, str]) -> None:
    """Fail a trial whose log does not end at the head its harness was given (verify --expect-head's rule)."""
    expected = heads.get(str(summary.get("trial_id")))
    if expected is None or summary.get("log_head") is None or summary["log_head"] == expected:
        return
    if summary["integrity"]["verdict"] == "failed":
        return
    why = f"the log's head is {summary['log_head']}, not {expected}, the one the harness was given (records appended?)"
    summary["integrity"] = {"verdict": "failed", "why": why, "first_bad_sequence": None, "line": None}


#: One trial's work: its state and log, the ledger key, whether to embed its calls, and the trusted keys.
_Job = tuple[str, str, bytes | None, bool, tuple[bytes, ...] | None]


def _work(job: _Job) -> Summary:
    state, log, key, with_calls, trusted = job
    from ..ledger import snapshot

    try:
        taken = snapshot.read(state, log)
    except Exception as exc:  # a worker reports what it cannot read; it must not kill the report
        return summaries.unreadable(state, log, str(getattr(exc, "message", exc)))
    summary, records = summaries.summarize_snapshot(taken, state, log, key, trusted=trusted)
    if with_calls:
        summary["calls"] = [_call_entry(record) for record in records if record.get("record_type") != START]
    return summary


_REPLAYER: Replayer | None = None


def _call_entry(record: Mapping[str, object]) -> dict[str, object]:
    """One call as the HTML report shows it: timing, outcome, tokens, and the start of what was delivered."""
    global _REPLAYER
    if _REPLAYER is None:
        _REPLAYER = Replayer()
    given = _REPLAYER.delivered(record) if record.get("record_type") != "trial_tool_repair" else None
    after = mapping(record.get("ledger_after"))
    wall = record.get("wall_elapsed_seconds")
    ran = record.get("elapsed_seconds")
    return {
        "record": record.get("record"),
        "sequence": record.get("sequence"),
        "status": ("grading: " if record.get("record_type") == "trial_tool_grading" else "")
        + str(record.get("status") or record.get("record_type")),
        "end": wall if isinstance(wall, (int, float)) else None,
        "duration": ran if isinstance(ran, (int, float)) else 0.0,
        "exit": record.get("command_exit_code"),
        "tokens": record.get("delivered_emitted_tokens"),
        "allowance": record.get("allowance_tokens"),
        "clipped": bool(record.get("output_truncated")),
        "calls_after": after.get("charged_calls"),
        "tokens_after": after.get("emitted_tokens"),
        "command": command_text(record)[:500],
        "stdout": "" if given is None else given.stdout[:TEXT_PREVIEW],
        "stderr": "" if given is None else given.stderr[:TEXT_PREVIEW],
        "more": given is not None and max(len(given.stdout), len(given.stderr)) > TEXT_PREVIEW,
        "matches": None if given is None else given.matches,
        "error": record.get("error"),
    }


def _results(jobs: list[_Job], workers: int) -> Iterator[Summary]:
    if workers <= 1 or len(jobs) < 2 * _CHUNK:
        yield from map(_work, jobs)
        return
    import multiprocessing

    # fork where it is safe (Linux; this process has no threads of its own): workers start in ~1 ms.
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
    with context.Pool(workers) as pool:
        yield from pool.imap(_work, jobs, chunksize=_CHUNK)


def _progress(total: int) -> Callable[[int], None]:
    """A progress line on stderr when it is a terminal, redrawn at most ten times a second."""
    if not sys.stderr.isatty():
        return lambda done: None
    last = [0.0]

    def show(done: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= 0.1:
            last[0] = now
            width = 30
            filled = width * done // max(1, total)
            end = "\n" if done == total else ""
            sys.stderr.write(f"\rverifying [{'#' * filled}{'.' * (width - filled)}] {done}/{total}{end}")
            sys.stderr.flush()

    return show


def build(
    pairs: Iterable[tuple[str, str]],
    *,
    key: bytes | None = None,
    workers: int | None = None,
    scores: Scores | None = None,
    with_calls: bool = False,
    heads: dict[str, str] | None = None,
    trusted: tuple[bytes, ...] | None = None,
) -> Report:
    """Verify and summarise every trial of `pairs`; the overview, and the summaries spooled to disk.

    `heads` (trial id -> the chain head its harness was last given) fails every trial
    whose log ends elsewhere. `trusted` (raw Ed25519 public keys) checks every trial's signatures.
    """
    jobs = [(state, log, key, with_calls, trusted) for state, log in pairs]
    if not jobs:
        msg = "no trials found (a trial is a state .json and its log .jsonl)"
        raise UsageError(msg)
    workers = workers or os.cpu_count() or 1
    spool = tempfile.TemporaryFile()  # noqa: SIM115 (closed by Report.close, or below on failure)
    rules: Counter[str] = Counter()
    keys = array("l")  # the index of each trial's rules in `order`
    order: dict[str, int] = {}
    used = {"calls": array("d"), "tokens": array("d"), "seconds": array("d")}
    share = {"calls": array("d"), "tokens": array("d"), "seconds": array("d")}
    integrity: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    ids: Counter[str] = Counter()
    scored: dict[str, list[float]] = {}
    network: Counter[str] = Counter({"trials": 0, "allowed": 0, "denied": 0, "trials_with_denials": 0})
    keyed = 0
    progress = _progress(len(jobs))
    try:
        for done, summary in enumerate(_results(jobs, workers), 1):
            if heads:
                _against_head(summary, heads)
            score = None if scores is None else scores.of(summary)
            if score is not None:
                summary["score"] = score
            spool.write(json.dumps(summary, separators=(",", ":")).encode() + b"\n")
            rule = summaries.fairness_key(summary)
            rules[rule] += 1
            keys.append(order.setdefault(rule, len(order)))
            limits, used_now = summary["limits"], summary["used"]
            spent = {
                "calls": float(used_now["calls"]),
                "tokens": float(used_now["tokens"]),
                "seconds": used_now["seconds"],
            }
            for name, limit in (("calls", "max_calls"), ("tokens", "max_tokens"), ("seconds", "trial_timeout")):
                value = float(spent[name])
                used[name].append(value)
                cap = limits.get(limit)
                share[name].append(value / cap if isinstance(cap, (int, float)) and cap > 0 else 0.0)
            integrity[summary["integrity"]["verdict"]] += 1
            ended[summary["ended_by"] or "none"] += 1
            statuses.update(summary["statuses"])
            trial_id = summary["trial_id"]
            if trial_id:
                ids[trial_id] += 1
            keyed += bool(summary["keyed"])
            _count_connections(network, summary)
            if "score" in summary:
                scored.setdefault(summary["ended_by"] or "none", []).append(float(summary["score"]))
            progress(done)
    except BaseException:
        spool.close()
        raise
    majority, _ = rules.most_common(1)[0]
    majority_index = order[majority]
    flagged = {index for index, rule in enumerate(keys) if rule != majority_index}
    fairness = _fairness(rules, majority)
    groups: dict[int, Group] = {order[majority]: {"group": 1, "differs": {}}}
    for other in fairness["others"]:
        groups[order[other.pop("rule")]] = {"group": other["group"], "differs": other["differs"]}
    overview = {
        "trials": len(jobs),
        "fairness": fairness,
        "integrity": dict(sorted(integrity.items())),
        "keyed": keyed,
        "duplicate_trial_ids": sorted(trial_id for trial_id, count in ids.items() if count > 1),
        "ended_by": dict(sorted(ended.items())),
        "statuses": dict(sorted(statuses.items())),
        "connections": dict(network),
        "used": {name: _distribution(values) for name, values in used.items()},
        "share_of_limit": {name: _distribution(values) for name, values in share.items()},
        "histograms": {name: _histogram(values) for name, values in share.items()},
    }
    if scores is not None:
        overview["scores"] = {
            "matched": sum(len(values) for values in scored.values()),
            "by_ended_by": {
                name: {"trials": len(values), "mean": round(statistics.fmean(values), 4)}
                for name, values in sorted(scored.items())
            },
        }
    return Report(spool, overview, flagged, keys, groups)


def _count_connections(network: Counter[str], summary: Summary) -> None:
    """Add a trial's connections (network "allow") to the report's: allowed, denied, trials denied any."""
    counted = summary.get("connections") or {}
    network["trials"] += summary["sandbox"].get("network") == "allow"
    network["allowed"] += counted.get("allowed", 0)
    network["denied"] += counted.get("denied", 0)
    network["trials_with_denials"] += counted.get("denied", 0) > 0


class _Other(TypedDict):
    group: int
    trials: int
    differs: dict[str, list[object]]
    rule: NotRequired[str]


class _Fairness(TypedDict):
    same_rules: bool
    majority: dict[str, object]
    others: list[_Other]


def _fairness(rules: Counter[str], majority: str) -> _Fairness:
    """The majority's rules, and each other set of rules with how it differs and how many trials hold it."""
    base = json.loads(majority)
    others: list[_Other] = []
    for rule, count in rules.most_common():
        if rule == majority:
            continue
        theirs = json.loads(rule)
        others.append({"group": len(others) + 2, "trials": count, "differs": _differences(base, theirs), "rule": rule})
    return {"same_rules": not others, "majority": {"group": 1, "trials": rules[majority], **base}, "others": others}


def _differences(base: dict[str, object], theirs: dict[str, object]) -> dict[str, list[object]]:
    """field -> [majority's value, theirs], over limits, sandbox and tokenizer."""
    found: dict[str, list[object]] = {}
    for group in ("limits", "sandbox"):
        mine, other = base.get(group), theirs.get(group)
        mine, other = mine if isinstance(mine, dict) else {}, other if isinstance(other, dict) else {}
        for name in sorted(set(mine) | set(other)):
            if mine.get(name) != other.get(name):
                found[f"{group}.{name}"] = [mine.get(name), other.get(name)]
    if base.get("tokenizer") != theirs.get("tokenizer"):
        found["tokenizer"] = [base.get("tokenizer"), theirs.get("tokenizer")]
    return found


def _distribution(values: array[float]) -> dict[str, float]:
    if not values:
        return {"median": 0.0, "p90": 0.0, "max": 0.0}
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return {"median": round(statistics.median(ordered), 4), "p90": round(p90, 4), "max": round(ordered[-1], 4)}


def _histogram(values: array[float], bins: int = 20) -> list[int]:
    """How many trials used each twentieth of a budget (the last bin holds 95-100% and over)."""
    counts = [0] * bins
    for value in values:
        counts[min(bins - 1, max(0, int(value * bins)))] += 1
    return counts


__all__ = ["TEXT_PREVIEW", "Report", "build"]
