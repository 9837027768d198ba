"""Host path of `xkernels.attention_with_kvcache` (flash_attn_with_kvcache's contract): checks, the in-place append
of new keys and values, and attention over each sequence's filled cache rows through the varlen kernel.

A dense cache (B, S_max, Hkv, D) is read in place: sequence b's keys are rows b * S_max .. + cache_seqlens[b] + new
of the flattened cache (the kernel takes per-sequence starts and counts; nothing is copied, no host sync is needed
for the launch). A paged cache (num_blocks, page_size, Hkv, D) is first gathered through `block_table` into a dense
(B, max_blocks * page_size, Hkv, D) copy: correct, but it reads every addressed page once more than a paged kernel
would (the split-KV decode kernel is the next step).
"""

from __future__ import annotations

import torch

from xkernels import plans, select, varlen


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


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, *, is_causal: bool,
                           scale: float | None, precision: str, return_lse: bool, backend: str):
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
    lse = torch.empty((hq, batch * sq) if return_lse else (0,), dtype=torch.float32, device=q.device)
    if batch * sq == 0:
        plans._record("empty")
        return out, lse.view(batch, hq, sq) if return_lse else lse
    if block_table is None:
        keys, values = k_cache, v_cache
    else:  # gather each sequence's pages into a dense (B, max_blocks * page_size, Hkv, D) view
        keys = k_cache[block_table.long()].flatten(1, 2)
        values = v_cache[block_table.long()].flatten(1, 2)
    s_max = keys.shape[1]
    hkv = keys.shape[2]
    index = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
    varlen.run(q.reshape(batch * sq, hq, d), keys.reshape(batch * s_max, hkv, d),
               values.reshape(batch * s_max, hkv, d), out.view(batch * sq, hq, d), lse if return_lse else None,
               index * sq, index * s_max, (cache_seqlens + new).to(torch.int32), sq, is_causal=is_causal,
               scale=scale, recipe=recipe, cfg=choice.config)
    paged = " paged" if block_table is not None else ""
    plans._record(f"portable.attention_kvcache[{recipe.name} {choice.config}{paged}]")
    if return_lse:
        return out, lse.view(hq, batch, sq).transpose(0, 1).contiguous()
    return out, lse
