"""The call: `Trial`, and the order of a call's steps (reserve, preflight, run, deliver, commit, verdict).

`Trial` (_trial.py) is the typed API every door calls; what a call checks
before it is charged is _preflight.py's, how its output is judged and delivered
_delivery.py's and _verdict.py's.
"""

from __future__ import annotations

from ._trial import Attestation, Trial, use_launcher

__all__ = ["Attestation", "Trial", "use_launcher"]
