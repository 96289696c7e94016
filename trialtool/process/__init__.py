"""The process room: run one command as a contained tree, and report what happened.

A call's supervisor is forked ahead of the call (launcher.py), directly or by a
fork server for threaded callers (forkserver.py); it gets ready (supervisor.py),
spawns the command (spawn.py), watches it against its deadline, output cap and
resource limits (running.py, capture.py, cgroups.py), and reaps the whole tree
(reaper.py). The result comes back as an `Outcome` (outcome.py). Nothing here
imports the ledger's writing side, a front door, or `trial`.
"""
