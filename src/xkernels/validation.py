"""Argument checks: each bad input gets a TypeError or ValueError that names the argument.

Three levels, so the same errors come at trace time under torch.compile as in eager calls:
  - Python values (flags, scale, precision, layouts): checked by the public functions before the op is called;
  - tensor metadata (dims, shapes, dtypes, devices): checked inside the ops, by the real and the fake kernels alike,
    so they work on FakeTensors and meta tensors;
  - memory (an `out` overlapping an input or itself): checked on real tensors only, by comparing address ranges.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch.autograd import forward_ad

from xkernels.recipes import AttentionRecipe, resolve_attention_recipe

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128, 256)
B_LAYOUTS = ("kn", "nk")
WALK_CHOICES = ("auto", "row", "grouped", "zorder")
OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# scale is folded with log2(e) into one fp32 factor: past this the factor overflows to inf
MAX_SCALE = 3.4028234663852886e38 / math.log2(math.e)


# ---- Python values -------------------------------------------------------------------------------------------------

def tensor(x: object, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {_type_name(x)}")
    if x.layout != torch.strided:
        raise ValueError(f"{name}: layout {x.layout} is not supported; use a dense (strided) tensor")
    return x


def _type_name(x: object) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def flag(x: object, name: str) -> None:
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected a Python bool, got {_type_name(x)}")


def choice(x: object, name: str, choices: tuple[str, ...]) -> None:
    if not isinstance(x, str):
        raise TypeError(f"{name}: expected a str, one of {choices}, got {type(x).__name__}")
    if x not in choices:
        raise ValueError(f"{name}: {x!r} is not one of {choices}")


def check_scale(scale: object) -> float | None:
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a real number, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite number, got {scale!r}")
    if abs(scale) > MAX_SCALE:
        raise ValueError(f"scale: |{scale!r}| is above {MAX_SCALE:.4g}, where scale * log2(e) overflows fp32")
    return scale


def check_precision(precision: object) -> str:
    if not isinstance(precision, str):
        raise TypeError(f"precision: expected a str, got {type(precision).__name__}")
    return precision


def no_grad(named: dict[str, torch.Tensor | None], why: str) -> None:
    if torch.is_grad_enabled():
        for name, t in named.items():
            if t is not None and t.requires_grad:
                raise ValueError(f"{name}: requires grad, but {why}; call under torch.no_grad() or detach it")


def forward_ad_level() -> int:
    """The innermost forward-mode AD level (torch.autograd.forward_ad.dual_level, torch.func.jvp and jacfwd enter
    one), -1 outside them: a module global read, cheap enough for every call."""
    return forward_ad._current_level


def no_tangent(named: dict[str, torch.Tensor | None], op: str) -> None:
    """Forward-mode AD has no rule in these ops: torch would run the kernel and drop the input's tangent (a zero
    derivative, silently), so an input that carries one is refused, as SDPA refuses it."""
    for name, t in named.items():
        if isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None:
            raise NotImplementedError(f"{name}: carries a forward-mode AD tangent (torch.autograd.forward_ad, "
                                      f"torch.func.jvp or jacfwd), but {op} has no forward-mode derivative; use "
                                      "reverse mode (backward, torch.autograd.grad)")


# ---- tensor metadata (fake-safe) -----------------------------------------------------------------------------------

def _same_dtype_and_device(named: dict[str, torch.Tensor]) -> None:
    for name, t in named.items():
        tensor(t, name)
    first_name, first = next(iter(named.items()))
    if first.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{first_name}: dtype {first.dtype} is not supported; use torch.float16 or torch.bfloat16")
    for name, t in named.items():
        if t.dtype != first.dtype:
            raise TypeError(f"{name}: dtype {t.dtype} does not match {first_name}'s {first.dtype}")
        if t.device != first.device:
            raise ValueError(f"{name}: on device {t.device}, but {first_name} is on {first.device}")


def check_out(out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    if out is None:
        return
    tensor(out, "out")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out: shape {tuple(out.shape)} != expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"out: dtype {out.dtype} != expected {dtype}")
    if out.device != device:
        raise ValueError(f"out: on device {out.device}, expected {device}")
    if out.requires_grad:
        raise ValueError("out: requires grad; an output buffer cannot be part of an autograd graph")


def check_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None, *,
                    enable_gqa: bool, precision: str) -> AttentionRecipe:
    """Validate attention tensors; return the precision recipe."""
    named = {"q": q, "k": k, "v": v}
    for name, t in named.items():
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dims (B, H, S, D), got shape {tuple(t.shape)}")
    _same_dtype_and_device(named)
    b, hq, sq, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"v: shape {tuple(v.shape)} does not match k's {tuple(k.shape)}")
    bk, hkv, skv, dk = k.shape
    if bk != b:
        raise ValueError(f"k: batch {bk} does not match q's batch {b}")
    if dk != d:
        raise ValueError(f"k: head dim {dk} does not match q's head dim {d}")
    if d not in HEAD_DIMS:
        raise ValueError(f"q: head dim {d} is not supported; supported head dims are {HEAD_DIMS}")
    if hq != hkv:
        if not enable_gqa:
            raise ValueError(f"k: {hkv} heads but q has {hq}; pass enable_gqa=True for grouped-query attention")
        if hkv == 0 or hq % hkv:
            raise ValueError(f"k: {hkv} kv heads do not divide q's {hq} heads")
    recipe = resolve_attention_recipe(precision, q.dtype)
    check_out(out, q.shape, q.dtype, q.device)
    return recipe


def _backward_tensors(grad_out, q, out, lse, grad_lse, lse_shape: tuple[int, ...], lse_names: str) -> None:
    """O and dO shaped and typed like q; the LSE and its gradient `lse_shape` fp32 (named `lse_names`), on q's
    device: the checks every backward shares."""
    for name, t in (("grad_out", grad_out), ("out", out)):
        tensor(t, name)
        if tuple(t.shape) != tuple(q.shape):
            raise ValueError(f"{name}: shape {tuple(t.shape)} does not match q's {tuple(q.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: dtype {t.dtype} does not match q's {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: on device {t.device}, but q is on {q.device}")
    for name, t in (("lse", lse), ("grad_lse", grad_lse)):
        if t is None:
            continue
        tensor(t, name)
        if tuple(t.shape) != lse_shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} is not {lse_names} = {lse_shape}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name}: dtype {t.dtype} is not torch.float32")
        if t.device != q.device:
            raise ValueError(f"{name}: on device {t.device}, but q is on {q.device}")


def check_attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             out: torch.Tensor, lse: torch.Tensor, grad_lse: torch.Tensor | None, *,
                             enable_gqa: bool, precision: str) -> AttentionRecipe:
    """Validate the backward's tensors against the forward's (q, k, v as in `check_attention`; O and dO shaped and
    typed like q; the LSE and its gradient (B, Hq, Sq) fp32); return the forward's recipe."""
    recipe = check_attention(q, k, v, None, enable_gqa=enable_gqa, precision=precision)
    _backward_tensors(grad_out, q, out, lse, grad_lse, tuple(q.shape[:3]), "(B, Hq, Sq)")
    return recipe


