#!/usr/bin/env bash
# ncu over scripts/attn_profile.py: per launch, speed of light, pipe utilizations (tensor, XU = MUFU, FMA, ALU),
# warp stall reasons and L2 hit rate, into $OUT/ncu.txt (raw report: $OUT/attn.ncu-rep). If a named metric is unknown
# to this ncu, it retries with the sections alone; $OUT/ncu-metrics.txt lists the pipe metrics this ncu knows.
#   bash scripts/attn_profile.sh [timeout seconds per attempt, default 180]
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
ncu --query-metrics 2>/dev/null | grep -i "pipe_\(tensor\|xu\|fma\|alu\)" > "$OUT/ncu-metrics.txt"
metrics=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy)
run() {
  timeout "${1}" ncu --clock-control none --profile-from-start off "${sections[@]}" "${@:2}" -o "$OUT/attn" -f \
    python3 scripts/attn_profile.py > "$OUT/ncu.log" 2>&1
}
run "${1:-180}" --metrics "$metrics"
rc=$?
if [ "$rc" != 0 ]; then
  echo "ncu with named metrics: rc=$rc; retrying with the sections alone" | tee -a "$OUT/ncu.log"
  run "${1:-180}"
  rc=$?
fi
ncu --import "$OUT/attn.ncu-rep" --print-units base > "$OUT/ncu.txt" 2>&1
tail -5 "$OUT/ncu.log"
exit "$rc"
