"""Every mbarrier the Hopper kernels use: what it guards, who arrives, who waits. Kernels allocate them here only.

Attention forward (`attention_fwd.py`), per CTA; "arrive" -> "wait": what the wait guarantees.
  q_ready      producer's TMA (every consumer's Q bytes) -> each consumer, once: its Q rows have landed.
  k.ready[s]   producer's TMA (K tile bytes) -> each consumer, per key tile: K tile s has landed.
  k.empty[s]   each of NUM_WG consumers, once its QK^T wgmma retired -> producer, before refilling stage s:
               nobody still reads K tile s.
  v_landed[s]  producer's TMA (V tile bytes) -> the bf16io producer, before converting: V tile s has landed.
  v.ready[s]   the producer after converting V in place (bf16io; else this is v_landed) -> each consumer, before
               P.V: V tile s holds the P.V operand dtype.
  v.empty[s]   each of NUM_WG consumers, once its P.V wgmma retired -> producer, before refilling stage s:
               nobody still reads V tile s.
K and V have separate rings so a K stage frees once the QK^T wgmmas retire, while P.V of that tile still reads V.
The persistent forward (`attention_persistent.py`) runs the K/V rings across tiles (counters never reset) and has
one or two Q slots (two when tiles are chained: the next tile's Q must be resident before this tile's last P.V), each
with its own pair; tile n of a program uses slot n % slots:
  q_ready[s]   producer's TMA (every consumer's Q bytes of the tile) -> each consumer, once per tile in slot s.
  q_free[s]    each of NUM_WG consumers, once the last QK^T of its tile in slot s retired (o_store 2: once its O
               store through the slot has read it) -> producer, before loading a later tile's Q into slot s: nobody
               reads it any more.
  o_left[w]    o_store 3 (O through the V ring, 64-key tiles: warpgroup w's O in V stage w): consumer w, once its O
               store has read the stage (it waited on v.empty[w] for both warpgroups' last P.V there first) ->
               producer, before the next tile's first V load: no V lands on an O still leaving. One completion per
               tile, waited once per tile, so its parity never skips a lap.
The persistent varlen forward (`attention_varlen_persistent.py`) has the same Q slots, plus:
  v_zeroed[n % 4]  consumer 0, after zeroing the rows of tile n's last V tile that lie past its sequence (every
               tile arrives, tail or not) -> consumer 1, before its last P.V of tile n: no store into the tile races
               its read (4 slots: `tail_zeroed_barriers`).

Attention backward, dQ (`attention_dq.py`), per CTA: the forward's set, without the conversion.
  q_ready      producer's TMA (Q and dO bytes of both consumers) -> each consumer, once.
  k.ready[s], v.ready[s]  producer's TMA -> each consumer, per key tile.
  v.empty[s]   each of the 2 consumers, once its dP = dO V^T wgmma retired -> producer.
  k.empty[s]   each of the 2 consumers, once its dQ += dS K wgmma retired (K is read twice: S and dQ) -> producer.

Attention backward, dK/dV (`attention_bwd.py`), per CTA:
  kv_ready     producer's TMA (K and V tile bytes) -> each consumer, once: its keys and values have landed.
  qdo.ready[s] producer's TMA (Q and dO tile bytes) plus the producer's arrive after writing the block's LSE and delta
               rows into shared memory (count 2 with the expect) -> each consumer, per query block: stage s holds
               Q, dO, LSE and delta.
  qdo.empty[s] each of the 2 consumers, once its dV and dK wgmmas retired -> producer, before refilling stage s.
  With FUSED_DQ, a `ds` ring of [128 keys, BLOCK_M] dS^T tiles (a stage per Q/dO stage) that both consumers fill
  and read:
  ds.ready[s]  each of the 2 consumers after storing its 64 rows of dS^T (+ fence) -> each consumer, before its dQ
               wgmma: both halves of the tile are in shared memory.
  ds.empty[s]  = qdo.empty[s] (one dS^T stage per Q/dO stage, released together): each of the 2 consumers, once
               its dK and dQ wgmmas (the readers of the tile) retired -> each consumer, before writing its rows of
               stage s a lap later (and the producer, as above). A waiter cannot miss the phase: it waits for the
               release of the step a lap back, and the next phase needs its own release of the current step.
  and per consumer w, 2 slots of its fp32 dQ partial [BLOCK_M, D / 2] (step i in slot i % 2; FUSED_DQ = 3: the
  whole [BLOCK_M, D] partial of the steps i with i % 2 == w, entry i // 2 in slot (i // 2) % 2):
  dq_w.ready[s] consumer w after storing its partial (+ fence) -> the dQ writer warp, before its TMA reduce-add.
  dq_w.empty[s] the writer, once that reduce has read the slot (`store_wait`) -> consumer w, before storing into
               slot s two entries later (two steps, or four with FUSED_DQ = 3). FUSED_DQ = 3's ds.ready[s] is
               waited on only by the consumer whose turn step s is.
  With SPLIT_D = 2 (D256: both consumers on the same 64 keys, each owning half of dK's and dV's columns), consumer 0
  computes S^T and consumer 1 dP^T, exchanged through a 2-slot `ScoreExchange` (step i in slot i % 2):
  x.dp_ready[s]  consumer 1 after storing dP^T (fp32) -> consumer 0, before dS^T = P^T (dP^T - delta).
  x.pds_ready[s] consumer 0 after storing P^T and dS^T (+ fence) -> consumer 1, before its dV and dK wgmmas.
  x.free[s]    each of the 2 consumers, once its dV and dK wgmmas (the readers of P^T and dS^T) retired; consumer 0
               has read dP^T before it arrives -> both consumers, before writing slot s two steps later.

GEMM (`gemm.py`), per CTA: one ring of A+B stages.
  ready[s]     loader's TMA (A and B tile bytes) -> MMA partition, per k-step: stage s's tiles have landed.
  empty[s]     MMA partition, once the wgmma reading stage s retired -> loader, before refilling stage s. With the
               rows split over ROW_WGS partitions (each its own A box of the stage, all the same B box), each of
               them arrives: the stage is free once every wgmma reading it retired.
  With two consumer partitions (ping-pong), each waits and releases the stages of its own work units only, so
  every stage still has one arrive per lap: a consumer counts the other's k-steps to know its ring positions.
  turns[c]     the other consumer, once its ring waits for a unit have passed -> consumer c, before its first ring
               wait of the next unit: the loader has filled every stage up to that unit, so c's waits are within one
               lap of the fill (a wait tells laps apart by parity only).
  With split-K, across CTAs (global memory, not an mbarrier): an arrival counter per output tile, one acq_rel add
  per split after its partial is stored; the split that reads SPLIT_K - 1 sums the partials and resets it to 0.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import constexpr_function
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from triton.language.core import _aggregate as aggregate

from xkernels.hopper.pipeline import Ring, allocate_barriers


@gluon.jit
def attention_barriers(k_bufs, v_bufs, CONVERT_V: gl.constexpr, NUM_WG: gl.constexpr):
    """(q_ready, k ring, v ring, v_landed) over the K and V stage buffers, as in the table above."""
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    k, v, v_landed = kv_rings(k_bufs, v_bufs, CONVERT_V, NUM_WG)
    return q_ready, k, v, v_landed


@gluon.jit
def kv_rings(k_bufs, v_bufs, CONVERT_V: gl.constexpr, NUM_WG: gl.constexpr):
    """(k ring, v ring, v_landed) of the attention forward, as in the table above."""
    STAGES: gl.constexpr = k_bufs.shape[0]
    k = Ring(k_bufs, allocate_barriers(STAGES, 1), allocate_barriers(STAGES, NUM_WG))
    v_landed = allocate_barriers(STAGES, 1)
    v_empty = allocate_barriers(STAGES, NUM_WG)
    if CONVERT_V:  # TMA lands on v_landed, the producer's conversion arrives on v.ready
        v = Ring(v_bufs, allocate_barriers(STAGES, 1), v_empty)
    else:
        v = Ring(v_bufs, v_landed, v_empty)
    return k, v, v_landed


@gluon.jit
def q_slot_barriers(Q_SLOTS: gl.constexpr, NUM_WG: gl.constexpr):
    """(q_ready, q_free) of the persistent forward, one of each per Q slot, as in the table above."""
    return allocate_barriers(Q_SLOTS, 1), allocate_barriers(Q_SLOTS, NUM_WG)


@gluon.jit
def o_store_barriers(NUM_WG: gl.constexpr):
    """o_left of the persistent forward with O through the V ring, one per consumer warpgroup, as in the table
    above."""
    return allocate_barriers(NUM_WG, 1)


@gluon.jit
def attention_dq_ring(dq_bufs):
    """One consumer's FUSED_DQ `dq` slots of the table above: one arrive completes each barrier."""
    STAGES: gl.constexpr = dq_bufs.shape[0]
    return Ring(dq_bufs, allocate_barriers(STAGES, 1), allocate_barriers(STAGES, 1))


