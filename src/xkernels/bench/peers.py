"""Peers timed in the same run on the same inputs: cuBLAS through torch.matmul, each forced SDPA backend, flash_attn."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xkernels.testing.cases import (
    AttentionCase,
    AttentionGradCase,
    Case,
    DecodeCase,
    GemmCase,
    VarlenCase,
    VarlenGradCase,
)
from xkernels.validation import NO_WINDOW


@dataclass(frozen=True)
class Peer:
    name: str
    context: Callable[[], contextlib.AbstractContextManager]
    prepare: Callable[[tuple], tuple]  # done once per input set, outside timing (e.g. flash_attn's layout)
    fn: Callable[[tuple], object]


def _sdpa_peer(name: str, backend_name: str, case: AttentionCase) -> Peer:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    gqa = case.hq != case.hkv
    if case.window != NO_WINDOW:  # SDPA has no window: its mask, built once outside the timing
        def masked(qkvm):
            q, k, v, mask = qkvm
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

        return Peer(name, lambda: sdpa_kernel([backend]), lambda qkv: (*qkv, case.mask(qkv[0].device)), masked)

    def fn(qkv):
        q, k, v = qkv
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

    return Peer(name, lambda: sdpa_kernel([backend]), lambda x: x, fn)


def _sdpa_grad_peer(name: str, backend_name: str, case: AttentionGradCase | VarlenGradCase) -> Peer:
    """The same step as ours through SDPA under the forced backend: prepared (for "bwd": the forward run once, its
    graph kept), so the timed backward is that backend's. A packed case runs on its batch padded to the longest
    sequence (the padding outside the timing, dO zero on it)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    gqa = case.hq != case.hkv
    dense = case.padded if isinstance(case, VarlenGradCase) else (lambda inputs: inputs)
    windowed = isinstance(case, AttentionGradCase) and case.window != NO_WINDOW
    masks: dict = {}  # SDPA has no window: its mask, built once (the first call) per device

    def forward(q, k, v):
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        if windowed:
            mask = masks.get(q.device)
            if mask is None:
                mask = masks[q.device] = case.mask(q.device)
            return F.scaled_dot_product_attention(*leaves, attn_mask=mask, enable_gqa=gqa), leaves
        return F.scaled_dot_product_attention(*leaves, is_causal=case.causal, enable_gqa=gqa), leaves

    def prepare(inputs):
        q, k, v, do = dense(inputs)
        if case.step != "bwd":
            return q, k, v, do
        with sdpa_kernel([backend]):
            o, leaves = forward(q, k, v)
        return o, leaves, do

    def fn(prepared):
        if case.step == "bwd":
            o, leaves, do = prepared
            return torch.autograd.grad(o, leaves, do, retain_graph=True)
        q, k, v, do = prepared
        o, leaves = forward(q, k, v)
        return torch.autograd.grad(o, leaves, do)

    return Peer(name, lambda: sdpa_kernel([backend]), prepare, fn)


def _flash_attn_peer(case: AttentionCase) -> Peer | None:
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        return None
    if (case.causal or case.window != NO_WINDOW) and case.sq != case.skv:
        return None  # flash_attn aligns causal masks and windows bottom-right; ours (and PyTorch's) top-left
    return Peer("flash_attn", contextlib.nullcontext, lambda qkv: tuple(t.transpose(1, 2).contiguous() for t in qkv),
                lambda qkv: flash_attn_func(*qkv, causal=case.causal, window_size=case.window))


def _sdpa_decode_peer(name: str, backend_name: str | None, case: DecodeCase) -> Peer:
    """SDPA on the same problem as contiguous (B, H, S, D) tensors (it has no cache layout): its default choice
    (backend_name None) or a forced backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    context = contextlib.nullcontext if backend_name is None else (
        lambda: sdpa_kernel([getattr(SDPBackend, backend_name)]))

    def fn(qkv):
        q, k, v = qkv
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=case.hq != case.hkv)

    return Peer(name, context, case.dense, fn)


def _padded_peer(name: str, backend_name: str, case: VarlenCase) -> Peer:
    """SDPA on the batch padded to its longest sequence (the padding done once, outside the timing, and no mask for
    it: the padded rows' outputs are not used, so this is the least a padded call costs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn(qkv):
        q, k, v = qkv
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=case.hq != case.hkv)

    return Peer(name, lambda: sdpa_kernel([getattr(SDPBackend, backend_name)]), case.padded, fn)


def peers_for(case: Case) -> list[Peer]:
    if isinstance(case, VarlenGradCase):
        return [_sdpa_grad_peer("SDPA-cuDNN padded", "CUDNN_ATTENTION", case),
                _sdpa_grad_peer("SDPA-flash padded", "FLASH_ATTENTION", case)]
    if isinstance(case, VarlenCase):
        return [_padded_peer("SDPA-cuDNN padded", "CUDNN_ATTENTION", case),
                _padded_peer("SDPA-flash padded", "FLASH_ATTENTION", case)]
    if isinstance(case, DecodeCase):
        return [_sdpa_decode_peer(n, b, case) for n, b in (("SDPA", None), ("SDPA-flash", "FLASH_ATTENTION"),
                                                           ("SDPA-cuDNN", "CUDNN_ATTENTION"))]
    if isinstance(case, GemmCase):
        if case.b_layout == "nk":
            return [Peer("cuBLAS", contextlib.nullcontext, lambda x: x, lambda ab: ab[0] @ ab[1].t())]
        return [Peer("cuBLAS", contextlib.nullcontext, lambda x: x, lambda ab: ab[0] @ ab[1])]
    if isinstance(case, AttentionCase) and (case.softcap or case.sinks):
        return []  # no SDPA backend has a soft cap or sinks
    if isinstance(case, AttentionGradCase):
        return [_sdpa_grad_peer(n, b, case) for n, b in (("SDPA-flash", "FLASH_ATTENTION"),
                                                         ("SDPA-cuDNN", "CUDNN_ATTENTION"),
                                                         ("SDPA-efficient", "EFFICIENT_ATTENTION"))]
    peers = [_sdpa_peer("SDPA-flash", "FLASH_ATTENTION", case), _sdpa_peer("SDPA-cuDNN", "CUDNN_ATTENTION", case),
             _sdpa_peer("SDPA-efficient", "EFFICIENT_ATTENTION", case)]
    fa = _flash_attn_peer(case)
    return peers + ([fa] if fa else [])
