"""The `xkernels` torch.library operators: the one way every public function reaches a kernel.

Each op has a real kernel (CPU under the Triton interpreter, CUDA, XPU) and a fake kernel (shapes and dtypes only,
no data access) that runs the same tensor checks, so `torch.compile(fullgraph=True)`, FakeTensorMode and meta-device
tracing see the op, its output shapes and its errors. The ops are declared with `torch.library.Library` rather than
the `torch.library.custom_op` decorator: the same dispatcher registration (opcheck, compile, CUDA graphs), but the
decorator's Python wrapper costs ~15 us of host time per call, more than the whole launch.

  xkernels::attention(q, k, v, is_causal, scale, enable_gqa, precision, backend) -> O
  xkernels::attention_lse(q, k, v, ...same...) -> (O, LSE)
  xkernels::attention_out(q, k, v, out!, ...same..., return_lse) -> LSE          (writes O into `out`)
  xkernels::attention_backward(grad_out, q, k, v, out, lse, grad_lse?, ...same...) -> (dQ, dK, dV)
  xkernels::attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale,
                             precision, return_lse, sync_checks, backend) -> (O, LSE (Hq, total_q) or empty)
  xkernels::attention_varlen_backward(grad_out, q, k, v, out, lse, grad_lse?, cu_seqlens_q, cu_seqlens_k,
                                      max_seqlen_q, max_seqlen_k, is_causal, scale, precision, backend) -> (dQ, dK, dV)
  xkernels::attention_with_kvcache(q, k_cache!, v_cache!, cache_seqlens, k?, v?, block_table?, cache_leftpad?,
                                   is_causal, scale, precision, return_lse, num_splits, sync_checks, window_left,
                                   window_right, backend, softcap=0.0)
                                   -> (O, LSE (B, Hq, Sq) or empty)
                                   (writes k, v into the caches first)
  xkernels::matmul(a, b, b_layout, walk, out_dtype, backend) -> C
  xkernels::matmul_out(a, b, out!, b_layout, walk, out_dtype, backend) -> ()
Every dense and varlen attention op (forward and backward) ends with `window_left=-1, window_right=-1,
softcap=0.0` (flash_attn's window_size and softcap), every forward one with `sinks=None` ((Hq,) attention sinks;
their gradient is computed here from O, dO and the LSE), and all of them with `deterministic=True` (flash_attn's;
the forward ops hand it to their backward): defaults, so calls without them keep their positional form.
LSE is (B, H, Sq) fp32; attention_out returns an empty fp32 tensor for it unless `return_lse`. Each op returns one
fixed type; the LSE-less op allocates nothing for an LSE.

Autograd: `attention_lse` saves q, k, v, O and the LSE, and its backward calls `attention_backward` (a gradient on
the LSE output is supported). `attention` has no LSE to save, so its backward first recomputes the forward with the
LSE; the public `xkernels.attention` therefore calls `attention_lse` whenever an input requires grad. The ops with
`out` are not differentiable, like torch's out= functions. `matmul`'s backward is two more `matmul` calls (so it
is differentiable again). `attention_varlen` saves the same and its backward calls
`attention_varlen_backward`; it needs the LSE, so it must run with `return_lse` when an input requires grad (the
public `xkernels.attention_varlen` sees to it). Registered with `torch.library.register_autograd`, so
`torch.compile` traces the backward too; under torch.func's transforms the public functions reach the same
setup_context and backward through `func_transforms` (`call_with_grad`), which also registers the ops' vmap rules.
"""

from __future__ import annotations

import torch

from xkernels import backward, kvcache, plans, varlen
from xkernels.select import (
    resolve_attention,
    resolve_attention_backward,
    resolve_attention_kvcache,
    resolve_attention_varlen,
    resolve_attention_varlen_backward,
    resolve_matmul,
)
from xkernels.validation import (
    NO_WINDOW,
    check_out_memory,
    check_out_storage,
    check_sinks,
    check_softcap,
    check_window,
)

