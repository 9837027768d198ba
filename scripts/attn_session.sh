#!/usr/bin/env bash
# Device loop for the Hopper attention fast path (one device call):
#   bash scripts/attn_session.sh [probe args...]
# installs, runs the GPU tests in two parts, each under a timeout so a hung pipeline cannot eat the call (all but the
# forced-hopper attention tests, which on an H100/H200 still reach the Hopper kernel by default dispatch; then those),
# then scripts/attn_probe.py with the given args, then (SANITIZE=1) scripts/sanitize.sh. Output under $OUT; exit
# code = failed stages.
set -uo pipefail
. "$(dirname "$0")/session_lib.sh"
note() { local rc=$1; echo "--- rc=$rc" | tee -a "$LOG"; [ "$rc" = 0 ] || failed=$((failed + 1)); }
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "=== gpu tests, all but hopper attention ($(date -u +%T))" | tee -a "$LOG"
  timeout 300 python3 -m pytest -q -p no:cacheprovider $XDIST -x -k "not (attention and hopper)" tests \
    2>&1 | tail -25 | tee -a "$LOG"; note "${PIPESTATUS[0]}"
fi
echo "=== gpu tests, hopper attention ($(date -u +%T))" | tee -a "$LOG"
timeout 240 python3 -m pytest -q -p no:cacheprovider $XDIST --maxfail=60 -k "attention and hopper" tests/gpu \
  2>&1 | tail -40 | tee -a "$LOG"; note "${PIPESTATUS[0]}"
echo "=== probe $* ($(date -u +%T))" | tee -a "$LOG"
timeout 300 python3 scripts/attn_probe.py --json "$OUT/probe.json" "$@" 2>&1 | tee -a "$LOG"; note "${PIPESTATUS[0]}"
if [ -n "${SANITIZE:-}" ]; then
  echo "=== sanitizers ($(date -u +%T))" | tee -a "$LOG"
  bash scripts/sanitize.sh 120 2>&1 | tee -a "$LOG"; note "${PIPESTATUS[0]}"
fi
echo "=== done ($(date -u +%T)), failed stages: $failed" | tee -a "$LOG"
exit "$failed"
