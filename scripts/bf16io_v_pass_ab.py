"""bf16io's V conversion on the H200: the producer converting each V tile in shared memory (the shipped path)
against one elementwise pass converting V to fp16 before the kernel (`hopper:v_pass=1`, which then runs the kernel the
fp16 recipe runs), with bf16 and SDPA-cuDNN in the same process. First every variant against float64 (bf16io's
contract, NaN-poisoned outputs; tails, GQA, causal Sq != Skv), then device time (CUDA-graph replay, interleaved
shuffled rounds) on the seeds' rows, D64/D256, GQA and the 16K-token sweep's 512-4K rows.

The selection (`select.v_pass_pays`) takes the pass from 2048 query rows per KV head at D128/D256 (8192 at D64; twice
those causal); `--mid` times only the rows measured second, between the first rows' two sides (MID_ROWS).

The prediction: the pass costs one read of V and one write of its fp16 copy (~2 x Hkv x Skv x D x 2 bytes at HBM
speed: ~40 us for B1 H32 8K D128, 2 % of the kernel), so bf16io lands within a few % of bf16's time on long rows;
on short rows of many sequences the pass's share grows (S = 512: ~20 %), where the producer's conversion may win.

    python scripts/bf16io_v_pass_ab.py --json bf16io_v_pass.json --md bf16io_v_pass.md
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels.bench.report import check_summary
from xkernels.bench.timing import interleaved_graph_ms
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_attention, reference_attention

BF16IO = ATTENTION_RECIPES["bf16io"]
# (B, Hq, Hkv, Sq, Skv, D, causal)
ROWS = ((1, 32, 32, 8192, 8192, 128, False), (1, 32, 32, 8192, 8192, 128, True),
        (1, 32, 32, 8192, 16384, 128, False), (1, 32, 32, 16384, 16384, 128, False),
        (1, 32, 32, 8192, 8192, 64, False), (1, 32, 32, 8192, 8192, 256, False), (1, 32, 8, 8192, 8192, 128, True),
        (32, 32, 32, 512, 512, 128, True), (16, 32, 32, 1024, 1024, 128, False), (8, 32, 32, 2048, 2048, 128, True),
        (4, 32, 32, 4096, 4096, 128, False), (16, 32, 32, 1024, 1024, 64, True), (16, 32, 32, 1024, 1024, 256, False))
CHECKS = ((1, 4, 4, 1000, 1000, False), (1, 4, 2, 300, 777, True), (2, 8, 2, 1024, 1024, True))
# 16K-token rows between ROWS' two sides (1024 and 4096 query rows per KV head), which set `select.v_pass_pays`
MID_ROWS = ((8, 32, 32, 2048, 2048, 128, False), (4, 32, 32, 4096, 4096, 128, True),
            (8, 32, 8, 2048, 2048, 128, True), (2, 32, 32, 8192, 8192, 64, True))
# "bf16io": the selection's choice; "in-kernel" and "v_pass" forced either way
VARIANTS = {"bf16": dict(precision="bf16"), "bf16io": dict(precision="bf16io"),
            "bf16io in-kernel": dict(precision="bf16io", backend="hopper:v_pass=0"),
            "bf16io v_pass": dict(precision="bf16io", backend="hopper:v_pass=1")}


def checks() -> list[dict]:
    out = []
    for d in (64, 128, 256):
        for b, hq, hkv, sq, skv, causal in CHECKS:
            q, k, v = attention_inputs(b, hq, sq, skv, d, torch.bfloat16, "cuda", hkv=hkv, seed=sq + d)
            ref = reference_attention(q, k, v, is_causal=causal)
            for name, kw in VARIANTS.items():
                o = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True,
                                       out=torch.full_like(q, float("nan")), **kw)
                c = compare_attention(o, ref, ATTENTION_RECIPES[kw["precision"]])
                out.append({"variant": name, "kernel": xkernels.last_backend(), "shape": [b, hq, hkv, sq, skv, d,
                                                                                          causal],
                            "passed": c.passed, "rel_rms": c.rel_rms, "reason": c.reason})
                if not c.passed:
                    print("FAILED", out[-1], flush=True)
    return out


def time_row(b, hq, hkv, sq, skv, d, causal) -> dict:
    q, k, v = attention_inputs(b, hq, sq, skv, d, torch.bfloat16, "cuda", hkv=hkv, seed=1)
    fns = {name: (lambda kw=kw: xkernels.attention(q, k, v, is_causal=causal, enable_gqa=hkv != hq, **kw))
           for name, kw in VARIANTS.items()}
    kernels = {}
    for name, fn in fns.items():
        fn()
        kernels[name] = xkernels.last_backend()
    kv = (k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)) if hkv != hq else (k, v)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, *kv, is_causal=causal)

    # the pass alone (V to fp16, as `HopperAttentionConfig.kernel_v` does it): whether a v_pass row's extra time is
    # the copy or the kernel after it
    ms = interleaved_graph_ms(fns | {"cudnn": cudnn, "pass": lambda: v.to(torch.float16)}, rounds=3)
    pass_ms = ms.pop("pass")
    flops = 4 * b * hq * sq * skv * d / (2 if causal else 1)
    row = {"shape": f"B{b} H{hq}/{hkv} {sq}x{skv} D{d}{' causal' if causal else ''}", "ms": ms, "kernels": kernels,
           "pass_ms": pass_ms, "pass_gbps": 2 * v.nbytes / pass_ms / 1e6,
           "tflops": {n: flops / t / 1e9 for n, t in ms.items()},
           "x_bf16_time": {n: ms[n] / ms["bf16"] for n in VARIANTS},
           "x_cudnn": {n: ms["cudnn"] / ms[n] for n in VARIANTS}}
    print(row, flush=True)
    return row


def markdown(res: dict) -> str:
    names = list(VARIANTS)
    timed = names[1:]
    lines = ["| shape | cuDNN ms | " + " | ".join(f"{n} x cuDNN" for n in names) + " | "
             + " | ".join(f"{n} / bf16 time" for n in timed) + " | pass alone ms (GB/s) | selected |",
             "|---" * (4 + len(names) + len(timed)) + "|"]
    for r in res["rows"]:
        picked = "v_pass" if "-vp" in r["kernels"]["bf16io"] else "in-kernel"
        lines.append(f"| {r['shape']} | {r['ms']['cudnn']:.3f} | " + " | ".join(f"{r['x_cudnn'][n]:.2f}" for n in names)
                     + " | " + " | ".join(f"{r['x_bf16_time'][n]:.3f}" for n in timed)
                     + f" | {r['pass_ms']:.3f} ({r['pass_gbps']:.0f}) | {picked} |")
    return "\n".join(lines + check_summary(res["check"])) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--mid", action="store_true", help="only the rows between the selection's two sides (MID_ROWS)")
    args = ap.parse_args()
    res: dict = {"device": torch.cuda.get_device_name(), "check": checks(), "rows": []}
    print(f"checks: {sum(c['passed'] for c in res['check'])}/{len(res['check'])} passed", flush=True)
    for row in MID_ROWS if args.mid else ROWS + MID_ROWS:
        res["rows"].append(time_row(*row))
        json.dump(res, open(args.json, "w"), indent=1)
        torch.cuda.empty_cache()
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(res))


if __name__ == "__main__":
    main()
