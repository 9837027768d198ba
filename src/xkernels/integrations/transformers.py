"""xkernels attention for Hugging Face transformers: `import xkernels.integrations.transformers` registers
`attn_implementation="xkernels"` (an AttentionInterface function and the SDPA mask builder, whose masks it reads).

    import xkernels.integrations.transformers  # noqa: F401
    model = AutoModelForCausalLM.from_config(config, attn_implementation="xkernels")

What it serves, with SDPA's semantics: prefill with a causal mask transformers can drop (no padding), decoding
one token against the cache (full attention over it), GQA without repeated K/V, any `scaling`; and batches padded on
the left (what `generate()` makes of prompts of different lengths): each row's mask must be "keys from its first
valid position to the end, causal or not", which is checked on the device (a few reads to the host); prefill packs
the valid rows and keys through `xkernels.attention_varlen`, decoding reads the cache in place as a left-padded
cache (`attention_with_kvcache(cache_leftpad=...)`); rows that see no key (a left-padded row's pad positions)
return 0, as SDPA's math and flash kernels do; transformers' "eager" and CUDA "sdpa" paths give such a row attention
over every key instead. Only a loss on a token predicted from a pad position (the first real token of a
left-padded row, in a causal LM's shifted loss) sees the difference.
Sliding-window layers (Mistral, Gemma, ...; the `sliding_window` argument, its mask) pass the window to the same
kernels (`window_size`): unpadded prefill and training through `attention`, padded or chunked prefill through
`attention_varlen`, decoding steps through the KV-cache kernel. Another mask (right padding with causal attention,
arbitrary patterns) raises a ValueError saying so; so does dropout. Soft-capped scores (Gemma 2's `softcap`) and
attention sinks (gpt-oss's `s_aux`) reach every kernel as `softcap` and `sinks`. Inputs must be fp16 or bf16 (the
model's dtype) with head dims 64, 128 or 256. Training works too, windowed or not: padded batches through the varlen
backward (decoding steps are inference only).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import xkernels
from xkernels.api import _autocast
from xkernels.select import DECODE_MAX_SQ

NAME = "xkernels"


def xkernels_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: torch.Tensor | None, dropout: float = 0.0,
                               scaling: float | None = None, is_causal: bool | None = None,
                               **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention function signature: (B, H, S, D) query, key, value -> ((B, S, H, D) output, None)."""
    for unsupported in ("position_bias",):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"{unsupported}: not supported by attn_implementation='xkernels'")
    if dropout:
        raise ValueError(f"dropout: {dropout} is not supported by attn_implementation='xkernels' (use 0 at "
                         "inference, or attn_implementation='sdpa')")
    q_length, kv_length = query.shape[2], key.shape[2]
    softcap = float(kwargs.get("softcap") or 0.0)
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))  # gpt-oss: one logit per query head
    window = kwargs.get("sliding_window")  # transformers' rule: key j is seen from query i when j > i - window
    if window is not None and kv_length <= window:
        window = None  # every key is inside every query's window
    if attention_mask is not None:
        return _left_padded(query, key, value, attention_mask, scaling, window, softcap, sinks), None
    if window is not None and q_length == kv_length:  # unpadded prefill or training: the dense kernels' window
        out = xkernels.attention(query, key, value, is_causal=True, scale=scaling,
                                 enable_gqa=query.shape[1] != key.shape[1], window_size=(window - 1, 0),
                                 softcap=softcap, sinks=sinks)
        return out.transpose(1, 2).contiguous(), None
    if window is not None:  # no mask, but the window cuts keys and the queries end the keys: causal, no padding
        mask = torch.ones((query.shape[0], 1, q_length, kv_length), dtype=torch.bool, device=query.device)
        return _left_padded(query, key, value, mask.tril(kv_length - q_length) & _window_mask(q_length, kv_length,
                                                                                              window, query.device),
                            scaling, window, softcap, sinks), None
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(q_length > 1 and is_causal)  # one query token attends to the whole cache
    if is_causal and kv_length > q_length:  # SDPA's top-left causal: keys past the queries are never attended
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = xkernels.attention(query, key, value, is_causal=is_causal, scale=scaling,
                             enable_gqa=query.shape[1] != key.shape[1], softcap=softcap, sinks=sinks)
    return out.transpose(1, 2).contiguous(), None


def _window_mask(sq: int, skv: int, window: int, device) -> torch.Tensor:
    """(Sq, Skv): key j inside query i's sliding window (transformers' rule, j > i + Skv - Sq - window)."""
    keys = torch.arange(skv, device=device)[None, :]
    return keys > torch.arange(sq, device=device)[:, None] + (skv - sq) - window


