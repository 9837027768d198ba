"""flash_attn's functions on xkernels' kernels: code written against FlashAttention 2 switches with one import.

    from xkernels.integrations.flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

The signatures, defaults, layouts and alignment are flash_attn's (2.6+): q (B, Sq, Hq, D), k and v (B, Skv, Hkv, D)
(batch first, heads third: not SDPA's layout), `causal` and `window_size` aligned **bottom-right** when Sq != Skv
(query i sees keys j <= i + Skv - Sq), `softmax_scale`, `softcap`, `deterministic`, and flash_attn_with_kvcache's
`causal=False` default (`xkernels.attention_with_kvcache` defaults to True); with `causal`, a window's right side
is 0 whatever is passed, and a dense cache may have more rows than the batch (rows 0 .. B - 1 are used), as in
flash_attn. Outputs are contiguous in flash_attn's layout (`out.view(B, S, -1)` works), the LSE natural-log fp32 in
flash_attn's shapes, (B, Hq, Sq) dense and (Hq, total_q) packed; two differences: a row that sees no key has LSE
-inf here (log 0; flash_attn writes +inf), and `return_attn_probs=True` returns (out, lse, None) (flash_attn an
empty tensor for the probabilities, which it has only with dropout).

The dense functions run the dense kernels on (B, H, S, D) views of the same memory where the alignment cannot matter
(Sq = Skv, or neither causal nor windowed; O comes back in q's layout, so it is (B, S, H, D) contiguous with no
copy), else the packed kernels (`xkernels.attention_varlen`, one sequence per batch row, also in place; their
bottom-right causal and window are flash_attn's); differentiable as flash_attn's. What the
kernels lack is refused by name (ValueError) rather than ignored: dropout, ALiBi slopes, a varlen `block_table`.
`cache_batch_idx` runs on the paged kernel (the dense cache viewed as pages, in place); the KV cache's rotary
embedding (`rotary_cos`, `rotary_sin`) rotates q and the new k with torch ops before the kernels.
Head dims 64, 128 and 256; fp16 or bf16.
"""

from __future__ import annotations

import torch

import xkernels
from xkernels.validation import check_sdpa_mask_dropout, tensor

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"]


def _unsupported(**given: object) -> None:
    """flash_attn arguments the kernels do not serve, refused by name unless left at their off value (dropout_p as
    `attention` checks SDPA's)."""
    for name, value in given.items():
        if name == "dropout_p":
            check_sdpa_mask_dropout(None, value)
        elif value is not None:
            what = {"alibi_slopes": "ALiBi biases are not supported",
                    "block_table": "packed sequences over a paged cache are not supported; use "
                                   "flash_attn_with_kvcache for paged caches"}[name]
            raise ValueError(f"{name}: {what} (got a value; pass None)")


def _window(window_size: object, causal: object) -> object:
    """flash_attn's window_size: a list too, and with `causal` a right side above 0 is 0 (flash_attn sets it so);
    anything else goes to xkernels' check as it is (and its named error)."""
    if isinstance(window_size, list):
        window_size = tuple(window_size)
    if causal is True and isinstance(window_size, tuple) and len(window_size) == 2 and type(window_size[1]) is int \
            and window_size[1] > 0:
        window_size = (window_size[0], 0)
    return window_size