_lib = torch.library.Library("xkernels", "DEF")
_ATTN_ARGS = "bool is_causal, float? scale, bool enable_gqa, str precision, str backend"
# flash_attn's window_size and softcap, last and with defaults, so calls without them keep their positional form
_WINDOW = "int window_left=-1, int window_right=-1, float softcap=0.0"
# flash_attn's deterministic, after everything else (the forward ops take it only to hand it to their backward)
_DETERMINISTIC = "bool deterministic=True"
_SINKS = "Tensor? sinks=None"  # the forward ops' attention sinks (gpt-oss): (Hq,) logits; the backward needs none
_MM_ARGS = "str b_layout, str walk, ScalarType? out_dtype, str backend"
_lib.define(f"attention(Tensor q, Tensor k, Tensor v, {_ATTN_ARGS}, {_WINDOW}, {_SINKS}, {_DETERMINISTIC}) -> Tensor")
_lib.define(f"attention_lse(Tensor q, Tensor k, Tensor v, {_ATTN_ARGS}, {_WINDOW}, {_SINKS}, {_DETERMINISTIC}) "
            "-> (Tensor, Tensor)")
_lib.define(f"attention_out(Tensor q, Tensor k, Tensor v, Tensor(a!) out, {_ATTN_ARGS}, bool return_lse, {_WINDOW}, "
            f"{_SINKS}, {_DETERMINISTIC}) -> Tensor")
_lib.define("attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            f"Tensor? grad_lse, {_ATTN_ARGS}, {_WINDOW}, {_DETERMINISTIC}) -> (Tensor, Tensor, Tensor)")
_lib.define("attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
            "SymInt max_seqlen_q, SymInt max_seqlen_k, bool is_causal, float? scale, str precision, bool return_lse, "
            f"bool sync_checks, str backend, {_WINDOW}, {_SINKS}, {_DETERMINISTIC}) -> (Tensor, Tensor)")
_lib.define("attention_varlen_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            "Tensor? grad_lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, "
            f"bool is_causal, float? scale, str precision, str backend, {_WINDOW}, {_DETERMINISTIC}) "
            "-> (Tensor, Tensor, Tensor)")
_lib.define("attention_with_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, "
            "Tensor? k, Tensor? v, Tensor? block_table, Tensor? cache_leftpad, bool is_causal, float? scale, "
            "str precision, bool return_lse, int num_splits, bool sync_checks, int window_left, int window_right, "
            f"str backend, float softcap=0.0, {_SINKS}) -> (Tensor, Tensor)")
_lib.define(f"matmul(Tensor a, Tensor b, {_MM_ARGS}) -> Tensor")
_lib.define(f"matmul_out(Tensor a, Tensor b, Tensor(a!) out, {_MM_ARGS}) -> ()")
_DEVICES = ("CPU", "CUDA", "XPU")


def _register(name: str, fn) -> None:
    for key in _DEVICES:
        _lib.impl(name, fn, key)


def _window(is_causal: bool, window_left: int, window_right: int, reach: int | None = None) -> tuple[int, int]:
    """The ops' window arguments checked (they may come from a direct op call) and normalized as the API does; with
    `reach` (Sq + Skv, or the longest sequences' sum), a side at least that long cuts no key from any row, whatever
    the alignment: unbounded (-1), so the kernels' int32 positions never wrap, as flash_attn does."""
    if window_left == window_right == -1:
        return NO_WINDOW
    left, right = check_window((window_left, window_right), is_causal)
    if reach is not None:
        left, right = (-1 if side >= reach else side for side in (left, right))
    return left, right


def _dense_window(is_causal: bool, window_left: int, window_right: int, q, k) -> tuple[int, int]:
    """`_window` of a dense call (reach Sq + Skv), without reading the shapes for the common call (no window)."""
    if window_left == window_right == -1:
        return NO_WINDOW
    return _window(is_causal, window_left, window_right, q.shape[-2] + k.shape[-2])


def _softcap(softcap: float) -> float:
    """The ops' softcap checked (a direct op call may pass any float)."""
    return softcap if softcap == 0.0 else check_softcap(softcap)


def _attention(q, k, v, is_causal, scale, enable_gqa, precision, backend, window_left=-1, window_right=-1,
               softcap=0.0, sinks=None, deterministic=True):
    return plans.attention(q, k, v, None, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                           precision=precision, return_lse=False, backend=backend,
                           window=_dense_window(is_causal, window_left, window_right, q, k),
                           softcap=_softcap(softcap), sinks=sinks)[0]


def _attention_lse(q, k, v, is_causal, scale, enable_gqa, precision, backend, window_left=-1, window_right=-1,
                   softcap=0.0, sinks=None, deterministic=True):
    return plans.attention(q, k, v, None, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                           precision=precision, return_lse=True, backend=backend,
                           window=_dense_window(is_causal, window_left, window_right, q, k),
                           softcap=_softcap(softcap), sinks=sinks)


