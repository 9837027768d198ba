"""Hardware counters for the Hopper attention kernel (and SDPA-cuDNN) on chosen rows; run under ncu:

    bash scripts/attn_profile.sh [targets|bf16io|persistent]   (the wrapper: ncu options, sections, metrics)

targets: the D128 and D64 bf16 rows, ours then cuDNN. bf16io: bf16 then bf16io at D128 and D256, ours only (where
does the V conversion's time go). persistent: the persistent kernel's weakest rows, ours then cuDNN. bwd: the
backward at B1 H32 8K D128 bf16, dQ fused into the dK/dV kernel, then the shipped dK/dV and dQ kernels, then
cuDNN's (`bwd_main`). walk: the persistent forward on the L2-chunk walk (`walk=0`), then the head-major walk (the
default), then cuDNN (`walk_main`), on B32 H32 512 causal D128, B16 H32 1K D256 full, and the rows where walk 0
measured ahead: B8 H32/8 2K causal D128 (GQA) and B32 H32 512 causal D64: DRAM bytes and the L2 hit rate say
whether a head's K/V is read from DRAM more than once. flat: the chained consumer (`flat=0`), the one-loop consumer
(`flat=1`), then cuDNN on B32 H32 512 causal D128 and D64 (how much instruction-fetch stall the one loop leaves).
d256: the persistent D256 config, then cuDNN, on B32 H32 512 causal and B4 H32 4K causal.
Every kernel is compiled and warmed outside the profiled range; inside it each row launches once, so ncu sees
exactly those launches (its replays restore memory between passes).
"""

from __future__ import annotations

import sys

import torch

import xkernels
from xkernels.bench.peers import _sdpa_peer
from xkernels.testing.cases import AttentionCase

SETS = {
    "targets": ([AttentionCase(1, 32, 32, 8192, 8192, 128, False, "bf16"),
                 AttentionCase(4, 32, 32, 4096, 4096, 64, False, "bf16")], True),
    "bf16io": ([AttentionCase(1, 32, 32, 8192, 8192, 128, False, r) for r in ("bf16", "bf16io")]
               + [AttentionCase(1, 16, 16, 8192, 8192, 256, False, r) for r in ("bf16", "bf16io")], False),
    # the persistent kernel's weakest sweep rows (run 35, 16K tokens per call): D128 full MHA and D64 causal at 2K
    "persistent": ([AttentionCase(8, 32, 32, 2048, 2048, 128, False, "bf16"),
                    AttentionCase(8, 32, 32, 2048, 2048, 64, True, "bf16")], True),
}


def bwd_main() -> None:
    """The backward's kernels, each launched once inside the profiled range (compiled and warmed outside it)."""
    import dataclasses

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from xkernels import backward, select
    from xkernels.testing import attention_inputs

    q, k, v = attention_inputs(1, 32, 8192, 8192, 128, torch.bfloat16, "cuda", seed=0)
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    o, lse = xkernels.attention(q, k, v, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, None, enable_gqa=False, precision="auto",
                                                  backend="auto")
    split = dataclasses.replace(choice.config, concurrent_dq=False)
    fused = dataclasses.replace(split, dkdv=dataclasses.replace(split.dkdv, fused_dq=1), dq=None)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(*leaves)

    def run_all():
        for cfg in (fused, split):
            backward._hopper(q, k, v, o, lse, do, *grads, None, is_causal=False, scale=128 ** -0.5, cfg=cfg)
        torch.autograd.grad(out, leaves, do, retain_graph=True)

    run_all()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run_all()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def walk_main(rows=None, backends=("hopper:persistent=2,walk=0", "hopper:persistent=2,walk=1")) -> None:
    """The persistent forward on both tile walks (or `backends`), then cuDNN, each launched once inside the profiled
    range."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from xkernels.testing import attention_inputs

    launches = []
    rows = rows or ((32, 512, 128, True, 32), (16, 1024, 256, False, 32), (8, 2048, 128, True, 8),
                    (32, 512, 64, True, 32))
    for b, s, d, causal, hkv in rows:
        q, k, v = attention_inputs(b, 32, s, s, d, torch.bfloat16, "cuda", hkv=hkv, seed=0)
        gqa = hkv != 32
        for backend in backends:
            launches.append(lambda q=q, k=k, v=v, c=causal, be=backend, g=gqa: xkernels.attention(
                q, k, v, is_causal=c, backend=be, enable_gqa=g))
            launches[-1]()
            print(b, s, d, causal, xkernels.last_backend(), flush=True)

        def cudnn(q=q, k=k, v=v, c=causal, g=gqa):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=c, enable_gqa=g)

        cudnn()
        launches.append(cudnn)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fn in launches:
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main(which: str) -> None:
    if which == "flat":  # the chained and the one-loop consumer on the short causal rows
        walk_main(((32, 512, 128, True, 32), (32, 512, 64, True, 32)),
                  ("hopper:persistent=2,walk=1,flat=0", "hopper:persistent=2,walk=1,flat=1"))
        return
    if which == "d256":  # D256's persistent config (not chained, O through the Q slot) where it trails cuDNN
        walk_main(((32, 512, 256, True, 32), (4, 4096, 256, True, 32)), ("hopper:persistent=2,walk=1",))
        return
    if which in ("bwd", "walk"):
        {"bwd": bwd_main, "walk": walk_main}[which]()
        return
    cases, with_cudnn = SETS[which]
    launches = []
    for case in cases:
        inputs = case.inputs("cuda", seed=0)
        peer = _sdpa_peer("cuDNN", "CUDNN_ATTENTION", case) if with_cudnn else None
        case.run(inputs)
        print(case.shape, case.recipe, xkernels.last_backend(), flush=True)
        if peer:
            with peer.context():
                peer.fn(inputs)
        launches.append((case, inputs, peer))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for case, inputs, peer in launches:
        case.run(inputs)
        if peer:
            with peer.context():
                peer.fn(inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "targets")
