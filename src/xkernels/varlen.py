"""Host path of the packed variable-length attention forward (`xkernels.attention_varlen`): checks of the
cu_seqlens values, the outputs, and the launch of the varlen kernel `select` chose: `hopper/attention_varlen.py` on
sm_90 with a tested triton, `portable/attention_varlen.py` elsewhere (both take the same arguments)."""

from __future__ import annotations

import math

import torch

from xkernels import plans, select
from xkernels.common import launch
from xkernels.common.runtime import strides_ok
from xkernels.common.seqlen import Band
from xkernels.portable import attention_varlen as kernel
from xkernels.portable.cu_seqlens import checked_on_device
from xkernels.portable.softmax import softcap_name
from xkernels.validation import NO_WINDOW, check_cu_seqlens


def _tiled(t: torch.Tensor) -> torch.Tensor:
    """Token rows with a unit last stride and 16-byte aligned strides and base: what the kernel's descriptors read (a
    copy otherwise: a fresh allocation, since `contiguous()` keeps a contiguous tensor's unaligned base)."""
    if t.data_ptr() % 16 == 0 and strides_ok(t.stride(), t.element_size()):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def output_like(q: torch.Tensor) -> torch.Tensor:
    """The uninitialized O of a call (tests fill it with NaN to catch rows the kernel leaves unwritten)."""
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                     is_causal: bool, scale: float | None, precision: str, return_lse: bool, sync_checks: bool,
                     backend: str, window: tuple[int, int] = NO_WINDOW, softcap: float = 0.0, sinks=None):
    """(O (total_q, Hq, D), LSE (Hq, total_q) fp32, or an empty tensor unless `return_lse`). The cu_seqlens values
    are read to the host and checked with `sync_checks`; without, and during CUDA-graph capture (where a read would
    break the capture), they are checked on the device (`cu_seqlens.checked_on_device`), and a bad call runs on
    empty sequences (nothing read or written outside the packed tensors) and returns NaN everywhere. `window`: a
    checked window_size, aligned bottom-right as is_causal; `softcap`: a checked soft cap (0: none); `sinks`: checked
    (Hq,) sink logits or None."""
    # the kernel reads cu_seqlens as contiguous int32 (the checks below read the same values)
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    recipe, choice = select.resolve_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                     max_seqlen_k, precision=precision, backend=backend,
                                                     is_causal=is_causal, window=window, softcap=softcap,
                                                     sinks=sinks)
    total_q, hq, d = q.shape
    # an upper bound past the packed total holds no more than the total: the grid follows the smaller (a bound
    # near 2^31 would otherwise launch ~2^31 / 64 empty row blocks per head and sequence)
    max_seqlen_q, max_seqlen_k = min(max_seqlen_q, total_q), min(max_seqlen_k, k.shape[0])
    out = output_like(q)
    lse = torch.empty((hq, total_q) if return_lse else (0,), dtype=torch.float32, device=q.device)
    # no key in the batch: every row's O is 0 and its LSE its sink (or -inf), written here, before the checks (a bad
    # call's NaN comes over them), with no launch (a TMA descriptor cannot describe an empty tensor)
    no_keys = k.shape[0] == 0
    if no_keys:
        out.zero_()
        if return_lse and sinks is not None:
            lse.copy_(sinks.float()[:, None].expand(hq, total_q))
        elif return_lse:
            lse.fill_(float("-inf"))
    if sync_checks and not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        check_cu_seqlens(cu_seqlens_q.tolist(), total_q, max_seqlen_q, "cu_seqlens_q", "max_seqlen_q")
        check_cu_seqlens(cu_seqlens_k.tolist(), k.shape[0], max_seqlen_k, "cu_seqlens_k", "max_seqlen_k")
    else:  # a bad call: every sequence empty (the kernel touches nothing), O and the LSE NaN
        cu_seqlens_q, cu_seqlens_k = checked_on_device(cu_seqlens_q, cu_seqlens_k, total_q, k.shape[0],
                                                       max_seqlen_q, max_seqlen_k, (out, lse))
    batch = cu_seqlens_q.shape[0] - 1
    if total_q == 0 or batch == 0 or max_seqlen_q == 0 or no_keys:
        plans._record("empty")
    else:
        plans._record(run(q, k, v, out, lse if return_lse else None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                          max_seqlen_k, is_causal=is_causal, scale=scale, recipe=recipe, choice=choice,
                          band=Band.of(is_causal, window), softcap=softcap, sinks=sinks))
    return out, lse


