#!/usr/bin/env bash
# From nothing to a demo trial: make a venv, install trialtool, run calls until a limit bites,
# then show the state and the log. Leaves the trial in a temporary directory it names.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-venv
tool=.venv/bin/trial-tool
trial=$(mktemp -d "${TMPDIR:-/tmp}/trialtool-demo.XXXXXX")
state=$trial/state.json
log=$trial/log.jsonl

run() {
  printf '$ trial-tool --state %s --log %s' "$state" "$log"
  printf ' %q' "$@"
  echo
  set +e
  "$tool" --state "$state" --log "$log" "$@"
  code=$?
  set -e
  echo "  -> exit $code"
  echo
}

"$tool" init --state "$state" --log "$log" --max-calls 4 --max-tokens 400 --max-call-tokens 60 --call-timeout 2 >/dev/null
echo "A trial of 4 calls, 400 delivered tokens, 60 tokens a call, 2 s a call, in $trial"
echo
run -- echo "hello from the agent's first tool call"
run -- sh -c 'seq 1 500'          # clipped to 60 tokens: head, a notice, tail
run -- sleep 10                   # stopped at the 2 s call deadline: exit 124
run -- sh -c 'echo out; echo err >&2; exit 3'
run -- echo "a fifth call"        # refused: the 4 calls are spent, exit 123

echo "== state ($state)"
"$tool" status --state "$state" --log "$log"
echo
echo "== verify: the chain, every record's totals, and the state"
"$tool" verify --state "$state" --log "$log"
echo
echo "== log ($log): one record a call, each chained to the one before"
.venv/bin/python - "$log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"#{r['sequence']} {r['status']:<20} exit={r['return_code']!s:<5} delivered={r['delivered_emitted_tokens']:>3}"
          f"/{r['allowance_tokens']:<3} tokens  prev_hash={r['prev_hash'][:12]}  {' '.join(r['command'])}")
PY