def check_attention_varlen_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    out: torch.Tensor, lse: torch.Tensor, grad_lse: torch.Tensor | None,
                                    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                                    max_seqlen_k: int, *, precision: str) -> AttentionRecipe:
    """The varlen backward's tensors: the forward's as in `check_attention_varlen`, O and dO like q, the LSE and its
    gradient (Hq, total_q) fp32."""
    recipe = check_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    precision=precision)
    _backward_tensors(grad_out, q, out, lse, grad_lse, (q.shape[1], q.shape[0]), "(Hq, total_q)")
    return recipe


MAX_SEQLEN = 2**31 - 1  # token rows are int32 inside the kernels


def check_max_seqlen(m: object, name: str) -> None:
    """A max_seqlen argument: an int (a SymInt under torch.compile: kept symbolic, so a new longest sequence does
    not recompile the graph) from 0 to MAX_SEQLEN; bool is refused."""
    if isinstance(m, bool) or not isinstance(m, int | torch.SymInt):
        raise TypeError(f"{name}: expected an int, got {type(m).__name__} {m!r}")
    if m < 0 or m > MAX_SEQLEN:
        raise ValueError(f"{name}: {m} is outside 0..{MAX_SEQLEN} (token rows are 32-bit in the kernels)")


NO_WINDOW = (-1, -1)  # window_size's default: no sliding window


