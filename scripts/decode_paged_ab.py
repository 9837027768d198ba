"""Paged split-KV decode on the device: the shipped key tiles and their neighbours on paged and dense caches,
against SDPA's default on the same keys held dense, interleaved rounds of CUDA-graph replay (device time). Each
variant's O is checked against the float64 reference first.

    python scripts/decode_paged_ab.py --json decode_paged_ab.json [--md decode_paged_ab.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
import torch.nn.functional as F

from xkernels import decode, select
from xkernels.bench.suites import DECODE_ROWS
from xkernels.bench.timing import interleaved_graph_ms
from xkernels.portable.configs import DecodeConfig, decode_config
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import compare_attention, reference_attention
from xkernels.testing.cases import DecodeCase


def variant(case: DecodeCase, inputs, cfg):
    q, k, v, table = inputs
    out = torch.empty_like(q)
    lengths = torch.full((case.b,), case.s, dtype=torch.int32, device=q.device)
    decode._PLANS.clear()
    plan = decode.kvcache_plan(q, k, v, out, table, is_causal=True, recipe=ATTENTION_RECIPES["bf16"], cfg=cfg,
                               write_lse=False, splits=0)
    decode._PLANS.clear()
    return (lambda: plan.run(q, k, v, out, None, lengths, table, None)), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    shipped = decode_config(128, select._target(torch.device("cuda")))
    cfgs = {str(c): c for c in (shipped, dataclasses.replace(shipped, num_stages=4), DecodeConfig(64, 4, 4),
                                DecodeConfig(64, 8, 4))}
    rows, lines = [], ["| shape | variant | us | TB/s | x SDPA | check |", "|---|---|---|---|---|---|"]
    for (b, hq, hkv, s), cache in [(r, c) for r in DECODE_ROWS for c in ("paged16", "paged64", "dense")]:
        case = DecodeCase(b, hq, hkv, s, 128, cache=cache, sync_checks=False)
        inputs = case.inputs("cuda")
        qd, kd, vd = case.dense(inputs)
        ref = reference_attention(qd, kd, vd)
        fns = {"SDPA": lambda qd=qd, kd=kd, vd=vd: F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True)}
        ok = {}
        for cname, cfg in cfgs.items():
            fn, out = variant(case, inputs, cfg)
            fn()
            ok[cname] = bool(compare_attention(out.transpose(1, 2), ref, ATTENTION_RECIPES["bf16"]).passed)
            fns[cname] = fn
        times = interleaved_graph_ms(fns, rounds=args.rounds)
        for name, ms in times.items():
            us = 1e3 * ms
            row = {"shape": case.shape, "variant": name, "us": us, "tbps": case.bytes_read / us / 1e6,
                   "x_sdpa": times["SDPA"] / ms, "check": ok.get(name)}
            rows.append(row)
            lines.append(f"| {case.shape} | {name} | {us:.1f} | {row['tbps']:.2f} | {row['x_sdpa']:.2f} | "
                         f"{'' if row['check'] is None else ('PASS' if row['check'] else 'FAIL')} |")
            print(lines[-1], flush=True)
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(args.json, "w"), indent=1)
        del inputs, qd, kd, vd, ref, fns
        torch.cuda.empty_cache()
    if args.md:
        open(args.md, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