def _attention_out(q, k, v, out, is_causal, scale, enable_gqa, precision, backend, return_lse, window_left=-1,
                   window_right=-1, softcap=0.0, sinks=None, deterministic=True):
    check_out_memory(out, {"q": q, "k": k, "v": v} | ({} if sinks is None else {"sinks": sinks}))
    lse = plans.attention(q, k, v, out, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                          precision=precision, return_lse=return_lse, backend=backend,
                          window=_dense_window(is_causal, window_left, window_right, q, k),
                          softcap=_softcap(softcap), sinks=sinks)[1]
    return q.new_empty(0, dtype=torch.float32) if lse is None else lse


def _attention_backward(grad_out, q, k, v, out, lse, grad_lse, is_causal, scale, enable_gqa, precision, backend,
                        window_left=-1, window_right=-1, softcap=0.0, deterministic=True):
    return backward.attention_backward(grad_out, q, k, v, out, lse, grad_lse, is_causal=is_causal, scale=scale,
                                       enable_gqa=enable_gqa, precision=precision, backend=backend,
                                       window=_dense_window(is_causal, window_left, window_right, q, k),
                                       softcap=_softcap(softcap), deterministic=deterministic)


def _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, precision,
                      return_lse, sync_checks, backend, window_left=-1, window_right=-1, softcap=0.0,
                      sinks=None, deterministic=True):
    return varlen.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   is_causal=is_causal, scale=scale, precision=precision, return_lse=return_lse,
                                   sync_checks=sync_checks, backend=backend,
                                   window=_window(is_causal, window_left, window_right, max_seqlen_q + max_seqlen_k),
                                   softcap=_softcap(softcap), sinks=sinks)


def _attention_varlen_backward(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, is_causal, scale, precision, backend, window_left=-1, window_right=-1,
                               softcap=0.0, deterministic=True):
    # (the packed backward is deterministic whatever `deterministic` says: it has no fused-dQ variant)
    return backward.attention_varlen_backward(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k,
                                              max_seqlen_q, max_seqlen_k, is_causal=is_causal, scale=scale,
                                              precision=precision, backend=backend,
                                              window=_window(is_causal, window_left, window_right,
                                                             max_seqlen_q + max_seqlen_k),
                                              softcap=_softcap(softcap))


def _attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad, is_causal, scale,
                            precision, return_lse, num_splits, sync_checks, window_left, window_right, backend,
                            softcap=0.0, sinks=None):
    check_sinks(sinks, q.shape[2], q.device)
    return kvcache.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad,
                                          is_causal=is_causal, scale=scale, precision=precision,
                                          return_lse=return_lse, num_splits=num_splits, sync_checks=sync_checks,
                                          window=(window_left, window_right), backend=backend,
                                          softcap=_softcap(softcap), sinks=sinks)


def _matmul(a, b, b_layout, walk, out_dtype, backend):
    return plans.matmul(a, b, None, b_layout=b_layout, walk=walk, out_dtype=out_dtype, backend=backend)


def _matmul_out(a, b, out, b_layout, walk, out_dtype, backend):
    check_out_memory(out, {"a": a, "b": b})
    plans.matmul(a, b, out, b_layout=b_layout, walk=walk, out_dtype=out_dtype, backend=backend)


_register("attention", _attention)
_register("attention_lse", _attention_lse)
_register("attention_out", _attention_out)
_register("attention_backward", _attention_backward)
_register("attention_varlen", _attention_varlen)
_register("attention_varlen_backward", _attention_varlen_backward)
_register("attention_with_kvcache", _attention_with_kvcache)
_register("matmul", _matmul)
_register("matmul_out", _matmul_out)


def _resolve_fake(q, k, v, out, is_causal, enable_gqa, precision, backend, window_left, window_right, softcap,
                  sinks) -> None:
    """The dense attention ops' fake kernels run the eager call's checks and choice (`resolve_attention`)."""
    window = _window(is_causal, window_left, window_right, q.shape[-2] + k.shape[-2])
    resolve_attention(q, k, v, out, enable_gqa=enable_gqa, precision=precision, backend=backend,
                      is_causal=is_causal, window=window, softcap=_softcap(softcap), sinks=sinks)


