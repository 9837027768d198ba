#!/usr/bin/env bash
# The fused-dQ dK/dV kernel's one-row fault (D64, Sq = 1 against 77 keys): which shapes fault with the kernel forced
# on (`views_bwd_cases.py --force-fused`), one process a case, a table line each, into $OUT/fault.md.
#   OUT=out bash scripts/fused_dq_fault.sh   (exit code: the number of failing stages)
set -uo pipefail
. "$(dirname "$0")/session_lib.sh"
LOG="$OUT/fault.log"  # its own log: it may run beside other stages
S="$(dirname "$0")/views_bwd_cases.py"
F="$OUT/fault.md"
run() { stage timeout "$1" python3 "$S" "${@:2}" --force-fused; grep '^|' "$LOG" > "$F"; }
# query and key counts at D64 (contiguous): one row, two, 17, 65 (two query blocks), more keys
run 150 --cases 64,1,77,0 64,1,77,1 64,2,77,0 64,17,77,0 64,1,200,0 64,1,128,0 64,65,77,0 --layout contiguous
# heads and batch at one row: no GQA, one head of one sequence; the (B, S, H, D) views; D128's fused kernel
run 40 --cases 64,1,77,0 --layout contiguous --heads 4,4
run 40 --cases 64,1,77,0 --layout contiguous --batch 1 --heads 1,1
run 40 --cases 64,1,77,0
run 40 --cases 128,1,77,0 --layout contiguous
# the single-iteration hypothesis: the same shapes with Sq, Skv and the head counts as runtime integers
run 80 --cases 64,1,77,0 64,2,77,0 --layout contiguous --no-specialize
exit "$failed"
