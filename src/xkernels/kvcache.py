"""Host path of `xkernels.attention_with_kvcache` (flash_attn_with_kvcache's contract): checks, the in-place append
of new keys and values, and attention over each sequence's filled cache rows through the split-KV kernel
(`decode.py`), which reads a dense (B, S_max, Hkv, D) or paged (num_blocks, page_size, Hkv, D) cache in place.
"""

from __future__ import annotations

import torch
import triton

from xkernels import decode, plans, select, varlen
from xkernels.common import launch
from xkernels.common.runtime import unit_last_stride
from xkernels.portable.kv_cache import cache_append_kernel, cache_check_kernel
from xkernels.validation import check_cache_writes


def check_values(k_cache, cache_seqlens, block_table, new: int, cache_leftpad=None) -> None:
    """The values the kernels trust, checked by one kernel (lengths in range, pages in range, left pads within the
    lengths) whose flags are read to the host once: a bad value raises, before anything is written, so a bad call
    leaves the cache as it was."""
    page = k_cache.shape[1]
    paged = block_table is not None
    capacity = page * block_table.shape[1] if paged else page
    flags = torch.zeros(4, dtype=torch.int32, device=cache_seqlens.device)
    if cache_seqlens.shape[0] == 0:
        return
    table = block_table if paged else cache_seqlens  # never read for a dense cache
    leftpad = cache_seqlens if cache_leftpad is None else cache_leftpad  # read only with LEFTPAD
    args = (cache_seqlens, table, leftpad, flags, table.stride(0), new, capacity, k_cache.shape[0],
            block_table.shape[1] if paged else 0)
    _launch(cache_check_kernel, cache_seqlens.shape[0], args,
            dict(PAGE=page if paged else 0, LEFTPAD=cache_leftpad is not None, CHUNK=64), 1)
    negative, too_long, outside, bad_pad = flags.tolist()  # the one read to the host
    if negative:
        raise ValueError(f"cache_seqlens: negative lengths {cache_seqlens.tolist()}")
    if too_long:
        raise ValueError(f"cache_seqlens: {cache_seqlens.max().item()} cached + {new} new tokens exceed the cache's "
                         f"{capacity} positions per sequence")
    if outside:
        raise ValueError(f"block_table: entries outside the {k_cache.shape[0]} cache blocks")
    if bad_pad:
        raise ValueError(f"cache_leftpad: values {cache_leftpad.tolist()} must lie in [0, cache_seqlens] "
                         f"({cache_seqlens.tolist()})")


_RESOLVED: dict = {}


def _resolve(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad, precision: str, backend: str):
    """`select.resolve_attention_kvcache` once per metadata key: its checks and choice read the tensors' shapes,
    dtypes, devices and layouts and nothing else (~6 us of host time a decode call saves)."""
    key = (precision, backend, *(None if t is None else (t.shape, t.dtype, t.device, t.layout)
                                 for t in (q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad)))
    hit = _RESOLVED.get(key)
    if hit is None:
        hit = select.resolve_attention_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad,
                                               precision=precision, backend=backend)
        if len(_RESOLVED) >= 1024:
            _RESOLVED.clear()
        _RESOLVED[key] = hit
    return hit


def _launch(fn, grid: int, args: tuple, constexprs: dict, num_warps: int) -> None:
    """Launch one of the cache kernels (one stage): directly where the direct path runs (`launch.run`)."""
    launch.run(fn, grid, args, constexprs, dict(num_warps=num_warps, num_stages=1))


def append(k_cache, v_cache, k, v, cache_seqlens, block_table, cache_leftpad=None) -> None:
    """Write k, v (B, new, Hkv, D) at positions cache_seqlens[b]... of each sequence (in place), one launch
    (`portable/kv_cache.py`, any strides). Each sequence's length, left pad and the pages its new tokens land on are
    checked on the device, and nothing is written for a sequence with a bad one."""
    batch, new, hkv, d = k.shape
    page = k_cache.shape[1]
    capacity = page * (block_table.shape[1] if block_table is not None else 1)
    table = cache_seqlens if block_table is None else block_table  # never read for a dense cache
    leftpad = cache_seqlens if cache_leftpad is None else cache_leftpad  # read only with LEFTPAD
    args = (k, v, k_cache, v_cache, cache_seqlens, table, leftpad, *k.stride(), *v.stride(), *k_cache.stride(),
            *v_cache.stride(), table.stride(0), new, hkv, capacity, k_cache.shape[0])
    _launch(cache_append_kernel, batch * new, args,
            dict(HEAD_DIM=d, HEADS=triton.next_power_of_2(hkv), PAGE=0 if block_table is None else page,
                 LEFTPAD=cache_leftpad is not None, CHUNK=16), 4)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad, *, is_causal: bool,
                           scale: float | None, precision: str, return_lse: bool, num_splits: int, sync_checks: bool,
                           window: tuple[int, int] = (-1, -1), backend: str, softcap: float = 0.0, sinks=None):
    """(O (B, Sq, Hq, D), LSE (B, Hq, Sq) fp32, or an empty tensor unless `return_lse`). The append and attention
    kernels always check the values they use: nothing is read or written through a bad one, every output that
    depends on it is NaN (all of a sequence's for a bad length or left pad, those of each block of query rows whose
    keys include a bad page for a bad block id), the rest is served as usual. With `sync_checks` (not during
    CUDA-graph capture, where a read to the host would break it) one more kernel checks the values first and a
    read to the host raises on a bad one, before anything is written. One kernel variant serves both modes, so a
    graph captured after an eager warm-up compiles nothing."""
    recipe, choice = _resolve(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad, precision,
                              backend)
    batch, sq, hq, d = q.shape
    new = 0 if k is None else k.shape[1]
    if new:  # the append writes the caches in place: nothing else may live in their memory
        check_cache_writes(k_cache, v_cache, {"k": k, "v": v, "q": q, "cache_seqlens": cache_seqlens,
                                              "block_table": block_table, "cache_leftpad": cache_leftpad,
                                              "sinks": sinks})
    cache_seqlens = cache_seqlens.contiguous()  # the kernels read it (and the block table's rows) with unit stride
    if block_table is not None and block_table.stride(-1) != 1:
        block_table = block_table.contiguous()
    if cache_leftpad is not None:
        cache_leftpad = cache_leftpad.contiguous()
    if sync_checks and not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        check_values(k_cache, cache_seqlens, block_table, new, cache_leftpad)
    if new:
        append(k_cache, v_cache, k, v, cache_seqlens, block_table, cache_leftpad)
    out = varlen.output_like(q)
    lse = torch.empty((batch, hq, sq) if return_lse else (0,), dtype=torch.float32, device=q.device)
    if batch * sq * hq == 0:
        plans._record("empty")
        return out, lse
    # another layout of the cache is read from a copy (correct, slower); the append above wrote the cache itself
    q, keys, values = unit_last_stride(q), unit_last_stride(k_cache), unit_last_stride(v_cache)
    plan = decode.kvcache_plan(q, keys, values, out, block_table, is_causal=is_causal, recipe=recipe,
                               cfg=choice.config, write_lse=return_lse, splits=num_splits,
                               key_starts=cache_leftpad is not None, window=window, softcap=softcap,
                               sinks=sinks is not None)
    # the sinks as fp32 (the plan's key has no dtype for them: its compiled kernel reads fp32 logits)
    plan.run(q, keys, values, out, lse if return_lse else None, cache_seqlens, block_table, scale, cache_leftpad,
             new=new, sinks=None if sinks is None else sinks.to(torch.float32).contiguous())
    plans._record(plan.name + (" paged" if block_table is not None else ""))
    return out, lse
