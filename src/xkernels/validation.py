"""Argument checks for the public API: each bad input gets an error that names the argument."""

from __future__ import annotations

import math
import numbers

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128, 256)
B_LAYOUTS = ("kn", "nk")
WALK_CHOICES = ("auto", "row", "grouped", "zorder")
OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _tensor(x: object, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def _same_dtype_and_device(named: dict[str, torch.Tensor]) -> None:
    first_name, first = next(iter(named.items()))
    if first.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{first_name}: dtype {first.dtype} is not supported; use torch.float16 or torch.bfloat16")
    for name, t in named.items():
        if t.dtype != first.dtype:
            raise TypeError(f"{name}: dtype {t.dtype} does not match {first_name}'s {first.dtype}")
        if t.device != first.device:
            raise ValueError(f"{name}: on device {t.device}, but {first_name} is on {first.device}")


def _no_grad(named: dict[str, torch.Tensor]) -> None:
    if torch.is_grad_enabled():
        for name, t in named.items():
            if t is not None and t.requires_grad:
                raise ValueError(f"{name}: requires grad, but xkernels has forward kernels only (no backward yet); "
                                 "call under torch.no_grad() or detach it")


def _flag(x: object, name: str) -> None:
    if not isinstance(x, bool):
        raise TypeError(f"{name}: expected bool, got {type(x).__name__}")


def _check_out(out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
               inputs: dict[str, torch.Tensor]) -> None:
    if out is None:
        return
    _tensor(out, "out")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out: shape {tuple(out.shape)} != expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"out: dtype {out.dtype} != expected {dtype}")
    if out.device != device:
        raise ValueError(f"out: on device {out.device}, expected {device}")
    if any(st == 0 and sz > 1 for st, sz in zip(out.stride(), out.shape, strict=True)):
        raise ValueError("out: several of its elements share one memory location (an expanded view)")
    _no_grad({"out": out})
    for name, t in inputs.items():
        if t.numel() and out.numel() and out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
            raise ValueError(f"out: shares memory with {name}; inputs are never overwritten")


def check_attention(q, k, v, *, is_causal: bool, scale: float | None, enable_gqa: bool,
                    out: torch.Tensor | None) -> float:
    """Validate attention arguments; return the softmax scale to use."""
    named = {"q": _tensor(q, "q"), "k": _tensor(k, "k"), "v": _tensor(v, "v")}
    for name, t in named.items():
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dims (B, H, S, D), got shape {tuple(t.shape)}")
    _same_dtype_and_device(named)
    _no_grad(named)
    _flag(is_causal, "is_causal")
    _flag(enable_gqa, "enable_gqa")
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
    if skv == 0 and b * hq * sq > 0:
        raise ValueError("k: sequence length is 0; softmax over no keys is undefined")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a real number, got {type(scale).__name__}")
    elif not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite number, got {scale!r}")
    _check_out(out, q.shape, q.dtype, q.device, named)
    return float(scale)


def check_matmul(a, b, *, b_layout: str, walk: str, out_dtype: torch.dtype | None,
                 out: torch.Tensor | None) -> tuple[tuple[int, ...], int, int, int, torch.dtype]:
    """Validate matmul arguments; return (batch shape, M, N, K, output dtype)."""
    named = {"a": _tensor(a, "a"), "b": _tensor(b, "b")}
    for name, t in named.items():
        if t.dim() < 2:
            raise ValueError(f"{name}: expected at least 2 dims, got shape {tuple(t.shape)}")
    _same_dtype_and_device(named)
    _no_grad(named)
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"b_layout: {b_layout!r} is not one of {B_LAYOUTS}")
    if walk not in WALK_CHOICES:
        raise ValueError(f"walk: {walk!r} is not one of {WALK_CHOICES}")
    if out_dtype is None:
        out_dtype = a.dtype
    elif out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: {out_dtype} is not one of {OUT_DTYPES}")
    m, k = a.shape[-2:]
    n, kb = (b.shape[-2], b.shape[-1]) if b_layout == "nk" else (b.shape[-1], b.shape[-2])
    if kb != k:
        raise ValueError(f"b: inner dim {kb} does not match a's inner dim {k} (b_layout={b_layout!r})")
    if b.dim() == 2:  # the common case, without torch.broadcast_shapes' ~20 us
        batch = tuple(a.shape[:-2])
    else:
        try:
            batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        except RuntimeError as e:
            raise ValueError(f"b: batch dims {tuple(b.shape[:-2])} do not broadcast with a's "
                             f"{tuple(a.shape[:-2])}") from e
    _check_out(out, (*batch, m, n), out_dtype, a.device, named)
    return batch, m, n, k, out_dtype