def check_sinks(sinks: object, heads: int, device: torch.device) -> None:
    """Attention sinks (gpt-oss): None, or one natural-log logit per query head, a (Hq,) float tensor on q's device
    (metadata only: fake-safe)."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks: expected a torch.Tensor or None, got {type(sinks).__name__}")
    tensor(sinks, "sinks")  # dense (strided)
    if sinks.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"sinks: expected float32, float16 or bfloat16, got {sinks.dtype}")
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks: expected one logit per query head, shape ({heads},), got {tuple(sinks.shape)}")
    if sinks.device != device:
        raise ValueError(f"sinks: on {sinks.device}, expected q's device {device}")


def check_sdpa_mask_dropout(attn_mask: object, dropout_p: object) -> None:
    """F.scaled_dot_product_attention's `attn_mask` and `dropout_p`, taken so that SDPA's calls run unchanged where
    they change nothing (no mask, no dropout); anything else is refused by name, with what serves it instead."""
    if attn_mask is not None:
        raise ValueError("attn_mask: only None is supported; pass a causal mask as is_causal=True, a sliding window "
                         "as window_size=(left, right), padded batches packed through attention_varlen, a KV "
                         "cache's lengths through attention_with_kvcache")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, float | int):
        raise TypeError(f"dropout_p: expected a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: attention dropout is not supported (got {dropout_p}); pass 0.0")


def check_softcap(softcap: object) -> float:
    """flash_attn's `softcap`: a finite float or int >= 0 (0: off), as a float."""
    if isinstance(softcap, bool) or not isinstance(softcap, float | int):
        raise TypeError(f"softcap: expected a float, got {type(softcap).__name__}")
    if not (0.0 <= softcap < float("inf")):
        raise ValueError(f"softcap: {softcap} is not a finite value >= 0 (0: no soft cap)")
    return float(softcap)


def check_window(window: object, is_causal: bool) -> tuple[int, int]:
    """FlashAttention's window_size: (left, right) ints >= -1 (-1: unbounded); causal windows end at the query
    (right -1 or 0). Returns (left, right) with a causal right of -1 made 0 and a side of 2^31 - 1 or more -1."""
    if not (isinstance(window, tuple | list) and len(window) == 2
            and all(type(side) is int for side in window)):
        raise TypeError(f"window_size: expected a (left, right) pair of ints, got {window!r}")
    left, right = window
    if left < -1 or right < -1:
        raise ValueError(f"window_size: {tuple(window)} has a side below -1 (-1: unbounded)")
    if is_causal and right > 0:
        raise ValueError(f"window_size: right = {right} with is_causal (a causal window ends at the query: -1 or 0)")
    # a side past any position the kernels index (int32) cuts no key: unbounded, so it fits the ops' int64 too
    left, right = (-1 if side >= 2**31 - 1 else side for side in (left, right))
    return left, 0 if is_causal else right


