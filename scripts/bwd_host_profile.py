"""Where a backward call's host time goes: host time per `torch.autograd.grad` call through `xkernels.attention` on
a small problem (device time well under the host's) on the plan's direct path and on its general path
(`backward._general`, what every call took before the plan), SDPA's backends' in the same process, then cProfile of
the direct path: the top functions by cumulative and by own time.

    python3 scripts/bwd_host_profile.py [--calls 200]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import xkernels
from xkernels import backward, plans
from xkernels.testing import attention_inputs


def host_us(step, calls: int) -> float:
    """Host time per call over `calls` back-to-back calls (no sync inside; the device keeps up on this problem)."""
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host


def set_direct(on: bool) -> None:
    for plan in plans._PLANS.values():
        if isinstance(plan, backward.BackwardPlan):
            plan.direct = on


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    q, k, v = (t.requires_grad_() for t in attention_inputs(1, 4, 256, 256, 128, torch.bfloat16, "cuda", seed=0))
    o = xkernels.attention(q, k, v, is_causal=True)
    do = torch.randn_like(o)

    def step():
        return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

    for path in ("direct", "general"):
        set_direct(path == "direct")
        print(f"backward host time per call: {host_us(step, args.calls):.1f} us ({xkernels.last_backend()}), "
              f"{path} path", flush=True)
    set_direct(True)
    for name, sdpa_backend in (("cudnn", torch.nn.attention.SDPBackend.CUDNN_ATTENTION),
                               ("flash", torch.nn.attention.SDPBackend.FLASH_ATTENTION)):
        qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
        with torch.nn.attention.sdpa_kernel(sdpa_backend):
            os_ = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

        def sdpa_step(os_=os_, inputs=(qs, ks, vs)):
            return torch.autograd.grad(os_, inputs, do, retain_graph=True)

        print(f"SDPA-{name} backward host time per call: {host_us(sdpa_step, args.calls):.1f} us", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        step()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