def _left_padded(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                 scaling: float | None, window: int | None = None, softcap: float = 0.0,
                 sinks: torch.Tensor | None = None) -> torch.Tensor:
    """A boolean (B, 1, Sq, Skv) mask in which sequence b sees keys [start_b, end_b) (end_b < Skv: a static cache's
    slots not yet filled), causally (key j for query i when j <= i + end_b - Sq) or all of them, and with a sliding
    `window` only keys j > i + end_b - Sq - window. Decoding
    steps (a few causal rows) read K and V in place as a left-padded cache (`attention_with_kvcache(cache_leftpad=
    ...)`, with the window as `window_size=(window - 1, 0)`); other prefill packs the valid rows and keys into one
    varlen call (the window aligned bottom-right there too) and unpacks them, the rows that see no key at 0; so does
    every call that needs gradients (the split-KV kernel has no backward). Any other mask raises."""
    batch, _, sq, _ = query.shape
    skv = key.shape[2]
    if mask.dtype != torch.bool or mask.dim() != 4 or tuple(mask.shape) != (batch, 1, sq, skv):
        raise ValueError(f"attention_mask: attn_implementation='xkernels' reads boolean (batch, 1, Sq, Skv) masks, "
                         f"got {mask.dtype} {tuple(mask.shape)}; use attn_implementation='sdpa'")
    mask = mask[:, 0]
    keys = torch.arange(skv, device=mask.device)
    valid = mask.any(1)  # (B, Skv): keys some query sees
    seen = valid.any(1)
    start = torch.where(seen, valid.to(torch.int8).argmax(1), skv)  # first valid key of each sequence
    # one past its last valid key: Skv, or less in a static cache, whose slots past the tokens so far are masked
    end = torch.where(seen, skv - valid.flip(1).to(torch.int8).argmax(1), skv)
    key_ok = (keys[None, :] >= start[:, None]) & (keys[None, :] < end[:, None])
    rows = torch.arange(sq, device=mask.device)[None, :, None]
    causal = keys[None, None, :] <= rows + (end - sq)[:, None, None]  # bottom-right against the sequence's end
    if window is not None:  # transformers' rule, j > i + end - Sq - window
        causal = causal & (keys[None, None, :] > rows + (end - sq)[:, None, None] - window)
    is_causal = torch.equal(mask, key_ok[:, None, :] & causal)  # each equal() is one read to the host
    if not (is_causal or (window is None and torch.equal(mask, key_ok[:, None, :].expand_as(mask)))):
        raise ValueError("attention_mask: attn_implementation='xkernels' serves masks where each sequence sees the "
                         "keys from its first valid position to its last (left padding, static caches, causal or "
                         "not, a causal sliding window); this one differs (right padding, another pattern): use "
                         "attn_implementation='sdpa'")
    # under autocast (an fp32 model trained or run in bf16) the inputs in its dtype, as sdpa takes them: the
    # cache read below does not cast (it may write a cache), and the packed output takes q's dtype
    query, key, value = _autocast((query, key, value))
    q_t, k_t, v_t = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (B, S, H, D) views
    training = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad
                                            or (sinks is not None and sinks.requires_grad))
    window_size = (-1, -1) if window is None else (window - 1, 0)  # transformers' window counts the query's key
    if window is not None and is_causal and sq == skv and not bool(start.any() | (end != skv).any()):
        # no padding (transformers builds a mask for every windowed call): the dense kernels' window, no packing
        return xkernels.attention(query, key, value, is_causal=True, scale=scaling, window_size=window_size,
                                  enable_gqa=query.shape[1] != key.shape[1], softcap=softcap,
                                  sinks=sinks).transpose(1, 2).contiguous()
    if is_causal and sq <= DECODE_MAX_SQ and not training:  # decoding: the split-KV kernel reads the cache in place
        lengths = end.to(torch.int32)
        # lengths and first keys come from the mask checked above: no second read of the cache checks
        return xkernels.attention_with_kvcache(q_t, k_t, v_t, cache_seqlens=lengths,
                                               cache_leftpad=start.to(torch.int32), scale=scaling, sync_checks=False,
                                               window_size=window_size, softcap=softcap, sinks=sinks)
    rows = mask.any(2)  # (B, Sq): queries that see a key
    q_counts, k_counts = rows.sum(1), key_ok.sum(1)
    zero = torch.zeros(1, dtype=torch.int32, device=mask.device)
    cu_q = torch.cat([zero, q_counts.cumsum(0).to(torch.int32)])
    cu_k = torch.cat([zero, k_counts.cumsum(0).to(torch.int32)])
    max_q, max_k = torch.stack([q_counts.max(), k_counts.max()]).tolist()
    # cu_seqlens and their bounds come from the mask checked above: no second read to check them
    packed = xkernels.attention_varlen(q_t[rows], k_t[key_ok], v_t[key_ok], cu_q, cu_k, max_q, max_k,
                                       is_causal=is_causal, scale=scaling, sync_checks=False, window_size=window_size,
                                       softcap=softcap, sinks=sinks)
    out = q_t.new_zeros(q_t.shape)
    out[rows] = packed
    return out


def register() -> None:
    """Register (again) under NAME: idempotent."""
    AttentionInterface.register(NAME, xkernels_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


register()
