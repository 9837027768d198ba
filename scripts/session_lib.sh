# Shared by the device-session scripts (source it): output folder, log, and `stage CMD...`, which runs a command,
# logs it with a timestamp and counts a non-zero exit in $failed (every stage runs even when an earlier one fails).
export OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: stages may run in another directory
export PYTHONUNBUFFERED=1
LOG="$OUT/session.log"
failed=0
stage() { echo "=== $* ($(date -u +%T))" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; local rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || failed=$((failed + 1)); return 0; }
# the device image has pytest-xdist: 8 workers compile kernel variants in parallel
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
