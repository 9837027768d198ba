#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck over scripts/small_shapes.py (every kernel variant once, small
# shapes with tails), appended to $OUT/sanitizer.log; each tool's summary line on stdout.
# Exit code: the number of tools with findings that count. memcheck/synccheck findings count; racecheck reports
# Gluon 3.6's warp_specialize partition hand-off (README, "Race check"), so it is logged for reading only.
#   bash scripts/sanitize.sh [timeout seconds per tool, default 300]
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
failed=0
for tool in memcheck racecheck synccheck; do
  echo "=== compute-sanitizer $tool ($(date -u +%T))" >> "$OUT/sanitizer.log"
  exitcode=1; [ "$tool" = racecheck ] && exitcode=0
  timeout "${1:-300}" compute-sanitizer --tool "$tool" --error-exitcode "$exitcode" --print-limit 20 \
    python3 scripts/small_shapes.py >> "$OUT/sanitizer.log" 2>&1
  rc=$?
  echo "$tool: $(tail -1 "$OUT/sanitizer.log") (rc=$rc)"
  [ "$rc" = 0 ] || failed=$((failed + 1))
done
exit "$failed"