def run(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *, is_causal: bool,
        scale: float | None, recipe, choice, band: Band | None = None, softcap: float = 0.0, sinks=None) -> str:
    """Launch the varlen kernel `choice` names (on Hopper the persistent one where it serves the call); returns the
    kernel's name for `last_backend()`. `lse` (Hq, total_q) or None; `band` a sliding window, `softcap` a soft cap
    and `sinks` (Hq,) sink logits (the Hopper kernel's where "hopper" was forced)."""
    band = band or Band(is_causal)
    is_causal = band.causal
    total_q, hq, d = q.shape
    q, k, v = _tiled(q), _tiled(k), _tiled(v)
    batch = cu_seqlens_q.shape[0] - 1
    qk_scale = (1.0 / math.sqrt(d) if scale is None else scale) * math.log2(math.e)
    if choice.layer == "hopper":  # bf16io: V as fp16 (converted by the producer, or with v_pass by one op first)
        v = choice.config.dense.kernel_v(v, recipe)
    # the persistent kernel has no band, sinks or soft cap
    if (choice.layer == "hopper" and not (band.windowed or sinks is not None or softcap)
            and _persistent(q, k, v, max_seqlen_k, is_causal, recipe, choice.config.persistent)):
        walk = _run_persistent(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, qk_scale,
                               is_causal=is_causal, positive_scale=scale is None or scale > 0, recipe=recipe,
                               cfg=choice.config.persistent)
        return f"hopper.attention_varlen[{recipe.name} {choice.config.persistent} persistent walk={walk}]"
    if choice.layer == "hopper":
        from xkernels.hopper import attention_varlen as hopper_kernel  # Gluon: imported where it can run

        fn = hopper_kernel.attention_varlen_kernel
        grid, constexprs, options = hopper_kernel.launch_spec(
            batch, hq, max_seqlen_q, d, is_causal=is_causal, recipe=recipe, positive_scale=scale is None or scale > 0,
            write_lse=lse is not None, cfg=choice.config.dense, band=band, sinks=sinks is not None, softcap=softcap)
    else:
        fn = kernel.attention_varlen_kernel
        grid, constexprs, options = kernel.launch_spec(batch, hq, max_seqlen_q, d, is_causal=is_causal,
                                                       recipe=recipe, write_lse=lse is not None, cfg=choice.config,
                                                       band=band, softcap=softcap, sinks=sinks is not None)
    args = (q, k, v, out, out if lse is None else lse, cu_seqlens_q, cu_seqlens_k, *q.stride()[:2], *k.stride()[:2],
            *v.stride()[:2], *out.stride()[:2], total_q, hq, hq // k.shape[1], max_seqlen_q, qk_scale)
    args += (out if sinks is None else sinks.contiguous(),)  # the sink logits, or a pointer the kernel never reads
    launch.run(fn, grid, args, constexprs, options)
    return (f"{choice.layer}.attention_varlen[{recipe.name} {choice.config}{band}{softcap_name(softcap)}"
            f"{' sinks' * (sinks is not None)}]")


def _persistent(q, k, v, max_seqlen_k: int, is_causal: bool, recipe, cfg) -> bool:
    """Whether the persistent varlen kernel serves the call: its config and layouts (`eligible`), then the measured
    rule (persistent=1; 2 forces it): causal batches, whose query blocks differ in length, GQA, whose group's heads
    share K/V in L2, batches of at most 2K keys per sequence, where the per-sequence grid's prologues dominate, and
    full MHA at D128 on the head-major walk (`packed_walk`: 1.82-1.86x padded cuDNN against the per-sequence grid's
    1.75-1.81x, H100, benchmarks/results/h100/2026-12-06/02-walk-default, 06-varlen-ablate). Full MHA at D64 over
    longer sequences stays on the per-sequence kernel (1.99x against 1.83-1.91x)."""
    from xkernels.hopper import attention_varlen_persistent

    if not attention_varlen_persistent.eligible(q, k, v, cfg, recipe):
        return False
    return (cfg.persistent == 2 or is_causal or q.shape[1] > k.shape[1] or max_seqlen_k <= 2048
            or (q.shape[-1] == 128 and cfg.walk in (1, 2)))


def _run_persistent(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, qk_scale: float, *,
                    is_causal: bool, positive_scale: bool, recipe, cfg, knobs: dict | None = None,
                    grid: int | None = None) -> int:
    """Launch the persistent varlen kernel; returns the tile walk it ran (0 or 1). Scripts only: `knobs` (CHAIN,
    ZERO_TAIL, O_TMA) are its ablation switches, `grid` a program count other than the SMs' (1: one program walks every
    tile)."""
    from xkernels.common.runtime import sm_count
    from xkernels.hopper import attention_varlen_persistent as hvp

    total_q, hq, d = q.shape
    batch = cu_seqlens_q.shape[0] - 1
    sms_grid, walk, constexprs, options = hvp.launch_spec(batch, hq, max_seqlen_q, d, sm_count(q.device.index),
                                                          is_causal=is_causal, recipe=recipe,
                                                          positive_scale=positive_scale, write_lse=lse is not None,
                                                          cfg=cfg, group=hq // k.shape[1])
    (_, q_rh, q_ch), (_, kv_rh, kv_ch), (_, o_rh, o_ch) = (hvp.packed_view(t)[2] for t in (q, k, out))
    units = cu_seqlens_q  # not read unless the walk deals units of real tiles (walk 1), counted here on the device
    if constexprs["WALK"]:
        from xkernels.common import tile_scheduler as ts

        pairs = ts.packed_pairs_pay(is_causal, hq, total_q, cfg.block_m, sm_count(q.device.index))
        constexprs = constexprs | {"PAIRS": pairs}
        units = torch.empty(batch + 1, dtype=torch.int32, device=q.device)
        launch.run(ts.packed_units_kernel, 1, (cu_seqlens_q, units, batch, hq),
                   dict(BLOCK_M=cfg.block_m, PAIRS=pairs, BLOCK=ts.PACKED_UNITS_BLOCK), dict(num_warps=4))
    args = (*hvp.descriptors(q, k, v, out, block_n=cfg.block_n), out, out if lse is None else lse, cu_seqlens_q,
            cu_seqlens_k, units, q_rh, q_ch, kv_rh, kv_ch, o_rh, o_ch, *out.stride()[:2],
            total_q if lse is not None else 0, hq // k.shape[1], *walk, qk_scale)
    launch.run(hvp.attention_varlen_persistent_kernel, grid or sms_grid, args,
               constexprs | (knobs or {}), options)
    return constexprs["WALK"]
