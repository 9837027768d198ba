"""Public API, shaped like PyTorch's: check the Python arguments, then call the `xkernels` ops (`ops.py`)."""

from __future__ import annotations

import math

import torch

from xkernels import ops
from xkernels.select import DEFAULT_BACKEND
from xkernels.validation import (
    B_LAYOUTS,
    MAX_SCALE,
    NO_WINDOW,
    WALK_CHOICES,
    check_max_seqlen,
    check_precision,
    check_scale,
    check_sdpa_mask_dropout,
    check_softcap,
    check_window,
    choice,
    flag,
    forward_ad_level,
    no_grad,
    no_tangent,
    tensor,
)

_STRIDED = torch.strided


def _backend(backend: object) -> str:
    if backend is None:
        return DEFAULT_BACKEND
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str or None, got {type(backend).__name__}")
    return backend


_AUTOCAST_DEVICES = ("cuda", "cpu", "xpu")
_AUTOCAST_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)  # autocast leaves float64 alone


def _autocast(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Under torch.autocast for the tensors' device, the fp32/fp16/bf16 inputs in the autocast dtype, as torch.matmul
    and F.scaled_dot_product_attention get them (both are autocast's lower-precision ops); differentiable
    (`Tensor.to`). Outside autocast the tensors themselves. The callers skip it for `out=` calls, as torch's out=
    variants do."""
    device_type = tensors[0].device.type
    if device_type not in _AUTOCAST_DEVICES or not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t.dtype in _AUTOCAST_ELIGIBLE and t.dtype != dtype else t for t in tensors)


def _out(out: object) -> None:
    """Per call, not per plan: whether `out` requires grad is not part of a plan's key."""
    if tensor(out, "out").requires_grad:
        raise ValueError("out: requires grad; an output buffer cannot be part of an autograd graph")


def _attention_arguments(q, k, v, is_causal, scale, enable_gqa, precision, return_lse, backend):
    """The full checks, with an error naming the argument; returns the normalized (scale, precision, backend)."""
    tensor(q, "q"), tensor(k, "k"), tensor(v, "v")
    flag(is_causal, "is_causal"), flag(enable_gqa, "enable_gqa"), flag(return_lse, "return_lse")
    return check_scale(scale), check_precision(precision), _backend(backend)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, *,
              enable_gqa: bool = False, precision: str = "auto", return_lse: bool = False,
              out: torch.Tensor | None = None,
              window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0, sinks: torch.Tensor | None = None,
              deterministic: bool | None = None,
              backend: str | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, F.scaled_dot_product_attention's signature (its positional order too).

    `attn_mask` must be None and `dropout_p` 0 (SDPA's calls that pass them so run unchanged; anything else raises,
    naming the argument): a causal mask is `is_causal`, a sliding window `window_size`, padding `attention_varlen`.

    q (B, Hq, Sq, D), k and v (B, Hkv, Skv, D), D in {64, 128, 256}, fp16 or bf16; any strides (layouts a tensor
    descriptor cannot read are copied, and `last_backend()` says so). SDPA's other ranks work too: (Hq, Sq, D), or
    more leading dims than B, the same in q, k and v (folded into one batch dim, restored in the outputs).
    `is_causal` is top-left aligned, as in PyTorch: query i attends keys j <= i also when Sq != Skv. `enable_gqa`
    allows Hq a multiple of Hkv. `precision` picks a recipe from `xkernels.recipes` ("fp16", "bf16", "bf16io",
    their fp16-accumulator variants "fp16-acc16" and "bf16io-acc16", or "auto": fp16 -> fp16, bf16 -> bf16).
    Returns O (B, Hq, Sq, D) in the input dtype, or (O, LSE) with the natural-log LSE (B, Hq, Sq) fp32 when
    `return_lse`. O is contiguous, or has q's layout where q is a (B, Sq, Hq, D) tensor viewed as (B, Hq, Sq, D)
    (what projections make): `o.transpose(1, 2)` is then contiguous, as SDPA's O, and the kernels write it in place.
    Differentiable in q, k and v through O and the LSE (not with `out`): the forward saves O and the LSE, and the
    backward recomputes the attention matrix tile by tile; bf16io's backward is the bf16 recipe's, an -acc16
    variant's that of its base.
    `window_size` (left, right) is FlashAttention's sliding window, aligned as `is_causal` (top-left): query i
    attends keys i - left <= j <= i + right, -1 for an unbounded side; with is_causal, right must be -1 or 0. Rows
    that see no key (a window past the last key, or Skv = 0) return 0 and LSE -inf. A window visits only the key
    tiles inside its band, forward and backward (on Hopper the Gluon kernels' band, elsewhere the portable
    kernels'); each window value compiles its own kernel variant. `softcap` > 0 soft-caps the scaled scores x to
    softcap * tanh(x / softcap) (flash_attn's softcap, Gemma 2's attn_logit_softcapping), in the forward and the
    backward (on Hopper the Gluon forward and the portable backward; the portable kernels elsewhere). `sinks`
    (Hq,) float: attention sinks (gpt-oss), one natural-log logit per query head that joins each row's softmax as a
    key of value 0 (not scaled by `scale`, not masked): O = sum_j p_j v_j / (sum_j p_j + exp(sink)), and the LSE
    includes it (a row that sees no key: O = 0, LSE = sink); differentiable in the sinks too. The forward runs
    where a sinkless call's would (on Hopper the Gluon kernel), and so does the backward, which needs nothing
    of them (the LSE holds the sink).
    `deterministic` (flash_attn's): True, bitwise-repeatable gradients (the Hopper backward's dQ kernel runs
    beside dK/dV); False lets the Hopper backward fuse dQ into the dK/dV kernel at D64 and D128 without a window
    where that is the faster kernel (fp32 partials reduce-added in any order: not bitwise repeatable; D128 without
    a mask 0-8 % faster, with it from 4K keys and enough heads; D64 1-24 % faster without a mask, with it on a grid
    of 1024 CTAs: `xkernels.select.fused_dq_pays`; any
    shape with backend="hopper" or XKERNELS_LAYER=hopper); None (the default) is
    `torch.are_deterministic_algorithms_enabled()`, the switch SDPA's backward kernels follow, read when this
    forward call is made (the backward keeps what the forward saw). The forward is deterministic either way.
    `out`, if given, receives O and must not overlap the inputs' memory. `backend` forces a kernel ("portable",
    "hopper", "hopper:stages=3"; default: XKERNELS_LAYER or "auto", see `xkernels.select`). Under torch.autocast,
    fp32/fp16/bf16 q, k and v are first cast to the autocast dtype, as for F.scaled_dot_product_attention (so are
    `attention_varlen`'s and `matmul`'s inputs, as for torch.matmul), except in calls with `out=` (as torch's out=
    variants) and `attention_with_kvcache` calls (its q, k, v and caches are never cast).
    """
    if attn_mask is not None or type(dropout_p) is not float or dropout_p != 0.0:
        check_sdpa_mask_dropout(attn_mask, dropout_p)
    if isinstance(q, torch.Tensor) and q.dim() != 4:
        return _attention_other_rank(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                                     precision=precision, return_lse=return_lse, out=out, window_size=window_size,
                                     softcap=softcap, sinks=sinks, deterministic=deterministic, backend=backend)
    # the common call passes this one test; anything else gets the full checks (and their named errors)
    if not (type(is_causal) is bool and type(enable_gqa) is bool and type(return_lse) is bool
            and (scale is None or (type(scale) is float and -MAX_SCALE <= scale <= MAX_SCALE))
            and type(precision) is str and (backend is None or type(backend) is str)
            and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
            and q.layout is _STRIDED and k.layout is _STRIDED and v.layout is _STRIDED):
        scale, precision, backend = _attention_arguments(q, k, v, is_causal, scale, enable_gqa, precision,
                                                         return_lse, backend)
    elif backend is None:
        backend = DEFAULT_BACKEND
    if forward_ad_level() >= 0:
        no_tangent({"q": q, "k": k, "v": v, "sinks": sinks}, "attention")
    grad = out is None and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                                        or (isinstance(sinks, torch.Tensor) and sinks.requires_grad))
    extras = _extras(window_size, softcap, is_causal, sinks, deterministic, grad)
    if out is None:
        q, k, v = _autocast((q, k, v))
    if grad:
        # differentiable: the op that also returns the LSE, which the backward needs (ops.py registers it)
        o, lse = ops.call_with_grad(ops.attention_lse_op, q, k, v, is_causal, scale, enable_gqa, precision, backend,
                                    *extras)
        return (o, lse) if return_lse else o
    if out is not None:
        no_grad({"q": q, "k": k, "v": v, "sinks": extras[3] if extras else None},
                "a call with out= is not differentiable (as for torch's out= functions)")
        _out(out)
        lse = ops.attention_out_op(q, k, v, out, is_causal, scale, enable_gqa, precision, backend, return_lse,
                                   *extras)
        return (out, lse) if return_lse else out
    if return_lse:
        return ops.call_without_grad(ops.attention_lse_op, q, k, v, is_causal, scale, enable_gqa, precision, backend,
                                     *extras)
    return ops.call_without_grad(ops.attention_op, q, k, v, is_causal, scale, enable_gqa, precision, backend,
                                 *extras)


def _attention_other_rank(q: torch.Tensor, k: object, v: object, *, out: object, return_lse: bool, **kwargs):
    """SDPA's other layouts, (..., H, L, E) with any number of leading dims: a 3-D (H, L, E) call runs as one batch,
    more leading dims fold into B (k and v with the same leading dims as q: as SDPA's fused kernels, no broadcast);
    O (and `out`) keep q's leading dims, the LSE too."""
    named = {"q": q, "k": k, "v": v} | ({} if out is None else {"out": out})
    for name, t in named.items():
        tensor(t, name)
        if t.dim() < 3:
            raise ValueError(f"{name}: expected (B, H, S, D) or SDPA's (..., H, S, D), got shape {tuple(t.shape)}")
    lead = q.shape[:-3]
    for name, t in named.items():
        if t.shape[:-3] != lead:
            raise ValueError(f"{name}: leading dims {tuple(t.shape[:-3])} do not match q's {tuple(lead)}")
    batch, given_out = math.prod(lead), out
    if out is not None:
        try:
            out = out.view(batch, *out.shape[-3:])
        except RuntimeError as e:
            raise ValueError(f"out: its {len(lead)} leading dims cannot be viewed as one batch dim (strides "
                             f"{out.stride()}); pass a contiguous out") from e
    try:
        result = attention(*(t.reshape(batch, *t.shape[-3:]) for t in (q, k, v)), out=out, return_lse=return_lse,
                           **kwargs)
    except (TypeError, ValueError) as e:  # its shapes are the folded ones: say so, with the caller's
        shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in named.items())
        how = f"the {len(lead)} leading dims folded into one" if lead else "a batch dim of 1 added"
        raise type(e)(f"{e} (shapes with {how}; as passed: {shapes})") from e
    o, lse = result if return_lse else (result, None)
    o = o.view(*lead, *o.shape[1:]) if given_out is None else given_out
    return o if lse is None else (o, lse.view(*lead, *lse.shape[1:]))


def _extras(window_size: object, softcap: object, is_causal: bool, sinks: object, deterministic: object,
            grad: bool) -> tuple:
    """The ops' trailing (window_left, window_right, softcap, sinks, deterministic), checked (the sinks' metadata by
    the op), or () for their defaults (no window, soft cap or sinks, deterministic: the common call passes four
    cheap tests). `deterministic` None is torch's switch (`torch.use_deterministic_algorithms`, which SDPA's
    backward kernels follow too; torch.compile guards on it); a call without gradients has no backward, so it
    passes the default."""
    if deterministic is None:
        deterministic = not grad or torch.are_deterministic_algorithms_enabled()
    if window_size is NO_WINDOW and type(softcap) is float and softcap == 0.0 and sinks is None:
        if deterministic is True:
            return ()
        if deterministic is False:
            return _NONDETERMINISTIC
    flag(deterministic, "deterministic")
    if sinks is not None:  # the layout too: the dispatcher would refuse a sparse tensor with its own error
        tensor(sinks, "sinks")
    return (*check_window(window_size, is_causal), check_softcap(softcap), sinks, deterministic)


# the ops' trailing arguments of a call with no window, soft cap or sinks whose backward may fuse dQ
_NONDETERMINISTIC = (*NO_WINDOW, 0.0, None, False)


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, is_causal: bool = False,
                     scale: float | None = None, precision: str = "auto", return_lse: bool = False,
                     sync_checks: bool = True, window_size: tuple[int, int] = NO_WINDOW, softcap: float = 0.0,
                     sinks: torch.Tensor | None = None, deterministic: bool | None = None,
                     backend: str | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over a packed batch of variable-length sequences, like flash_attn_varlen_func.

    q (total_q, Hq, D), k and v (total_k, Hkv, D) with Hq a multiple of Hkv (GQA), D in {64, 128, 256}, fp16 or
    bf16; sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and
    v (int32, (batch + 1,), starting at 0); max_seqlen_q / max_seqlen_k bound the lengths. No padding is computed.
    **Causal is aligned bottom-right** per sequence, as FlashAttention >= 2.1 and KV caches (query i sees keys
    j <= i + Sk - Sq), unlike `attention`'s top-left, and so is `window_size` (left, right), flash_attn's sliding
    window: query i sees keys i + Sk - Sq - left <= j <= i + Sk - Sq + right (-1: unbounded; causal: right -1 or
    0; the kernels' band, as for `attention`), `softcap` the scores' soft cap and `sinks` (Hq,) attention sinks as
    in `attention`; rows that see no key return 0 (LSE -inf, or the sink). The cu_seqlens values
    are checked (0 first, non-decreasing, the packed total last, no sequence over max_seqlen): with `sync_checks`
    (the default) they are read to the host (one synchronization) and a bad value raises a ValueError naming the
    argument; with `sync_checks=False`, and during CUDA-graph capture, nothing is read: they are checked on the
    device (one small launch), and a bad call reads and writes nothing outside the packed tensors and returns NaN
    in every output (flash_attn_varlen_func checks nothing). Returns O (total_q, Hq, D), or
    (O, LSE) with LSE (Hq, total_q) fp32 natural log. Differentiable in q, k and v through O and the LSE: the
    forward saves O and the LSE, and the backward recomputes the attention matrix tile by tile, checking the
    cu_seqlens on the device (bad values give NaN gradients); its kernels are the Gluon backward's packed variants on
    sm_90, the portable ones elsewhere or with backend="portable"; bf16io's backward is the bf16 recipe's, as for
    `attention`. `deterministic` is flash_attn_varlen_func's argument (None: torch's switch, as for `attention`):
    the packed backward has no fused-dQ variant, so its gradients are bitwise repeatable either way.
    """
    tensor(q, "q"), tensor(k, "k"), tensor(v, "v"), tensor(cu_seqlens_q, "cu_seqlens_q")
    tensor(cu_seqlens_k, "cu_seqlens_k"), check_max_seqlen(max_seqlen_q, "max_seqlen_q")
    check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    flag(is_causal, "is_causal"), flag(return_lse, "return_lse"), flag(sync_checks, "sync_checks")
    scale, precision, backend = check_scale(scale), check_precision(precision), _backend(backend)
    if forward_ad_level() >= 0:
        no_tangent({"q": q, "k": k, "v": v, "sinks": sinks}, "attention_varlen")
    # differentiable: the backward needs the LSE, so the op returns it whatever the caller asked
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                        or (isinstance(sinks, torch.Tensor) and sinks.requires_grad))
    extras = _extras(window_size, softcap, is_causal, sinks, deterministic, grad)
    q, k, v = _autocast((q, k, v))
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, precision,
            return_lse or grad, sync_checks, backend, *extras)
    o, lse = ops.call_with_grad(ops.attention_varlen_op, *args) if grad else ops.attention_varlen_op(*args)
    return (o, lse) if return_lse else o


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                           cache_seqlens: torch.Tensor, k: torch.Tensor | None = None, v: torch.Tensor | None = None,
                           block_table: torch.Tensor | None = None, cache_leftpad: torch.Tensor | None = None,
                           is_causal: bool = True, scale: float | None = None,
                           precision: str = "auto", return_lse: bool = False, num_splits: int = 0,
                           sync_checks: bool = True, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           sinks: torch.Tensor | None = None,
                           backend: str | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention against a KV cache, like flash_attn_with_kvcache (decode, speculative decoding, chunked prefill).

    q (B, Sq, Hq, D); caches (B, S_max, Hkv, D), or paged (num_blocks, page_size, Hkv, D) with `block_table`
    (B, max_blocks) int32 (page size a power of two, 16 to 256); `cache_seqlens` (B,) int32 filled positions. If
    `k`, `v` (B, new, Hkv, D) are given they are first written into the caches at positions cache_seqlens[b]... (in
    place; `cache_seqlens` is not advanced), then attended to. Causal is aligned bottom-right (query i of Sq sees
    cached keys up to its own position). The cache values are checked on the device (lengths fit, pages in range,
    left pads within the lengths). With `sync_checks` (the default) the result is read to the host (one
    synchronization) and a bad value raises a ValueError naming the argument before anything is written. With
    `sync_checks=False`, and during CUDA-graph capture, nothing is read and nothing else runs: the append and
    attention kernels check the values they use, nothing is read or written through a bad one, and every output
    that depends on it is NaN (flash_attn checks nothing). A length or left pad out of range: none of that
    sequence's tokens is written and all its outputs are NaN; a block id out of range: the outputs of every block
    of query rows (up to 64 rows: tokens x the heads of a GQA group) whose keys include its page are NaN, and
    tokens bound for it are not written. Other sequences and rows are served as usual. Returns O (B, Sq, Hq, D), or
    (O, LSE) with LSE
    (B, Hq, Sq) fp32. Forward only: q, a cache, k, v or sinks that requires grad raises a ValueError naming it (under
    torch.no_grad() the call runs). The split-KV kernel reads the cache in place (dense or paged); `num_splits`
    sets how many key splits each (sequence, kv head) is cut into (0: a heuristic from the batch, heads, cache
    length and SM count). `cache_leftpad` (B,) int32, dense caches only: sequence b's keys start at that row (a
    left-padded batch), so it attends rows cache_leftpad[b] .. cache_seqlens[b] + new. `window_size` (left, right),
    as flash_attn_with_kvcache's: query i (at position p = i + L - Sq of its sequence of L keys) sees keys p - left ..
    p (causal) or p - left .. p + right (not causal), -1 leaving a side unbounded; a decode step then reads only its
    window (sliding-window models: Mistral, Gemma, ...). With is_causal, right must be -1 or 0. The checks still
    read every page below a sequence's length, so pages before the window must be valid blocks too. `softcap` > 0:
    the scores' soft cap, `sinks` (Hq,) attention sinks, as in `attention`.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens)):
        tensor(t, name)
    flag(is_causal, "is_causal"), flag(return_lse, "return_lse"), flag(sync_checks, "sync_checks")
    scale, precision, backend = check_scale(scale), check_precision(precision), _backend(backend)
    if type(num_splits) is not int or num_splits < 0:
        raise ValueError(f"num_splits: expected an int >= 0 (0: heuristic), got {num_splits!r}")
    left, right = check_window(window_size, is_causal)
    softcap = check_softcap(softcap)
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks: expected a torch.Tensor or None, got {type(sinks).__name__}")
    no_grad({"q": q, "k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v, "sinks": sinks},
            "attention_with_kvcache is an inference op (no backward)")
    if forward_ad_level() >= 0:
        no_tangent({"q": q, "k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v, "sinks": sinks},
                   "attention_with_kvcache")
    args = (q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad, is_causal, scale, precision,
            return_lse, num_splits, sync_checks, left, right, backend, softcap, sinks)
    if k is None and v is None:  # nothing appended: the op writes no input, so a plain eager call may skip the
        o, lse = ops.call_without_grad(ops.attention_with_kvcache_op, *args)  # dispatcher (`call_without_grad`)
    else:
        o, lse = ops.attention_with_kvcache_op(*args)
    return (o, lse) if return_lse else o


def _column_major_as_nk(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, str]:
    """A "kn" b (stride 1 down K) stored column-major, e.g. `weight.T` of a row-major (N, K) weight as F.linear's
    callers write it, is the "nk" layout of b.mT: read in place (the kernels would otherwise copy the transpose every
    call). An expanded or overlapping b keeps its copy; a K mismatch is reported on the operands as given."""
    if (a.dim() >= 2 and a.shape[-1] == b.shape[-2] and b.shape[-2] > 1 and b.shape[-1] > 1
            and b.stride(-1) >= b.shape[-2]):
        return b.mT, "nk"
    return b, "kn"


def matmul(a: torch.Tensor, b: torch.Tensor, *, b_layout: str = "kn", walk: str = "auto",
           out_dtype: torch.dtype | None = None, out: torch.Tensor | None = None,
           backend: str | None = None) -> torch.Tensor:
    """a @ b with fp32 accumulation, like torch.matmul for fp16/bf16 matrices.

    a (..., M, K); b (..., K, N) for b_layout "kn", or (..., N, K) for "nk" (computes a @ b^T without a transpose
    copy); a column-major "kn" b, such as `weight.T` of a row-major weight, is read in place as "nk". Batch dims
    broadcast; a 1-D a or b is a vector, as in torch.matmul (its dim dropped from the result). `walk` sets the
    output-tile order: "row", "grouped", "zorder"; "auto" (the default) is "grouped", or for one 2-D problem of at
    most 32 rows the few-row kernel (K split over the SMs where the weight's columns do not fill them; no tile order
    to choose).
    `out_dtype` defaults to the input dtype (fp16, bf16 or fp32 allowed). `backend` as for `attention`.
    Differentiable in a and b (not with `out`): the backward is two more matmuls in the inputs' dtype (dC rounded to
    it when `out_dtype` is wider), batch broadcasts summed in fp32.
    """
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.layout is _STRIDED
            and b.layout is _STRIDED and type(b_layout) is str
            and b_layout in B_LAYOUTS and type(walk) is str and walk in WALK_CHOICES
            and (out_dtype is None or isinstance(out_dtype, torch.dtype))
            and (backend is None or type(backend) is str)):
        tensor(a, "a"), tensor(b, "b")
        choice(b_layout, "b_layout", B_LAYOUTS)
        choice(walk, "walk", WALK_CHOICES)
        if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
            raise TypeError(f"out_dtype: expected a torch.dtype or None, got {type(out_dtype).__name__}")
    backend = _backend(backend)
    if forward_ad_level() >= 0:
        no_tangent({"a": a, "b": b}, "matmul")
    for name, t in (("a", a), ("b", b)):
        if t.dim() == 0:
            raise ValueError(f"{name}: expected a vector or a matrix (at least 1 dim), got a 0-d tensor")
    vector_a, vector_b = a.dim() == 1, b.dim() == 1
    if vector_a or vector_b:  # torch.matmul's vectors: a row (1, K) of a, a column of b ((1, K) read as "nk")
        return _vector_matmul(a, b, vector_a, vector_b, b_layout=b_layout, walk=walk, out_dtype=out_dtype, out=out,
                              backend=backend)
    if b_layout == "kn" and b.dim() >= 2 and b.stride(-2) == 1:  # (a row-major b fails the first stride test)
        b, b_layout = _column_major_as_nk(a, b)
    if out is None:
        a, b = _autocast((a, b))
        if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
            return ops.call_with_grad(ops.matmul_op, a, b, b_layout, walk, out_dtype, backend)
        return ops.call_without_grad(ops.matmul_op, a, b, b_layout, walk, out_dtype, backend)
    no_grad({"a": a, "b": b}, "a call with out= is not differentiable (as for torch's out= functions)")
    _out(out)
    ops.matmul_out_op(a, b, out, b_layout, walk, out_dtype, backend)
    return out


def _vector_matmul(a: torch.Tensor, b: torch.Tensor, vector_a: bool, vector_b: bool, **kwargs) -> torch.Tensor:
    """torch.matmul's 1-D operands: a vector a is the row (1, K), a vector b the column (K, 1) (whatever b_layout
    says: passed as the "nk" row (1, K)); the product drops the dims they added (both: a 0-d dot product). `out`, of
    the dropped shape, receives it through a view with those dims."""
    if vector_a:
        a = a.unsqueeze(0)
    if vector_b:
        b, kwargs["b_layout"] = b.unsqueeze(0), "nk"
    out = kwargs.pop("out")
    if out is not None:  # (not a tensor, or of another shape: `matmul` names it)
        view = out
        if isinstance(out, torch.Tensor) and vector_b:
            view = view.unsqueeze(-1)
        if isinstance(out, torch.Tensor) and vector_a:
            view = view.unsqueeze(-2)
        matmul(a, b, out=view, **kwargs)
        return out
    c = matmul(a, b, **kwargs)
    if vector_a and vector_b:
        return c.reshape(())
    return c.squeeze(-1) if vector_b else c.squeeze(-2)
