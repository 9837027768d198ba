"""How a sequence is cut over the ranks of a ring, and which (query rows, key rows) pairs of a ring step attend.

"contiguous": rank r holds positions [r * n, (r + 1) * n) of the W * n. "zigzag": the sequence is cut into 2W equal
chunks and rank r holds chunks r and 2W - 1 - r, in that order, so under a causal mask every rank does the same work
(an early chunk paired with a late one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

LAYOUTS = ("contiguous", "zigzag")
SEQ_DIM = 2  # (B, H, S, D)


@dataclass(frozen=True)
class Block:
    """One attention call of a ring step: local query rows [q0, q1) against rows [k0, k1) of the K/V in hand."""

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool  # top-left aligned within the block (the diagonal block of the rank's own keys)


def ring_blocks(rank: int, source: int, local: int, *, causal: bool, layout: str) -> list[Block]:
    """The blocks rank `rank` computes while holding the K/V shard of rank `source` (`local` rows per shard).

    Not causal: everything. Causal, contiguous: earlier shards in full, its own shard causally, later shards not at
    all. Causal, zigzag (chunks of local / 2 rows): its own shard causally (the local order keeps positions
    increasing, so top-left causal over the shard is exact); an earlier source's first chunk is before both of its
    chunks (all queries, first half of the keys); a later source's chunks are both before its second chunk and after
    its first (second half of the queries, all keys)."""
    if not causal:
        return [Block(0, local, 0, local, False)]
    if source == rank:
        return [Block(0, local, 0, local, True)]
    if layout == "contiguous":
        return [Block(0, local, 0, local, False)] if source < rank else []
    half = local // 2
    if source < rank:
        return [Block(0, local, 0, half, False)]
    return [Block(half, local, 0, local, False)]


def _chunks(world: int, rank: int, layout: str) -> tuple[int, ...]:
    return (rank,) if layout == "contiguous" else (rank, 2 * world - 1 - rank)


def _check_layout(layout: object) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    return layout


def _world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("xkernels.distributed: torch.distributed is not initialized (init_process_group first)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:  # torch answers -1 on a rank outside the group
        raise ValueError(f"group: global rank {dist.get_rank()} is not a member of this process group")
    return rank, world


def shard(x: torch.Tensor, group: dist.ProcessGroup | None = None, layout: str = "contiguous") -> torch.Tensor:
    """This rank's shard of a full (B, H, S, D) tensor (the same on every rank), contiguous: S must be a multiple of
    the group size W ("contiguous") or of 2W ("zigzag")."""
    layout = _check_layout(layout)
    rank, world = _world(group)
    parts = world if layout == "contiguous" else 2 * world
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError("x: expected a (B, H, S, D) tensor")
    if x.shape[SEQ_DIM] % parts:
        raise ValueError(f"x: S = {x.shape[SEQ_DIM]} is not a multiple of {parts} (layout {layout!r}, {world} ranks)")
    pieces = x.chunk(parts, dim=SEQ_DIM)
    return torch.cat([pieces[c] for c in _chunks(world, rank, layout)], dim=SEQ_DIM).contiguous()


def unshard(x: torch.Tensor, group: dist.ProcessGroup | None = None, layout: str = "contiguous") -> torch.Tensor:
    """The full (B, H, S, D) tensor from every rank's shard (an all-gather; the inverse of `shard`)."""
    layout = _check_layout(layout)
    rank, world = _world(group)
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError("x: expected a (B, H, S, D) tensor")
    if layout == "zigzag" and x.shape[SEQ_DIM] % 2:
        raise ValueError(f"x: a zigzag shard holds two equal chunks; S = {x.shape[SEQ_DIM]} is odd")
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x.contiguous(), group=group)
    if layout == "contiguous":
        return torch.cat(gathered, dim=SEQ_DIM)
    pieces: dict[int, torch.Tensor] = {}
    for r, part in enumerate(gathered):
        for c, piece in zip(_chunks(world, r, layout), part.chunk(2, dim=SEQ_DIM), strict=True):
            pieces[c] = piece
    return torch.cat([pieces[c] for c in range(2 * world)], dim=SEQ_DIM)
