"""The acc16 recipes (fp16 P.V accumulator) against their fp32-accumulator bases on the H200: error against float64
(B1 H4, Sq = Skv = 8K and 16K, D64/D128, full and causal: every check of the recipe's contract, and the base's
contract applied to the acc16 output) and device time at B1 H32 8K x 8K (CUDA-graph replay) with SDPA-cuDNN in the
same process.

    python scripts/acc16_ab.py --json acc16_ab.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels.bench.timing import graph_ms
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_attention, reference_attention

PAIRS = (("fp16", "fp16-acc16"), ("bf16io", "bf16io-acc16"))


def time_row(base: str, acc16: str, d: int, causal: bool) -> dict:
    q, k, v = attention_inputs(1, 32, 8192, 8192, d, ATTENTION_RECIPES[base].io_dtype, "cuda", seed=1)
    t: dict = {"shape": f"B1 H32 8K D{d}{' causal' if causal else ''}"}
    for name in (base, acc16):
        t[name] = graph_ms(lambda name=name: xkernels.attention(q, k, v, is_causal=causal, precision=name))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        t["cudnn_ms"] = graph_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    t["acc16_speedup"] = t[base] / t[acc16]
    print(t, flush=True)
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    rows = []
    for base, acc16 in PAIRS:
        for d in (64, 128):
            for s in (8192, 16384):
                for causal in (False, True):
                    q, k, v = attention_inputs(1, 4, s, s, d, ATTENTION_RECIPES[base].io_dtype, "cuda", seed=s + d)
                    ref = reference_attention(q, k, v, is_causal=causal)
                    row = {"shape": f"B1 H4 {s} D{d}{' causal' if causal else ''}", "base": base}
                    for name in (base, acc16):
                        o = xkernels.attention(q, k, v, is_causal=causal, precision=name)
                        c = compare_attention(o, ref, ATTENTION_RECIPES[name])
                        row[name] = {"rel_rms": c.rel_rms, "max_abs": c.max_abs_diff, "worst_row": c.worst_row_rel,
                                     "passed": c.passed, "kernel": xkernels.last_backend()}
                    row[acc16]["passes_base_contract"] = compare_attention(
                        xkernels.attention(q, k, v, is_causal=causal, precision=acc16), ref,
                        ATTENTION_RECIPES[base]).passed
                    rows.append(row)
                    print(row["shape"], base, f"{row[base]['rel_rms']:.2e}", acc16, f"{row[acc16]['rel_rms']:.2e}",
                          row[acc16]["passed"], flush=True)
                    del ref
                    torch.cuda.empty_cache()
    timing = [time_row(base, acc16, d, causal) for base, acc16 in PAIRS for d in (64, 128)
              for causal in (False, True)]
    json.dump({"device": torch.cuda.get_device_name(), "accuracy": rows, "timing": timing}, open(args.json, "w"),
              indent=1)


if __name__ == "__main__":
    main()
