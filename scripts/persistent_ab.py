"""Persistent Hopper forward variants against the dense kernel and SDPA-cuDNN on the sweep's attention rows
(B * S = 16K tokens, H32, bf16; D64, D128 and D256 (`--dims`), causal and full, GQA 32/8 at D128): each variant is a
backend string (`hopper:persistent=2,...`, the persistent kernel forced with config overrides), the dense kernel is
`hopper:persistent=0`, and the default's pick is recorded. Device time from CUDA-graph replay, all in the same
process, in interleaved rounds of shuffled order (`bench.timing.interleaved_graph_ms`, median of `--rounds`);
every variant's output is checked bitwise against the dense kernel's first (the same per-row arithmetic in another
tile order).

    python scripts/persistent_ab.py --json persistent_ab.json [--md persistent_ab.md]
        [--variants hopper:persistent=2 hopper:persistent=2,chained=1 bf16@auto] [--lengths 512 1024] [--dims 64 128]
        [--precision bf16io]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels.bench.sweep import LENGTHS, TOKENS
from xkernels.bench.timing import graph_ms, interleaved_graph_ms
from xkernels.testing import attention_inputs

DENSE = "hopper:persistent=0"


def row(hq: int, hkv: int, s: int, d: int, causal: bool, variants: list[str], rounds: int,
        precision: str = "auto") -> dict:
    b = TOKENS // s
    q, k, v = attention_inputs(b, hq, s, s, d, torch.bfloat16, "cuda", hkv=hkv, seed=s + d)
    gqa = hq != hkv
    out = {"shape": f"B{b} H{hq}/{hkv} S{s} D{d}{' causal' if causal else ''}", "variants": {}}

    def ours(variant):  # "backend", or "precision@backend" for another recipe than the row's
        prec, _, backend = variant.rpartition("@")
        return lambda: xkernels.attention(q, k, v, is_causal=causal, enable_gqa=gqa, backend=backend,
                                          precision=prec or precision)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    ours("auto")()
    out["auto_kernel"] = xkernels.last_backend()  # what the measured rule picks
    o_d = ours(DENSE)()
    fns = {"cuDNN": cudnn, "dense": ours(DENSE)}
    for backend in variants:
        try:
            o_p = ours(backend)()
            out["variants"][backend] = {"kernel": xkernels.last_backend()}
            if "@" not in backend:  # another recipe's output is not comparable bit for bit
                out["variants"][backend]["bitwise_equal"] = bool(torch.equal(o_p, o_d))
            graph_ms(ours(backend), reps=1, repeats=1)  # it captures (a failure is recorded, not fatal)
            fns[backend] = ours(backend)
        except Exception as e:  # a variant that cannot run this row (config check, compile error) is recorded
            out["variants"][backend] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    # interleaved rounds in shuffled orders (`interleaved_graph_ms`): in a fixed order the same kernel measured 0.85
    # and 1.00x cuDNN in one call
    med = interleaved_graph_ms(fns, rounds)
    out["cudnn_ms"] = med.pop("cuDNN")
    out["dense_ms"] = med.pop("dense")
    flops = 4 * b * hq * s * s * d // (2 if causal else 1)
    for backend, t in med.items():
        r = out["variants"][backend]
        r["ms"] = t
        r["tflops"] = flops / r["ms"] / 1e9
        r["x_cudnn"] = out["cudnn_ms"] / r["ms"]
        r["x_dense"] = out["dense_ms"] / r["ms"]
    out["dense_x_cudnn"] = out["cudnn_ms"] / out["dense_ms"]
    return out


def _cell(x: dict) -> str:
    if "ms" not in x:
        return "error"
    return f"{x['x_cudnn']:.2f}" + ("" if x.get("bitwise_equal", True) else " (differs)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--variants", nargs="+", default=["hopper:persistent=2"])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median)")
    ap.add_argument("--precision", default="auto", help="the recipe of the dense kernel and of every variant that "
                    "names none (a variant `bf16@auto` runs another)")
    args = ap.parse_args()
    rows = []
    for hq, hkv, d in ((32, 32, 64), (32, 32, 128), (32, 8, 128), (32, 32, 256)):
        if d not in args.dims:
            continue
        for causal in (True, False):
            for s in args.lengths:
                r = row(hq, hkv, s, d, causal, args.variants, args.rounds, args.precision)
                rows.append(r)
                cells = "  ".join(f"{name.removeprefix('hopper:')} " + _cell(x) for name, x in r["variants"].items())
                print(f"{r['shape']:<28} cudnn {r['cudnn_ms']:.3f} ms  x cuDNN: dense {r['dense_x_cudnn']:.2f}  {cells}"
                      f"  auto: {r['auto_kernel']}", flush=True)
                torch.cuda.empty_cache()
    json.dump({"device": torch.cuda.get_device_name(), "precision": args.precision, "variants": args.variants,
               "rows": rows},
              open(args.json, "w"), indent=1)
    if args.md:
        names = [v.removeprefix("hopper:") for v in args.variants]
        lines = ["| shape | cuDNN ms | dense x cuDNN | " + " | ".join(f"{n} x cuDNN" for n in names) + " |",
                 "|---|---|---|" + "---|" * len(names)]
        for r in rows:
            cells = " | ".join(_cell(x) for x in r["variants"].values())
            lines.append(f"| {r['shape']} | {r['cudnn_ms']:.3f} | {r['dense_x_cudnn']:.2f} | {cells} |")
        open(args.md, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
