"""Gradient accuracy of xkernels and SDPA's backends against float64 autograd, on the same inputs: the measurement the
backward bounds in `recipes.py` are set from. Prints and writes rel-RMS and worst-row error of dQ, dK, dV.

  python scripts/grad_accuracy.py --json out/grad_accuracy.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_grad, reference_attention_grads

ROWS = [(1, 8, 8192, 128, True, "bf16"), (1, 8, 8192, 128, False, "bf16"), (1, 8, 8192, 128, True, "fp16"),
        (2, 8, 4096, 64, True, "fp16"), (1, 4, 4096, 256, True, "bf16")]


def grads(fn, q, k, v, do):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    return torch.autograd.grad(fn(*leaves), leaves, do)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="grad_accuracy.json")
    args = p.parse_args()
    out = []
    for b, h, s, d, causal, recipe_name in ROWS:
        recipe = ATTENTION_RECIPES[recipe_name]
        q, k, v = attention_inputs(b, h, s, s, d, recipe.io_dtype, "cuda", seed=s + d)
        g = torch.Generator(device="cuda").manual_seed(1)
        do = (torch.rand(q.shape, generator=g, device="cuda") - 0.5).to(q.dtype)
        refs = reference_attention_grads(q, k, v, do, is_causal=causal)
        kernels = {"xkernels": lambda q, k, v, causal=causal: xkernels.attention(q, k, v, is_causal=causal)}
        for name, backend in (("SDPA-cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA-flash", SDPBackend.FLASH_ATTENTION)):
            def sdpa(q, k, v, backend=backend, causal=causal):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            kernels[name] = sdpa
        row = {"shape": f"B{b} H{h} {s} D{d}{' causal' if causal else ''}", "recipe": recipe_name, "kernels": {}}
        for name, fn in kernels.items():
            cs = [compare_grad(gr, ref, recipe) for gr, ref in zip(grads(fn, q, k, v, do), refs, strict=True)]
            row["kernels"][name] = {n: {"rel_rms": c.rel_rms, "worst_row_rel": c.worst_row_rel, "passed": c.passed}
                                    for n, c in zip(("dq", "dk", "dv"), cs, strict=True)}
        print(json.dumps(row), flush=True)
        out.append(row)
        del refs
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