def _packed_call(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, window, softcap, deterministic,
                 return_lse: bool, sync_checks: bool):
    """`xkernels.attention_varlen` with flash_attn's argument names; `window` as `_window` gives it."""
    return xkernels.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=causal, scale=softmax_scale,
                                     return_lse=return_lse, sync_checks=sync_checks, window_size=window,
                                     softcap=softcap, deterministic=deterministic)


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                    return_attn_probs: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, None]:
    """flash_attn.flash_attn_func: q (B, Sq, Hq, D), k and v (B, Skv, Hkv, D) -> out (B, Sq, Hq, D), or
    (out, lse (B, Hq, Sq), None) with `return_attn_probs`."""
    _unsupported(dropout_p=dropout_p, alibi_slopes=alibi_slopes)
    for name, t in (("q", q), ("k", k), ("v", v)):
        tensor(t, name)
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dims (batch, seqlen, heads, head dim), got shape {tuple(t.shape)}")
    (b, sq), skv = q.shape[:2], k.shape[1]
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"k: batch {k.shape[0]} (v: {v.shape[0]}) does not match q's batch {b}")
    if v.shape[1] != skv:
        raise ValueError(f"v: {v.shape[1]} keys, k has {skv}")
    window = _window(window_size, causal)
    if sq == skv or not (causal or window != (-1, -1)):  # alignment cannot matter: the dense kernels, in place
        result = xkernels.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                    scale=softmax_scale, enable_gqa=q.shape[2] != k.shape[2], window_size=window,
                                    softcap=softcap, deterministic=deterministic, return_lse=return_attn_probs)
        if not return_attn_probs:
            return result.transpose(1, 2)
        return result[0].transpose(1, 2), result[1], None
    rows = torch.arange(b + 1, device=q.device, dtype=torch.int32)
    # the cu_seqlens are made here, valid by construction: nothing to read back (sync_checks=False)
    result = _packed_call(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), rows * sq, rows * skv, sq, skv,
                          softmax_scale, causal, window, softcap, deterministic, return_attn_probs, False)
    if not return_attn_probs:
        return result.unflatten(0, (b, sq))
    out, lse = result
    return out.unflatten(0, (b, sq)), lse.unflatten(1, (b, sq)).transpose(0, 1).contiguous(), None


def flash_attn_qkvpacked_func(qkv: torch.Tensor, dropout_p: float = 0.0, softmax_scale: float | None = None,
                              causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                              return_attn_probs: bool = False):
    """flash_attn.flash_attn_qkvpacked_func: qkv (B, S, 3, H, D), read in place (no unpacking copy); its gradient
    is one (B, S, 3, H, D) tensor."""
    tensor(qkv, "qkv")
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv: expected (batch, seqlen, 3, heads, head dim), got shape {tuple(qkv.shape)}")
    return flash_attn_func(*qkv.unbind(2), dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, dropout_p: float = 0.0,
                             softmax_scale: float | None = None, causal: bool = False,
                             window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                             return_attn_probs: bool = False):
    """flash_attn.flash_attn_kvpacked_func: q (B, Sq, Hq, D), kv (B, Skv, 2, Hkv, D)."""
    tensor(kv, "kv")
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv: expected (batch, seqlen, 2, heads, head dim), got shape {tuple(kv.shape)}")
    return flash_attn_func(q, *kv.unbind(2), dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: torch.Tensor | None = None):
    """flash_attn.flash_attn_varlen_func: q (total_q, Hq, D), k and v (total_k, Hkv, D), cu_seqlens int32 -> out
    (total_q, Hq, D), or (out, lse (Hq, total_q), None). The cu_seqlens are checked as `xkernels.attention_varlen`
    checks them by default (read to the host: one synchronization; flash_attn checks nothing)."""
    _unsupported(dropout_p=dropout_p, alibi_slopes=alibi_slopes, block_table=block_table)
    result = _packed_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                          _window(window_size, causal), softcap, deterministic, return_attn_probs, True)
    return (*result, None) if return_attn_probs else result


def flash_attn_varlen_qkvpacked_func(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                                     dropout_p: float = 0.0, softmax_scale: float | None = None,
                                     causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                                     softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                                     deterministic: bool = False, return_attn_probs: bool = False):
    """flash_attn.flash_attn_varlen_qkvpacked_func: qkv (total, 3, H, D)."""
    tensor(qkv, "qkv")
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv: expected (total, 3, heads, head dim), got shape {tuple(qkv.shape)}")
    return flash_attn_varlen_func(*qkv.unbind(1), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                                    dropout_p: float = 0.0, softmax_scale: float | None = None,
                                    causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                                    softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                                    deterministic: bool = False, return_attn_probs: bool = False):
    """flash_attn.flash_attn_varlen_kvpacked_func: kv (total_k, 2, Hkv, D)."""
    tensor(kv, "kv")
    if kv.dim() != 4 or kv.shape[1] != 2:
        raise ValueError(f"kv: expected (total, 2, heads, head dim), got shape {tuple(kv.shape)}")
    return flash_attn_varlen_func(q, *kv.unbind(1), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs)


