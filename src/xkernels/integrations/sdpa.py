"""Route `F.scaled_dot_product_attention` calls to `xkernels.attention` inside a `with` block, with no change to the
model's code (timm, diffusers, nanoGPT-style modules, transformers' "sdpa" implementation):

    from xkernels.integrations.sdpa import use_xkernels

    with use_xkernels() as routed:
        loss = model(x).loss
        loss.backward()
    print(routed.calls, routed.fallbacks)  # how many calls each way, and why the others went to torch

A call is served where xkernels computes what SDPA would: no mask but the causal flag, dropout_p 0 (modules pass
their dropout only in training mode), fp16 or bf16 q, k and v of one dtype on a device xkernels runs on (CUDA, XPU,
the CPU under the Triton interpreter), head dims 64, 128 or 256, the same in k and v, and SDPA's shapes ((..., H,
S, D) with the same leading dims; GQA with enable_gqa). Every other call runs torch's own SDPA,
unchanged, and is counted in `fallbacks` with its reason; `strict=True` raises instead (ValueError naming what
xkernels cannot serve). Gradients flow through the served calls (xkernels' backward); `torch.compile` traces the
block (a TorchFunctionMode; the counts are then those of the traced calls). The block is the only scope: nothing
changes outside it or in other threads, and nothing is global. Two costs of a mode: every torch call in the block
passes through one Python check (host time on every eager call; none once compiled), and an SDPA
call that a torch function makes inside itself (nn.MultiheadAttention's, through F.multi_head_attention_forward) is
not seen: a mode is off while it handles a call.
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import xkernels
from xkernels.common.runtime import INTERPRET
from xkernels.validation import HEAD_DIMS

_DTYPES = (torch.float16, torch.bfloat16)
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def _why_not(q: object, k: object, v: object, attn_mask: object, dropout_p: object, enable_gqa: object) -> str | None:
    """Why xkernels cannot serve this SDPA call, or None where it computes what SDPA would."""
    if not all(type(t) is torch.Tensor or isinstance(t, torch.nn.Parameter) for t in (q, k, v)):
        return "q, k or v is not a plain tensor (a subclass, nested or sparse tensor)"
    if any(t.layout is not torch.strided or t.is_nested for t in (q, k, v)):
        return "q, k or v is not a strided tensor"
    if attn_mask is not None:
        return "attn_mask is given"
    if not isinstance(dropout_p, float | int) or dropout_p != 0:
        return f"dropout_p is {dropout_p}"
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype} (fp16 or bf16, all alike)"
    if q.device.type not in ("cuda", "xpu") and not (q.device.type == "cpu" and INTERPRET):
        return f"device {q.device.type}"
    if q.shape[-1] not in HEAD_DIMS or k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        return f"head dims {q.shape[-1]}, {k.shape[-1]}, {v.shape[-1]} (xkernels: one of {HEAD_DIMS})"
    if q.dim() < 3 or k.dim() != q.dim() or v.dim() != q.dim() or k.shape[:-3] != q.shape[:-3] \
            or v.shape[:-3] != q.shape[:-3]:
        return "shapes that broadcast (xkernels: (..., H, S, D) with the same leading dims)"
    if k.shape[-3] != q.shape[-3] and not enable_gqa:
        return "different head counts without enable_gqa"
    return None


class use_xkernels(TorchFunctionMode):  # noqa: N801  (used as a context manager, named like one)
    """Inside the block, `F.scaled_dot_product_attention` calls xkernels where it can (see the module); `calls`
    counts the served calls, `fallbacks` the others by reason. `strict=True` raises instead of falling back.
    `precision` and `backend` are handed to `xkernels.attention`."""

    def __init__(self, *, strict: bool = False, precision: str = "auto", backend: str | None = None) -> None:
        super().__init__()
        if type(strict) is not bool:
            raise TypeError(f"strict: expected a bool, got {type(strict).__name__}")
        self.strict, self.precision, self.backend = strict, precision, backend
        self.calls = 0
        self.fallbacks: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:  # every other torch call in the block: straight through
            return func(*args, **kwargs)
        bound = dict(zip(_SDPA_ARGS, args, strict=False)) | kwargs
        q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
        attn_mask, dropout_p = bound.get("attn_mask"), bound.get("dropout_p", 0.0)
        enable_gqa = bound.get("enable_gqa", False)
        reason = _why_not(q, k, v, attn_mask, dropout_p, enable_gqa)
        if reason is not None:
            if self.strict:
                raise ValueError(f"scaled_dot_product_attention: xkernels cannot serve this call: {reason}")
            self.fallbacks[reason] += 1
            return func(*args, **kwargs)
        self.calls += 1
        return xkernels.attention(q, k, v, is_causal=bound.get("is_causal", False), scale=bound.get("scale"),
                                  enable_gqa=enable_gqa, precision=self.precision, backend=self.backend)
