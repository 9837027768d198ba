"""Split-KV decode tuning on the device: device time (CUDA-graph replay) of every (key tile, stages, warps, splits)
on the decode anchor rows, against SDPA's default on the same problem; then page sizes with each row's best config,
and the dense API's crossover (split-KV kernel vs the forward kernel) as Sq grows. Writes one JSON.

    python scripts/decode_sweep.py --json decode_sweep.json [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import torch.nn.functional as F

import xkernels
from xkernels import decode, select
from xkernels.bench.suites import DECODE_ROWS
from xkernels.bench.timing import graph_ms
from xkernels.portable.configs import DecodeConfig, decode_config
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import compare_attention, reference_attention
from xkernels.testing.cases import DecodeCase

REPS = 20


def graph_time_us(fn, reps: int = REPS) -> float:
    """Device time per call, us: CUDA-graph replay (`bench.timing.graph_ms`)."""
    return 1e3 * graph_ms(fn, reps)


def kvcache_fn(case: DecodeCase, inputs, cfg: DecodeConfig, splits: int):
    q, k, v, table = inputs
    recipe = ATTENTION_RECIPES[case.recipe]
    out = torch.empty_like(q)
    lengths = torch.full((case.b,), case.s, dtype=torch.int32, device=q.device)
    plan = decode.kvcache_plan(q, k, v, out, table, is_causal=False, recipe=recipe, cfg=cfg, write_lse=False,
                               splits=splits)
    return plan, lambda: plan.run(q, k, v, out, None, lengths, table, None), out


def sdpa_fn(case: DecodeCase, inputs):
    q, k, v = case.dense(inputs)
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=case.hq != case.hkv)


def checked(case, inputs, out) -> bool:
    q, k, v = case.dense(inputs)
    c = compare_attention(out.transpose(1, 2), reference_attention(q, k, v), ATTENTION_RECIPES[case.recipe])
    return bool(c.passed)


def crossover_row(sq: int) -> dict:
    """B8 H32/8 8K D128 through the dense API with `sq` query rows: the split-KV kernel, the forward kernel
    ("hopper" forced) and SDPA's default."""
    case = DecodeCase(8, 32, 8, 8192, 128, cache="dense-api", sq=sq)
    q, k, v, _ = case.inputs("cuda")
    cfg = decode_config(128, select._target(torch.device("cuda")))
    out = torch.empty_like(q)
    plan = decode.dense_plan(q, k, v, out, is_causal=False, recipe=ATTENTION_RECIPES["bf16"], cfg=cfg,
                             write_lse=False)
    split_us = graph_time_us(lambda: plan.run(q, k, v, out, None, None, None, None))
    fwd_us = graph_time_us(lambda: xkernels.attention(q, k, v, enable_gqa=True, backend="hopper"))
    sdpa = graph_time_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    return {"sq": sq, "split_kv_us": split_us, "forward_us": fwd_us, "sdpa_us": sdpa, "splits": plan.splits}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pages-only", action="store_true", help="only the paged caches, over a few key tiles")
    args = ap.parse_args()
    t0 = time.time()
    res: dict = {"device": torch.cuda.get_device_name(), "rows": [], "pages": [], "crossover": []}
    tiles = [(32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (128, 8, 3)]
    split_list = [0, 1, 2, 4, 8, 16, 32, 64]
    rows = [(*r, 128) for r in DECODE_ROWS]
    if args.quick:  # the shipped tiles against their neighbours, and the other head dims
        tiles, split_list = [(64, 4, 3), (128, 4, 3), (128, 4, 2)], [0, 1, 2, 4, 8, 16, 32]
        rows += [(8, 32, 8, 8192, 64), (8, 32, 8, 8192, 256), (1, 32, 8, 131072, 256)]
    for b, hq, hkv, s, d in [] if args.pages_only else rows:
        case = DecodeCase(b, hq, hkv, s, d, cache="dense")
        inputs = case.inputs("cuda")
        sdpa = graph_time_us(sdpa_fn(case, inputs))
        row = {"shape": case.shape, "bytes": case.bytes_read, "sdpa_us": sdpa, "configs": []}
        for (bn, w, st), sp in itertools.product(tiles, split_list):
            cfg = DecodeConfig(bn if d < 256 else bn // 2, w, st)
            try:
                plan, fn, out = kvcache_fn(case, inputs, cfg, sp)
                fn()
                ok = checked(case, inputs, out) if sp in (0, 8) else None
                us = graph_time_us(fn)
            except Exception as e:  # noqa: BLE001 - a config that cannot compile is a row, not a lost sweep
                row["configs"].append({"cfg": str(cfg), "splits": sp, "error": str(e)[:200]})
                continue
            row["configs"].append({"cfg": str(cfg), "splits_asked": sp, "splits": plan.splits, "us": us,
                                   "tbps": case.bytes_read / us / 1e6, "x_sdpa": sdpa / us, "check": ok})
        best = min((c for c in row["configs"] if "us" in c), key=lambda c: c["us"])
        row["best"] = best
        res["rows"].append(row)
        print(f"{case.shape}: SDPA {sdpa:.1f} us ({case.bytes_read / sdpa / 1e6:.2f} TB/s); best {best}", flush=True)
        heur = [c for c in row["configs"] if c.get("splits_asked") == 0]
        for c in heur:
            print(f"   heuristic {c['cfg']} splits={c['splits']}: {c['us']:.1f} us {c['tbps']:.2f} TB/s "
                  f"x{c['x_sdpa']:.2f}", flush=True)
        json.dump(res, open(args.json, "w"), indent=1)
        del inputs
        torch.cuda.empty_cache()

    # pages: the shipped config and heuristic split on paged caches (--pages-only: and a few other key tiles)
    shipped = decode_config(128, select._target(torch.device("cuda")))
    page_cfgs = [shipped] + ([DecodeConfig(64, 4, 3), DecodeConfig(64, 4, 4), DecodeConfig(128, 4, 2),
                              DecodeConfig(128, 8, 3)] if args.pages_only else [])
    for (b, hq, hkv, s), cache in itertools.product(DECODE_ROWS, ("dense", "paged16", "paged64", "paged256")):
        case = DecodeCase(b, hq, hkv, s, 128, cache=cache)
        inputs = case.inputs("cuda")
        sdpa = graph_time_us(sdpa_fn(case, inputs))
        for cfg in page_cfgs:
            plan, fn, out = kvcache_fn(case, inputs, cfg, 0)
            fn()
            ok = checked(case, inputs, out) if cfg == shipped else None
            us = graph_time_us(fn)
            res["pages"].append({"shape": case.shape, "cfg": str(cfg), "splits": plan.splits, "us": us,
                                 "tbps": case.bytes_read / us / 1e6, "sdpa_us": sdpa, "x_sdpa": sdpa / us,
                                 "check": ok})
            print(res["pages"][-1], flush=True)
        json.dump(res, open(args.json, "w"), indent=1)
        del inputs
        torch.cuda.empty_cache()

    # dense API crossover: Sq query rows, split-KV kernel vs the forward kernel ("hopper" forced) vs SDPA
    for sq in () if args.pages_only else (1, 4, 16, 32, 64, 128):
        res["crossover"].append(crossover_row(sq))
        print(res["crossover"][-1], flush=True)
        json.dump(res, open(args.json, "w"), indent=1)
    res["seconds"] = time.time() - t0
    json.dump(res, open(args.json, "w"), indent=1)
    print(f"done in {res['seconds']:.0f} s")


if __name__ == "__main__":
    main()
