"""Public API, shaped like PyTorch's: validate, resolve the precision recipe, dispatch."""

from __future__ import annotations

import torch

from xkernels import dispatch
from xkernels.recipes import resolve_attention_recipe
from xkernels.validation import check_attention, check_matmul


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
              scale: float | None = None, enable_gqa: bool = False, precision: str = "auto",
              return_lse: bool = False, out: torch.Tensor | None = None):
    """Scaled dot-product attention forward, like F.scaled_dot_product_attention without a mask or dropout.

    q (B, Hq, Sq, D), k and v (B, Hkv, Skv, D), D in {64, 128, 256}, fp16 or bf16; any strides (layouts a tensor
    descriptor cannot read are copied, and `last_backend()` says so). `is_causal` is top-left aligned, as in PyTorch:
    query i attends keys j <= i also when Sq != Skv. `enable_gqa` allows Hq a multiple of Hkv. `precision` picks a
    recipe from `xkernels.recipes` ("fp16", "bf16", "bf16io", or "auto": fp16 -> fp16, bf16 -> bf16).
    Returns O (B, Hq, Sq, D) in the input dtype, or (O, LSE) with the natural-log LSE (B, Hq, Sq) fp32 when
    `return_lse`. `out`, if given, receives O and must not share memory with the inputs.
    """
    scale = check_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, out=out)
    recipe = resolve_attention_recipe(precision, q.dtype)
    o, lse = dispatch.attention(q, k, v, out, is_causal=is_causal, scale=scale, recipe=recipe, return_lse=return_lse)
    return (o, lse) if return_lse else o


def matmul(a: torch.Tensor, b: torch.Tensor, *, b_layout: str = "kn", walk: str = "auto",
           out_dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b with fp32 accumulation, like torch.matmul for fp16/bf16 matrices.

    a (..., M, K); b (..., K, N) for b_layout "kn", or (..., N, K) for "nk" (computes a @ b^T without a transpose
    copy). Batch dims broadcast. `walk` sets the output-tile order: "row", "grouped", "zorder" ("auto" = grouped).
    `out_dtype` defaults to the input dtype (fp16, bf16 or fp32 allowed).
    """
    batch, m, n, k, out_dtype = check_matmul(a, b, b_layout=b_layout, walk=walk, out_dtype=out_dtype, out=out)
    return dispatch.matmul(a, b, out, batch=batch, m=m, n=n, k=k, out_dtype=out_dtype, b_layout=b_layout, walk=walk)