@gluon.jit
def attention_ds_ring(ds_bufs, qdo):
    """The FUSED_DQ dS^T ring of the table above, one stage per Q/dO stage: `ready` counts the two consumers; its
    `empty` barriers are the Q/dO ring's, which the consumers arrive on once dK and dQ (dS^T's readers) retired."""
    STAGES: gl.constexpr = ds_bufs.shape[0]
    gl.static_assert(STAGES == qdo.bufs.shape[0], "one dS^T stage per Q/dO stage")
    return Ring(ds_bufs, allocate_barriers(STAGES, 2), qdo.empty)


@aggregate
class ScoreExchange:
    """SPLIT_D = 2's exchange of the dK/dV kernel (table above): 2 slots of P^T, dS^T and dP^T, [64 keys, BLOCK_M]."""
    p: gl.shared_memory_descriptor  # P^T, the input dtype: consumer 0 -> both (dV's A operand)
    ds: gl.shared_memory_descriptor  # dS^T, the input dtype: consumer 0 -> both (dK's A operand)
    dp: gl.shared_memory_descriptor  # dP^T, fp32: consumer 1 -> consumer 0
    dp_ready: gl.shared_memory_descriptor
    pds_ready: gl.shared_memory_descriptor
    free: gl.shared_memory_descriptor

    @constexpr_function
    def __init__(self, p, ds, dp, dp_ready, pds_ready, free):
        self.p = p
        self.ds = ds
        self.dp = dp
        self.dp_ready = dp_ready
        self.pds_ready = pds_ready
        self.free = free


