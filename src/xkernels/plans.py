"""Launch plans: everything about a call that follows from its (shapes, strides, dtypes, device, flags) key,
resolved once and cached, so a repeated call costs a dict lookup, the output allocation and a driver launch.

A plan holds numbers and compiled kernels, never a tensor: the inputs and outputs of a call are freed when the
caller drops them. Its fast path needs layouts that tensor descriptors read as they are (checked once per key) and
16-byte aligned addresses (checked per call); anything else takes the general path, which makes descriptor-ready
copies (visible in `last_backend()`) and launches through Triton's own launcher.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch
import triton

from xkernels import decode, select
from xkernels.common import launch, scratch
from xkernels.common.runtime import (
    sm_count,
    strides_ok,
    strides_ready,
    tma_copy,
    tma_empty,
    tma_ready,
    unit_last_stride,
)
from xkernels.common.seqlen import Band
from xkernels.portable import attention_fwd as portable_attention
from xkernels.portable import gemm as portable_gemm
from xkernels.portable import gemm_skinny
from xkernels.portable.softmax import softcap_name
from xkernels.select import DECODE_MAX_SQ
from xkernels.validation import NO_WINDOW

log = logging.getLogger("xkernels")
_last: str | None = None
_PLANS: dict = {}
_PLANS_MAX = 4096
LOG2E = math.log2(math.e)


def last_backend() -> str | None:
    """The kernel the last eager xkernels call ran, e.g. 'hopper.attention[bf16 BM128-BN128-S2-ov]'."""
    return _last


def _record(name: str) -> None:
    global _last
    _last = name
    if log.isEnabledFor(logging.DEBUG):
        log.debug("xkernels ran %s", name)


def _remember(key: tuple, plan):
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _ready(t: torch.Tensor, name: str, copies: list[str]) -> torch.Tensor:
    if tma_ready(t):
        return t
    copies.append(name)
    return tma_copy(t)


def _suffix(copies: list[str]) -> str:
    return f" copied:{','.join(dict.fromkeys(copies))}" if copies else ""


# ---- attention -----------------------------------------------------------------------------------------------------

def attention_args(q, k, v, out, lse, hq: int, group: int, sq: int, skv: int, qk_scale: float) -> tuple:
    """The runtime arguments of both attention kernels, in order: Q, K, V, O, LSE, the (B, H, S) strides of Q, K, V
    and O, then HQ, GROUP, SQ, SKV and the scale folded with log2(e) for exp2."""
    return (q, k, v, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            hq, group, sq, skv, qk_scale)


def output_strides(shape, stride) -> tuple:
    """O's strides for a q of this shape and stride: q's heads-inner layout where q is a (B, S, H, D) tensor viewed as
    (B, H, S, D) (what projections make and transformers passes; O then transposes back to (B, S, H, D) without a
    copy, as SDPA's O does, and the kernels write it in place), else contiguous. The fake kernels use the same rule,
    so traced strides match eager ones."""
    b, h, s, d = shape
    if stride[1] < stride[2]:
        return (s * h * d, d, h * d, 1)
    return (h * s * d, s * d, d, 1)


def new_output(shape, strides, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized O (tests fill it with NaN to catch rows a kernel leaves unwritten)."""
    return torch.empty_strided(shape, strides, dtype=dtype, device=device)


def output_like(q: torch.Tensor) -> torch.Tensor:
    """An uninitialized O for `q` (`output_strides`)."""
    return new_output(q.shape, output_strides(q.shape, q.stride()), q.dtype, q.device)


class DecodeAttentionPlan:
    """A dense call with few query rows, run by the split-KV kernel (K/V read as a one-page-per-sequence cache). The
    layouts the kernel sees (inputs with a non-unit last stride copied, an output allocated) follow from this plan's
    key, so its decode plan is made on the first call and reused. A plan made for contiguous K and V (`grows`) serves
    every key count: a decoding loop whose cache grows by a token per step (transformers' caches) takes the same
    plan, with the integer arguments of its key count (`decode.DecodePlan.resize`)."""

    def __init__(self, q, k, v, recipe, choice, *, is_causal: bool, return_lse: bool, grows: bool = False,
                 window: tuple[int, int] = NO_WINDOW, softcap: float = 0.0, sinks: bool = False):
        b, hq, sq, d = q.shape
        self.recipe, self.cfg, self.is_causal, self.window = recipe, choice.config, is_causal, window
        self.softcap, self.sinks = softcap, sinks
        self.out_shape, self.dtype, self.device = (b, hq, sq, d), q.dtype, q.device
        self.out_strides = output_strides(q.shape, q.stride())
        self.lse_shape = (b, hq, sq) if return_lse else None
        self.empty = q.numel() == 0
        self.grows = grows
        self.resized: dict[int, decode.Launch] = {}  # launches by key count (contiguous K/V: strides follow)
        self.plan: decode.DecodePlan | None = None
        # the inputs the kernel cannot read as they are: their strides are part of the plan's key
        self.copies = [name for name, t in (("q", q), ("k", k), ("v", v)) if t.stride(-1) != 1]

    def run(self, q, k, v, out, scale: float | None, sinks=None):
        given = out
        if out is None or out.stride(-1) != 1:
            out = new_output(self.out_shape, self.out_strides, self.dtype, self.device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device) if self.lse_shape else None
        if self.empty:
            _record("empty")
            return out, lse
        copies = self.copies
        if copies:
            q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
        if self.plan is None:
            self.plan = decode.dense_plan(q, k, v, out, is_causal=self.is_causal, recipe=self.recipe, cfg=self.cfg,
                                          write_lse=lse is not None, window=self.window, softcap=self.softcap,
                                          sinks=self.sinks)
        plan, at = self.plan, None
        if self.grows and k.shape[2] != plan.g.capacity:  # K and V contiguous: (batch, token, head) strides
            at = self.resized.get(k.shape[2])  # every layer of a model calls with the same key count in a step
            if at is None:
                if len(self.resized) >= 8:
                    self.resized.clear()
                at = self.resized[k.shape[2]] = plan.resize(k.shape[2], (k.stride(0), k.stride(2), k.stride(1)),
                                                            (v.stride(0), v.stride(2), v.stride(1)))
        plan.run(q, k, v, out, lse, None, None, scale, at=at, sinks=sinks)
        if given is not None and given is not out:
            given.copy_(out)
            copies = [*copies, "out"]
            out = given
        _record((at or plan.launch).name + _suffix(copies))
        return out, lse


class AttentionPlan:
    def __init__(self, q, k, v, out, recipe, choice, *, is_causal: bool, return_lse: bool, positive_scale: bool,
                 window: tuple[int, int] = NO_WINDOW, softcap: float = 0.0, sinks: bool = False):
        band = Band.of(is_causal, window)  # a non-causal window of right side 0 and no left one is causal
        is_causal = band.causal
        self.recipe = recipe
        b, hq, sq, d = q.shape
        self.out_shape, self.dtype, self.device = (b, hq, sq, d), q.dtype, q.device
        self.out_strides = output_strides(q.shape, q.stride())
        self.lse_shape = (b, hq, sq) if return_lse else None
        self.default_scale = 1.0 / math.sqrt(d)
        self.empty = q.numel() == 0
        self.group, self.skv = hq // k.shape[1] if k.shape[1] else 1, k.shape[2]
        self.layer = choice.layer
        if choice.layer == "hopper" and choice.config.dense.v_pass and not _dense_layout(v):
            # V's fp16 copy takes V's strides (the plan's integer arguments), which a layout with gaps or overlaps
            # does not give it: the producer converts V instead (the same bits)
            choice = dataclasses.replace(choice, config=choice.config.with_v_pass(0, d, recipe))
        self.dense_cfg = choice.config.dense if choice.layer == "hopper" else None
        if choice.layer == "hopper":
            from xkernels.hopper import attention_fwd as hopper_attention  # Gluon: imported where it can run

            self.fn = hopper_attention.attention_fwd_kernel
            self.grid, self.constexprs, self.options = hopper_attention.launch_spec(
                b, hq, sq, d, is_causal=is_causal, recipe=recipe, positive_scale=positive_scale,
                write_lse=return_lse, cfg=choice.config.dense, band=band, sinks=sinks, softcap=softcap)
        else:
            self.fn = portable_attention.attention_fwd_kernel
            self.grid, self.constexprs, self.options = portable_attention.launch_spec(
                b, hq, sq, d, is_causal=is_causal, recipe=recipe, write_lse=return_lse, cfg=choice.config, band=band,
                softcap=softcap, sinks=sinks)
        self.name = (f"{choice.layer}.attention[{recipe.name} {choice.config}{band}{softcap_name(softcap)}"
                     f"{' sinks' * sinks}]")
        self.tail = launch.constexpr_tail(self.fn, self.constexprs)
        # the fast path: every layout descriptor-ready as it is; its integer arguments follow from the key
        tensors = (q, k, v) if out is None else (q, k, v, out)
        self.direct = launch.direct_launch_available(q.device) and all(strides_ready(t) for t in tensors)
        self.kernel: launch.Kernel | None = None
        if self.direct:
            o_strides = out.stride()[:3] if out is not None else self.out_strides[:3]
            self.ints = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o_strides, hq, self.group, sq, self.skv)
        self.persistent = None
        if (self.direct and choice.layer == "hopper" and not self.empty and choice.config.persistent is not None
                and not (band.windowed or sinks or softcap)):  # the persistent kernel: no band, sinks or cap
            self.persistent = PersistentAttention.make(q, k, v, out, recipe, choice.config.persistent,
                                                       is_causal=is_causal,
                                                       return_lse=return_lse, positive_scale=positive_scale)

    def run(self, q, k, v, out, scale: float | None, sinks=None):
        """(O, LSE or None): LSE is allocated only when the plan writes it. `sinks`: the sink logits (Hq,),
        contiguous (either kernel converts them to fp32), for a plan made with them."""
        if out is None:
            out = new_output(self.out_shape, self.out_strides, self.dtype, self.device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device) if self.lse_shape else None
        if self.empty:
            _record("empty")
            return out, lse
        qk_scale = (self.default_scale if scale is None else scale) * LOG2E
        lse_arg = out if lse is None else lse  # never written when LSE is off
        # both kernels' last runtime argument: the sink logits, or a pointer they never read
        sinks_arg = (out if sinks is None else sinks,)
        if self.direct and not (q.data_ptr() | k.data_ptr() | v.data_ptr() | out.data_ptr()
                                | (0 if sinks is None else sinks.data_ptr())) % 16:
            if self.persistent is not None:
                self.persistent.run(q, k, self._v(v, self.persistent.cfg), out, lse_arg, qk_scale)
                _record(self.persistent.name)
                return out, lse
            v = self._v(v)
            if self.kernel is None:  # first call of this key: compile against these very tensors
                self.kernel = launch.compile_kernel(
                    self.fn, self.grid, attention_args(q, k, v, out, lse_arg, *self.ints[12:], qk_scale)
                    + sinks_arg, self.constexprs, self.options, q.device)
            self.kernel.launch(self.grid, (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                           lse_arg.data_ptr(), *self.ints, qk_scale,
                                           *(t.data_ptr() for t in sinks_arg), *self.tail))
            _record(self.name)
            return out, lse
        copies: list[str] = []
        qq, kk, vv, oo = _ready(q, "q", copies), _ready(k, "k", copies), _ready(v, "v", copies), \
            _ready(out, "out", copies)
        args = attention_args(qq, kk, self._v(vv), oo, oo if lse is None else lse, self.out_shape[1], self.group,
                              self.out_shape[2], self.skv, qk_scale) + sinks_arg
        launch.generic_launch(self.fn, self.grid, args, self.constexprs, self.options)
        if oo is not out:
            out.copy_(oo[..., :self.out_shape[3]])
        _record(self.name + _suffix(copies))
        return out, lse

    def _v(self, v, cfg=None):
        """V as the Hopper bf16io kernel reads it (`cfg`: the kernel's config, the dense one's by default): V's bf16
        bits viewed as fp16, which the producer converts in shared memory, or with `v_pass` V converted to fp16 by one
        elementwise pass, in V's own strides."""
        return (cfg or self.dense_cfg).kernel_v(v, self.recipe) if self.layer == "hopper" else v


