"""Is racecheck's report on the Hopper GEMM about our pipeline or about Gluon's warp_specialize runtime?

The smallest warp-specialized Gluon kernel: one mbarrier, the worker warp arrives, the default partition waits, no
shared-memory data at all. Run it under `compute-sanitizer --tool racecheck`: any hazard it reports lies in the
partition hand-off code triton generates, not in a kernel's own ring buffers or epilogue.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def _wait(bar, out):
    mbarrier.wait(bar, 0)
    gl.store(out + gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0])), 1.0)


@gluon.jit
def _arrive(bar):
    mbarrier.arrive(bar)


@gluon.jit
def ws_minimal(out):
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    gl.warp_specialize([(_wait, (bar.index(0), out)), (_arrive, (bar.index(0),))], [1], [24])


if __name__ == "__main__":
    out = torch.zeros(128, device="cuda")
    ws_minimal[(4,)](out, num_warps=4)
    torch.cuda.synchronize()
    print("ws_minimal ran:", bool((out == 1).all()))
