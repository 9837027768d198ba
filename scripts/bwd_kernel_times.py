"""Where the Hopper backward's device time goes, per kernel, against SDPA-cuDNN's backward kernels on the backward
anchor rows: torch.profiler's CUDA kernel times over `--iters` backwards run one kernel after another (the dQ kernel
after dK/dV, not beside it, so each kernel's time is its own), with the tensor-core rate each kernel reaches on the
matmuls it does (dK/dV: S^T, dP^T, dV, dK, four of 2 * S^2 * D each, halved when causal; dQ: S, dP, dQ, three);
the variant with dQ fused into the dK/dV kernel too.

    python scripts/bwd_kernel_times.py --json bwd_kernel_times.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels import backward, select
from xkernels.bench.suites import BWD_ROWS
from xkernels.testing import attention_inputs


def kernel_times(fn, iters: int) -> dict[str, float]:
    """Mean device microseconds per call of each CUDA kernel fn launches."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name[:90]] += e.device_time / iters
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--fused", type=int, default=1, help="the fused variant's wgmma order (`fused_dq`: 1 or 2)")
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "rows": []}
    for b, h, s, d, causal in BWD_ROWS:
        res["rows"].append(row_times(b, h, s, d, causal, args.iters, args.fused))
        print(json.dumps(res["rows"][-1], indent=1), flush=True)
        json.dump(res, open(args.json, "w"), indent=1)
        torch.cuda.empty_cache()


def row_times(b: int, h: int, s: int, d: int, causal: bool, iters: int, fused_order: int = 1) -> dict:
    q, k, v = attention_inputs(b, h, s, s, d, torch.bfloat16, "cuda", seed=0)
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    o, lse = xkernels.attention(q, k, v, is_causal=causal, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, None, enable_gqa=False, precision="auto",
                                                  backend="auto")
    cfg = dataclasses.replace(choice.config, concurrent_dq=False)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    ours = kernel_times(lambda: backward._hopper(q, k, v, o, lse, do, *grads, None, is_causal=causal,
                                                 scale=d ** -0.5, cfg=cfg), iters)
    fused = {}
    if not cfg.dkdv.split_d:  # dQ fused into dK/dV (five matmuls in one kernel, dQ reduced into fp32)
        fcfg = dataclasses.replace(cfg, dkdv=dataclasses.replace(cfg.dkdv, fused_dq=fused_order), dq=None)
        fused = kernel_times(lambda: backward._hopper(q, k, v, o, lse, do, *grads, None, is_causal=causal,
                                                      scale=d ** -0.5, cfg=fcfg), iters)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        cudnn = kernel_times(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True), iters)
    gemm = 2 * s * s * d * b * h / (2 if causal else 1)  # one of the backward's matmuls
    rates = {}
    for name, us in ours.items():
        n = 4 if "dkdv" in name else 3 if "dq_kernel" in name else 0
        if n:
            rates[name] = n * gemm / us / 1e6
    return {"shape": f"B{b} H{h} {s} D{d}{' causal' if causal else ''}", "config": str(cfg), "ours_us": ours,
            "ours_total_us": sum(ours.values()), "tflops_per_kernel": rates, "fused_dq_us": fused,
            "fused_dq_total_us": sum(fused.values()), "cudnn_us": cudnn,
            "cudnn_total_us": sum(cudnn.values()), "cudnn_tflops_5_matmuls": 5 * gemm / sum(cudnn.values()) / 1e6}


if __name__ == "__main__":
    main()