def check_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
                           precision: str) -> AttentionRecipe:
    """Validate packed varlen tensors (metadata only: fake-safe): q (total_q, Hq, D), k and v (total_k, Hkv, D),
    cu_seqlens int32 (batch + 1,) on q's device; returns the recipe. `check_cu_seqlens` checks their values."""
    named = {"q": q, "k": k, "v": v}
    for name, t in named.items():
        if t.dim() != 3:
            raise ValueError(f"{name}: expected 3 dims (total tokens, heads, head dim), got shape {tuple(t.shape)}")
    _same_dtype_and_device(named)
    _, hq, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"v: shape {tuple(v.shape)} does not match k's {tuple(k.shape)}")
    if k.shape[2] != d:
        raise ValueError(f"k: head dim {k.shape[2]} does not match q's head dim {d}")
    if d not in HEAD_DIMS:
        raise ValueError(f"q: head dim {d} is not supported; supported head dims are {HEAD_DIMS}")
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"k: {hkv} kv heads do not divide q's {hq} heads")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        tensor(cu, name)
        if cu.dtype != torch.int32:
            raise TypeError(f"{name}: dtype {cu.dtype} is not torch.int32")
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ValueError(f"{name}: expected shape (batch + 1,), got {tuple(cu.shape)}")
        if cu.device != q.device:
            raise ValueError(f"{name}: on device {cu.device}, but q is on {q.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_k: shape {tuple(cu_seqlens_k.shape)} does not match cu_seqlens_q's "
                         f"{tuple(cu_seqlens_q.shape)} (one entry per sequence, plus one)")
    check_max_seqlen(max_seqlen_q, "max_seqlen_q"), check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    return resolve_attention_recipe(precision, q.dtype)


def _per_sequence(t: object, name: str, batch: int, device: torch.device) -> None:
    """A (batch,) int32 vector of one value per sequence, on q's device."""
    tensor(t, name)
    if t.dtype != torch.int32 or tuple(t.shape) != (batch,):
        raise ValueError(f"{name}: expected int32 ({batch},), got {t.dtype} {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: on device {t.device}, but q is on {device}")


def check_attention_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad, *,
                            precision: str) -> AttentionRecipe:
    """Validate a KV-cache call (metadata only: fake-safe): q (B, Sq, Hq, D); caches (B, S_max, Hkv, D), or paged
    (num_blocks, page_size, Hkv, D) with block_table (B, max_blocks) int32 and a power-of-two page size 16..256;
    cache_seqlens (B,) int32; k, v (B, new, Hkv, D) together or not at all. Returns the recipe."""
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    for name, t in named.items():
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dims, got shape {tuple(t.shape)}")
    _same_dtype_and_device(named)
    batch, _, hq, d = q.shape
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} does not match k_cache's {tuple(k_cache.shape)}")
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"k_cache: head dim {k_cache.shape[3]} does not match q's head dim {d}")
    if d not in HEAD_DIMS:
        raise ValueError(f"q: head dim {d} is not supported; supported head dims are {HEAD_DIMS}")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"k_cache: {hkv} kv heads do not divide q's {hq} heads")
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(f"k_cache: batch {k_cache.shape[0]} does not match q's batch {batch} (a paged cache "
                             "needs block_table)")
    else:
        tensor(block_table, "block_table")
        if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ValueError(f"block_table: expected int32 (batch, max_blocks) with batch {batch}, got "
                             f"{block_table.dtype} {tuple(block_table.shape)}")
        if block_table.device != q.device:
            raise ValueError(f"block_table: on device {block_table.device}, but q is on {q.device}")
        page = k_cache.shape[1]
        if page < 16 or page > 256 or page & (page - 1):
            raise ValueError(f"k_cache: page size {page} is not a power of two from 16 to 256")
        if k_cache.shape[0] == 0:
            raise ValueError("k_cache: a paged cache with no blocks (block_table has nowhere to point)")
    _per_sequence(cache_seqlens, "cache_seqlens", batch, q.device)
    if cache_leftpad is not None:
        _per_sequence(cache_leftpad, "cache_leftpad", batch, q.device)
        if block_table is not None:
            raise ValueError("cache_leftpad: a left-padded cache must be dense (block_table is given)")
    if (k is None) != (v is None):
        raise ValueError("k, v: pass both new keys and new values, or neither")
    if k is not None:
        _same_dtype_and_device({"q": q, "k": k, "v": v})
        if k.shape != v.shape or k.dim() != 4 or k.shape[0] != batch or tuple(k.shape[2:]) != (hkv, d):
            raise ValueError(f"k: expected (batch, new, Hkv, D) = ({batch}, new, {hkv}, {d}) like v, got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")
    return resolve_attention_recipe(precision, q.dtype)


