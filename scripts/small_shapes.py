"""Every kernel variant at small shapes with tails, each called twice (the first call builds the launch plan and
compiles, the second takes the cached plan's launch): the workload for compute-sanitizer, and with --check a smoke
test of both calls against the float64 references (exit 1 on any failure). The backward runs once per head dim,
recipe and mask, with GQA, tails and Sq != Skv, and on (B, S, H, D) views (one query row included)."""

import sys

import torch

import xkernels
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare_attention,
    compare_gemm,
    compare_grad,
    gemm_inputs,
    reference_attention,
    reference_attention_grads,
    reference_matmul,
)

check = "--check" in sys.argv
failures = []
for backend in ("auto", "portable"):
    for recipe, rec in ATTENTION_RECIPES.items():
        for d in (64, 128, 256):
            for causal in (False, True):
                q, k, v = attention_inputs(1, 4, 130, 77, d, rec.io_dtype, "cuda", hkv=2, seed=d)
                for _ in range(2):
                    o, _lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, precision=recipe,
                                                 return_lse=True, backend=backend)
                    if check:
                        c = compare_attention(o, reference_attention(q, k, v, is_causal=causal), rec)
                        if not c.passed:
                            failures.append(f"{xkernels.last_backend()} D{d} causal={causal}: {c.reason}")
                            print("FAIL", failures[-1], flush=True)
                if backend == "auto":  # the backward has one layer
                    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                    o = xkernels.attention(*leaves, is_causal=causal, enable_gqa=True, precision=recipe)
                    do = torch.rand_like(o) - 0.5
                    grads = torch.autograd.grad(o, leaves, do)
                    if check:
                        refs = reference_attention_grads(q, k, v, do, is_causal=causal)
                        for name, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True):
                            c = compare_grad(g, r, rec)
                            if not c.passed:
                                failures.append(f"backward {name} {recipe} D{d} causal={causal}: {c.reason}")
                                print("FAIL", failures[-1], flush=True)
    if backend == "auto":  # the backward on (B, S, H, D) views, read in place, and on one query row
        for d in (64, 128, 256):
            for sq, skv, causal in ((130, 77, False), (77, 77, True), (1, 77, False)):
                q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in
                           attention_inputs(2, 4, sq, skv, d, torch.bfloat16, "cuda", hkv=2, seed=d + sq))
                o = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True)
                do = (torch.rand(o.shape[0], o.shape[2], o.shape[1], d, device="cuda") - 0.5).bfloat16()
                do = do.transpose(1, 2)
                grads = torch.autograd.grad(o, (q, k, v), do)
                if check:
                    refs = reference_attention_grads(q.detach(), k.detach(), v.detach(), do, is_causal=causal)
                    for name, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True):
                        c = compare_grad(g, r, ATTENTION_RECIPES["bf16"])
                        if not c.passed:
                            failures.append(f"backward (B, S, H, D) {name} D{d} {sq}x{skv}: {c.reason}")
                            print("FAIL", failures[-1], flush=True)
    for dtype in (torch.float16, torch.bfloat16):
        for lay in ("kn", "nk"):
            for walk in ("row", "grouped", "zorder"):
                a, b = gemm_inputs(130, 300, 72, dtype, "cuda", lay, seed=1)
                for _ in range(2):
                    c = xkernels.matmul(a, b, b_layout=lay, walk=walk, backend=backend)
                    if check:
                        r = compare_gemm(c, reference_matmul(a, b, lay), 72)
                        if not r.passed:
                            failures.append(f"{xkernels.last_backend()}: {r.reason}")
                            print("FAIL", failures[-1], flush=True)
torch.cuda.synchronize()
print("small shapes ran:", xkernels.last_backend())
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
