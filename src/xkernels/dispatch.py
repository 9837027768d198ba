"""Choose the kernel for a validated call, make layouts descriptor-ready, and record what ran.

There is no silent fallback: every call records the kernel, its recipe and config, and any copy it had to make, in
`last_backend()`, and logs it at DEBUG level on the "xkernels" logger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os

import torch

from xkernels.hopper import attention_fwd as hopper_attention
from xkernels.hopper import gemm as hopper_gemm
from xkernels.hopper.runtime import available as hopper_available
from xkernels.portable import attention_fwd as portable_attention
from xkernels.portable import gemm as portable_gemm
from xkernels.portable.runtime import prepare_device, tma_copy, tma_empty, tma_ready
from xkernels.recipes import AttentionRecipe

log = logging.getLogger("xkernels")
_last: str | None = None
LAYERS = ("portable", "hopper")
# XKERNELS_LAYER=portable (or hopper) forces a layer process-wide, e.g. to compare layers or to rule one out
_forced: tuple[str | None, dict] = (os.environ.get("XKERNELS_LAYER") or None, {})
if _forced[0] not in (None, *LAYERS):
    raise ValueError(f"XKERNELS_LAYER: {_forced[0]!r} is not one of {LAYERS}")


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _configured(default, config: dict):
    """The kernel's default config with the forced overrides; an override this kernel lacks is an error."""
    if not config:  # the common call: no copy of the default (dataclasses.replace costs ~10 us a call)
        return default
    unknown = set(config) - _fields(type(default))
    if unknown:
        raise ValueError(f"config: {sorted(unknown)} are not fields of {type(default).__name__}")
    return dataclasses.replace(default, **config)


@contextlib.contextmanager
def use_layer(layer: str | None, **config):
    """Force a kernel layer ("portable" or "hopper") and optionally override its tile config, for benchmarks and
    tests; layer=None forces nothing. A forced layer that cannot run raises instead of falling back."""
    global _forced
    if layer not in (None, *LAYERS):
        raise ValueError(f"layer: {layer!r} is not one of {LAYERS}")
    if config and layer != "hopper":
        raise ValueError(f"config: overrides {sorted(config)} need layer='hopper', got layer={layer!r}")
    known = _fields(hopper_gemm.HopperGemmConfig) | _fields(hopper_attention.HopperAttentionConfig)
    if set(config) - known:
        raise ValueError(f"config: {sorted(set(config) - known)} are not hopper config fields {sorted(known)}")
    if layer is None:  # nothing forced: keep whatever XKERNELS_LAYER or an outer use_layer chose
        yield
        return
    saved, _forced = _forced, (layer, config)
    try:
        yield
    finally:
        _forced = saved


def last_backend() -> str | None:
    """The kernel the last xkernels call ran, e.g. 'portable.attention[bf16 BM128-BN128-W8-S3]'."""
    return _last


def _record(name: str) -> None:
    global _last
    _last = name
    log.debug("xkernels ran %s", name)


def _ready(t: torch.Tensor, name: str, copies: list[str]) -> torch.Tensor:
    if tma_ready(t):
        return t
    copies.append(name)
    return tma_copy(t)


def _suffix(copies: list[str]) -> str:
    return f" copied:{','.join(dict.fromkeys(copies))}" if copies else ""


def attention(q, k, v, out, *, is_causal: bool, scale: float, recipe: AttentionRecipe, return_lse: bool):
    b, hq, sq, d = q.shape
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device) if return_lse else None
    if out is None:
        out = torch.empty((b, hq, sq, d), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        _record("empty")
        return out, lse
    prepare_device(q, "q")
    copies: list[str] = []
    qq, kk, vv = _ready(q, "q", copies), _ready(k, "k", copies), _ready(v, "v", copies)
    oo = _ready(out, "out", copies)
    layer, config = _forced
    on_hopper = hopper_available(q)
    if layer == "hopper" and not on_hopper:
        raise ValueError("layer 'hopper' was forced, but attention there needs sm_90 and triton 3.6")
    if layer != "portable" and on_hopper:
        cfg = _configured(hopper_attention.CONFIGS[d], config)
        hopper_attention.attention_fwd(qq, kk, vv, oo, lse, is_causal=is_causal, scale=scale, recipe=recipe, cfg=cfg)
        name = "hopper"
    else:
        cfg = portable_attention.attention_fwd(qq, kk, vv, oo, lse, is_causal=is_causal, scale=scale, recipe=recipe)
        name = "portable"
    if oo is not out:
        out.copy_(oo[..., :d])
    _record(f"{name}.attention[{recipe.name} {cfg}]{_suffix(copies)}")
    return out, lse


def _as_3d(t: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """(batch..., r, c) -> (prod(batch), r, c); a view where strides allow (broadcast dims keep stride 0)."""
    t = t.expand(*batch, *t.shape[-2:])
    if len(batch) == 1:
        return t
    return t.reshape(-1, *t.shape[-2:]) if batch else t.unsqueeze(0)


def matmul(a, b, out, *, batch: tuple[int, ...], m: int, n: int, k: int, out_dtype: torch.dtype, b_layout: str,
           walk: str):
    if out is None:
        out = torch.empty((*batch, m, n), dtype=out_dtype, device=a.device)
    if out.numel() == 0:
        _record("empty")
        return out
    if k == 0:
        _record("zero-k")
        return out.zero_()
    prepare_device(a, "a")
    walk = "grouped" if walk == "auto" else walk
    copies: list[str] = []
    if b.dim() == 2 and a.dim() > 2:
        a3 = a.reshape(1, -1, k)  # fold a's batch dims into M: one big GEMM against the shared b
        b3 = b.unsqueeze(0)
    else:
        a3, b3 = _as_3d(a, batch), _as_3d(b, batch)
    for name, src, view in (("a", a, a3), ("b", b, b3)):
        if view.untyped_storage().data_ptr() != src.untyped_storage().data_ptr():
            copies.append(name)  # reshape had to copy (e.g. a transposed batched a folded into M)
    a3, b3 = _ready(a3, "a", copies), _ready(b3, "b", copies)
    try:
        c3 = out.view(a3.shape[0], a3.shape[1], n)  # never reinterpret out with other strides
    except RuntimeError:
        c3 = None
    if c3 is None or not tma_ready(c3):
        copies.append("out")
        c3 = tma_empty((a3.shape[0], a3.shape[1], n), out_dtype, a.device)
    layer, config = _forced
    # the Hopper kernel takes one 2-D problem with a 16-bit C tile; fp32 outputs and batches stay portable
    fits_hopper = hopper_available(a) and a3.shape[0] == 1 and out_dtype != torch.float32
    if layer == "hopper" and not fits_hopper:
        raise ValueError("layer 'hopper' was forced, but this call needs sm_90, triton 3.6, one 2-D problem and a "
                         "16-bit output")
    if layer != "portable" and fits_hopper:
        cfg = _configured(hopper_gemm.CONFIG, config)
        hopper_gemm.gemm(a3[0], b3[0], c3[0], a3.shape[1], n, k, b_layout=b_layout, walk=walk, cfg=cfg)
        name = "hopper.gemm"
    else:
        cfg = portable_gemm.gemm(a3, b3, c3, a3.shape[1], n, k, b_layout=b_layout, walk=walk)
        name = "portable.gemm"
    if "out" in copies:
        out.copy_(c3[..., :n].reshape(out.shape))
    _record(f"{name}[{b_layout} {walk} {cfg}]{_suffix(copies)}")
    return out