def check_cu_seqlens(cu: list[int], total: int, max_seqlen: int, name: str, max_name: str) -> None:
    """The values of one cu_seqlens (read to the host): 0 first, non-decreasing, `total` last, no sequence longer
    than `max_seqlen`. A bad one would make the kernels read or write outside the packed tensors."""
    if cu[0] != 0:
        raise ValueError(f"{name}: must start at 0, starts at {cu[0]}")
    lengths = [b - a for a, b in zip(cu, cu[1:], strict=False)]
    if any(n < 0 for n in lengths):
        raise ValueError(f"{name}: must be non-decreasing, got {cu}")
    if cu[-1] != total:
        raise ValueError(f"{name}: ends at {cu[-1]}, but the packed tensor has {total} tokens")
    if lengths and max(lengths) > max_seqlen:
        raise ValueError(f"{max_name}: {max_seqlen} is less than the longest sequence in {name}, {max(lengths)}")


def check_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, *, b_layout: str,
                 out_dtype: torch.dtype | None) -> tuple[tuple[int, ...], int, int, int, torch.dtype]:
    """Validate matmul tensors; return (batch shape, M, N, K, output dtype)."""
    named = {"a": a, "b": b}
    for name, t in named.items():
        if t.dim() < 2:
            raise ValueError(f"{name}: expected at least 2 dims, got shape {tuple(t.shape)}")
    _same_dtype_and_device(named)
    if out_dtype is None:
        out_dtype = a.dtype
    elif out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: {out_dtype} is not one of {OUT_DTYPES}")
    m, k = a.shape[-2:]
    n, kb = (b.shape[-2], b.shape[-1]) if b_layout == "nk" else (b.shape[-1], b.shape[-2])
    if kb != k:
        raise ValueError(f"b: inner dim {kb} does not match a's inner dim {k} (b_layout={b_layout!r})")
    if b.dim() == 2:  # the common case, without torch.broadcast_shapes
        batch = tuple(a.shape[:-2])
    else:
        try:
            batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        except RuntimeError as e:
            raise ValueError(f"b: batch dims {tuple(b.shape[:-2])} do not broadcast with a's "
                             f"{tuple(a.shape[:-2])}") from e
    check_out(out, (*batch, m, n), out_dtype, a.device)
    return batch, m, n, k, out_dtype


# ---- memory (real tensors only) ------------------------------------------------------------------------------------

def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte address any element of `t` can occupy."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    start = t.data_ptr()
    return start, start + (last + 1) * t.element_size()


def self_overlaps(t: torch.Tensor) -> bool:
    """True unless the layout provably gives every element its own address: dims sorted by stride, each stride at
    least the span of the smaller dims (contiguous, transposed, sliced and padded layouts pass; as_strided rows
    that overlap, and expanded dims, do not)."""
    span = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz > 1):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


def check_out_storage(out: torch.Tensor | None, inputs: dict[str, torch.Tensor]) -> None:
    """What the fake kernels can see of the memory check (no addresses under FakeTensorMode): `out` overlapping
    itself, or sharing a storage with an input. Under torch.compile this runs at trace time, before functionalization
    would hand the real kernel a copy of `out` and hide the alias."""
    from torch.multiprocessing.reductions import StorageWeakRef

    if out is None or out.numel() == 0:
        return
    if self_overlaps(out):
        raise ValueError("out: several of its elements share memory (an expanded or overlapping strided view)")
    ref = StorageWeakRef(out.untyped_storage())
    for name, t in inputs.items():
        if t.numel() and StorageWeakRef(t.untyped_storage()) == ref:
            raise ValueError(f"out: overlaps the memory of {name}; inputs are never overwritten")


