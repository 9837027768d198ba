"""Every kernel variant once at small shapes with tails: the workload for compute-sanitizer."""

import torch

import xkernels
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, gemm_inputs

for recipe, rec in ATTENTION_RECIPES.items():
    for d in (64, 128, 256):
        for causal in (False, True):
            q, k, v = attention_inputs(1, 4, 130, 77, d, rec.io_dtype, "cuda", hkv=2, seed=d)
            xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, precision=recipe, return_lse=True)
for dtype in (torch.float16, torch.bfloat16):
    for lay in ("kn", "nk"):
        for walk in ("row", "grouped", "zorder"):
            a, b = gemm_inputs(130, 300, 72, dtype, "cuda", lay, seed=1)
            xkernels.matmul(a, b, b_layout=lay, walk=walk)
torch.cuda.synchronize()
print("small shapes ran:", xkernels.last_backend())