def _fake_lse(q):
    return q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.register_fake("xkernels::attention")
def _(q, k, v, is_causal, scale, enable_gqa, precision, backend, window_left=-1, window_right=-1, softcap=0.0,
      sinks=None, deterministic=True):
    _resolve_fake(q, k, v, None, is_causal, enable_gqa, precision, backend, window_left, window_right, softcap, sinks)
    return plans.output_like(q)


@torch.library.register_fake("xkernels::attention_lse")
def _(q, k, v, is_causal, scale, enable_gqa, precision, backend, window_left=-1, window_right=-1, softcap=0.0,
      sinks=None, deterministic=True):
    _resolve_fake(q, k, v, None, is_causal, enable_gqa, precision, backend, window_left, window_right, softcap, sinks)
    return plans.output_like(q), _fake_lse(q)


@torch.library.register_fake("xkernels::attention_out")
def _(q, k, v, out, is_causal, scale, enable_gqa, precision, backend, return_lse, window_left=-1, window_right=-1,
      softcap=0.0, sinks=None, deterministic=True):
    _resolve_fake(q, k, v, out, is_causal, enable_gqa, precision, backend, window_left, window_right, softcap, sinks)
    check_out_storage(out, {"q": q, "k": k, "v": v})
    return _fake_lse(q) if return_lse else q.new_empty(0, dtype=torch.float32)


@torch.library.register_fake("xkernels::attention_backward")
def _(grad_out, q, k, v, out, lse, grad_lse, is_causal, scale, enable_gqa, precision, backend, window_left=-1,
      window_right=-1, softcap=0.0, deterministic=True):
    window = _window(is_causal, window_left, window_right, q.shape[-2] + k.shape[-2])
    resolve_attention_backward(grad_out, q, k, v, out, lse, grad_lse, enable_gqa=enable_gqa, precision=precision,
                               backend=backend, is_causal=is_causal, window=window, softcap=_softcap(softcap),
                               deterministic=deterministic)
    return backward.grad_like(q), backward.grad_like(k), backward.grad_like(v)


@torch.library.register_fake("xkernels::attention_varlen")
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, precision, return_lse,
      sync_checks, backend, window_left=-1, window_right=-1, softcap=0.0, sinks=None, deterministic=True):
    window = _window(is_causal, window_left, window_right, max_seqlen_q + max_seqlen_k)
    resolve_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             precision=precision, backend=backend, is_causal=is_causal,
                             window=window, softcap=_softcap(softcap),
                             sinks=sinks)
    lse_shape = (q.shape[1], q.shape[0]) if return_lse else (0,)
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.register_fake("xkernels::attention_varlen_backward")
def _(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale,
      precision, backend, window_left=-1, window_right=-1, softcap=0.0, deterministic=True):
    window = _window(is_causal, window_left, window_right, max_seqlen_q + max_seqlen_k)
    resolve_attention_varlen_backward(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k,
                                      max_seqlen_q, max_seqlen_k, precision=precision, backend=backend,
                                      is_causal=is_causal, window=window,
                                      softcap=_softcap(softcap))
    return backward.grad_like(q), backward.grad_like(k), backward.grad_like(v)


@torch.library.register_fake("xkernels::attention_with_kvcache")
def _(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad, is_causal, scale, precision, return_lse,
      num_splits, sync_checks, window_left, window_right, backend, softcap=0.0, sinks=None):
    resolve_attention_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_leftpad, precision=precision,
                              backend=backend)
    _softcap(softcap)
    check_sinks(sinks, q.shape[2], q.device)
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if return_lse else (0,)
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.register_fake("xkernels::matmul")
def _(a, b, b_layout, walk, out_dtype, backend):
    (batch, m, n, _, dtype), _ = resolve_matmul(a, b, None, b_layout=b_layout, out_dtype=out_dtype,
                                                backend=backend)
    return a.new_empty((*batch, m, n), dtype=dtype)


@torch.library.register_fake("xkernels::matmul_out")
def _(a, b, out, b_layout, walk, out_dtype, backend):
    resolve_matmul(a, b, out, b_layout=b_layout, out_dtype=out_dtype, backend=backend)
    check_out_storage(out, {"a": a, "b": b})


# ---- autograd -------------------------------------------------------------------------------------------------------

