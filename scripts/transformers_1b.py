"""A ~1B-parameter transformers Llama (TinyLlama-1.1B's shape: 22 layers, hidden 2048, 32 query / 4 kv heads of
D64; random weights, no download) with attn_implementation="xkernels" against "sdpa" on the GPU: prefill logits,
greedy generate() with the KV cache (tokens and per-step logits), and the caller-seen time of both. transformers'
"eager" attention (bf16 matmuls and softmax) against "sdpa" gives the noise floor the same comparisons have
without xkernels: with random weights the top logits are near ties, so greedy paths part early for any two
kernels.

    python scripts/transformers_1b.py --json transformers_1b.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import transformers

import xkernels
import xkernels.integrations.transformers  # noqa: F401  (registers "xkernels")


def model(attn: str):
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                      num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                      head_dim=64, max_position_embeddings=4096)
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.bfloat16)
    return m.to("cuda").eval()


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def timed(fn, reps: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    ours, sdpa, eager = model("xkernels"), model("sdpa"), model("eager")
    params = sum(p.numel() for p in ours.parameters())
    res: dict = {"params": params, "device": torch.cuda.get_device_name()}
    ids = torch.randint(0, 32000, (4, 1024), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        a = ours(ids).logits
        res["prefill_backend"] = xkernels.last_backend()
        b = sdpa(ids).logits
        c = eager(ids).logits
        res["prefill_logits_rel"] = {"xkernels_vs_sdpa": rel(a, b), "eager_vs_sdpa": rel(c, b)}
        res["prefill_argmax_agree"] = {"xkernels_vs_sdpa": (a.argmax(-1) == b.argmax(-1)).float().mean().item(),
                                       "eager_vs_sdpa": (c.argmax(-1) == b.argmax(-1)).float().mean().item()}
        del a, b, c
        res["prefill_s"] = {"xkernels": timed(lambda: ours(ids)), "sdpa": timed(lambda: sdpa(ids))}
        prompt = ids[:, :512]
        kw = dict(max_new_tokens=64, do_sample=False, output_logits=True, return_dict_in_generate=True)
        g1 = ours.generate(prompt, **kw)
        res["decode_backend"] = xkernels.last_backend()
        g2 = sdpa.generate(prompt, **kw)
        g3 = eager.generate(prompt, **kw)
        for name, g in (("xkernels_vs_sdpa", g1), ("eager_vs_sdpa", g3)):
            first = [int((r1 != r2).nonzero()[0]) - 512 if (r1 != r2).any() else 64
                     for r1, r2 in zip(g.sequences, g2.sequences, strict=True)]
            res.setdefault("generate_first_divergence", {})[name] = first
            # per-step logits of the rows still on the same path (same tokens so far)
            res.setdefault("generate_logits_rel", {})[name] = [
                rel(x[[i for i, f in enumerate(first) if f >= t]], y[[i for i, f in enumerate(first) if f >= t]])
                for t, (x, y) in enumerate(zip(g.logits, g2.logits, strict=True)) if max(first) >= t][:16]
        kw = dict(max_new_tokens=64, min_new_tokens=64, do_sample=False)
        res["generate_s"] = {"xkernels": timed(lambda: ours.generate(prompt, **kw), 2),
                             "sdpa": timed(lambda: sdpa.generate(prompt, **kw), 2)}
        res["generate_ms_per_token"] = {k: 1e3 * v / 64 for k, v in res["generate_s"].items()}
    print(json.dumps(res, indent=1))
    json.dump(res, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
