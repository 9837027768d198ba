"""Hardware counters for the Hopper attention kernel (and SDPA-cuDNN) on chosen rows; run under ncu:

    bash scripts/attn_profile.sh [targets|bf16io|persistent]   (the wrapper: ncu options, sections, metrics)

targets: the D128 and D64 bf16 rows, ours then cuDNN. bf16io: bf16 then bf16io at D128 and D256, ours only (where
does the V conversion's time go). persistent: the persistent kernel's weakest rows, ours then cuDNN. Every kernel is
compiled and warmed outside the profiled range; inside it each row launches once, so ncu sees exactly those launches
(its replays restore memory between passes).
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


def main(which: str) -> None:
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
