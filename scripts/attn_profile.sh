#!/usr/bin/env bash
# ncu over scripts/attn_profile.py: per launch, speed of light, pipe utilizations (HGMMA, XU = MUFU, FMA, ALU),
# shared-memory and L2 use, warp stall reasons, into $OUT/ncu-<set>.txt (raw report: $OUT/attn-<set>.ncu-rep), and every
# stall reason per launch as a table in $OUT/ncu-<set>-stalls.md, and per instruction region in
# $OUT/ncu-<set>-source.md.
# If this ncu does not know a named metric, it retries once with the sections alone (each attempt keeps its own log);
# $OUT/ncu-metrics.txt lists the pipe metrics this ncu knows.
#   bash scripts/attn_profile.sh [set: targets|bf16io|persistent|bwd|walk|flat|d256, default targets]
#   [timeout seconds per attempt, default 180]
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
set_=${1:-targets}
limit=${2:-180}
case "$set_" in
  targets|bf16io|persistent|bwd|walk|flat|d256) ;;
  *) echo "unknown set '$set_' (targets, bf16io, persistent, bwd, walk, flat, d256)"; exit 2 ;;
esac
ncu --query-metrics 2>/dev/null | grep -i "pipe_\(tensor\|xu\|fma\|alu\)" > "$OUT/ncu-metrics.txt"
metrics=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section WarpStateStats --section Occupancy --section SourceCounters)
report="$OUT/attn-$set_.ncu-rep"
rm -f "$report"
run() {  # run LOG [extra ncu args]
  local log=$1
  shift
  timeout "$limit" ncu --clock-control none --profile-from-start off "${sections[@]}" "$@" -o "${report%.ncu-rep}" \
    -f python3 scripts/attn_profile.py "$set_" > "$log" 2>&1
}
run "$OUT/ncu-$set_.log" --metrics "$metrics"
rc=$?
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -qi "metric" "$OUT/ncu-$set_.log"; then
  echo "ncu with named metrics: rc=$rc (see ncu-$set_.log); retrying with the sections alone"
  run "$OUT/ncu-$set_-sections.log"
  rc=$?
fi
if [ "$rc" = 0 ] && [ -f "$report" ]; then
  ncu --import "$report" --print-units base > "$OUT/ncu-$set_.txt" 2>&1
  # per launch, each stall reason's warps per issued instruction (the summary above names only the largest)
  ncu --import "$report" --page raw --csv 2>/dev/null | python3 scripts/ncu_stalls.py > "$OUT/ncu-$set_-stalls.md"
  # per instruction: which program regions (by run count) the instructions and the stalls fall in
  ncu --import "$report" --page source --csv --print-source sass 2>/dev/null | python3 scripts/ncu_source.py \
    > "$OUT/ncu-$set_-source.md"
fi
tail -8 "$OUT"/ncu-"$set_"*.log
exit "$rc"
