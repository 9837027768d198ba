"""xkernels attention for Hugging Face transformers: `import xkernels.integrations.transformers` registers
`attn_implementation="xkernels"` (an AttentionInterface function and the SDPA mask builder, whose masks it reads).

    import xkernels.integrations.transformers  # noqa: F401
    model = AutoModelForCausalLM.from_config(config, attn_implementation="xkernels")

What it serves, with SDPA's semantics: prefill with a causal mask transformers can drop (no padding), and decoding
one token against the cache (full attention over it), GQA without repeated K/V, any `scaling`. A padding mask, or a
causal mask with more keys than queries that transformers could not drop, raises a ValueError saying so (pad-free
batches, or `attn_implementation="sdpa"`); so do dropout, softcapping and attention sinks. Inputs must be fp16 or
bf16 (the model's dtype) with head dims 64, 128 or 256.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import xkernels

NAME = "xkernels"


def xkernels_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: torch.Tensor | None, dropout: float = 0.0,
                               scaling: float | None = None, is_causal: bool | None = None,
                               **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention function signature: (B, H, S, D) query, key, value -> ((B, S, H, D) output, None)."""
    for unsupported in ("softcap", "s_aux", "sinks", "position_bias"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"{unsupported}: not supported by attn_implementation='xkernels'")
    if dropout:
        raise ValueError(f"dropout: {dropout} is not supported by attn_implementation='xkernels' (use 0 at "
                         "inference, or attn_implementation='sdpa')")
    q_length, kv_length = query.shape[2], key.shape[2]
    if attention_mask is not None:
        raise ValueError("attention_mask: attn_implementation='xkernels' serves unpadded batches (causal masks that "
                         "transformers drops, and decoding); this call has an explicit mask (padding, or a cache "
                         "longer than the filled positions): pass pad-free batches or use "
                         "attn_implementation='sdpa'")
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(q_length > 1 and is_causal)  # one query token attends to the whole cache
    if is_causal and kv_length > q_length:  # SDPA's top-left causal: keys past the queries are never attended
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = xkernels.attention(query, key, value, is_causal=is_causal, scale=scaling,
                             enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register (again) under NAME: idempotent."""
    AttentionInterface.register(NAME, xkernels_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


register()