def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: torch.Tensor | None = None, v: torch.Tensor | None = None,
                            rotary_cos: torch.Tensor | None = None, rotary_sin: torch.Tensor | None = None,
                            cache_seqlens: int | torch.Tensor | None = None,
                            cache_batch_idx: torch.Tensor | None = None, cache_leftpad: torch.Tensor | None = None,
                            block_table: torch.Tensor | None = None, softmax_scale: float | None = None,
                            causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: torch.Tensor | None = None,
                            num_splits: int = 0, return_softmax_lse: bool = False):
    """flash_attn.flash_attn_with_kvcache (`xkernels.attention_with_kvcache`, whose checks it keeps): `k`, `v`
    are written into the caches in place first; `cache_seqlens` an int (every sequence), a (B,) int32 tensor, or
    None (the whole cache: S_max rows, or every page of the block table; not with `k`, `v`). Returns out (B, Sq,
    Hq, D), or (out, lse (B, Hq, Sq)) with `return_softmax_lse`."""
    _unsupported(alibi_slopes=alibi_slopes)
    tensor(q, "q"), tensor(k_cache, "k_cache"), tensor(v_cache, "v_cache")
    if q.dim() != 4:
        raise ValueError(f"q: expected (batch, seqlen, heads, head dim), got shape {tuple(q.shape)}")
    if cache_seqlens is None and k is not None:
        raise ValueError("cache_seqlens: None with new k and v: pass where each sequence's tokens are written")
    capacity = k_cache.shape[1] * (1 if block_table is None else block_table.shape[-1])  # positions a sequence has
    window = _window(window_size, causal)
    if cache_seqlens is None or (isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool)):
        length = capacity if cache_seqlens is None else cache_seqlens
        cache_seqlens = torch.full((q.shape[0],), length, dtype=torch.int32, device=q.device)
    if rotary_cos is not None or rotary_sin is not None:
        q, k = _rotary(q, k, rotary_cos, rotary_sin, cache_seqlens, cache_leftpad, rotary_interleaved,
                       local=causal or window != (-1, -1), positions=capacity)
    rows = k_cache.shape[0]
    if cache_batch_idx is None and block_table is None and rows > q.shape[0]:
        k_cache, v_cache = k_cache[:q.shape[0]], v_cache[:q.shape[0]]  # flash_attn reads rows 0 .. B - 1
    if cache_batch_idx is not None:
        k_cache, v_cache, block_table = _rows_as_pages(k_cache, v_cache, cache_batch_idx, block_table, cache_leftpad,
                                                       q.shape[0])
    try:
        return xkernels.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, k=k, v=v,
                                               block_table=block_table, cache_leftpad=cache_leftpad,
                                               is_causal=causal, scale=softmax_scale,
                                               return_lse=return_softmax_lse, num_splits=num_splits,
                                               window_size=window, softcap=softcap)
    except ValueError as e:
        if cache_batch_idx is not None and str(e).startswith("block_table"):  # the table made of cache_batch_idx
            raise ValueError(f"cache_batch_idx: every index must be a row of the cache, 0 to {rows - 1} "
                             f"({e})") from e
        raise


