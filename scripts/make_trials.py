"""Write many real trials, for the graders' benchmarks: every file made by trial-tool's API.

    python scripts/make_trials.py DIR [--trials N] [--calls 12] [--jobs J] [--signing-key KEY]

Trials go to DIR/shard-KK/trial-NNNNNN.json and .jsonl, made by J worker
processes, each running its trials' calls through `Trial.run` (unsandboxed,
for speed). They vary as a benchmark's do: most run all their calls
(echo, seq with clipped output, failing commands); one in ten tries two calls
more than its budget allows and is refused at the end; one in two hundred was
given another token limit (the fairness check must find them). A trial already complete is skipped, so an
interrupted run can be resumed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

LIMITS = {"sandbox": "none", "max_calls": 14, "max_tokens": 20_000, "max_call_tokens": 400}


def commands(number: int, calls: int) -> list[list[str]]:
    """Call `i` of trial `number`: small outputs, some clipped, some failing."""
    made = []
    for index in range(calls):
        kind = (number + index) % 6
        if kind == 0:
            made.append(["seq", "1", str(50 + (number * 7 + index) % 400)])  # clipped past ~200 numbers
        elif kind == 1:
            made.append(["false"])
        elif kind == 2:
            made.append(["printf", f"trial {number} call {index}\n"])
        else:
            made.append(["echo", "step", str(index), "of", str(number)])
    return made


_FORK_SERVER = None


_SIGNING_KEY = None


def make(job: tuple[str, int, int, str | None]) -> int:
    from trialtool import BudgetExhausted, Trial
    from trialtool.process._forkserver import ForkServer

    global _FORK_SERVER, _SIGNING_KEY
    if _FORK_SERVER is None:
        _FORK_SERVER = ForkServer()  # one per worker, as the per-user server shares one among its trials

    directory, number, calls, signing = job
    if signing is not None and _SIGNING_KEY is None:
        from trialtool import read_signing_key

        _SIGNING_KEY = read_signing_key(signing)
    base = Path(directory) / f"shard-{number % 100:02}" / f"trial-{number:06}"
    state, log = base.with_suffix(".json"), base.with_suffix(".jsonl")
    greedy = number % 10 == 9
    wanted = LIMITS["max_calls"] + 2 if greedy else calls
    if log.exists() and state.exists() and log.read_bytes().count(b"\n") >= wanted:
        return 0
    for leftover in (state, log):
        leftover.unlink(missing_ok=True)
    limits = dict(LIMITS)
    if number % 200 == 199:
        limits["max_tokens"] = 30_000  # held to other rules
    with Trial(state, log, limits=limits, fork_server=_FORK_SERVER, signing_key=_SIGNING_KEY) as trial:
        for command in commands(number, wanted):
            try:
                trial.run(command)
            except BudgetExhausted:
                pass
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory")
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=12, help="calls a trial makes (the budget is 14)")
    parser.add_argument("--jobs", type=int, default=(os.cpu_count() or 1) * 2)
    parser.add_argument("--signing-key", help="sign every trial with this key (made by `trial-tool keygen`)")
    args = parser.parse_args()
    for shard in range(min(100, args.trials)):
        (Path(args.directory) / f"shard-{shard:02}").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    signing = None if args.signing_key is None else os.path.abspath(args.signing_key)
    jobs = [(args.directory, number, args.calls, signing) for number in range(args.trials)]
    made = 0
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for done, fresh in enumerate(pool.imap_unordered(make, jobs, chunksize=8), 1):
            made += fresh
            if done % 500 == 0 or done == len(jobs):
                rate = done / (time.perf_counter() - started)
                print(f"\r{done}/{len(jobs)} trials ({rate:.0f}/s)", end="", file=sys.stderr, flush=True)
    print(f"\n{made} trials made in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
