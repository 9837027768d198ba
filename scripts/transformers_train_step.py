"""A training step (forward, loss, backward) of a transformers Llama with attn_implementation="xkernels" against
"sdpa" (torch's default backend choice) on the GPU: TinyLlama-1.1B's shape (22 layers, hidden 2048, 32 query / 4 kv
heads of D64) or a D128 variant (16 layers, hidden 2048, 16 / 4 heads of D128), random weights, no download, bf16,
causal without padding. Both models start from the same weights; the step's loss and a few gradients are compared
before any timing, then the caller-seen time of a step (the whole model, host included, back-to-back steps,
median of rounds that alternate the two) and the share of it that attention is (the same step with attention
replaced by an identity of the same shapes with zero gradients for k and v, so the rest of the model, forward and
backward, is timed alone). The three models are built once per shape and reused for its rows.

    python scripts/transformers_train_step.py --json train_step.json [--md train_step.md] [--rows 1x4096 4x2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import transformers

import xkernels
import xkernels.integrations.transformers  # noqa: F401  (registers "xkernels")

SHAPES = {"d64": dict(num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4, head_dim=64),
          "d128": dict(num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4, head_dim=128)}


class _IdentityKV(torch.autograd.Function):
    """O = q, with zero gradients of their shapes for k and v: the projections and rotary embedding behind all
    three still run their backward, as they do around a real attention."""

    @staticmethod
    def forward(ctx, query, key, value):
        ctx.shapes = key.shape, value.shape
        return query.clone()

    @staticmethod
    def backward(ctx, grad):
        k_shape, v_shape = ctx.shapes
        return (grad, torch.zeros(k_shape, dtype=grad.dtype, device=grad.device),
                torch.zeros(v_shape, dtype=grad.dtype, device=grad.device))


def identity_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention's shapes without its work: the query as the output, (B, S, H, D) as transformers expects, and zero
    gradients for key and value, so everything around attention runs forward and backward as it does for the
    real kernels."""
    return _IdentityKV.apply(query, key, value).transpose(1, 2), None


transformers.AttentionInterface.register("identity", identity_attention)


def model(attn: str, shape: str, seq: int):
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                      max_position_embeddings=seq, **SHAPES[shape])
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.bfloat16)
    return m.to("cuda").train()


def step(m, ids) -> torch.Tensor:
    loss = m(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.detach()


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def caller_ms(fns: dict, steps: int = 5, rounds: int = 5) -> dict:
    """Median over rounds of the mean time of `steps` back-to-back steps, the models taking turns each round."""
    times: dict = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t0) / steps * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def row(models: dict, shape: str, batch: int, seq: int) -> dict:
    ids = torch.randint(0, 32000, (batch, seq), generator=torch.Generator().manual_seed(seq)).cuda()
    out: dict = {"shape": shape, "batch": batch, "seq": seq,
                 "params": sum(p.numel() for p in models["sdpa"].parameters())}
    losses = {}
    for name in ("xkernels", "sdpa"):
        if name == "xkernels":
            with torch.no_grad():
                models[name](input_ids=ids, use_cache=False)
            out["forward_backend"] = xkernels.last_backend()
        losses[name] = step(models[name], ids).item()
        if name == "xkernels":
            out["backward_backend"] = xkernels.last_backend()
    out["loss"] = losses
    named = {name: dict(models[name].named_parameters()) for name in ("xkernels", "sdpa")}
    probes = [n for n in named["sdpa"] if n.endswith(("q_proj.weight", "k_proj.weight"))][:: 8]
    out["grad_rel"] = {n: rel(named["xkernels"][n].grad, named["sdpa"][n].grad) for n in probes}
    for m in models.values():
        m.zero_grad(set_to_none=False)

    def fn(name):
        def run():
            step(models[name], ids)
            models[name].zero_grad(set_to_none=False)
        return run

    out["step_ms"] = caller_ms({name: fn(name) for name in models})
    rest = out["step_ms"]["identity"]
    out["attention_ms"] = {k: out["step_ms"][k] - rest for k in ("xkernels", "sdpa")}
    out["step_speedup"] = out["step_ms"]["sdpa"] / out["step_ms"]["xkernels"]
    out["attention_speedup"] = out["attention_ms"]["sdpa"] / out["attention_ms"]["xkernels"]
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| model | B x S | loss xkernels / sdpa | max grad rel | step ms xkernels / sdpa / no attention | "
             "step x sdpa | attention ms xkernels / sdpa | attention x sdpa |", "|---" * 8 + "|"]
    for r in rows:
        s, a = r["step_ms"], r["attention_ms"]
        lines.append(f"| {r['shape']} ({r['params'] / 1e9:.2f}B) | {r['batch']} x {r['seq']} | "
                     f"{r['loss']['xkernels']:.4f} / {r['loss']['sdpa']:.4f} | {max(r['grad_rel'].values()):.3f} | "
                     f"{s['xkernels']:.1f} / {s['sdpa']:.1f} / {s['identity']:.1f} | {r['step_speedup']:.3f} | "
                     f"{a['xkernels']:.1f} / {a['sdpa']:.1f} | {r['attention_speedup']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--shapes", nargs="+", default=["d64", "d128"], choices=sorted(SHAPES))
    ap.add_argument("--rows", nargs="+", default=["1x4096", "4x2048"], help="BxS")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes:
        longest = max(int(r.split("x")[1]) for r in args.rows)
        models = {name: model(name, shape, longest) for name in ("xkernels", "sdpa", "identity")}  # one init
        for r in args.rows:
            b, s = map(int, r.split("x"))
            rows.append(row(models, shape, b, s))
            print(json.dumps(rows[-1]), flush=True)
        del models
        torch.cuda.empty_cache()
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(args.json, "w"), indent=1)
    if args.md:
        open(args.md, "w").write(f"`python scripts/transformers_train_step.py` on {torch.cuda.get_device_name()}\n\n"
                                 + markdown(rows))


if __name__ == "__main__":
    main()
