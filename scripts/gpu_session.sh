#!/usr/bin/env bash
# One whole device session in one command (see README "GPU verification"):
#   bash scripts/gpu_session.sh [quick|full]
# installs the package, runs the GPU tests, compute-sanitizer on small shapes, `xkernels check` and
# `xkernels bench`, and leaves everything under $OUT (or ./out): session.log, sanitizer.log (memcheck, racecheck,
# synccheck), check.json, bench.json, bench.md, bench.png. (scripts/gemm_floor_probe.py is a separate probe.)
# Every stage runs even when an earlier one fails; the exit code is the number of failed stages.
set -uo pipefail
MODE=${1:-quick}
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/session.log"
failed=0
stage() { echo "=== $* ($(date -u +%T))" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; local rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || failed=$((failed + 1)); return 0; }

stage python3 -m pip install -q --no-deps --no-build-isolation -e .
stage nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
stage python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# the device image has pytest-xdist: 8 workers compile kernel variants in parallel
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
stage python3 -m pytest -q -p no:cacheprovider $XDIST --durations=10 tests
for tool in memcheck racecheck synccheck; do
  echo "=== compute-sanitizer $tool" | tee -a "$LOG" "$OUT/sanitizer.log" >/dev/null
  compute-sanitizer --tool "$tool" --print-limit 20 python3 scripts/small_shapes.py >> "$OUT/sanitizer.log" 2>&1
  rc=$?; tail -2 "$OUT/sanitizer.log" | tee -a "$LOG"; [ "$rc" = 0 ] || failed=$((failed + 1))
done
stage xkernels check --json "$OUT/check.json"
if [ "$MODE" = full ]; then
  stage xkernels bench --out "$OUT"
else
  stage xkernels bench --quick --out "$OUT"
fi
echo "=== failed stages: $failed" | tee -a "$LOG"
exit "$failed"
