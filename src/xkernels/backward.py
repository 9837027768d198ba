"""Host path of the attention backward: the layouts its kernels read, the gradient buffers, and the launch.

Autograd reaches it through `xkernels::attention_backward` and `xkernels::attention_varlen_backward` (registered in
`ops.py`); the forward saved q, k, v, O and the fp32 LSE, nothing of size S x S.
"""

from __future__ import annotations

import math

import torch
import triton

from xkernels import plans, select
from xkernels.common import scratch
from xkernels.common.runtime import side_stream, unit_last_stride
from xkernels.common.seqlen import Band
from xkernels.hopper.views import descriptor_view, tight
from xkernels.portable import attention_bwd as portable_bwd
from xkernels.portable.cu_seqlens import checked_on_device
from xkernels.portable.softmax import softcap_name
from xkernels.validation import NO_WINDOW


def grad_like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialized gradient for `t`: its layout where the kernels can write it (unit last stride), else
    contiguous. The fake kernel uses the same rule, so traced strides match eager ones."""
    g = torch.empty_like(t)
    return g if g.stride(-1) == 1 else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def attention_backward(grad_out, q, k, v, out, lse, grad_lse, *, is_causal: bool, scale: float | None,
                       enable_gqa: bool, precision: str, backend: str, window: tuple[int, int] = NO_WINDOW,
                       softcap: float = 0.0, deterministic: bool = True):
    """(dQ, dK, dV) of O = attention(q, k, v) for the upstream gradients dO (and dLSE, or None): dK and dV summed
    over each GQA group, in the inputs' dtypes; `window` and `softcap` the forward's, checked; `deterministic`
    False lets the selection take the fused-dQ kernel (not bitwise repeatable). The call's plan (`BackwardPlan`)
    is found by its key."""
    key = ("attention_backward", grad_out.shape, grad_out.stride(), grad_out.dtype, grad_out.device, q.shape,
           q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(), v.dtype,
           v.device, out.shape, out.stride(), out.dtype, out.device, lse.shape, lse.stride(), lse.dtype, lse.device,
           None if grad_lse is None else (grad_lse.shape, grad_lse.stride(), grad_lse.dtype, grad_lse.device),
           is_causal, enable_gqa, precision, backend, window, softcap, deterministic)
    plan = plans._PLANS.get(key)
    if plan is None:
        plan = plans._remember(key, BackwardPlan(grad_out, q, k, v, out, lse, grad_lse, is_causal=is_causal,
                                                 enable_gqa=enable_gqa, precision=precision, backend=backend,
                                                 window=window, softcap=softcap, deterministic=deterministic))
    return plan.run(grad_out, q, k, v, out, lse, grad_lse, scale)


class BackwardPlan:
    """What a dense backward call's key fixes: the checks (run once per key, as the forward's plans do), the kernels'
    choice and, on the direct path, each launch's argument kinds, integer arguments and descriptor geometry
    (`launch.Prepared`), so a repeated call costs its allocations (dQ, dK, dV, delta; the fused-dQ variant's fp32
    dQ buffer) and three direct launches (preprocess, dK/dV, then dQ or, fused, the scaling of the dQ buffer).

    The direct path serves the Hopper kernels with the Gluon dQ kernel, or with dQ fused into dK/dV, on inputs their
    descriptors read in place (q and dO, k and v in pairs of one 2-D view geometry, `_shared_geometry`: heads-outer
    or sequence-outer, as transformers and flash_attn callers hold them; O with a unit last stride; LSE and dLSE
    contiguous) at 16-byte aligned addresses (checked per call). Anything else takes `_general`, which copies what
    the kernels cannot read as it is (`_readable`) and launches through `launch.run`. A plan holds numbers and
    compiled kernels, never a tensor."""

    def __init__(self, grad_out, q, k, v, out, lse, grad_lse, *, is_causal: bool, enable_gqa: bool, precision: str,
                 backend: str, window: tuple[int, int] = NO_WINDOW, softcap: float = 0.0,
                 deterministic: bool = True):
        _, self.choice = select.resolve_attention_backward(grad_out, q, k, v, out, lse, grad_lse,
                                                           enable_gqa=enable_gqa, precision=precision,
                                                           backend=backend, is_causal=is_causal, window=window,
                                                           softcap=softcap, deterministic=deterministic)
        self.band, self.softcap = Band.of(is_causal, window), softcap
        self.is_causal = self.band.causal
        self.empty = q.numel() == 0 or k.numel() == 0
        self.default_scale = 1.0 / math.sqrt(q.shape[-1])
        self.device = q.device
        cfg = self.choice.config
        from xkernels.common import launch

        self.fused = self.choice.layer == "hopper" and bool(cfg.dkdv.fused_dq)
        self.geometry = _shared_geometry(q, grad_out), _shared_geometry(k, v)
        self.direct = (self.choice.layer == "hopper" and not self.empty
                       and (cfg.dq is not None or self.fused) and launch.direct_launch_available(q.device)
                       and None not in self.geometry and lse.is_contiguous()
                       and out.stride(-1) == 1 and (grad_lse is None or grad_lse.is_contiguous()))
        self.name = f"{self.choice.layer}.attention_backward[{cfg}{self.band}{softcap_name(softcap)}]"
        self.launches: tuple | None = None

    def run(self, grad_out, q, k, v, out, lse, grad_lse, scale: float | None):
        dq, dk, dv = grad_like(q), grad_like(k), grad_like(v)
        if self.empty:
            dq.zero_(), dk.zero_(), dv.zero_()
            plans._record("empty")
            return dq, dk, dv
        scale = self.default_scale if scale is None else scale
        addresses = q.data_ptr() | k.data_ptr() | v.data_ptr() | grad_out.data_ptr() | out.data_ptr() | lse.data_ptr()
        if self.direct and not (addresses | (0 if grad_lse is None else grad_lse.data_ptr())) % 16:
            self._direct(grad_out, q, k, v, out, lse, grad_lse, dq, dk, dv, scale)
            plans._record(self.name)
            return dq, dk, dv
        _general(grad_out, q, k, v, out, lse, grad_lse, dq, dk, dv, is_causal=self.is_causal, scale=scale,
                 choice=self.choice, band=self.band, softcap=self.softcap)
        return dq, dk, dv

    def _prepare(self, q, k, v, out, grad_out, dq, dk, dv, has_dlse: bool) -> tuple:
        """The three launches (`launch.Prepared`) and their integer arguments, from the first direct call's tensors
        (the key fixes every layout, so the next call's are alike)."""
        from xkernels.common import launch
        from xkernels.hopper import attention_bwd as hopper_bwd
        from xkernels.hopper import attention_dq as hopper_dq

        b, hq, sq, d = q.shape
        hkv, skv = k.shape[1], k.shape[2]
        cfg = self.choice.config
        pre_cfg, kv_cfg, dq_cfg = cfg.portable, cfg.dkdv, cfg.dq
        view = hopper_bwd.view_geometry  # [rows, D] boxes over a 2-D view of the tensor
        geometry = (*self.geometry[0], *self.geometry[1])  # the views' row and column steps, for the kernels

        fused = bool(kv_cfg.fused_dq)
        row_blocks = triton.cdiv(sq, pre_cfg.q_m) * b * hq
        # fused: the preprocess also zeroes the fp32 dQ buffer, which the dK/dV kernel reduces into
        pre = launch.Prepared(portable_bwd.preprocess_kernel, row_blocks,
                              dict(HEAD_DIM=d, BLOCK_M=pre_cfg.q_m, HAS_DLSE=has_dlse, ZERO_DQ=fused, VARLEN=False),
                              dict(num_warps=pre_cfg.num_warps))
        pre_ints = (*out.stride()[:3], *grad_out.stride()[:3], 0, hq, sq)
        # argument 4: the fp32 dQ buffer where fused, else a stand-in (Q's descriptor)
        accum = hopper_bwd.dq_accum_geometry(b * hq * sq, d, kv_cfg) if fused else view(q, kv_cfg.block_m)
        dkdv = launch.Prepared(hopper_bwd.attention_dkdv_kernel, hopper_bwd.grid(b, hkv, skv, kv_cfg),
                               kv_cfg.constexprs(d, causal=self.is_causal, band=self.band,
                                                 whole_key_blocks=skv % kv_cfg.block_n == 0), {},
                               {0: view(q, kv_cfg.block_m), 1: view(k, kv_cfg.block_n), 2: view(v, kv_cfg.block_n),
                                3: view(grad_out, kv_cfg.block_m), 4: accum})
        # the dense kernel never reads cu_seqlens (lse stands in) nor the packed LSE's head stride (0)
        dkdv_ints = (*dk.stride()[:3], *dv.stride()[:3], 0, *geometry, hq, hkv, hq // hkv, sq, skv)
        if fused:  # dq = scale * buffer, in dq's dtype
            finish = launch.Prepared(portable_bwd.dq_finish_kernel, row_blocks,
                                     dict(HEAD_DIM=d, BLOCK_M=pre_cfg.q_m), dict(num_warps=pre_cfg.num_warps))
            return pre, pre_ints, dkdv, dkdv_ints, finish, (*dq.stride()[:3], hq, sq), False
        dqk = launch.Prepared(hopper_dq.attention_dq_kernel, hopper_dq.grid(b, hq, sq),
                              dq_cfg.constexprs(d, causal=self.is_causal, band=self.band), {},
                              {0: view(q, 64), 1: view(k, dq_cfg.block_n), 2: view(v, dq_cfg.block_n),
                               3: view(grad_out, 64)})
        dq_ints = (*dq.stride()[:3], 0, *geometry, hq, hq // hkv, sq, skv)
        concurrent = cfg.concurrent_dq
        return pre, pre_ints, dkdv, dkdv_ints, dqk, dq_ints, concurrent

    def _direct(self, grad_out, q, k, v, out, lse, grad_lse, dq, dk, dv, scale: float) -> None:
        if self.launches is None:
            self.launches = self._prepare(q, k, v, out, grad_out, dq, dk, dv, grad_lse is not None)
        pre, pre_ints, dkdv, dkdv_ints, dqk, dq_ints, concurrent = self.launches
        b, hq, sq, d = q.shape
        delta = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
        qk_scale = scale * plans.LOG2E
        if self.fused:
            dq_accum = torch.empty((b, hq, sq, d), dtype=torch.float32, device=q.device)
            pre((out, grad_out, delta if grad_lse is None else grad_lse, delta, dq_accum, out, *pre_ints))
            dkdv((q, k, v, grad_out, dq_accum, lse, delta, dk, dv, lse, lse, *dkdv_ints, qk_scale, scale, lse, lse))
            dqk((dq_accum, dq, *dq_ints, scale))
            return
        pre((out, grad_out, delta if grad_lse is None else grad_lse, delta, delta, out, *pre_ints))
        dkdv_args = (q, k, v, grad_out, q, lse, delta, dk, dv, lse, lse, *dkdv_ints, qk_scale, scale,
                     *_group_scratch(self.choice.config.dkdv, b, k.shape[1], k.shape[2], d, lse))
        dq_args = (q, k, v, grad_out, lse, delta, dq, lse, lse, *dq_ints, qk_scale, scale)
        if not concurrent:
            dkdv(dkdv_args)
            dqk(dq_args)
            return
        # dQ on the side stream, forked after the preprocess (every input and delta ready there) and joined after
        # it: its CTAs fill the SMs that dK/dV's last wave leaves idle (as `_dkdv_then_dq`)
        current = torch.cuda.current_stream(self.device)
        side = side_stream(self.device.index)
        side.wait_stream(current)
        dkdv(dkdv_args)
        dqk(dq_args, side.cuda_stream)
        current.wait_stream(side)


def _general(grad_out, q, k, v, out, lse, grad_lse, dq, dk, dv, *, is_causal: bool, scale: float, choice,
             band: Band, softcap: float = 0.0) -> None:
    """Any layout: copies where a kernel cannot read a tensor as it is, then the chosen kernels (`_hopper`, or the
    portable backward; both apply a sliding window `band`, the portable one a soft cap too), launched through
    `launch.run`."""
    grad_lse = None if grad_lse is None else grad_lse.contiguous()
    q, k, v, out, grad_out, lse = (unit_last_stride(q), unit_last_stride(k), unit_last_stride(v),
                                   unit_last_stride(out), unit_last_stride(grad_out), lse.contiguous())
    if choice.layer == "hopper":
        _hopper(q, k, v, out, lse, grad_out, dq, dk, dv, grad_lse, is_causal=is_causal, scale=scale,
                cfg=choice.config, band=band)
        plans._record(f"hopper.attention_backward[{choice.config}{band}]")
        return
    portable_bwd.launch(q, k, v, out, lse, grad_out, dq, dk, dv, grad_lse, is_causal=is_causal, scale=scale,
                        cfg=choice.config, band=band, softcap=softcap)
    plans._record(f"portable.attention_backward[{choice.config}{band}{softcap_name(softcap)}]")


def attention_varlen_backward(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                              max_seqlen_k: int, *, is_causal: bool, scale: float | None, precision: str,
                              backend: str, window: tuple[int, int] = NO_WINDOW, softcap: float = 0.0):
    """(dQ, dK, dV) of a packed varlen forward (q (total_q, Hq, D), LSE (Hq, total_q)), causal (and `window`)
    bottom-right, dK and dV summed over each GQA group, by the kernels `select.resolve_attention_varlen_backward`
    picks. The cu_seqlens are checked on the device (`cu_seqlens.checked_on_device`), as the forward's
    `sync_checks=False` does (the forward already raised on bad values with `sync_checks`; the saved tensors cannot
    change in between without autograd refusing, but a direct op caller may pass any): a bad call writes nothing
    and returns NaN gradients. The call's plan (`VarlenBackwardPlan`) is found by its key. The max_seqlen bounds
    are cut at the packed totals, as the forward's."""
    max_seqlen_q, max_seqlen_k = min(max_seqlen_q, q.shape[0]), min(max_seqlen_k, k.shape[0])
    key = ("attention_varlen_backward", *(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in
                                          (grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k)),
           max_seqlen_q, max_seqlen_k, is_causal, precision, backend, window, softcap)
    plan = plans._PLANS.get(key)
    if plan is None:
        plan = plans._remember(key, VarlenBackwardPlan(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q,
                                                       cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=is_causal,
                                                       precision=precision, backend=backend, window=window,
                                                       softcap=softcap))
    return plan.run(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, scale)


class VarlenBackwardPlan:
    """What a packed backward call's key fixes (as `BackwardPlan` for dense calls): the checks and the kernels'
    choice once per key and, on the direct path, the four launches (the cu_seqlens check, the preprocess, the Gluon
    dK/dV and dQ kernels' VARLEN variants: `launch.Prepared`), so a repeated call costs its allocations and four
    direct launches. The direct path serves the Hopper kernels on inputs their packed descriptors read as they are
    (`hopper_bwd.packed_ready`, checked per call for the addresses), O with a unit last stride and contiguous LSE,
    dLSE and cu_seqlens; anything else takes `_varlen_general`. A plan holds numbers and compiled kernels, never a
    tensor."""

    def __init__(self, grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                 max_seqlen_k: int, *, is_causal: bool, precision: str, backend: str,
                 window: tuple[int, int] = NO_WINDOW, softcap: float = 0.0):
        _, self.choice = select.resolve_attention_varlen_backward(
            grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            precision=precision, backend=backend, is_causal=is_causal, window=window, softcap=softcap)
        self.band, self.softcap = Band.of(is_causal, window), softcap
        self.max_seqlen_q, self.max_seqlen_k = max_seqlen_q, max_seqlen_k
        self.batch = cu_seqlens_q.shape[0] - 1
        self.empty = q.shape[0] == 0 or k.shape[0] == 0 or cu_seqlens_q.shape[0] < 2 or max_seqlen_q == 0
        self.default_scale = 1.0 / math.sqrt(q.shape[-1])
        from xkernels.common import launch

        self.direct = (self.choice.layer == "hopper" and not self.empty and launch.direct_launch_available(q.device)
                       and out.stride(-1) == 1 and lse.is_contiguous()
                       and (grad_lse is None or grad_lse.is_contiguous())
                       and cu_seqlens_q.is_contiguous() and cu_seqlens_k.is_contiguous())
        if self.direct:  # the descriptors' strides (their addresses are checked per call)
            from xkernels.hopper import attention_bwd as hopper_bwd

            self.direct = all(hopper_bwd.packed_layout_ready(t) for t in (q, k, v, grad_out))
        cfg = self.choice.config
        self.name = (f"{self.choice.layer}.attention_varlen_backward[{cfg}{self.band}"
                     f"{softcap_name(softcap)}]")
        self.launches: tuple | None = None

    def run(self, grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, scale: float | None):
        dq, dk, dv = grad_like(q), grad_like(k), grad_like(v)
        scale = self.default_scale if scale is None else scale
        addresses = (q.data_ptr() | k.data_ptr() | v.data_ptr() | grad_out.data_ptr() | out.data_ptr()
                     | lse.data_ptr() | cu_seqlens_q.data_ptr() | cu_seqlens_k.data_ptr()
                     | (0 if grad_lse is None else grad_lse.data_ptr()))
        if self.direct and not addresses % 16:
            self._direct(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, dq, dk, dv, scale)
            plans._record(self.name)
            return dq, dk, dv
        _varlen_general(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, self.max_seqlen_q,
                        self.max_seqlen_k, dq, dk, dv, empty=self.empty, scale=scale, choice=self.choice,
                        band=self.band, softcap=self.softcap)
        plans._record("empty" if self.empty else self.name)
        return dq, dk, dv

    def _prepare(self, q, k, v, out, grad_out, dq, dk, dv, has_dlse: bool) -> tuple:
        """The four launches and their integer arguments, from the first direct call's tensors (the key fixes every
        layout and size, so the next call's are alike)."""
        from xkernels.common import launch
        from xkernels.hopper import attention_bwd as hopper_bwd
        from xkernels.hopper import attention_dq as hopper_dq
        from xkernels.portable import cu_seqlens

        total_q, hq, d = q.shape
        total_k, hkv = k.shape[0], k.shape[1]
        cfg = self.choice.config
        pre_cfg, kv_cfg, dq_cfg = cfg.portable, cfg.dkdv, cfg.dq
        batch = self.batch
        max_q, max_k = self.max_seqlen_q, self.max_seqlen_k

        packed = hopper_bwd.packed_geometry
        check = launch.Prepared(cu_seqlens.cu_seqlens_check_kernel,
                                *cu_seqlens.launch_spec(batch + 1, (dq.numel(), dk.numel(), dv.numel())))
        check_ints = (total_q, total_k, max_q, max_k)
        pre = launch.Prepared(portable_bwd.preprocess_kernel, triton.cdiv(max_q, pre_cfg.q_m) * batch * hq,
                              dict(HEAD_DIM=d, BLOCK_M=pre_cfg.q_m, HAS_DLSE=has_dlse, ZERO_DQ=False, VARLEN=True),
                              dict(num_warps=pre_cfg.num_warps))
        pre_ints = (0, out.stride(1), out.stride(0), 0, grad_out.stride(1), grad_out.stride(0), total_q, hq, max_q)
        dkdv = launch.Prepared(hopper_bwd.attention_dkdv_kernel, hopper_bwd.grid(batch, hkv, max_k, kv_cfg),
                               kv_cfg.constexprs(d, causal=self.band.causal, varlen=True, band=self.band), {},
                               {0: packed(q, kv_cfg.block_m), 1: packed(k, kv_cfg.block_n),
                                2: packed(v, kv_cfg.block_n), 3: packed(grad_out, kv_cfg.block_m),
                                4: packed(q, kv_cfg.block_m)})
        dkdv_ints = (0, dk.stride(1), dk.stride(0), 0, dv.stride(1), dv.stride(0), total_q, *_packed_geometry(d), hq,
                     hkv, hq // hkv, max_q, max_k)
        dqk = launch.Prepared(hopper_dq.attention_dq_kernel, hopper_dq.grid(batch, hq, max_q),
                              dq_cfg.constexprs(d, causal=self.band.causal, varlen=True, band=self.band), {},
                              {0: packed(q, 64), 1: packed(k, dq_cfg.block_n), 2: packed(v, dq_cfg.block_n),
                               3: packed(grad_out, 64)})
        dq_ints = (0, dq.stride(1), dq.stride(0), total_q, *_packed_geometry(d), hq, hq // hkv, max_q, max_k)
        return check, check_ints, pre, pre_ints, dkdv, dkdv_ints, dqk, dq_ints

    def _direct(self, grad_out, q, k, v, out, lse, grad_lse, cu_q, cu_k, dq, dk, dv, scale: float) -> None:
        from xkernels.portable import cu_seqlens

        if self.launches is None:
            self.launches = self._prepare(q, k, v, out, grad_out, dq, dk, dv, grad_lse is not None)
        check, check_ints, pre, pre_ints, dkdv, dkdv_ints, dqk, dq_ints = self.launches
        checked = torch.empty((2, cu_q.shape[0]), dtype=torch.int32, device=q.device)
        # a bad call: every sequence empty (the kernels touch nothing), the gradients NaN
        check(cu_seqlens.check_args(cu_q, cu_k, checked, *check_ints, (dq, dk, dv)))
        cu_q, cu_k = checked[0], checked[1]
        hq, total_q = lse.shape
        delta = torch.empty((hq, total_q), dtype=torch.float32, device=q.device)
        pre((out, grad_out, delta if grad_lse is None else grad_lse, delta, delta, cu_q, *pre_ints))
        qk_scale = scale * plans.LOG2E
        dkdv_args = (q, k, v, grad_out, q, lse, delta, dk, dv, cu_q, cu_k, *dkdv_ints, qk_scale, scale, lse, lse)
        dq_args = (q, k, v, grad_out, lse, delta, dq, cu_q, cu_k, *dq_ints, qk_scale, scale)
        _dkdv_then_dq(q.device, lambda: dkdv(dkdv_args), lambda: dqk(dq_args),
                      concurrent=self.choice.config.concurrent_dq)


def _varlen_general(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                    max_seqlen_k: int, dq, dk, dv, *, empty: bool, scale: float, choice, band: Band,
                    softcap: float) -> None:
    """Any layout, any device: the cu_seqlens check, then copies where a kernel cannot read a tensor as it is and
    the chosen kernels (`_varlen_launch`), launched through `launch.run`."""
    if empty:  # no query row (no gradient reaches k, v) or no key (O = 0 everywhere)
        dq.zero_(), dk.zero_(), dv.zero_()
    # a bad call: every sequence empty (the kernels touch nothing), the gradients NaN (over the zeros too)
    cu_seqlens_q, cu_seqlens_k = checked_on_device(cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), q.shape[0],
                                                   k.shape[0], max_seqlen_q, max_seqlen_k, (dq, dk, dv))
    if empty:
        return
    grad_lse = None if grad_lse is None else grad_lse.contiguous()
    packed = portable_bwd.Packed(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    _varlen_launch(q, k, v, out, lse.contiguous(), grad_out, dq, dk, dv, grad_lse, packed, is_causal=band.causal,
                   scale=scale, choice=choice, band=band, softcap=softcap)


def _varlen_launch(q, k, v, out, lse, grad_out, dq, dk, dv, grad_lse, packed, *, is_causal: bool, scale: float,
                   choice, band: Band, softcap: float = 0.0) -> None:
    """The packed backward's kernels: the portable ones (which apply a sliding window `band`), or (choice "hopper")
    the portable preprocess, then the Gluon dK/dV and dQ kernels' VARLEN variants over packed (total, H * D)
    descriptors, dQ beside dK/dV as in `_hopper`."""
    if choice.layer != "hopper":
        portable_bwd.launch(unit_last_stride(q), unit_last_stride(k), unit_last_stride(v), unit_last_stride(out), lse,
                            unit_last_stride(grad_out), dq, dk, dv, grad_lse, is_causal=is_causal, scale=scale,
                            cfg=choice.config, packed=packed, band=band, softcap=softcap)
        return
    from xkernels.common import launch
    from xkernels.hopper import attention_bwd as hopper_bwd
    from xkernels.hopper import attention_dq as hopper_dq

    cfg = choice.config
    total_q, hq, d = q.shape
    hkv = k.shape[1]
    delta = portable_bwd.preprocess(unit_last_stride(out), unit_last_stride(grad_out), grad_lse,
                                    block_m=cfg.portable.q_m, num_warps=cfg.portable.num_warps, packed=packed)
    # a copy (a fresh, aligned allocation) where the layout or the base address does not suit a descriptor
    qp, kp, vp, dop = (t if hopper_bwd.packed_ready(t) else t.clone(memory_format=torch.contiguous_format)
                       for t in (q, k, v, grad_out))
    ints = (hq, hq // hkv, packed.max_seqlen_q, packed.max_seqlen_k, scale * math.log2(math.e), scale)
    descs = [hopper_bwd.packed_descriptor(t, rows) for t, rows in ((qp, cfg.dkdv.block_m), (kp, cfg.dkdv.block_n),
                                                                   (vp, cfg.dkdv.block_n), (dop, cfg.dkdv.block_m))]

    def dkdv() -> None:
        args = (*descs, descs[0], lse, delta, dk, dv, packed.cu_seqlens_q, packed.cu_seqlens_k, 0, dk.stride(1),
                dk.stride(0), 0, dv.stride(1), dv.stride(0), total_q, *_packed_geometry(d), hq, hkv, *ints[1:],
                lse, lse)
        launch.run(hopper_bwd.attention_dkdv_kernel,
                   hopper_bwd.grid(packed.batch, hkv, packed.max_seqlen_k, cfg.dkdv), args,
                   cfg.dkdv.constexprs(d, causal=is_causal, varlen=True, band=band), {})

    def dq_kernel() -> None:
        dq_descs = [hopper_bwd.packed_descriptor(t, rows) for t, rows in ((qp, 64), (kp, cfg.dq.block_n),
                                                                          (vp, cfg.dq.block_n), (dop, 64))]
        args = (*dq_descs, lse, delta, dq, packed.cu_seqlens_q, packed.cu_seqlens_k, 0, dq.stride(1), dq.stride(0),
                total_q, *_packed_geometry(d), *ints)
        launch.run(hopper_dq.attention_dq_kernel, hopper_dq.grid(packed.batch, hq, packed.max_seqlen_q),
                   args, cfg.dq.constexprs(d, causal=is_causal, varlen=True, band=band), {})

    _dkdv_then_dq(q.device, dkdv, dq_kernel, concurrent=cfg.concurrent_dq and q.is_cuda)


def _dkdv_then_dq(device: torch.device, dkdv, dq, *, concurrent: bool) -> None:
    """Launch the dK/dV kernel, then the dQ kernel. `concurrent`: dQ on a side stream forked before dK/dV (every
    input and delta are ready there) and joined after, so its CTAs fill the SMs that dK/dV's last wave leaves idle
    (the two read the same inputs and write disjoint outputs; the join orders every later use and free after both).
    Capturable: the fork and join become graph edges."""
    if not concurrent:
        dkdv()
        dq()
        return
    current = torch.cuda.current_stream(device)
    inputs_ready = torch.cuda.Event()
    inputs_ready.record(current)
    dkdv()  # the longer kernel first; dQ's CTAs take the SMs as they free up
    side = side_stream(device.index)
    side.wait_event(inputs_ready)
    with torch.cuda.stream(side):
        dq()
    current.wait_stream(side)  # the join: dq is written before anything later on this stream


def _group_scratch(cfg, batch: int, kv_heads: int, skv: int, d: int, stand_in: torch.Tensor) -> tuple:
    """(fp32 partials, int32 counters at zero) of a dK/dV launch that splits its GQA groups over programs
    (`cfg.group_parts`, `attention_bwd.group_workspace`), kept per stream (`common.scratch`); else `stand_in` twice
    (the kernel never reads them)."""
    if cfg.group_parts == 1:
        return stand_in, stand_in
    from xkernels.hopper import attention_bwd as hopper_bwd

    counters, words = hopper_bwd.group_workspace(batch, kv_heads, skv, cfg, d)
    cnt, ws = scratch.counters_and_partials(stand_in.device, counters, words)
    return ws, cnt


def _packed_geometry(d: int) -> tuple[int, ...]:
    """The kernels' view steps (rows_b, rows_h, cols_h of Q/dO, then of K/V) on packed (total, H * D) views: rows
    from the sequence's first (cu_seqlens), head h at column h * D."""
    return 0, 0, d, 0, 0, d


def _shared_geometry(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int] | None:
    """The 2-D view geometry (`views.descriptor_view`) that a and b (Q and dO, or K and V: the kernels address each
    pair with one set of coordinates) share, or None: both have views, alike, and tight (`views.tight`: a tile past
    a head's sequence end reads the tensor's own rows, as on contiguous tensors, never memory outside it)."""
    va, vb = descriptor_view(a), descriptor_view(b)
    if va is None or vb is None or va[2] != vb[2] or not tight(a, va[2]):
        return None
    return va[2]


def _readable(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]]:
    """(a, b, their shared geometry) as the Hopper kernels read them: as they are where they can
    (`_shared_geometry`, 16-byte aligned bases); else b copied into a sequence-outer layout where a has one (a
    transformers or flash_attn caller's q, whose dO can arrive contiguous); else both contiguous."""
    geometry = _shared_geometry(a, b)
    aligned = a.data_ptr() % 16 == 0
    if geometry is not None and aligned and b.data_ptr() % 16 == 0:
        return a, b, geometry
    view = descriptor_view(a)
    if aligned and view is not None and view[2][2]:  # a's heads side by side within a row
        batch, heads, seq, d = b.shape
        b = torch.empty((batch, seq, heads, d), dtype=b.dtype, device=b.device).transpose(1, 2).copy_(b)
        geometry = _shared_geometry(a, b)
        if geometry is not None:
            return a, b, geometry
    a, b = (t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)
            for t in (a, b))
    geometry = _shared_geometry(a, b)  # contiguous tensors of one shape share a view (size-1 dims' strides aside)
    if geometry is None:
        raise ValueError(f"a {tuple(a.shape)} tensor has 2^31 rows or more: beyond the Hopper backward's TMA "
                         f"coordinates")
    return a, b, geometry


def _hopper(q, k, v, out, lse, grad_out, dq, dk, dv, grad_lse, *, is_causal: bool, scale: float,
            cfg: select.HopperBackward, band: Band | None = None) -> None:
    """The Hopper dK/dV kernel, with the portable preprocess kernel and the Gluon or the portable dQ kernel, or with
    dQ fused into it (`cfg.dkdv.fused_dq`: reduced into an fp32 buffer, then scaled into dq; no window). With
    `cfg.concurrent_dq` the Gluon dQ kernel runs beside dK/dV (`_dkdv_then_dq`). `band`: a sliding window."""
    from xkernels.common import launch
    from xkernels.hopper import attention_bwd as hopper_bwd

    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    portable_cfg, dq_cfg, concurrent_dq, cfg = cfg.portable, cfg.dq, cfg.concurrent_dq, cfg.dkdv
    # fused dQ: an fp32 buffer the preprocess pass zeroes, the dK/dV kernel reduces into, and finish_dq scales
    dq_accum = torch.empty((b, hq, sq, d), dtype=torch.float32, device=q.device) if cfg.fused_dq else None
    if dq_accum is not None and band is not None and band.windowed:
        raise ValueError("the fused-dQ Hopper backward has no sliding window")
    delta = portable_bwd.preprocess(out, grad_out, grad_lse, block_m=portable_cfg.q_m,
                                    num_warps=portable_cfg.num_warps, dq_accum=dq_accum)
    qf, dof, q_geometry = _readable(q, grad_out)
    kf, vf, kv_geometry = _readable(k, v)
    geometry = (*q_geometry, *kv_geometry)
    # the dense kernel never reads cu_seqlens (lse stands in) nor the packed LSE's head stride (0)
    args = (*hopper_bwd.descriptors(qf, kf, vf, dof, cfg, dq_accum), lse, delta, dk, dv, lse, lse, *dk.stride()[:3],
            *dv.stride()[:3], 0, *geometry, hq, hkv, hq // hkv, sq, skv, scale * math.log2(math.e), scale,
            *_group_scratch(cfg, b, hkv, skv, d, lse))

    def dkdv() -> None:
        launch.run(hopper_bwd.attention_dkdv_kernel, hopper_bwd.grid(b, hkv, skv, cfg), args,
                   cfg.constexprs(d, causal=is_causal, band=band,
                                  whole_key_blocks=skv % cfg.block_n == 0), {})

    if dq_cfg is not None and dq_accum is None:
        _dkdv_then_dq(q.device, dkdv, lambda: _gluon_dq(qf, kf, vf, dof, lse, delta, dq, geometry,
                                                        is_causal=is_causal, scale=scale, dq_cfg=dq_cfg, band=band),
                      concurrent=concurrent_dq and q.is_cuda)
        return
    dkdv()
    if dq_accum is not None:
        portable_bwd.finish_dq(dq_accum, dq, scale=scale, block_m=portable_cfg.q_m, num_warps=portable_cfg.num_warps)
        return
    portable_bwd.launch_dq(q, k, v, grad_out, lse, delta, dq, is_causal=is_causal, scale=scale, cfg=portable_cfg,
                           band=band)


def _gluon_dq(qf, kf, vf, dof, lse, delta, dq, geometry: tuple[int, ...], *, is_causal: bool, scale: float, dq_cfg,
              band: Band | None = None) -> None:
    """The Gluon dQ kernel (`hopper/attention_dq.py`) on the current stream; `geometry`: the views' row and column
    steps (Q and dO's, then K and V's)."""
    from xkernels.common import launch
    from xkernels.hopper import attention_dq as hopper_dq

    b, hq, sq, d = qf.shape
    hkv, skv = kf.shape[1], kf.shape[2]
    args = (*hopper_dq.descriptors(qf, kf, vf, dof, dq_cfg), lse, delta, dq, lse, lse, *dq.stride()[:3], 0,
            *geometry, hq, hq // hkv, sq, skv, scale * math.log2(math.e), scale)
    launch.run(hopper_dq.attention_dq_kernel, hopper_dq.grid(b, hq, sq), args,
               dq_cfg.constexprs(d, causal=is_causal, band=band), {})