def _rotary(q: torch.Tensor, k: torch.Tensor | None, cos: object, sin: object, cache_seqlens: torch.Tensor,
            cache_leftpad: object, interleaved: bool, *, local: bool, positions: int):
    """flash_attn_with_kvcache's rotary embedding, applied to q and the new k before the kernels (in fp32, rounded to
    their dtype): k at positions cache_seqlens, cache_seqlens + 1, ...; q at the same positions when causal or
    windowed, else all of q at position cache_seqlens. The first rotary_dim = 2 * cos.shape[1] dims rotate, as
    pairs (0, 1), (2, 3), ... (`interleaved`, GPT-J) or (i, i + rotary_dim / 2) (GPT-NeoX)."""
    tensor(cos, "rotary_cos"), tensor(sin, "rotary_sin")
    if k is None:
        raise ValueError("rotary_cos: rotary embedding applies to new k and v; pass them (or rotate q yourself)")
    if cache_leftpad is not None:
        raise ValueError("rotary_cos: not supported with cache_leftpad (rotate q and k yourself)")
    half = cos.shape[-1] if cos.dim() == 2 else -1
    if cos.shape != sin.shape or half < 1 or 2 * half > q.shape[-1]:
        raise ValueError(f"rotary_sin: rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2) with "
                         f"rotary_dim <= head dim {q.shape[-1]}, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.shape[0] < positions:
        raise ValueError(f"rotary_cos: {cos.shape[0]} positions, fewer than the cache's {positions}")
    start = cache_seqlens.long()[:, None]  # out-of-range lengths: clamped here, refused (or NaN) by the kernels
    steps = torch.arange(max(q.shape[1], k.shape[1]), device=q.device)[None, :]

    def rotate(x, pos):
        pos = pos.clamp(0, cos.shape[0] - 1)
        c, s = cos.float()[pos][:, :, None], sin.float()[pos][:, :, None]  # (B, S, 1, rotary_dim / 2)
        part = x[..., :2 * half].float()
        a, b = (part[..., 0::2], part[..., 1::2]) if interleaved else (part[..., :half], part[..., half:])
        ra, rb = a * c - b * s, a * s + b * c
        rotated = torch.stack((ra, rb), -1).flatten(-2) if interleaved else torch.cat((ra, rb), -1)
        return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), -1)

    q_pos = (start + steps[:, :q.shape[1]]) if local else start.expand(-1, q.shape[1])
    return rotate(q, q_pos), rotate(k, start + steps[:, :k.shape[1]])


def _rows_as_pages(k_cache: torch.Tensor, v_cache: torch.Tensor, cache_batch_idx: object,
                   block_table: object, cache_leftpad: object,
                   batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flash_attn's `cache_batch_idx` (sequence b reads and appends to cache row cache_batch_idx[b]) on the paged
    kernel: a dense cache (rows, S_max, Hkv, D) is also a paged one, S_max / P pages of P positions a row (the
    largest power of two from 16 to 256 that divides S_max), viewed in place; sequence b's block table lists its
    row's pages."""
    tensor(cache_batch_idx, "cache_batch_idx")
    if block_table is not None or cache_leftpad is not None:
        raise ValueError("cache_batch_idx: not supported with a paged cache (block_table) or cache_leftpad")
    if cache_batch_idx.dtype != torch.int32 or cache_batch_idx.dim() != 1:
        raise TypeError(f"cache_batch_idx: expected a 1-D int32 tensor, got {cache_batch_idx.dtype} of shape "
                        f"{tuple(cache_batch_idx.shape)}")
    if cache_batch_idx.shape[0] != batch:
        raise ValueError(f"cache_batch_idx: {cache_batch_idx.shape[0]} indices for a batch of {batch}")
    s_max = k_cache.shape[1]
    page = next((p for p in (256, 128, 64, 32, 16) if s_max % p == 0), None)
    if page is None or k_cache.dim() != 4:
        raise ValueError(f"cache_batch_idx: needs a dense cache (rows, S_max, Hkv, D) with S_max a multiple of 16, "
                         f"got k_cache of shape {tuple(k_cache.shape)}")
    pages = []
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        try:
            pages.append(cache.view(-1, page, *cache.shape[2:]))
        except RuntimeError as e:
            raise ValueError(f"{name}: with cache_batch_idx, each row's positions must be one run of memory (a "
                             f"contiguous cache), got strides {cache.stride()}") from e
    per_row = s_max // page
    table = cache_batch_idx[:, None] * per_row + torch.arange(per_row, dtype=torch.int32,
                                                               device=cache_batch_idx.device)
    return pages[0], pages[1], table
