"""A tiny Llama's attention-weight gradients from a left-padded training step under bf16 autocast: xkernels and
sdpa, each against the fp32 eager model without autocast (the exact-ish reference), per weight (rel-RMS), to tell
a kernel error from bf16 noise.

    python scripts/autocast_grad_probe.py [--length 20]
"""

from __future__ import annotations

import argparse

import torch

import xkernels.integrations.transformers  # noqa: F401  (registers "xkernels")
from tests.integrations.test_transformers import tiny_llama


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=20)
    ap.add_argument("--no-pad", action="store_true", help="no padded row (the dense kernels)")
    ap.add_argument("--bf16-model", action="store_true", help="bf16 weights, no autocast (the reference stays fp32)")
    ap.add_argument("--eval", action="store_true", help="the models in eval mode (gradients still taken)")
    ap.add_argument("--skip-pad-prediction", action="store_true",
                    help="no loss on the first real token, predicted from a padded row (which sees no key)")
    args = ap.parse_args()
    models = {impl: tiny_llama(impl, "cuda").float() for impl in ("xkernels", "sdpa", "eager")}
    for model in models.values():
        model.train(not args.eval)
    if args.bf16_model:
        models["xkernels"], models["sdpa"] = models["xkernels"].bfloat16(), models["sdpa"].bfloat16()
    ids = torch.randint(0, 256, (2, args.length), generator=torch.Generator().manual_seed(4)).cuda()
    mask = torch.ones_like(ids)
    if not args.no_pad:
        mask[0, :3] = 0
    labels = ids.masked_fill(mask == 0, -100)
    if args.skip_pad_prediction and not args.no_pad:
        labels[0, 3] = -100
    grads = {}
    for impl, model in models.items():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=impl != "eager" and not args.bf16_model):
            model(ids, attention_mask=mask, labels=labels).loss.backward()
        grads[impl] = {n: p.grad for n, p in model.named_parameters() if "self_attn" in n}
    for name in grads["eager"]:
        print(f"{name}: xkernels vs fp32 {rel(grads['xkernels'][name], grads['eager'][name]):.3f}, sdpa vs fp32 "
              f"{rel(grads['sdpa'][name], grads['eager'][name]):.3f}, xkernels vs sdpa "
              f"{rel(grads['xkernels'][name], grads['sdpa'][name]):.3f}")


if __name__ == "__main__":
    main()
