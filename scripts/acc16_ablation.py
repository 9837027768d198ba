"""The seeds' fp16-accumulate GEMM variant on the Hopper kernel: speed and accuracy against the fp32 accumulator and
cuBLAS, same inputs, same run (fp16 inputs; wgmma has no fp16 accumulator for bf16)."""

import json
import os

import torch

import xkernels
from xkernels.bench.timing import time_cuda
from xkernels.testing import compare_gemm, gemm_inputs, reference_matmul

rows = []
for n in (4096, 8192):
    a, b = gemm_inputs(n, n, n, torch.float16, "cuda", seed=n)
    ref = reference_matmul(a, b)
    cublas = time_cuda(lambda ab: ab[0] @ ab[1], [(a, b)], iters=100)
    for acc16 in (False, True):
        backend = f"hopper:acc_fp16={int(acc16)}"
        c = compare_gemm(xkernels.matmul(a, b, backend=backend), ref, n)
        t = time_cuda(lambda ab, be=backend: xkernels.matmul(*ab, backend=be), [(a, b)], iters=100)
        rows.append({"n": n, "acc": "fp16" if acc16 else "fp32", "tflops": t.tflops(2 * n**3),
                     "cublas_tflops": cublas.tflops(2 * n**3), "speedup_vs_cublas": cublas.median_ms / t.median_ms,
                     "rel_rms": c.rel_rms, "outliers": c.outliers, "passed_contract": c.passed})
        print(rows[-1], flush=True)
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "acc16_ablation.json"), "w") as f:
        json.dump(rows, f, indent=1)
