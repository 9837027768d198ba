#!/usr/bin/env bash
# One whole device session in one command (see README "GPU verification"):
#   bash scripts/gpu_session.sh [quick|full|gemm|attention]   (gemm: no sanitizers, GEMM suite only;
#   attention: attention suite only; SKIP_TESTS=1 skips pytest when the same commit's tests ran in an earlier call;
#   full and attention take longer than one 10-minute device call: see benchmarks/NOTES.md for the split)
# installs the package, runs the GPU tests, compute-sanitizer on small shapes (scripts/sanitize.sh), `xkernels
# check` and `xkernels bench`, and leaves everything under $OUT (or ./out): session.log, sanitizer.log (memcheck,
# racecheck, synccheck), check.json, bench.json, bench.md, bench.png. (scripts/gemm_floor_probe.py is a separate probe.)
# Every stage runs even when an earlier one fails; the exit code is the number of failed stages.
set -uo pipefail
MODE=${1:-quick}
. "$(dirname "$0")/session_lib.sh"

stage python3 -m pip install -q --no-deps --no-build-isolation -e .
stage nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
stage python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# a hung Hopper pipeline must not eat the session: smoke-test GEMM and attention under a timeout, else run the rest
# portable-only
if ! timeout 120 python3 -c "
import torch, xkernels
a, b = (torch.rand(3000, 2000, device='cuda') - 0.5).half(), (torch.rand(2000, 1000, device='cuda') - 0.5).half()
c = xkernels.matmul(a, b); torch.cuda.synchronize()
err = ((c.double() - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm()).item()
print(xkernels.last_backend(), 'rel err', err); assert err < 5e-3
q, k, v = ((torch.rand(1, 4, 1000, 128, device='cuda') - 0.5).bfloat16() for _ in range(3))
o = xkernels.attention(q, k, v, is_causal=True); torch.cuda.synchronize()
ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
err = ((o.double() - ref).norm() / ref.norm()).item()
print(xkernels.last_backend(), 'rel err', err); assert err < 1e-2
" 2>&1 | tee -a "$LOG"; then
  echo "!!! Hopper smoke test failed or hung: XKERNELS_LAYER=portable for the rest of this session" | tee -a "$LOG"
  export XKERNELS_LAYER=portable; failed=$((failed + 1))
fi
[ -z "${SKIP_TESTS:-}" ] && stage timeout 420 python3 -m pytest -q -p no:cacheprovider $XDIST --durations=10 tests
[ "$MODE" = gemm ] || stage bash scripts/sanitize.sh
stage timeout 300 xkernels check --json "$OUT/check.json"
if [ "$MODE" = full ]; then
  stage xkernels bench --out "$OUT"
elif [ "$MODE" = gemm ] || [ "$MODE" = attention ]; then
  stage xkernels bench --suite "$MODE" --out "$OUT"
else
  stage xkernels bench --quick --out "$OUT"
fi
echo "=== failed stages: $failed" | tee -a "$LOG"
exit "$failed"
