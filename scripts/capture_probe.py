"""The first CUDA-graph capture in a process of a backward whose forward ran eagerly: the packed backward (default
kernels, then the portable ones) and, for comparison, the dense one. Prints each capture's outcome; run it in fresh
processes under different settings (CUDA_MODULE_LOADING, XKERNELS_DIRECT_LAUNCH) to find what the first capture
trips on.

    python scripts/capture_probe.py [varlen|varlen-portable|dense|torch|fwdbwd]
"""

from __future__ import annotations

import sys
import traceback

import torch

import xkernels
from xkernels.bench.timing import capture
from xkernels.testing.inputs import uniform


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "varlen"
    g = torch.Generator(device="cuda").manual_seed(0)
    if which == "fwdbwd":  # forward and backward in one capture (make_graphed_callables' pattern), packed
        return fwd_bwd(g)
    if which == "torch":  # no xkernels op: a matmul's backward
        q, k, v, do = (uniform((512, 512), torch.bfloat16, "cuda", g) for _ in range(4))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = (leaves[0] @ leaves[1]) @ leaves[2]
    elif which == "dense":
        q, k, v, do = (uniform((2, 8, 512, 128), torch.bfloat16, "cuda", g) for _ in range(4))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = xkernels.attention(*leaves, is_causal=True)
    else:
        lens = [100, 257, 31]
        cu = torch.tensor([0, 100, 357, 388], dtype=torch.int32, device="cuda")
        q, k, v, do = (uniform((sum(lens), 8, 128), torch.bfloat16, "cuda", g) for _ in range(4))
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = xkernels.attention_varlen(*leaves, cu, cu, 257, 257, is_causal=True,
                                      backend="portable" if which == "varlen-portable" else "auto")
    want = torch.autograd.grad(o, leaves, do, retain_graph=True)
    print(which, "eager backward:", xkernels.last_backend(), flush=True)
    _try(which, lambda: torch.autograd.grad(o, leaves, do, retain_graph=True), want)


def _try(name: str, step, want) -> None:
    """Capture `step` (after its warm-up), replay it, and print whether that worked and matched `want`."""
    try:
        graph, got = capture(step)
        graph.replay()
        torch.cuda.synchronize()
        print(name, "capture OK, bitwise equal:", all(torch.equal(a, b) for a, b in zip(got, want, strict=True)))
    except Exception:
        print(name, "capture FAILED:", traceback.format_exc()[-1200:])


def fwd_bwd(g) -> None:
    cu = torch.tensor([0, 100, 357, 388], dtype=torch.int32, device="cuda")
    q, k, v, do = (uniform((388, 8, 128), torch.bfloat16, "cuda", g) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def step():
        o = xkernels.attention_varlen(*leaves, cu, cu, 257, 257, is_causal=True)
        return torch.autograd.grad(o, leaves, do)

    _try("fwdbwd", step, step())


if __name__ == "__main__":
    main()
