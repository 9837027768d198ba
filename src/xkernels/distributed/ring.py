"""Ring attention over torch.distributed: each rank keeps its query shard and passes its K/V shard around the ring.

Forward, W steps: at step t rank r holds the K/V shard of rank (r - t) mod W. It starts sending that shard on to
rank r + 1 (and receiving the next one from r - 1) with `batch_isend_irecv`, then attends its queries to the shard in
hand (`layout.ring_blocks`: which rows attend under the mask), and merges each partial (O, LSE) into fp32
accumulators through the LSEs (`portable.lse_merge`, one pass in place); the transfer runs under the attention.
Step 0 is the rank's own shard (the diagonal block under a causal mask), so every row has a partial after it.

Backward, W steps with the merged O and LSE saved: a block's gradients given the global O and LSE are the block's own
attention backward (P = exp(S - LSE), delta = rowsum(dO * O)), so each step calls `xkernels::attention_backward`
on the block in hand. dQ accumulates locally; dK and dV of a shard accumulate in fp32 and travel with it. The walk
runs the other way round so that each shard's accumulator ends at its owner with no hop after the last step: at
step t rank r holds shard (r + 1 + t) mod W, received from rank r + 1, and the last step is its own. Step 0's
shard, r + 1, is the one the forward ended on (saved with the inputs: one K/V shard more per call in memory), so
no transfer precedes the first backward; the K/V for step t + 1 and the accumulator of step t move to rank r - 1
under step t + 1's backward. With W = 2 no K/V moves in the backward at all, only one accumulator each way.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from xkernels import ops
from xkernels.distributed.layout import LAYOUTS, SEQ_DIM, Block, _check_layout, _world, ring_blocks
from xkernels.portable.lse_merge import merge_into
from xkernels.select import DEFAULT_BACKEND
from xkernels.validation import check_precision, check_scale, flag, forward_ad_level, no_tangent, tensor


class _Ring:
    """Point-to-point shifts around the group: send to rank + 1 and receive from rank - 1 (or, reversed, send to
    rank - 1 and receive from rank + 1); global ranks for P2POp."""

    def __init__(self, group: dist.ProcessGroup | None):
        self.group = group
        self.rank, self.world = _world(group)
        whole = group if group is not None else dist.group.WORLD
        self.next = dist.get_global_rank(whole, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(whole, (self.rank - 1) % self.world)

    def shift(self, tensors: list[torch.Tensor], *, reverse: bool = False) -> tuple[list[torch.Tensor], list]:
        """Start sending `tensors` on and receiving their successors; returns (receive buffers, requests)."""
        to, source = (self.prev, self.next) if reverse else (self.next, self.prev)
        received = [torch.empty_like(t) for t in tensors]
        p2p = [dist.P2POp(dist.isend, t, to, self.group) for t in tensors]
        p2p += [dist.P2POp(dist.irecv, r, source, self.group) for r in received]
        return received, dist.batch_isend_irecv(p2p)


def _wait(requests: list) -> None:
    for r in requests:
        r.wait()


def _rows(t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return t.narrow(SEQ_DIM, lo, hi - lo)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, scale, enable_gqa, precision, layout, backend):
        ring = _Ring(group)
        n = q.shape[SEQ_DIM]
        flags = (scale, enable_gqa, precision, backend)
        acc_out = torch.empty(q.shape, dtype=torch.float32, device=q.device)  # merge_into never reads unseen rows
        acc_lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        kv = [k, v]
        for t in range(ring.world):
            nxt, requests = ring.shift(kv) if t < ring.world - 1 else (None, [])
            source = (ring.rank - t) % ring.world
            for blk in ring_blocks(ring.rank, source, n, causal=causal, layout=layout):
                o, lse = ops.attention_lse_op(_rows(q, blk.q0, blk.q1), _rows(kv[0], blk.k0, blk.k1),
                                              _rows(kv[1], blk.k0, blk.k1), blk.causal, *flags)
                merge_into(_rows(acc_out, blk.q0, blk.q1), acc_lse[:, :, blk.q0:blk.q1], o, lse)
            _wait(requests)
            kv = nxt if nxt is not None else kv
        out = acc_out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, acc_lse, *kv)  # kv: shard r + 1's, where the backward starts
        ctx.ring, ctx.causal, ctx.flags, ctx.layout = ring, causal, flags, layout
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, *kv = ctx.saved_tensors
        ring, n = ctx.ring, q.shape[SEQ_DIM]
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        incoming: tuple[list[torch.Tensor] | None, list] = (None, [])
        for t in range(ring.world):
            # K/V of step t + 1's shard from rank r + 1; the last step's shard is this rank's own
            nxt, kv_requests = ring.shift(kv, reverse=True) if t < ring.world - 2 else (None, [])
            source = (ring.rank + 1 + t) % ring.world
            grads = [_block_grads(grad_out, q, kv, out, lse, blk, ctx.flags)
                     for blk in ring_blocks(ring.rank, source, n, causal=ctx.causal, layout=ctx.layout)]
            if t == 0:  # this shard's accumulator starts here
                dkv = [torch.zeros(k.shape, dtype=torch.float32, device=k.device),
                       torch.zeros(v.shape, dtype=torch.float32, device=v.device)]
            else:  # the accumulator of the shard in hand, from rank r + 1, which held the shard last step
                _wait(incoming[1])
                dkv = incoming[0]
            for blk, (dq_b, dk_b, dv_b) in grads:
                _rows(dq, blk.q0, blk.q1).add_(dq_b)
                _rows(dkv[0], blk.k0, blk.k1).add_(dk_b)
                _rows(dkv[1], blk.k0, blk.k1).add_(dv_b)
            if t < ring.world - 1:  # on to rank r - 1, the shard's next holder (after the last step: at home)
                incoming = ring.shift(dkv, reverse=True)
            _wait(kv_requests)
            kv = nxt if nxt is not None else [k, v] if t == ring.world - 2 else kv
        dk, dv = dkv
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None)


def _block_grads(grad_out, q, kv, out, lse, blk: Block, flags) -> tuple[Block, tuple]:
    rows = (blk.q0, blk.q1)
    grads = ops.attention_backward_op(_rows(grad_out, *rows), _rows(q, *rows), _rows(kv[0], blk.k0, blk.k1),
                                      _rows(kv[1], blk.k0, blk.k1), _rows(out, *rows), lse[:, :, blk.q0:blk.q1],
                                      None, blk.causal, *flags)
    return blk, grads


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group: dist.ProcessGroup | None = None,
                   is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                   precision: str = "auto", layout: str = "contiguous", backend: str | None = None) -> torch.Tensor:
    """Attention over a sequence sharded across the ranks of `group` (default: the whole world): each rank passes
    its shard (B, H, S / W, D) of q, k and v (the same shard length on every rank; `layout` says which positions it
    holds, see `xkernels.distributed.shard`) and gets its shard of O. Differentiable in q, k and v (each rank gets
    the gradients of its shard). `is_causal`, `scale`, `enable_gqa` (Hq a multiple of Hkv), `precision` and `backend`
    as in `xkernels.attention`; the kernels are xkernels' own, the transport torch.distributed point-to-point ops
    (NCCL on GPUs, gloo on CPU). A causal mask balances best with layout="zigzag".
    """
    tensor(q, "q"), tensor(k, "k"), tensor(v, "v")
    flag(is_causal, "is_causal"), flag(enable_gqa, "enable_gqa")
    scale, precision = check_scale(scale), check_precision(precision)
    layout = _check_layout(layout)
    if forward_ad_level() >= 0:
        no_tangent({"q": q, "k": k, "v": v}, "ring_attention")
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend: expected a str or None, got {type(backend).__name__}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v: expected (B, H, S / W, D) shards")
    if k.shape[SEQ_DIM] != q.shape[SEQ_DIM] or v.shape[SEQ_DIM] != q.shape[SEQ_DIM]:
        raise ValueError(f"k, v: a ring shard holds the same positions as q's ({q.shape[SEQ_DIM]} rows), got "
                         f"{k.shape[SEQ_DIM]} and {v.shape[SEQ_DIM]}")
    if layout == "zigzag" and q.shape[SEQ_DIM] % 2:
        raise ValueError(f"q: a zigzag shard holds two equal chunks; S / W = {q.shape[SEQ_DIM]} is odd")
    k, v = k.contiguous(), v.contiguous()  # they travel through point-to-point sends
    return _ring(q, k, v, group, is_causal, scale, enable_gqa, precision, layout,
                 DEFAULT_BACKEND if backend is None else backend)


_DTYPES = (torch.float16, torch.bfloat16)


def _agree(q, k, v, group, causal: bool, enable_gqa: bool, layout: str) -> None:
    """Every rank's shards must have the same shapes and dtype and its call the same mask, GQA flag and layout: the
    receive buffers take the local shard's shape, so a rank whose shard differs would corrupt its neighbours' steps.
    One all_gather of these numbers (a host sync) before the ring, on every rank, so all of them raise together."""
    _, world = _world(group)
    if world == 1:
        return
    mine = [*q.shape, *k.shape, *v.shape, _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1, int(causal),
            int(enable_gqa), LAYOUTS.index(layout)]
    local = torch.tensor(mine, dtype=torch.int64, device=q.device)
    every = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(every, local, group=group)
    rows = [t.tolist() for t in every]
    if any(row != rows[0] for row in rows):
        names = ("q shape", "k shape", "v shape", "dtype", "is_causal", "enable_gqa", "layout")
        spans = ((0, 4), (4, 8), (8, 12), (12, 13), (13, 14), (14, 15), (15, 16))
        differ = [name for name, (lo, hi) in zip(names, spans, strict=True)
                  if any(row[lo:hi] != rows[0][lo:hi] for row in rows)]
        raise ValueError(f"q, k, v: the ranks of the group disagree on {', '.join(differ)} "
                         f"(per rank: {[row[:12] for row in rows]}); every rank passes same-shaped shards and the "
                         "same arguments")


@torch.compiler.disable
def _ring(q, k, v, group, causal, scale, enable_gqa, precision, layout, backend):
    """The ring runs eagerly under torch.compile (a graph break around it, as for torch's own context parallelism
    outside DTensor): its steps are point-to-point transfers, kernel launches and merges whose order is the point.
    The ranks first check that they agree on their shards (`_agree`)."""
    _agree(q, k, v, group, causal, enable_gqa, layout)
    return _RingAttention.apply(q, k, v, group, causal, scale, enable_gqa, precision, layout, backend)
