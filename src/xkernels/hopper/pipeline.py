"""Split-barrier ring of shared-memory stages: the seeds' arrive -> independent work -> wait, on Hopper mbarriers.

A `Ring` travels as one object (a Gluon aggregate): its stage buffers, a `ready` barrier per stage (the producer's
TMA, or the producer's own arrive, says the stage holds data) and an `empty` barrier per stage (every consumer
partition arrives once it is done reading). A running iteration counter gives the stage index and the phase to wait
for; the producer's first lap waits on the opposite phase, so it passes at once. Every arrive has exactly one
matching wait per lap (the seeds' double-arrive rule).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from triton.language.core import _aggregate as aggregate

from xkernels.hopper import tma

# A barrier of the calling partition's warps (bar.sync over its threads): Triton 3.7 renamed Gluon's
# `thread_barrier` to `barrier`; both take no argument here.
partition_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def allocate_barriers(STAGES: gl.constexpr, COUNT: gl.constexpr):
    """STAGES mbarriers, each completing a phase after COUNT arrives."""
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=COUNT)
    return bars


@gluon.jit
def ring_slot(it, STAGES: gl.constexpr, MASK: gl.constexpr = False):
    """Stage `it % STAGES`. MASK (a power-of-two ring, `it` >= 0): `it & (STAGES - 1)`, which LLVM cannot rewrite as
    `it - STAGES * (it / STAGES)` and so cannot strength-reduce into one `it * stride` induction variable per derived
    shared-memory address (each a loop-carried register: the FUSED_DQ backward consumer spilled them)."""
    if MASK:
        gl.static_assert((STAGES & (STAGES - 1)) == 0, "MASK takes a power-of-two ring")
        return it & (STAGES - 1)
    else:
        return it % STAGES


@aggregate
class Ring:
    bufs: gl.shared_memory_descriptor  # [STAGES, ...] tiles
    ready: gl.shared_memory_descriptor  # [STAGES, 1]: the stage holds data (producer -> consumers)
    empty: gl.shared_memory_descriptor  # [STAGES, 1]: every consumer is done with the stage (consumers -> producer)

    @constexpr_function
    def __init__(self, bufs, ready, empty):
        self.bufs = bufs
        self.ready = ready
        self.empty = empty

    @gluon.jit
    def acquire(self, it, MASK: gl.constexpr = False):
        """Producer: wait until stage `it % STAGES` was released by every consumer; return its index."""
        STAGES: gl.constexpr = self.bufs.shape[0]
        s = ring_slot(it, STAGES, MASK)
        mbarrier.wait(self.empty.index(s), ((it // STAGES) & 1) ^ 1)
        return s

    @gluon.jit
    def load(self, desc, coord, it):
        """Producer: acquire stage `it % STAGES`, then TMA `desc`'s box at `coord` into it, landing on its ready
        barrier; return the stage's index."""
        s = self.acquire(it)
        mbarrier.expect(self.ready.index(s), desc.block_type.nbytes)
        tma.async_load(desc, coord, self.ready.index(s), self.bufs.index(s))
        return s

    @gluon.jit
    def wait(self, it, MASK: gl.constexpr = False):
        """Consumer: wait until stage `it % STAGES` is ready; return its index."""
        STAGES: gl.constexpr = self.bufs.shape[0]
        s = ring_slot(it, STAGES, MASK)
        mbarrier.wait(self.ready.index(s), (it // STAGES) & 1)
        return s

    @gluon.jit
    def release(self, it, pred=True, MASK: gl.constexpr = False):
        """Consumer: hand stage `it % STAGES` back to the producer (arrive on its empty barrier)."""
        STAGES: gl.constexpr = self.bufs.shape[0]
        mbarrier.arrive(self.empty.index(ring_slot(it, STAGES, MASK)), pred=pred)