def _sink_grad(sinks, out, lse, grad_out, grad_lse, *, packed: bool):
    """d loss / d sinks: a sink is a key of value 0, so each row's share of it, P_sink = exp(sink - LSE), takes
    -P_sink * delta, delta = rowsum(dO * O) - dLSE (the backward's delta), summed over the rows of its head. Dense: O
    (B, Hq, Sq, D), LSE (B, Hq, Sq); packed: O (total, Hq, D), LSE (Hq, total). One fp32 pass over O and dO."""
    delta = (grad_out.float() * out.float()).sum(-1)  # (B, Hq, Sq) dense, (total, Hq) packed
    if packed:
        delta, sink, rows = delta.t(), sinks.float()[:, None], (1,)
    else:
        sink, rows = sinks.float()[None, :, None], (0, 2)
    if grad_lse is not None:
        delta = delta - grad_lse
    share = torch.where(lse == float("-inf"), 0.0, torch.exp(sink - lse))  # a -inf sink on a row without keys
    return -(share * delta).sum(rows).to(sinks.dtype)


def _split_sinks(ctx, flags: list, inputs: tuple) -> list:
    """The forward op's trailing flags (..., sinks, deterministic) without its sinks, as the backward op takes them
    (it needs the LSE only); `ctx.sinks` keeps them for save_for_backward, `ctx.sinks_at` their input position.
    (`inputs` has every argument; `ctx.needs_input_grad` may lack trailing ones the call left at their defaults,
    so the sinks' entry is found from the front.)"""
    *flags, ctx.sinks, deterministic = flags
    ctx.sinks_at = len(inputs) - 2
    return [*flags, deterministic]


def _sinks_need_grad(ctx, sinks: list) -> bool:
    return bool(sinks) and ctx.needs_input_grad[ctx.sinks_at]


def _saved_sinks(ctx) -> tuple:
    sinks, ctx.sinks = ctx.sinks, None  # kept by save_for_backward only (torch.func's vmap ctx has no `del`)
    return () if sinks is None else (sinks,)


def _save_lse(ctx, inputs, output) -> None:
    q, k, v, *flags = inputs
    ctx.flags = _split_sinks(ctx, flags, inputs)  # is_causal, ..., backend, window, softcap, deterministic
    ctx.save_for_backward(q, k, v, *output, *_saved_sinks(ctx))
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zero tensor to build and read


def _backward_lse(ctx, grad_out, grad_lse):
    q, k, v, out, lse, *sinks = ctx.saved_tensors
    nones = (None,) * (len(ctx.flags) - 1)  # the flags before the sinks (deterministic comes after them)
    if grad_out is None and grad_lse is None:
        return None, None, None, *nones, None, None
    if grad_out is None:  # only the LSE reached the loss
        grad_out = torch.zeros_like(out)
    dq, dk, dv = _gradient_op(attention_backward_op, grad_out, q, k, v, out, lse, grad_lse, *ctx.flags)
    dsinks = None
    if _sinks_need_grad(ctx, sinks):
        dsinks = _sink_grad(sinks[0], out, lse, grad_out, grad_lse, packed=False)
    return dq, dk, dv, *nones, dsinks, None


def _save_inputs(ctx, inputs, output) -> None:
    q, k, v, *flags = inputs
    ctx.flags = _split_sinks(ctx, flags, inputs)
    ctx.save_for_backward(q, k, v, *_saved_sinks(ctx))


def _backward_recompute(ctx, grad_out):
    q, k, v, *sinks = ctx.saved_tensors
    *flags, deterministic = ctx.flags
    out, lse = _gradient_op(attention_lse_op, q, k, v, *flags, sinks[0] if sinks else None, deterministic)
    dq, dk, dv = _gradient_op(attention_backward_op, grad_out, q, k, v, out, lse, None, *ctx.flags)
    dsinks = None
    if _sinks_need_grad(ctx, sinks):
        dsinks = _sink_grad(sinks[0], out, lse, grad_out, None, packed=False)
    return dq, dk, dv, *(None,) * (len(ctx.flags) - 1), dsinks, None