def _meets(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two address ranges [lo, hi) (`_span`) share a byte."""
    return a[0] < b[1] and b[0] < a[1]


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the address ranges of two non-empty tensors meet."""
    return a.numel() > 0 and b.numel() > 0 and _meets(_span(a), _span(b))


def _offset_reachable(diff: int, t: torch.Tensor, budget: int = 4096) -> bool:
    """Whether `diff` elements is the distance between two elements of `t`'s layout: sum(i * stride) over index
    differences |i| < size. Dims are tried largest stride first, each bounded by what the smaller ones can still
    reach; a search past `budget` steps answers True (undecided counts as reachable)."""
    dims = sorted(((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz > 1), reverse=True)
    reach = [0] * (len(dims) + 1)
    for i in range(len(dims) - 1, -1, -1):
        reach[i] = reach[i + 1] + dims[i][0] * (dims[i][1] - 1)
    steps = 0

    def found(i: int, rest: int) -> bool:
        nonlocal steps
        if i == len(dims):
            return rest == 0
        steps += 1
        if abs(rest) > reach[i] or steps > budget:
            return steps > budget
        stride, size = dims[i]
        lo = max(1 - size, -((reach[i + 1] - rest) // stride))  # ceil((rest - reach) / stride)
        hi = min(size - 1, (rest + reach[i + 1]) // stride)
        return any(found(i + 1, rest - j * stride) for j in range(lo, hi + 1))

    return found(0, diff)


def _share_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors may share memory: their address ranges meet and, where both have one layout (shape,
    strides, element size) that gives each element its own address and lie whole elements apart, an element of one
    is an element of the other (the interleaved halves kv[:, :, 0] and kv[:, :, 1] of one buffer share none)."""
    if not _overlap(a, b):
        return False
    size = a.element_size()
    if (a.shape != b.shape or a.stride() != b.stride() or b.element_size() != size or self_overlaps(a)
            or (b.data_ptr() - a.data_ptr()) % size):
        return True
    return _offset_reachable((b.data_ptr() - a.data_ptr()) // size, a)


_CHECKED_CACHES: dict = {}  # (address, shape, strides, element size) of a checked cache pair -> their spans


def check_cache_writes(k_cache: torch.Tensor, v_cache: torch.Tensor, others: dict[str, torch.Tensor | None]) -> None:
    """An append writes k_cache and v_cache in place: each must give every element its own memory (not an
    expanded view), they must not share an element (interleaved views of one buffer may be given), and no other
    argument (the new k and v, q, the lengths, the block table) may lie in their memory, which the append would
    overwrite before, or while, it is read. The pair's own
    checks depend only on its addresses and layouts, so a decoding loop's caches are checked once (keyed by
    numbers: no tensor is kept)."""
    key = (k_cache.data_ptr(), k_cache.shape, k_cache.stride(), v_cache.data_ptr(), v_cache.shape, v_cache.stride(),
           k_cache.element_size(), v_cache.element_size())
    spans = _CHECKED_CACHES.get(key)
    if spans is None:
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if self_overlaps(cache):
                raise ValueError(f"{name}: several of its elements share memory (an expanded or overlapping view); "
                                 "appending k and v writes it in place")
        if _share_elements(k_cache, v_cache):
            raise ValueError("v_cache: overlaps k_cache's memory; appending k and v writes both in place")
        spans = (_span(k_cache), _span(v_cache)) if k_cache.numel() and v_cache.numel() else ()
        if len(_CHECKED_CACHES) >= 64:
            _CHECKED_CACHES.clear()
        _CHECKED_CACHES[key] = spans
    for name, t in others.items():
        if t is not None and t.numel():
            span = _span(t)
            if any(_meets(span, cache) for cache in spans):
                raise ValueError(f"{name}: overlaps the cache's memory, which appending k and v writes in place")


def check_out_memory(out: torch.Tensor | None, inputs: dict[str, torch.Tensor]) -> None:
    """`out` must not overlap itself or any input's memory (compared as address ranges, whatever storage object
    each tensor has: two views of one foreign buffer share memory without sharing a storage)."""
    if out is None or out.numel() == 0:
        return
    if self_overlaps(out):
        raise ValueError("out: several of its elements share memory (an expanded or overlapping strided view)")
    for name, t in inputs.items():
        if _overlap(out, t):
            raise ValueError(f"out: overlaps the memory of {name}; inputs are never overwritten")
