"""Where a transformers generate() step's time goes with attn_implementation="xkernels" and "sdpa": a ~1B Llama
(`transformers_1b.model`), greedy generate of 64 tokens in interleaved rounds (median per token), the host time
spent inside each attention function (a timer around transformers' call of it), the synchronizing CUDA calls one
generate makes (torch.cuda.set_sync_debug_mode), the device time of each kernel over one generate
(torch.profiler), and a cProfile of one xkernels generate (top functions).

    python3 scripts/generate_host.py [--json generate_host.json] [--rounds 3]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
import warnings

import torch
from transformers import AttentionInterface
from transformers_1b import model

import xkernels.integrations.transformers  # noqa: F401  (registers "xkernels")

TOKENS = 64


def timed_attention(name: str, spent: list[float]) -> None:
    """Wrap the registered attention function `name` so each call adds its host time to spent[0]."""
    fn = AttentionInterface._global_mapping[name]

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    AttentionInterface._global_mapping[name] = wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    models = {name: model(name) for name in ("xkernels", "sdpa")}
    spent = {name: [0.0] for name in models}
    for name in models:
        timed_attention(name, spent[name])
    prompt = torch.randint(0, 32000, (4, 512), generator=torch.Generator().manual_seed(1)).cuda()
    kw = dict(max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False)
    per_token: dict[str, list[float]] = {name: [] for name in models}
    attention_ms: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        for m in models.values():
            m.generate(prompt, **kw)  # compiles, plans
        for r in range(args.rounds):
            for name in (list(models) if r % 2 == 0 else list(reversed(models))):
                spent[name][0] = 0.0
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                models[name].generate(prompt, **kw)
                torch.cuda.synchronize()
                per_token[name].append((time.perf_counter() - t0) / TOKENS * 1e3)
                attention_ms[name].append(spent[name][0] / TOKENS * 1e3)
        syncs = {}
        for name, m in models.items():
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                m.generate(prompt, **kw)
            torch.cuda.set_sync_debug_mode(0)
            syncs[name] = sorted({str(w.message).splitlines()[0][:120] for w in caught})
            syncs[name + "_count"] = len(caught)
        kernels = {}
        for name, m in models.items():  # device time per kernel over one generate
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as tp:
                m.generate(prompt, **kw)
            kernels[name] = tp.key_averages().table(sort_by="device_time_total", row_limit=12, max_name_column_width=60)
            print(name, "kernels over one generate:\n" + kernels[name], flush=True)
        prof = cProfile.Profile()
        prof.enable()
        models["xkernels"].generate(prompt, **kw)
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
    res = {"ms_per_token": {k: statistics.median(v) for k, v in per_token.items()},
           "ms_per_token_rounds": per_token,
           "attention_host_ms_per_token": {k: statistics.median(v) for k, v in attention_ms.items()},
           "syncs_per_generate": syncs, "backend": xkernels.last_backend(), "kernels": kernels}
    print(json.dumps({k: v for k, v in res.items() if k != "kernels"}, indent=1))
    print(out.getvalue())
    if args.json:
        json.dump(res | {"profile": out.getvalue()}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