def _save_varlen(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, precision, _, _, backend, \
        *extras = inputs
    ctx.flags = (max_seqlen_q, max_seqlen_k, is_causal, scale, precision, backend, *_split_sinks(ctx, extras, inputs))
    ctx.save_for_backward(q, k, v, cu_seqlens_q, cu_seqlens_k, *output, *_saved_sinks(ctx))
    ctx.set_materialize_grads(False)


def _backward_varlen(ctx, grad_out, grad_lse):
    q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, *sinks = ctx.saved_tensors
    # cu_seqlens, lengths and flags (return_lse and sync_checks too) before the sinks; deterministic after them
    nones = (None,) * (len(ctx.flags) + 3)
    if grad_out is None and grad_lse is None:
        return None, None, None, *nones, None, None
    if lse.dim() != 2:  # the (0,) placeholder of a call without return_lse
        raise RuntimeError("xkernels::attention_varlen: the backward needs the LSE; call the op with return_lse=True "
                           "when an input requires grad (xkernels.attention_varlen does)")
    if grad_out is None:  # only the LSE reached the loss
        grad_out = torch.zeros_like(out)
    dq, dk, dv = _gradient_op(attention_varlen_backward_op, grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q,
                              cu_seqlens_k, *ctx.flags)
    dsinks = None
    if _sinks_need_grad(ctx, sinks):
        dsinks = _sink_grad(sinks[0], out, lse, grad_out, grad_lse, packed=True)
    return dq, dk, dv, *nones, dsinks, None


def _gradient_op(op, *args):
    """A backward op from an autograd backward: its kernel function directly where `call_without_grad` would run it
    (a plain eager call, grad mode off: no create_graph, whose double backward must reach the op's refusal), else
    the op."""
    if torch.is_grad_enabled():
        return call_with_grad(op, *args)
    return call_without_grad(op, *args)


def _save_nothing(ctx, inputs, output) -> None:
    pass


def _no_double_backward(ctx, *grads):
    raise RuntimeError("xkernels attention (dense or varlen): double backward (a gradient of the gradients, "
                       "create_graph=True) is not supported")


def _save_matmul(ctx, inputs, output) -> None:
    a, b, b_layout, _, _, backend = inputs
    ctx.save_for_backward(a, b)
    ctx.flags = (b_layout, backend)


def _reduced_to(t: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A gradient computed over the broadcast batch, summed back to its input's shape and dtype."""
    return t if t.shape == shape else t.sum_to_size(shape).to(dtype)


def _backward_matmul(ctx, grad):
    """C = A op(B), op(B) = B ("kn", B (K, N)) or B^T ("nk", B (N, K)): dA = dC op(B)^T and dB = A^T dC ("kn") or
    dC^T A ("nk"), each one `matmul`. dC is rounded to the inputs' dtype first when C is wider (out_dtype fp32), as
    the kernels multiply fp16/bf16 operands. A 2-D B's gradient folds A's batch dims into the product's inner
    dim; other broadcasts are summed in fp32 from per-batch products. A forced layer applies to the forward only
    (but "portable", which serves every product)."""
    a, b = ctx.saved_tensors
    b_layout, backend = ctx.flags
    # the products differ from the forward's (batched where it was one problem, fp32 where batches are summed), so a
    # forced Hopper layer or config override might not serve them
    backend = "portable" if backend.partition(":")[0] == "portable" else "auto"
    g = grad if grad.dtype == a.dtype else grad.to(a.dtype)
    da = db = None
    if ctx.needs_input_grad[0]:
        # "kn": B (K, N) read as [N, K] gives dC B^T; "nk": B (N, K) read as [K, N] gives dC B
        wide = None if g.shape[:-2] == a.shape[:-2] else torch.float32
        da = _gradient_op(matmul_op, g, b, "nk" if b_layout == "kn" else "kn", "auto", wide, backend)
        da = _reduced_to(da, a.shape, a.dtype)
    if ctx.needs_input_grad[1]:
        if b.dim() == 2:  # a weight: one product over every row of every batch
            a2, g2 = a.flatten(0, -2), g.flatten(0, -2)
            db = _gradient_op(matmul_op, a2.mT, g2, "kn", "auto", None, backend) if b_layout == "kn" else \
                _gradient_op(matmul_op, g2.mT, a2, "kn", "auto", None, backend)
        else:
            wide = None if g.shape[:-2] == b.shape[:-2] else torch.float32
            db = _gradient_op(matmul_op, a.mT, g, "kn", "auto", wide, backend) if b_layout == "kn" else \
                _gradient_op(matmul_op, g.mT, a, "kn", "auto", wide, backend)
            db = _reduced_to(db, b.shape, b.dtype)
    return da, db, None, None, None, None


# each differentiable op's (setup_context, backward): registered with torch.library below, and reused by
# `func_transforms` for calls under torch.func's transforms
AUTOGRAD = {"attention_lse": (_save_lse, _backward_lse), "attention": (_save_inputs, _backward_recompute),
            "attention_varlen": (_save_varlen, _backward_varlen), "matmul": (_save_matmul, _backward_matmul),
            "attention_backward": (_save_nothing, _no_double_backward),
            "attention_varlen_backward": (_save_nothing, _no_double_backward)}
for _name, (_setup, _backward) in AUTOGRAD.items():
    torch.library.register_autograd(f"xkernels::{_name}", _backward, setup_context=_setup)

_BELOW_AUTOGRAD = getattr(torch._C, "_AutoDispatchBelowAutograd", None)


def _plain_eager(tensors) -> bool:
    """Nothing watches or transforms this call: no compile, functorch or torch.jit tracing, no TorchDispatchMode or
    TorchFunctionMode on the stack, no profiler, plain tensors not on the meta device (whose calls take the ops'
    fake kernels) and without a negative or conjugate bit."""
    if (torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()
            or torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
            or torch.autograd._profiler_enabled() or torch._C._get_tracing_state() is not None):
        return False
    for t in tensors:  # negative- and conjugate-bit views: the dispatcher's fallbacks materialize them
        if t is None:  # an optional tensor argument not given
            continue
        if type(t) is not torch.Tensor or t.is_meta or t.is_neg() or t.is_conj():
            return False
    return True


def call_with_grad(op, *args):
    """`op(*args)` for a call an input of which requires grad: the op (its registered autograd), or under torch.func's
    transforms, which cannot use a torch.library op's autograd, `func_transforms.apply` (torch.compile traces the
    op)."""
    if not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active():
        from xkernels import func_transforms

        return func_transforms.apply(op, *args)
    return op(*args)


def call_without_grad(op, *args):
    """`op(*args)` for a call none of whose inputs needs a gradient (or under no_grad), at the least host cost that
    gives the same result. A plain eager call (`_plain_eager`) runs the op's kernel function directly: the
    dispatcher's round trip into a Python kernel (boxing, the schema's arguments converted back to Python) costs
    ~15 us of host time on an H200 host, as much as the rest of a call. A call that something traces or watches
    goes through the op, past the Autograd key (torch.library's Python autograd kernel would only re-dispatch below
    itself), or, under compile and functorch transforms, through the whole dispatcher."""
    direct = _NO_GRAD_KERNELS.get(op)
    if direct is not None:
        n = len(args)
        if _plain_eager([args[i] for i in direct[1] if i < n]):
            return direct[0](*args)
    if (_BELOW_AUTOGRAD is None or torch.compiler.is_compiling()
            or torch._C._are_functorch_transforms_active()):
        return op(*args)
    with _BELOW_AUTOGRAD():
        return op(*args)


attention_op = torch.ops.xkernels.attention.default
attention_lse_op = torch.ops.xkernels.attention_lse.default
attention_out_op = torch.ops.xkernels.attention_out.default
attention_backward_op = torch.ops.xkernels.attention_backward.default
attention_varlen_op = torch.ops.xkernels.attention_varlen.default
attention_varlen_backward_op = torch.ops.xkernels.attention_varlen_backward.default
attention_with_kvcache_op = torch.ops.xkernels.attention_with_kvcache.default
matmul_op = torch.ops.xkernels.matmul.default
matmul_out_op = torch.ops.xkernels.matmul_out.default

# the kernel functions `call_without_grad` may run directly (ops that write no input: no version counter to bump;
# the KV-cache op only where the API passes no tokens to append), with the positions of their tensor (or optional
# tensor) arguments: the attention ops' sinks are their 12th
_ATTENTION_TENSORS = (0, 1, 2, 11)
_NO_GRAD_KERNELS = {attention_op: (_attention, _ATTENTION_TENSORS),
                    attention_lse_op: (_attention_lse, _ATTENTION_TENSORS), matmul_op: (_matmul, (0, 1)),
                    attention_backward_op: (_attention_backward, tuple(range(7))),
                    attention_varlen_backward_op: (_attention_varlen_backward, tuple(range(9))),
                    attention_with_kvcache_op: (_attention_with_kvcache, (*range(8), 18))}

from xkernels import func_transforms  # noqa: E402  (the ops' vmap rules, registered once the ops exist)

func_transforms.register_batching_rules()
