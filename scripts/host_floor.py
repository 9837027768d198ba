"""Where a call's host time goes: each layer of `xkernels.matmul` / `xkernels.attention` timed on its own, next to
torch's calls, in one process (us per call, no synchronization, median of 7 runs of 2000 calls after warm-up).

    python3 scripts/host_floor.py [--json out.json]

Then the same layers for a few-row GEMM (1 x 4096 x 4096, B as [N, K]: a decode-time linear layer, the split-K
few-row kernel with its per-stream scratch), whose device time (~11 us) is under its host time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import xkernels
from xkernels import ops, plans
from xkernels.common import scratch
from xkernels.testing import attention_inputs, gemm_inputs

CALLS = 2000

# ops declared like xkernels::matmul, to split the dispatcher's cost from ours: a kernel that only allocates, one
# registered like ours (CPU, CUDA and XPU kernels plus a fake), and one whose kernel runs a cached plan directly
_lib = torch.library.Library("xkernels_floor", "DEF")
_SCHEMA = "(Tensor a, Tensor b, str s, str t, ScalarType? d, str u) -> Tensor"
for _name in ("noop", "noop_like_ours", "plan_only"):
    _lib.define(_name + _SCHEMA)
_lib.impl("noop", lambda a, b, s, t, d, u: torch.empty((256, 256), dtype=a.dtype, device=a.device), "CUDA")
for _key in ("CPU", "CUDA", "XPU"):
    _lib.impl("noop_like_ours", lambda a, b, s, t, d, u: torch.empty((256, 256), dtype=a.dtype, device=a.device), _key)
torch.library.register_fake("xkernels_floor::noop_like_ours", lambda a, b, s, t, d, u: a.new_empty((256, 256)),
                            lib=_lib)
noop = torch.ops.xkernels_floor.noop.default
noop_like_ours = torch.ops.xkernels_floor.noop_like_ours.default
plan_only = torch.ops.xkernels_floor.plan_only.default


def per_call(fn) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(7):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        runs.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    # small problems: a few us of device time each, so no row waits on the GPU's queue
    a, b = gemm_inputs(256, 256, 256, torch.bfloat16, "cuda", seed=0)
    q, k, v = attention_inputs(1, 2, 128, 128, 64, torch.bfloat16, "cuda", seed=0)
    xkernels.matmul(a, b)
    xkernels.attention(q, k, v, is_causal=True)
    mm_plan = next(p for p in plans._PLANS.values() if isinstance(p, plans.MatmulPlan))
    _lib.impl("plan_only", lambda a, b, s, t, d, u: mm_plan.run(a, b, None), "CUDA")
    at_plan = next(p for p in plans._PLANS.values() if isinstance(p, plans.AttentionPlan))
    out = torch.empty(256, 256, dtype=torch.bfloat16, device="cuda")
    rows = {
        "torch.empty (256^2 bf16)": lambda: torch.empty((256, 256), dtype=torch.bfloat16, device="cuda"),
        "torch.matmul 256^3": lambda: torch.matmul(a, b),
        "SDPA B1 H2 128 D64 causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "library op, Python kernel returning torch.empty": lambda: noop(a, b, "kn", "auto", None, "auto"),
        "  same, registered like ours (3 keys + fake)": lambda: noop_like_ours(a, b, "kn", "auto", None, "auto"),
        "  same, kernel = the cached matmul plan's run": lambda: plan_only(a, b, "kn", "auto", None, "auto"),
        "matmul: plan.run with out given (launch path only)": lambda: mm_plan.run(a, b, out),
        "matmul: plan.run (allocates out)": lambda: mm_plan.run(a, b, None),
        "matmul: plans.matmul (key + lookup + run)": lambda: plans.matmul(a, b, None, b_layout="kn", walk="auto",
                                                                          out_dtype=None, backend="auto"),
        "matmul: the op": lambda: ops.matmul_op(a, b, "kn", "auto", None, "auto"),
        "matmul: xkernels.matmul": lambda: xkernels.matmul(a, b),
        "attention: plan.run": lambda: at_plan.run(q, k, v, None, None),
        "attention: the op": lambda: ops.attention_op(q, k, v, True, None, False, "auto", "auto"),
        "attention: xkernels.attention": lambda: xkernels.attention(q, k, v, is_causal=True),
    }
    # the few-row GEMM (device ~11 us: host-bound back to back)
    sa, sb = gemm_inputs(1, 4096, 4096, torch.bfloat16, "cuda", "nk", seed=1)
    xkernels.matmul(sa, sb, b_layout="nk")
    sk_plan = next(p for p in plans._PLANS.values() if isinstance(p, plans.MatmulPlan) and p.skinny)
    sk_out = torch.empty(1, 4096, dtype=torch.bfloat16, device="cuda")
    rows.update({
        "torch.matmul 1x4096x4096 (B^T view)": lambda: torch.matmul(sa, sb.t()),
        "F.linear 1x4096x4096": lambda: F.linear(sa, sb),
        "skinny: scratch.split_k (kept set lookup)": lambda: scratch.split_k(sa.device, sk_plan.counters,
                                                                           sk_plan.partial_words),
        "skinny: plan.run with out given": lambda: sk_plan.run(sa, sb, sk_out),
        "skinny: plan.run (allocates out)": lambda: sk_plan.run(sa, sb, None),
        "skinny: plans.matmul": lambda: plans.matmul(sa, sb, None, b_layout="nk", walk="auto", out_dtype=None,
                                                     backend="auto"),
        "skinny: the op": lambda: ops.matmul_op(sa, sb, "nk", "auto", None, "auto"),
        "skinny: xkernels.matmul": lambda: xkernels.matmul(sa, sb, b_layout="nk"),
    })
    result = {}
    for name, fn in rows.items():
        result[name] = round(per_call(fn), 2)
        print(f"{result[name]:8.2f} us  {name}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "us_per_call": result}, f, indent=1)


if __name__ == "__main__":
    main()
