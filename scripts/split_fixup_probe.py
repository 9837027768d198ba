"""Where the Hopper GEMM's split-K time goes: the same split launch with parts of its fix-up removed, each in a fresh
process (the kernel's `reduce_parts` is replaced before anything compiles), against the unsplit tile and
torch.matmul in the same process. Device time from CUDA-graph replay, interleaved rounds. Only "full" and "all-store"
compute the right product (checked); the others time the launch without a part of the fix-up:

  full        the shipped fix-up (`partials.reduce_parts`): the units that do not arrive last store their partials,
              the last waits for them and reloads theirs
  all-store   the fix-up before it: every unit stores its partial and counts itself, the last reloads them all
  no-reload   every unit stores its partial and counts itself; the last writes its own as C (no reloads)
  store-only  the partial stores, no barrier, atomic or reloads (the last split writes C)
  none        nothing: the last split writes its partial as C (the split launch's main loops and C stores alone)

A captured split launch also zeroes its counters (a per-capture workspace, `plans.MatmulPlan._workspace`): a fill
node of ~1-2 us in every split row alike, so compare the variants with one another.

    python scripts/split_fixup_probe.py --json probe.json   (runs every variant, one process each)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

ROWS = {  # shape -> the tile, every field named; the split launches add split_k
    (2560, 2560, 2560): ("block_m=128,block_n=256,block_k=64,stages=3,num_warps=8,consumers=1,row_wgs=1",
                         ("split_k=2",)),
    (1024, 1024, 1024): ("block_m=64,block_n=128,block_k=64,stages=8,num_warps=4,consumers=1,row_wgs=1",
                         ("split_k=2",)),
    (128, 4096, 14336): ("block_m=64,block_n=128,block_k=64,stages=8,num_warps=4,consumers=1,row_wgs=1",
                         ("split_k=2",)),  # the shipped split: a few rows against a long-K weight
}
VARIANTS = ("full", "all-store", "no-reload", "store-only", "none")


def patch(variant: str) -> None:
    from xkernels.hopper import gemm, partials
    from xkernels.hopper.pipeline import partition_barrier

    if variant == "full":
        return

    @gluon.jit
    def store_partial(acc, WS, tile_id, split, SPLIT_K: gl.constexpr):
        tile_ws, at = partials.tile_partials(acc, WS, tile_id, SPLIT_K)
        gl.store(tile_ws + split * (acc.shape[0] * acc.shape[1]) + at, acc)

    @gluon.jit
    def no_reload(acc, WS, CNT, tile_id, split, SPLIT_K: gl.constexpr):
        store_partial(acc, WS, tile_id, split, SPLIT_K)
        partition_barrier()
        arrived = gl.atomic_add(CNT + tile_id, 1, sem="acq_rel", scope="gpu")
        last = arrived == SPLIT_K - 1
        if last:
            gl.atomic_xchg(CNT + tile_id, 0, sem="relaxed", scope="gpu")
        return last, acc

    @gluon.jit
    def all_store(acc, WS, CNT, tile_id, split, SPLIT_K: gl.constexpr):
        tile_ws, at = partials.tile_partials(acc, WS, tile_id, SPLIT_K)
        store_partial(acc, WS, tile_id, split, SPLIT_K)
        partition_barrier()
        arrived = gl.atomic_add(CNT + tile_id, 1, sem="acq_rel", scope="gpu")
        last = arrived == SPLIT_K - 1
        total = acc
        if last:
            partition_barrier()
            total = gl.zeros_like(acc)
            for j in gl.static_range(SPLIT_K):
                total += gl.load(tile_ws + j * (acc.shape[0] * acc.shape[1]) + at, cache_modifier=".cg")
            gl.atomic_xchg(CNT + tile_id, 0, sem="relaxed", scope="gpu")
        return last, total

    @gluon.jit
    def store_only(acc, WS, CNT, tile_id, split, SPLIT_K: gl.constexpr):
        store_partial(acc, WS, tile_id, split, SPLIT_K)
        return split == SPLIT_K - 1, acc

    @gluon.jit
    def none(acc, WS, CNT, tile_id, split, SPLIT_K: gl.constexpr):
        return split == SPLIT_K - 1, acc

    variants = {"all-store": all_store, "no-reload": no_reload, "store-only": store_only, "none": none}
    gemm.reduce_parts = variants[variant]  # the name the GEMM kernel's globals resolve at compile time


def one(variant: str) -> list[dict]:
    patch(variant)
    import torch

    import xkernels
    from xkernels.bench.timing import interleaved_graph_ms

    out = []
    for (m, n, k), (tile, splits) in ROWS.items():
        g = torch.Generator(device="cuda").manual_seed(m)
        a = (torch.rand(m, k, device="cuda", generator=g) - 0.5).bfloat16()
        b = (torch.rand(n, k, device="cuda", generator=g) - 0.5).bfloat16()
        want = (a.float() @ b.float().T)
        fns = {"torch": lambda a=a, b=b: a @ b.T}
        row = {"variant": variant, "shape": f"{m}x{n}x{k}", "checked": {}}
        for split in ("split_k=1", *splits):
            backend = f"hopper:{tile},{split}"
            c = xkernels.matmul(a, b, b_layout="nk", backend=backend)
            row["checked"][split] = ((c.float() - want).norm() / want.norm()).item()
            fns[split] = lambda a=a, b=b, backend=backend: xkernels.matmul(a, b, b_layout="nk", backend=backend)
        times = interleaved_graph_ms(fns)
        row["us"] = {name: t * 1e3 for name, t in times.items()}
        row["x_torch"] = {name: times["torch"] / t for name, t in times.items()}
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--variant", choices=VARIANTS, help="run one variant here (the driver runs each in a process)")
    args = ap.parse_args()
    if args.variant:
        json.dump(one(args.variant), open(args.json, "w"), indent=1)
        return
    rows = []
    for variant in VARIANTS:
        part = f"{args.json}.{variant}"
        done = subprocess.run([sys.executable, __file__, "--variant", variant, "--json", part])
        if done.returncode:  # recorded; the other variants still run
            rows.append({"variant": variant, "error": f"exit {done.returncode}"})
            continue
        rows += json.load(open(part))
    json.dump(rows, open(args.json, "w"), indent=1)
    print("| variant | shape | unsplit x torch | split x torch | split us | split rel err |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | {r['error']} | | | | |")
            continue
        split = [s for s in r["us"] if s.startswith("split_k=") and s != "split_k=1"][0]
        print(f"| {r['variant']} | {r['shape']} | {r['x_torch']['split_k=1']:.2f} | "
              f"{r['x_torch'][split]:.2f} | {r['us'][split]:.1f} | {r['checked'][split]:.1e} |")


if __name__ == "__main__":
    main()
