"""`trial-tool keygen` and `trial-tool attest`: a signing key made, and a signed trial's statement signed now."""

from __future__ import annotations

import json
import sys

from ..errors import UsageError
from .options import Arguments


def keygen(args: Arguments) -> int:
    """A new Ed25519 key in `-o FILE` (mode 0600, never over an existing file); its public key on stdout."""
    from ..signing import generate

    if not args.output:
        raise UsageError("keygen needs -o FILE: where to write the new signing key")
    key = generate(args.output)
    print(key.public.pem(), end="")
    print(f"trial-tool: wrote {args.output}; fingerprint {key.fingerprint}", file=sys.stderr)
    return 0


def attest(args: Arguments) -> int:
    """Sign the trial's statement now; where it is and its SHA-256."""
    from .fromflags import trial_of

    trial = trial_of(args)
    made = trial.attest("attest")
    if args.json:
        print(json.dumps(made.as_json(), indent=2))
    else:
        print(f"signed {made.records} records of the log: {made.path} (statement sha256 {made.sha256})")
    return 0


__all__ = ["attest", "keygen"]