def _dense_layout(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill its memory span without gaps or overlaps, in any dimension order: then
    `empty_like` and `to` (preserve_format) keep its strides."""
    return torch.empty_like(t, device="meta").stride() == t.stride()


class PersistentAttention:
    """The Hopper persistent forward (`hopper/attention_persistent.py`) for a plan whose shape and layouts it serves:
    host descriptors over 2-D views of Q, K, V and O, encoded once per address (`launch.DescriptorSlot`)."""

    @classmethod
    def make(cls, q, k, v, out, recipe, cfg, *, is_causal: bool, return_lse: bool,
             positive_scale: bool) -> PersistentAttention | None:
        from xkernels.hopper import attention_persistent as hp

        b, hq, sq, d = q.shape
        o_view = hp.descriptor_view(out if out is not None else torch.empty_strided(
            q.shape, output_strides(q.shape, q.stride()), dtype=q.dtype, device="meta"))
        if o_view is None or not hp.eligible(q, k, v, cfg, recipe, causal=is_causal):
            return None
        return cls(q, k, v, o_view, recipe, cfg, hp, is_causal=is_causal, return_lse=return_lse,
                   positive_scale=positive_scale)

    def __init__(self, q, k, v, o_view, recipe, cfg, hp, *, is_causal: bool, return_lse: bool,
                 positive_scale: bool):
        b, hq, sq, d = q.shape
        hkv, skv = k.shape[1], k.shape[2]
        self.hp, self.cfg, self.device = hp, cfg, q.device
        self.grid, walk, self.constexprs, self.options = hp.launch_spec(
            b, hq, sq, skv, d, hq // hkv, q.element_size(), sm_count(q.device.index), is_causal=is_causal,
            recipe=recipe, positive_scale=positive_scale, write_lse=return_lse, cfg=cfg)
        self.views = [hp.descriptor_view(q), hp.descriptor_view(k), hp.descriptor_view(v), o_view]
        at = self.views[0][2] + self.views[1][2] + o_view[2]
        self.ints = (*at, o_view[1][0], hq, hq // hkv, sq, skv, *walk)
        self.tail = launch.constexpr_tail(hp.attention_persistent_kernel, self.constexprs)
        named = dataclasses.replace(cfg, flat=int(self.constexprs["FLAT"]))  # the resolved loop shows as -fl
        self.name = (f"hopper.attention[{recipe.name} {named} persistent grid={self.grid} "
                     f"walk={self.constexprs['WALK']}]")
        self.kernel: launch.Kernel | None = None
        self.slots: list[launch.DescriptorSlot] = []

    def run(self, q, k, v, out, lse_arg, qk_scale: float) -> None:
        if self.kernel is None:  # first call of this key: compile against descriptors of these very tensors
            descs = self.hp.descriptors((q, k, v, out), self.views, block_n=self.cfg.block_n)
            self.kernel = launch.compile_kernel(self.hp.attention_persistent_kernel, self.grid,
                                                (*descs, lse_arg, out, *self.ints, qk_scale), self.constexprs,
                                                self.options, q.device)
            self.slots = [launch.DescriptorSlot(meta, shape, strides) for meta, (shape, strides, _)
                          in zip(self.kernel.descriptor_meta, self.views, strict=True)]
        dq, dk, dv, do = self.slots
        self.kernel.launch(self.grid, (*dq.at(q.data_ptr()), *dk.at(k.data_ptr()), *dv.at(v.data_ptr()),
                                       *do.at(out.data_ptr()), lse_arg.data_ptr(), out.data_ptr(), *self.ints,
                                       qk_scale, *self.tail))


def _no_keys(q, k, v, out, *, enable_gqa: bool, precision: str, return_lse: bool, backend: str, is_causal: bool,
             window: tuple[int, int], softcap: float, sinks):
    """A call with no key (Skv = 0): every row's O is 0 and its LSE its sink (or -inf), as SDPA and the varlen op
    give a row that sees no key; checked as any call, with no launch (a TMA descriptor cannot describe an empty
    tensor)."""
    select.resolve_attention(q, k, v, out, enable_gqa=enable_gqa, precision=precision, backend=backend,
                             is_causal=is_causal, window=window, softcap=softcap, sinks=sinks)
    out = (output_like(q) if out is None else out).zero_()
    lse = None
    if return_lse:
        b, hq, sq = q.shape[:3]
        lse = (torch.full((b, hq, sq), float("-inf"), device=q.device) if sinks is None
               else sinks.float()[None, :, None].expand(b, hq, sq).contiguous())
    _record("empty")
    return out, lse


_NOT_DECODE = object()  # a growing-cache key whose call does not take the split-KV kernel: use the full key


def attention(q, k, v, out, *, is_causal: bool, scale: float | None, enable_gqa: bool, precision: str,
              return_lse: bool, backend: str, window: tuple[int, int] = NO_WINDOW, softcap: float = 0.0,
              sinks=None):
    """(O, LSE or None); `out` (checked for memory overlap by the caller) receives O when given; `window` a checked
    window_size (`validation.check_window`), `softcap` a checked soft cap (0: none), `sinks` checked (Hq,) sink
    logits or None."""
    has_sinks = sinks is not None
    if has_sinks and sinks.layout == torch.strided and not sinks.is_contiguous():  # (a sparse one fails its check)
        sinks = sinks.contiguous()
    positive = scale is None or scale > 0
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    if len(k_shape) == 4 and k_shape[2] == 0:
        return _no_keys(q, k, v, out, enable_gqa=enable_gqa, precision=precision, return_lse=return_lse,
                        backend=backend, is_causal=is_causal, window=window, softcap=softcap, sinks=sinks)
    if (len(q_shape) == len(k_shape) == len(v_shape) == 4 and q_shape[2] <= DECODE_MAX_SQ and k_shape[2]
            and k.is_contiguous() and v.is_contiguous()):
        # few query rows over contiguous K/V: a key without the key count, so a growing cache keeps its plan
        grows = ("decode", q_shape, q.stride(), k_shape[0], k_shape[1], k_shape[3], v_shape[0], v_shape[1],
                 v_shape[3], k_shape[2] == v_shape[2], q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
                 None if out is None else (out.shape, out.stride(), out.dtype, out.device), is_causal, enable_gqa,
                 precision, return_lse, backend, window, softcap,
                 has_sinks and (sinks.shape, sinks.dtype, sinks.device))
        plan = _PLANS.get(grows)
        if plan is None:
            recipe, choice = select.resolve_attention(q, k, v, out, enable_gqa=enable_gqa, precision=precision,
                                                      backend=backend, is_causal=is_causal, window=window,
                                                      softcap=softcap, sinks=sinks)
            plan = _remember(grows, DecodeAttentionPlan(q, k, v, recipe, choice, is_causal=is_causal,
                                                        return_lse=return_lse, grows=True, window=window,
                                                        softcap=softcap, sinks=has_sinks)
                             if choice.kernel == "decode" else _NOT_DECODE)
        if plan is not _NOT_DECODE:
            return plan.run(q, k, v, out, scale, sinks)
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.device,
           k.device, v.device, None if out is None else (out.shape, out.stride(), out.dtype, out.device),
           is_causal, enable_gqa, precision, return_lse, positive, backend, window, softcap,
           has_sinks and (sinks.shape, sinks.dtype, sinks.device))
    plan = _PLANS.get(key)
    if plan is None:
        recipe, choice = select.resolve_attention(q, k, v, out, enable_gqa=enable_gqa, precision=precision,
                                                  backend=backend, is_causal=is_causal, window=window, softcap=softcap,
                                                  sinks=sinks)
        if choice.kernel == "decode":
            plan = DecodeAttentionPlan(q, k, v, recipe, choice, is_causal=is_causal, return_lse=return_lse,
                                       window=window, softcap=softcap, sinks=has_sinks)
        else:
            plan = AttentionPlan(q, k, v, out, recipe, choice, is_causal=is_causal, return_lse=return_lse,
                                 positive_scale=positive, window=window, softcap=softcap, sinks=has_sinks)
        plan = _remember(key, plan)
    return plan.run(q, k, v, out, scale, sinks)


# ---- matmul --------------------------------------------------------------------------------------------------------

def _as_3d(t: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """(batch..., r, c) -> (prod(batch), r, c); a view where strides allow (broadcast dims keep stride 0)."""
    t = t.expand(*batch, *t.shape[-2:])
    if len(batch) == 1:
        return t
    return t.reshape(-1, *t.shape[-2:]) if batch else t.unsqueeze(0)


def _operands_3d(a, b, batch, k):
    """(a3, b3, names of operands the folding copied): a's batch dims fold into M against a shared 2-D b."""
    if b.dim() == 2 and a.dim() > 2:
        a3, b3 = a.reshape(1, -1, k), b.unsqueeze(0)
    else:
        a3, b3 = _as_3d(a, batch), _as_3d(b, batch)
    copied = [name for name, src, view in (("a", a, a3), ("b", b, b3))
              if view.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()]
    return a3, b3, copied


def _out_3d(out: torch.Tensor, rows: int, cols: int) -> torch.Tensor | None:
    try:
        return out.view(-1, rows, cols)  # never reinterpret out with other strides
    except RuntimeError:
        return None


class MatmulPlan:
    def __init__(self, a, b, out, *, b_layout: str, walk: str, out_dtype, backend: str):
        (batch, m, n, k, out_dtype), choice = select.resolve_matmul(a, b, out, b_layout=b_layout,
                                                                    out_dtype=out_dtype, backend=backend, walk=walk)
        self.out_shape, self.out_dtype, self.device = (*batch, m, n), out_dtype, a.device
        self.batch, self.n, self.k = batch, n, k
        self.b_layout, self.walk = b_layout, "grouped" if walk == "auto" else walk
        self.trivial = "empty" if math.prod(self.out_shape) == 0 else ("zero-k" if k == 0 else None)
        if self.trivial:
            return
        a3, b3, copied = _operands_3d(a, b, batch, k)
        self.problems, self.rows = a3.shape[0], a3.shape[1]
        self.layer, self.cfg, self.skinny = choice.layer, choice.config, choice.kernel == "skinny"
        self.name = f"{choice.layer}.gemm[{b_layout} {self.walk} {choice.config}]"
        if out is None:  # contiguous: descriptor-ready when its rows are 16-byte multiples
            c_strides = (self.rows * n, n, 1)
        else:
            o3 = _out_3d(out, self.rows, n)
            c_strides = o3.stride() if o3 is not None else (0, 0, 0)
        self.direct = (launch.direct_launch_available(a.device) and not copied and strides_ready(a3)
                       and strides_ready(b3) and strides_ok(c_strides, out_dtype.itemsize))
        self.kernel: launch.Kernel | None = None
        if self.layer == "hopper":
            from xkernels.hopper import gemm as hopper_gemm

            self.grid, self.ints, self.constexprs, self.options = hopper_gemm.launch_spec(
                self.rows, n, k, b_layout=b_layout, walk=self.walk, cfg=self.cfg, device_index=a.device.index)
            self.fn, self.descriptors = hopper_gemm.persistent_gemm_kernel, hopper_gemm.descriptors
            # split-K workspace (`_workspace`): a counter per output tile, (split, tile rows, tile cols) fp32
            # partials per tile
            self.slices = self.cfg.split_k
            self.counters = triton.cdiv(self.rows, self.cfg.block_m) * triton.cdiv(n, self.cfg.block_n)
            self.partial_words = self.slices * self.counters * self.cfg.block_m * self.cfg.block_n
            b_shape = (n, k) if b_layout == "nk" else (k, n)
            self.geometry = (((self.rows, k), a3.stride()[1:]), (b_shape, b3.stride()[1:]), ((self.rows, n),
                                                                                          c_strides[1:]))
        elif self.skinny:
            sms = sm_count(a.device.index) if a.device.type == "cuda" else 4  # the interpreter; other backends
            self.grid, self.slices, k_slice, self.constexprs, self.options = gemm_skinny.launch_spec(
                self.rows, n, k, b_layout=b_layout, cfg=self.cfg, sms=sms)
            self.name = f"portable.gemm[{b_layout} {self.cfg} slices={self.slices}]"
            self.fn = gemm_skinny.skinny_gemm_kernel
            self.ints = (self.rows, n, k, a3.stride(1), b3.stride(1), c_strides[1], k_slice)
            # split-K workspace (`_workspace`): a counter per column block, (slice, M, N) fp32 partials
            self.counters = triton.cdiv(n, self.cfg.block_n)
            self.partial_words = self.slices * self.rows * n
        else:
            self.grid, self.walk_args, self.constexprs, self.options = portable_gemm.launch_spec(
                self.problems, self.rows, n, b_layout=b_layout, walk=self.walk, cfg=self.cfg)
            self.fn = portable_gemm.gemm_kernel
            self.ints = (self.rows, n, k, a3.stride(0), a3.stride(1), b3.stride(0), b3.stride(1), c_strides[0],
                         c_strides[1], *self.walk_args)
        self.tail = launch.constexpr_tail(self.fn, self.constexprs)

    def run(self, a, b, out):
        if out is None:
            out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
        if self.trivial:
            _record(self.trivial)
            return out.zero_() if self.trivial == "zero-k" else out
        if self.direct and not (a.data_ptr() | b.data_ptr() | out.data_ptr()) % 16:
            if self.layer == "hopper":
                self._hopper_direct(a, b, out)
            else:
                self._portable_direct(a, b, out)
            _record(self.name)
            return out
        return self._general(a, b, out)

    def _hopper_direct(self, a, b, out):
        if self.kernel is None:
            a2, b2, c2 = a.reshape(-1, self.k), b.reshape(b.shape[-2:]), _out_3d(out, self.rows, self.n)[0]
            descs = self.descriptors(a2, b2, c2, b_layout=self.b_layout, cfg=self.cfg)
            self.kernel = launch.compile_kernel(self.fn, self.grid, (*descs, *self._workspace(out), *self.ints),
                                                self.constexprs, self.options, a.device)
            self.descriptors = [launch.DescriptorSlot(meta, shape, strides)
                                for meta, (shape, strides) in zip(self.kernel.descriptor_meta, self.geometry,
                                                                  strict=True)]
        da, db, dc = self.descriptors
        partials, arrivals = self._workspace(out)
        self.kernel.launch(self.grid, (*da.at(a.data_ptr()), *db.at(b.data_ptr()), *dc.at(out.data_ptr()),
                                       partials.data_ptr(), arrivals.data_ptr(), *self.ints, *self.tail))

    def _portable_direct(self, a, b, out):
        if self.kernel is None:
            a3, b3, _ = _operands_3d(a, b, self.batch, self.k)
            args = (a3, b3, out, *self._workspace(out), *self.ints) if self.skinny else (a3, b3, out, *self.ints)
            self.kernel = launch.compile_kernel(self.fn, self.grid, args, self.constexprs, self.options, a.device)
        if self.skinny:
            partials, arrivals = self._workspace(out)
            self.kernel.launch(self.grid, (a.data_ptr(), b.data_ptr(), out.data_ptr(), partials.data_ptr(),
                                           arrivals.data_ptr(), *self.ints, *self.tail))
        else:
            self.kernel.launch(self.grid, (a.data_ptr(), b.data_ptr(), out.data_ptr(), *self.ints, *self.tail))

    def _workspace(self, out):
        """(fp32 K-slice partials, arrival counters at zero) of a split-K launch (the few-row kernel, or the Hopper
        kernel with split_k > 1): the current stream's set kept across calls (`common.scratch`), or, under
        CUDA-graph capture, one zeroed allocation from the graph's pool. One slice needs neither (the kernel never
        reads them: `out` stands in)."""
        if self.slices == 1:
            return out, out
        counters, partials = scratch.counters_and_partials(out.device, self.counters, self.partial_words)
        return partials, counters

    def _general(self, a, b, out):
        """Descriptor-ready copies where needed, then Triton's own launcher (the interpreter's path too)."""
        n, k = self.n, self.k
        a3, b3, copies = _operands_3d(a, b, self.batch, k)
        a3, b3 = _ready(a3, "a", copies), _ready(b3, "b", copies)
        c3 = _out_3d(out, self.rows, n)
        if c3 is None or not tma_ready(c3):
            copies.append("out")
            c3 = tma_empty((self.problems, self.rows, n), self.out_dtype, self.device)
        if self.skinny:
            a2 = a3[0, :, :k] if a3.shape[2] != k else a3[0]
            b2 = b3[0, :n, :k] if self.b_layout == "nk" else b3[0, :k, :n]
            args = (a2, b2, c3[0], *self._workspace(out), self.rows, n, k, a2.stride(0), b2.stride(0),
                    c3.stride(1), self.ints[-1])
        elif self.layer == "hopper":
            a2 = a3[0, :, :k] if a3.shape[2] != k else a3[0]
            b2 = b3[0, :n, :k] if self.b_layout == "nk" else b3[0, :k, :n]
            descs = self.descriptors(a2, b2, c3[0, :, :n], b_layout=self.b_layout, cfg=self.cfg)
            args = (*descs, *self._workspace(out), *self.ints)
        else:
            args = (a3, b3, c3, self.rows, n, k, a3.stride(0), a3.stride(1), b3.stride(0), b3.stride(1),
                    c3.stride(0), c3.stride(1), *self.walk_args)
        launch.generic_launch(self.fn, self.grid, args, self.constexprs, self.options)
        if "out" in copies:
            out.copy_(c3[..., :n].reshape(out.shape))
        _record(self.name + _suffix(copies))
        return out


def matmul(a, b, out, *, b_layout: str, walk: str, out_dtype, backend: str):
    key = (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device,
           None if out is None else (out.shape, out.stride(), out.dtype, out.device), b_layout, walk, out_dtype,
           backend)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _remember(key, MatmulPlan(a, b, out, b_layout=b_layout, walk=walk, out_dtype=out_dtype,
                                         backend=backend))
    return plan.run(a, b, out)

