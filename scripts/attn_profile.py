"""Hardware counters for the Hopper attention kernel and SDPA-cuDNN on the same rows (run under ncu):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --metrics ... \
        python3 scripts/attn_profile.py

Compiles and warms every kernel outside the profiled range, then launches ours and cuDNN once per row inside it, so
ncu sees exactly those launches (its replays restore memory between passes). scripts/attn_profile.sh is the wrapper.
"""

from __future__ import annotations

import torch

import xkernels
from xkernels.bench.peers import _sdpa_peer
from xkernels.testing.cases import AttentionCase

ROWS = [AttentionCase(1, 32, 32, 8192, 8192, 128, False, "bf16"),
        AttentionCase(4, 32, 32, 4096, 4096, 64, False, "bf16")]


def main() -> None:
    launches = []
    for case in ROWS:
        inputs = case.inputs("cuda", seed=0)
        peer = _sdpa_peer("cuDNN", "CUDNN_ATTENTION", case)
        with peer.context():
            launches.append((case, inputs, peer))
            case.run(inputs)
            peer.fn(inputs)
            print(case.shape, xkernels.last_backend(), flush=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for case, inputs, peer in launches:
        case.run(inputs)
        with peer.context():
            peer.fn(inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
