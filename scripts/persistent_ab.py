"""The persistent Hopper forward against the dense one and SDPA-cuDNN on the sweep's attention rows (B * S = 16K
tokens, H32, bf16; D64 and D128, causal and full, GQA 32/8 at D128), the persistent kernel forced
(`backend="hopper:persistent=2"`) and off (`persistent=0`), and which one the default picks: device time from
CUDA-graph replay (`bench.timing.graph_ms`), all three in the same process; each persistent output checked bitwise
against the dense kernel's first.

    python scripts/persistent_ab.py --json persistent_ab.json [--md persistent_ab.md]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels.bench.sweep import LENGTHS, TOKENS
from xkernels.bench.timing import graph_ms
from xkernels.testing import attention_inputs


def row(hq: int, hkv: int, s: int, d: int, causal: bool) -> dict:
    b = TOKENS // s
    q, k, v = attention_inputs(b, hq, s, s, d, torch.bfloat16, "cuda", hkv=hkv, seed=s + d)
    gqa = hq != hkv
    out = {"shape": f"B{b} H{hq}/{hkv} S{s} D{d}{' causal' if causal else ''}"}

    def ours(backend):
        return lambda: xkernels.attention(q, k, v, is_causal=causal, enable_gqa=gqa, backend=backend)

    ours("auto")()
    out["auto_kernel"] = xkernels.last_backend()  # what the measured rule picks
    o_p = ours("hopper:persistent=2")()
    out["persistent_kernel"] = xkernels.last_backend()
    o_d = ours("hopper:persistent=0")()
    out["bitwise_equal"] = bool(torch.equal(o_p, o_d))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        def cudnn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        out["cudnn_ms"] = graph_ms(cudnn)
    out["persistent_ms"] = graph_ms(ours("hopper:persistent=2"))
    out["dense_ms"] = graph_ms(ours("hopper:persistent=0"))
    flops = 4 * b * hq * s * s * d // (2 if causal else 1)
    out["persistent_tflops"] = flops / out["persistent_ms"] / 1e9
    out["x_cudnn"] = out["cudnn_ms"] / out["persistent_ms"]
    out["dense_x_cudnn"] = out["cudnn_ms"] / out["dense_ms"]
    out["x_dense"] = out["dense_ms"] / out["persistent_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    args = ap.parse_args()
    rows = []
    for hq, hkv, d in ((32, 32, 64), (32, 32, 128), (32, 8, 128)):
        for causal in (True, False):
            for s in args.lengths:
                r = row(hq, hkv, s, d, causal)
                rows.append(r)
                print(f"{r['shape']:<28} cudnn {r['cudnn_ms']:.3f} dense {r['dense_ms']:.3f} persistent "
                      f"{r['persistent_ms']:.3f} ms  x cuDNN {r['x_cudnn']:.2f} (dense {r['dense_x_cudnn']:.2f})  "
                      f"equal={r['bitwise_equal']}  auto: {r['auto_kernel']}", flush=True)
                torch.cuda.empty_cache()
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(args.json, "w"), indent=1)
    if args.md:
        lines = ["| shape | cuDNN ms | dense ms | persistent ms | persistent TFLOP/s | x cuDNN | dense x cuDNN |",
                 "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['cudnn_ms']:.3f} | {r['dense_ms']:.3f} | {r['persistent_ms']:.3f} | "
                  f"{r['persistent_tflops']:.0f} | {r['x_cudnn']:.2f} | {r['dense_x_cudnn']:.2f} |" for r in rows]
        open(args.md, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
