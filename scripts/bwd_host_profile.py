"""Where a backward call's host time goes: host time per `torch.autograd.grad` call through `xkernels.attention` on
a small problem (device time well under the host's) on the plan's direct path and on its general path
(`backward._general`, what every call took before the plan), SDPA's backends' in the same process, then cProfile of
the direct path: the top functions by cumulative and by own time. Then the packed (varlen) backward and forward
(`sync_checks=False`) on a small batch (the backward on its plan's direct and general paths), with their cu_seqlens
device check alone: the one-launch kernel
(`cu_seqlens.checked_on_device`) against the same checks as torch ops (what both took before), and cProfile of the
varlen backward.

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
        if isinstance(plan, backward.BackwardPlan | backward.VarlenBackwardPlan):
            plan.direct = on


def both_paths(what: str, o, leaves, do, calls: int):
    """Host time of the backward of `o` on its plans' direct and general paths; returns the timed step."""
    def step():
        return torch.autograd.grad(o, leaves, do, retain_graph=True)

    for path in ("direct", "general"):
        set_direct(path == "direct")
        print(f"{what} host time per call: {host_us(step, calls):.1f} us ({xkernels.last_backend()}), {path} path",
              flush=True)
    set_direct(True)
    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    q, k, v = (t.requires_grad_() for t in attention_inputs(1, 4, 256, 256, 128, torch.bfloat16, "cuda", seed=0))
    o = xkernels.attention(q, k, v, is_causal=True)
    do = torch.randn_like(o)

    step = both_paths("backward", o, (q, k, v), do, args.calls)
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
    varlen(args.calls)


def _torch_op_checks(cu_q, cu_k, total_q, total_k, max_q, max_k, fills):
    """The cu_seqlens checks as torch ops (the varlen host paths' before the one-launch kernel), for the A/B."""
    def bad(cu, total, max_seqlen):
        lengths = cu[1:] - cu[:-1]
        return (cu[0] != 0) | (cu[-1] != total) | (lengths < 0).any() | (lengths > max_seqlen).any()

    flag = bad(cu_q, total_q, max_q) | bad(cu_k, total_k, max_k)
    cu_q, cu_k = cu_q.masked_fill(flag, 0), cu_k.masked_fill(flag, 0)
    for t in fills:
        t.masked_fill_(flag, float("nan"))
    return cu_q, cu_k


def varlen(calls: int) -> None:
    from xkernels.portable.cu_seqlens import checked_on_device

    lens = [64, 128, 200, 100]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    total = sum(lens)
    q, k, v = (t.requires_grad_() for t in
               torch.randn(3, total, 4, 128, device="cuda", dtype=torch.bfloat16).unbind(0))
    o = xkernels.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), is_causal=True)
    do = torch.randn_like(o)

    step = both_paths("varlen backward", o, (q, k, v), do, calls)
    with torch.no_grad():
        def fwd():
            return xkernels.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), is_causal=True,
                                             sync_checks=False)

        print(f"varlen forward (sync_checks=False) host time per call: {host_us(fwd, calls):.1f} us "
              f"({xkernels.last_backend()})", flush=True)
        grads = [torch.empty_like(t) for t in (q, k, v)]
        for name, check in (("one launch", checked_on_device), ("torch ops", _torch_op_checks)):
            us = host_us(lambda check=check: check(cu, cu, total, total, max(lens), max(lens), grads), calls)
            print(f"cu_seqlens check with three outputs, {name}: {us:.1f} us per call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
