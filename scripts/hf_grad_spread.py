"""How far a tiny bf16 Llama's attention-weight gradients on a left-padded batch lie from an fp32 model's (sdpa),
for attn_implementation xkernels, sdpa and eager in bf16: what "within bf16 noise" means for the transformers
training test on this device.

    PYTHONPATH=. python scripts/hf_grad_spread.py   (from the repository root: it reuses the test's tiny model)
"""

from __future__ import annotations

import torch

import xkernels.integrations.transformers  # noqa: F401  (registers "xkernels")
from tests.integrations.test_transformers import _rel, tiny_llama


def grads(model, ids, mask):
    labels = ids.masked_fill(mask == 0, -100)
    model.train()
    model(ids, attention_mask=mask, labels=labels).loss.backward()
    return {n: p.grad.float() for n, p in model.named_parameters() if "self_attn" in n}


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for length in (21, 12):
        ids = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(3)).to(device)
        mask = torch.ones_like(ids)
        mask[0, :5] = 0
        ref = grads(tiny_llama("sdpa", device).float(), ids, mask)
        for impl in ("xkernels", "sdpa", "eager"):
            g = grads(tiny_llama(impl, device), ids, mask)
            worst = max((_rel(g[n], ref[n]), n) for n in ref)
            print(f"S{length} {impl:9s} worst rel vs fp32 sdpa: {worst[0]:.4f} ({worst[1]})", flush=True)


if __name__ == "__main__":
    main()
