"""Host path of `xkernels.attention_with_kvcache` (flash_attn_with_kvcache's contract): checks, the in-place append
of new keys and values, and attention over each sequence's filled cache rows through the split-KV kernel
(`decode.py`), which reads a dense (B, S_max, Hkv, D) or paged (num_blocks, page_size, Hkv, D) cache in place.
"""

from __future__ import annotations

import torch

from xkernels import decode, plans, select, varlen


def _positions(cache_seqlens: torch.Tensor, new: int) -> torch.Tensor:
    """(B, new) cache positions the new tokens go to."""
    return cache_seqlens.long()[:, None] + torch.arange(new, device=cache_seqlens.device)[None, :]


def check_values(k_cache, cache_seqlens, block_table, new: int) -> None:
    """The values the kernels trust, read to the host: lengths in range, pages in range. Raised before anything is
    written, so a bad call leaves the cache as it was."""
    lengths = cache_seqlens.tolist()
    if any(n < 0 for n in lengths):
        raise ValueError(f"cache_seqlens: negative lengths {lengths}")
    page = k_cache.shape[1]
    capacity = page if block_table is None else page * block_table.shape[1]
    if lengths and max(lengths) + new > capacity:
        raise ValueError(f"cache_seqlens: {max(lengths)} cached + {new} new tokens exceed the cache's {capacity} "
                         "positions per sequence")
    if block_table is not None and lengths:
        pages = -(-(cache_seqlens.long() + new) // page)  # pages each sequence reads
        used = block_table[torch.arange(block_table.shape[1], device=block_table.device)[None, :] < pages[:, None]]
        if used.numel() and (used.min().item() < 0 or used.max().item() >= k_cache.shape[0]):
            raise ValueError(f"block_table: entries outside the {k_cache.shape[0]} cache blocks")


def append(k_cache, v_cache, k, v, cache_seqlens, block_table) -> None:
    """Write k, v (B, new, Hkv, D) at positions cache_seqlens[b]... of each sequence (in place)."""
    batch, new = k.shape[:2]
    pos = _positions(cache_seqlens, new)
    rows = torch.arange(batch, device=k.device)[:, None].expand(batch, new)
    if block_table is None:
        k_cache[rows, pos] = k
        v_cache[rows, pos] = v
        return
    page = k_cache.shape[1]
    blocks = block_table.long().gather(1, pos // page)
    k_cache[blocks, pos % page] = k
    v_cache[blocks, pos % page] = v


def _unit_rows(t: torch.Tensor) -> torch.Tensor:
    """The kernel reads head-dim rows with unit stride; another layout is read from a copy (correct, slower)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, *, is_causal: bool,
                           scale: float | None, precision: str, return_lse: bool, num_splits: int, backend: str):
    """(O (B, Sq, Hq, D), LSE (B, Hq, Sq) fp32, or an empty tensor unless `return_lse`)."""
    recipe, choice = select.resolve_attention_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table,
                                                      precision=precision, backend=backend)
    batch, sq, hq, d = q.shape
    new = 0 if k is None else k.shape[1]
    if not (q.is_cuda and torch.cuda.is_current_stream_capturing()):  # reading them would break a graph capture
        check_values(k_cache, cache_seqlens, block_table, new)
    if new:
        append(k_cache, v_cache, k, v, cache_seqlens, block_table)
    out = varlen.output_like(q)
    lse = torch.empty((batch, hq, sq) if return_lse else (0,), dtype=torch.float32, device=q.device)
    if batch * sq * hq == 0:
        plans._record("empty")
        return out, lse
    q, keys, values = _unit_rows(q), _unit_rows(k_cache), _unit_rows(v_cache)
    seqlens = (cache_seqlens + new if new else cache_seqlens).to(torch.int32).contiguous()
    plan = decode.kvcache_plan(q, keys, values, out, block_table, is_causal=is_causal, recipe=recipe,
                               cfg=choice.config, write_lse=return_lse, splits=num_splits)
    plan.run(q, keys, values, out, lse if return_lse else None, seqlens, block_table, scale)
    plans._record(plan.name + (" paged" if block_table is not None else ""))
    return out, lse
