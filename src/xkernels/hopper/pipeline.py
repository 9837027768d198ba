"""Split-barrier ring of shared-memory stages: the seeds' arrive -> independent work -> wait, on Hopper mbarriers.

Each stage has a "full" barrier (the producer's TMA arrives on it with the stage's byte count) and an "empty" barrier
(the consumer arrives when the tensor cores are done reading the stage). A running iteration counter gives the stage
index and the phase to wait for; the producer's first lap waits on the opposite phase, so it passes at once. Every
arrive has exactly one matching wait per lap (the seeds' double-arrive rule).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def allocate_ring(STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 1):
    """(full, empty) barrier arrays of STAGES entries: full expects the producer's one arrive per lap, empty one arrive
    from each of CONSUMERS partitions (a stage is free only when every consumer is done with it)."""
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(empty.index(s), count=CONSUMERS)
    return full, empty


@gluon.jit
def producer_acquire(empty, it, STAGES: gl.constexpr):
    """Wait until stage `it % STAGES` was released by the consumer; return its index."""
    s = it % STAGES
    mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
    return s


@gluon.jit
def consumer_wait(full, it, STAGES: gl.constexpr):
    """Wait until the producer's copies into stage `it % STAGES` have landed; return its index."""
    s = it % STAGES
    mbarrier.wait(full.index(s), (it // STAGES) & 1)
    return s


@gluon.jit
def consumer_release(empty, it, STAGES: gl.constexpr, pred=True):
    """Hand stage `it % STAGES` back to the producer (arrive on its empty barrier)."""
    mbarrier.arrive(empty.index(it % STAGES), pred=pred)