@gluon.jit
def score_exchange(p_bufs, ds_bufs, dp_bufs):
    """The ScoreExchange over its [2, 64, BLOCK_M] buffers, with its barriers as in the table above."""
    return ScoreExchange(p_bufs, ds_bufs, dp_bufs, allocate_barriers(2, 1), allocate_barriers(2, 1),
                         allocate_barriers(2, 2))


@gluon.jit
def tail_zeroed_barriers():
    """`v_zeroed` of the persistent varlen forward (table above): 4 slots, each completing on consumer 0's arrive.
    Consumer 0 arrives for tile n after it held Q(n), which the producer loaded only after consumer 1 released
    Q(n - 2), past its wait for tile n - 3: a slot's phase of tile n - 4 is always consumed before it is re-armed."""
    return allocate_barriers(4, 1)


@gluon.jit
def gemm_barriers(b_bufs, ROW_WGS: gl.constexpr):
    """The A+B ring of the table above over the B stages (one ready and one empty barrier per stage, shared by the
    stage's A boxes, which live beside it) and the two consumers' `turns` (unused with one)."""
    STAGES: gl.constexpr = b_bufs.shape[0]
    return Ring(b_bufs, allocate_barriers(STAGES, 1), allocate_barriers(STAGES, ROW_WGS)), allocate_barriers(2, 1)


@gluon.jit
def attention_bwd_barriers(q_bufs):
    """(kv_ready, the Q/dO ring over `q_bufs`; dO's stages share its barriers), as in the table above."""
    STAGES: gl.constexpr = q_bufs.shape[0]
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    return kv_ready, Ring(q_bufs, allocate_barriers(STAGES, 2), allocate_barriers(STAGES, 2))
