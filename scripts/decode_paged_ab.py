"""Split-KV decode on the device: the shipped key tiles and their neighbours (and more key splits than the
heuristic's one wave, for more programs per SM) on paged and dense caches, against SDPA's default on the same keys
held dense, interleaved rounds of CUDA-graph replay (device time). Each variant's O is checked against the float64
reference first.

    python scripts/decode_paged_ab.py --json decode_paged_ab.json [--md decode_paged_ab.md]
        [--dim 64] [--caches dense paged16seq] [--configs 128,8,3 128,4,3] [--split-scales 1 2] [--fused]
        [--preload 1024] [--selected] [--pdl]

A cache named with "seq" after it (paged16seq) holds its pages in order, behind an identity block table: against
the shuffled table of the same page size, what the random placement costs.
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


def variant(case: DecodeCase, inputs, cfg, split_scale: int):
    """(the call, its output, its launch: "splits=N" or stream-K's grid): the heuristic's splits times
    `split_scale`."""
    q, k, v, table = inputs
    out = torch.empty_like(q)
    lengths = torch.full((case.b,), case.s, dtype=torch.int32, device=q.device)
    decode._PLANS.clear()
    kwargs = dict(is_causal=True, recipe=ATTENTION_RECIPES["bf16"], cfg=cfg, write_lse=False)
    plan = decode.kvcache_plan(q, k, v, out, table, splits=0, **kwargs)
    if split_scale != 1:
        decode._PLANS.clear()
        plan = decode.kvcache_plan(q, k, v, out, table, splits=plan.splits * split_scale, **kwargs)
    decode._PLANS.clear()
    launch = plan.name.rstrip("]").split(" BM", 1)[1].split(" ", 1)[1]  # "splits=N" or "stream-K grid=G ..."
    return (lambda: plan.run(q, k, v, out, None, lengths, table, None)), out, launch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--caches", nargs="+", default=["paged16", "paged64", "dense"])
    ap.add_argument("--configs", nargs="+", default=[], help="BLOCK_N,warps,stages (default: shipped and 3 others)")
    ap.add_argument("--split-scales", nargs="+", type=int, default=[1])
    ap.add_argument("--fused", action="store_true", help="each config also with the fused merge (no combine kernel)")
    ap.add_argument("--preload", nargs="+", type=int, default=[],
                    help="each config also with a split's block ids read before its loop (DecodeConfig.preload_ids)")
    ap.add_argument("--pdl", action="store_true",
                    help="each config also with the other setting of DecodeConfig.pdl (the combine as a programmatic "
                         "dependent launch, the default on sm_90, or a plain launch after the split kernel)")
    ap.add_argument("--selected", action="store_true",
                    help="per row the config the selection picks for its pairs (not --configs or the defaults)")
    args = ap.parse_args()
    target = select._target(torch.device("cuda"))
    shipped = decode_config(args.dim, target)

    def configs(pairs: int) -> list[DecodeConfig]:
        if args.selected:
            cfgs = [decode_config(args.dim, target, interpret=False, pairs=pairs,
                                  sms=torch.cuda.get_device_properties(0).multi_processor_count)]
        elif args.configs:
            cfgs = [DecodeConfig(*map(int, c.split(","))) for c in args.configs]
        else:
            cfgs = [shipped, dataclasses.replace(shipped, num_stages=4), DecodeConfig(64, 4, 4), DecodeConfig(64, 8, 4)]
        if args.fused:
            cfgs += [dataclasses.replace(c, fused_combine=True) for c in cfgs]
        cfgs += [dataclasses.replace(c, preload_ids=n) for n in args.preload for c in list(cfgs)]
        if args.pdl:
            cfgs += [dataclasses.replace(c, pdl=not c.pdl) for c in cfgs if not c.fused_combine]
        return cfgs

    rows, lines = [], ["| shape | variant | us | TB/s | x SDPA | check |", "|---|---|---|---|---|---|"]
    for (b, hq, hkv, s), cache in [(r, c) for r in DECODE_ROWS for c in args.caches]:
        cfgs = configs(b * hkv)
        sequential = cache.endswith("seq")  # pages in order (an identity table): what the random order costs
        case = DecodeCase(b, hq, hkv, s, args.dim, cache=cache.removesuffix("seq"), sync_checks=False)
        inputs = case.inputs("cuda")
        if sequential:
            q, k, v, table = inputs
            order = table.flatten().long()  # logical page i of the batch sits in block order[i]
            inputs = (q, k[order].contiguous(), v[order].contiguous(),
                      torch.arange(order.numel(), dtype=torch.int32, device="cuda").view(table.shape))
        qd, kd, vd = case.dense(inputs)
        ref = reference_attention(qd, kd, vd)
        fns = {"SDPA": lambda qd=qd, kd=kd, vd=vd: F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True)}
        ok = {}
        for cfg in cfgs:
            for scale in args.split_scales:
                fn, out, splits = variant(case, inputs, cfg, scale)
                name = f"{cfg} {splits}"
                fn()
                ok[name] = bool(compare_attention(out.transpose(1, 2), ref, ATTENTION_RECIPES["bf16"]).passed)
                fns[name] = fn
        times = interleaved_graph_ms(fns, rounds=args.rounds)
        for name, ms in times.items():
            us = 1e3 * ms
            row = {"shape": case.shape + " sequential pages" * sequential, "variant": name, "us": us,
                   "tbps": case.bytes_read / us / 1e6,
                   "x_sdpa": times["SDPA"] / ms, "check": ok.get(name)}
            rows.append(row)
            lines.append(f"| {row['shape']} | {name} | {us:.1f} | {row['tbps']:.2f} | {row['x_sdpa']:.2f} | "
                         f"{'' if row['check'] is None else ('PASS' if row['check'] else 'FAIL')} |")
            print(lines[-1], flush=True)
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(args.json, "w"), indent=1)
        del inputs, qd, kd, vd, ref, fns
        torch.cuda.empty_cache()
    if args.md:
        open(args.md, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
