"""Hopper GEMM tile configs on the shapes where the default 128 x 256 tile leaves SMs idle: cubes from 512 to 2048
and the M = 64-256 rows of Llama-8B's layers (B as [N, K], bf16), with K split 2 or 4 ways on the small tile, and
deeper rings (8 stages, or 128-deep k-steps) for the memory-bound few-row shapes, where the bytes in flight per SM
bound the rate at which the weight streams. Each
config is a backend override string (`hopper:block_m=...`); the default and the few-row/tiled pick of `auto` are
recorded too. Device time from CUDA-graph replay (`bench.timing.graph_ms`) against torch.matmul in the same process;
every output is checked against torch's (relative Frobenius error < 1e-2) before it is timed, and every config,
the default and torch are timed in interleaved rounds (`bench.timing.interleaved_graph_ms`). The summary names,
per shape, the fastest config and the work units it launched, so a shape rule (units per SM) can be read off it.

    python scripts/gemm_tiles.py --json gemm_tiles.json [--md gemm_tiles.md] [--configs pingpong|big|rows]
                                 [--shapes 1536x1536x1536 ... | --shape-set big]
"""

from __future__ import annotations

import argparse
import json

import torch

import xkernels
from xkernels.bench.timing import interleaved_graph_ms

SHAPES = [(512, 512, 512), (1024, 1024, 1024), (1536, 1536, 1536), (2048, 2048, 2048), (1024, 4096, 4096),
          (128, 4096, 4096), (64, 4096, 4096), (64, 4096, 14336), (128, 6144, 4096), (128, 4096, 14336),
          (128, 28672, 4096), (256, 4096, 4096), (1024, 6144, 4096)]  # the last: 1.45 waves of 128 x 256 tiles
# (block_m, block_n, block_k, stages, num_warps, split_k): compiled spill-free for sm_90 (bf16 and fp16, both B
# layouts); every field is named in the override, so none is inherited from the shape's default pick
# (the seventh field: consumer partitions, 2 = ping-pong; an eighth, where given: row warpgroups, 3 = 192-row tiles
# over three one-warpgroup partitions)
CONFIG_SETS = {
    "tiles": [(128, 256, 64, 3, 8, 1, 1), (128, 128, 64, 5, 8, 1, 1), (128, 128, 64, 6, 8, 1, 1),
              (64, 128, 64, 6, 4, 1, 1), (64, 128, 64, 8, 4, 1, 1), (64, 128, 128, 4, 4, 1, 1),
              (64, 64, 64, 8, 4, 1, 1), (64, 256, 64, 3, 4, 1, 1), (64, 128, 64, 6, 4, 2, 1),
              (64, 128, 64, 8, 4, 2, 1), (64, 128, 64, 6, 4, 4, 1), (64, 64, 64, 8, 4, 2, 1)],
    # one consumer against two taking the units in turn, on the 64-row tiles, unsplit and split
    "pingpong": [(128, 256, 64, 3, 8, 1, 1), (128, 128, 64, 6, 8, 1, 1), (64, 128, 64, 8, 4, 1, 1),
                 (64, 128, 64, 8, 4, 1, 2), (64, 64, 64, 8, 4, 1, 1), (64, 64, 64, 8, 4, 1, 2),
                 (64, 128, 64, 8, 4, 2, 1), (64, 128, 64, 8, 4, 2, 2), (64, 64, 64, 8, 4, 2, 1),
                 (64, 64, 64, 8, 4, 2, 2), (64, 64, 64, 8, 4, 4, 2)],
    # 32-column tiles (twice the CTAs of 64 x 64 on a few-row output; cuBLAS's pick at 64 x 4096 x 4096 is 64 x 32)
    "narrow": [(64, 64, 64, 8, 4, 1, 1), (64, 32, 64, 8, 4, 1, 1), (64, 32, 64, 12, 4, 1, 1),
               (64, 32, 128, 6, 4, 1, 1), (64, 32, 64, 12, 4, 1, 2), (64, 32, 64, 12, 4, 2, 2)],
    # the whole-wave tiles `gemm_config` ranks
    "big": [(128, 256, 64, 3, 8, 1, 1), (128, 128, 64, 6, 8, 1, 1), (128, 128, 64, 5, 8, 1, 1),
            (64, 128, 64, 8, 4, 1, 1), (64, 256, 64, 4, 4, 1, 1)],
    # 192-row tiles (three row warpgroups) against the ranked tiles; 128 x 128 over two row warpgroups is the
    # same-program control of one 8-warp partition (bitwise the same products)
    "rows": [(128, 256, 64, 3, 8, 1, 1), (128, 128, 64, 6, 8, 1, 1), (64, 128, 64, 8, 4, 1, 1),
             (128, 128, 64, 6, 4, 1, 1, 2), (192, 128, 64, 4, 4, 1, 1, 3), (192, 128, 64, 3, 4, 1, 1, 3),
             (192, 64, 64, 6, 4, 1, 1, 3)],
}
CONFIGS = CONFIG_SETS["tiles"]
SHAPE_SETS = {"default": SHAPES,
              # cubes from 1024 to 8192 and Llama-8B's layers at 1024-8192 rows: the shapes `gemm_config`'s
              # wave-fill rule ranks
              "big": [(s, s, s) for s in (1024, 1536, 2048, 2560, 3072, 3584, 4096, 6144, 8192)]
              + [(m, n, k) for m in (1024, 4096, 8192) for n, k in ((4096, 4096), (6144, 4096), (28672, 4096),
                                                                   (4096, 14336))]}


def backend(cfg: tuple[int, ...]) -> str:
    bm, bn, bk, st, w, split, consumers, row_wgs = (*cfg, 1)[:8]
    return (f"hopper:block_m={bm},block_n={bn},block_k={bk},stages={st},num_warps={w},split_k={split},"
            f"consumers={consumers},row_wgs={row_wgs}")


def row(m: int, n: int, k: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = (torch.rand(m, k, device="cuda", generator=g) - 0.5).bfloat16()
    b = (torch.rand(n, k, device="cuda", generator=g) - 0.5).bfloat16()
    want = (a @ b.T).float()
    out = {"shape": f"{m}x{n}x{k}", "configs": {}}
    xkernels.matmul(a, b, b_layout="nk")
    out["auto_kernel"] = xkernels.last_backend()
    fns = {"torch": lambda: a @ b.T, "auto": lambda: xkernels.matmul(a, b, b_layout="nk")}
    for cfg in CONFIGS:
        name = backend(cfg)
        try:
            c = xkernels.matmul(a, b, b_layout="nk", backend=name)
            err = ((c.float() - want).norm() / want.norm()).item()
            r = {"kernel": xkernels.last_backend(), "rel_err": err}
            if err < 1e-2:
                fns[name] = lambda name=name: xkernels.matmul(a, b, b_layout="nk", backend=name)
                r["tiles"] = -(-m // cfg[0]) * -(-n // cfg[1]) * cfg[5]  # work units
        except Exception as e:  # a config that cannot run this shape is recorded, not fatal
            r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        out["configs"][name] = r
    # every config and torch in interleaved rounds (a clock drift over the row hits all alike)
    times = interleaved_graph_ms(fns)
    out["torch_ms"], out["auto_ms"] = times["torch"], times["auto"]
    for name, r in out["configs"].items():
        if name in times:
            r["ms"] = times[name]
            r["x_torch"] = out["torch_ms"] / r["ms"]
    timed = {name: r for name, r in out["configs"].items() if "ms" in r}
    if timed:
        best = min(timed, key=lambda name: timed[name]["ms"])
        out["best"] = {"config": best, **timed[best]}
    out["auto_x_torch"] = out["torch_ms"] / out["auto_ms"]
    return out


def markdown(rows: list[dict]) -> str:
    names = [f"{bm}x{bn}x{bk} S{st} W{w}" + (f" SK{sk}" if sk > 1 else "") + (" PP" if c == 2 else "")
             + (f" R{r}" if r > 1 else "") for bm, bn, bk, st, w, sk, c, r in ((*cfg, 1)[:8] for cfg in CONFIGS)]
    lines = ["| shape | torch us | auto (x torch) | " + " | ".join(names) + " |",
             "|---" * (3 + len(names)) + "|"]
    for r in rows:
        cells = []
        for cfg in CONFIGS:
            c = r["configs"][backend(cfg)]
            cells.append(f"{c['x_torch']:.2f} ({c['tiles']} tiles)" if "x_torch" in c else
                         ("FAIL" if "rel_err" in c else "error"))
        lines.append(f"| {r['shape']} | {r['torch_ms'] * 1e3:.1f} | {r['auto_x_torch']:.2f} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--configs", choices=sorted(CONFIG_SETS), default="tiles")
    ap.add_argument("--shapes", nargs="*", help="MxNxK shapes instead of the shape set")
    ap.add_argument("--shape-set", choices=sorted(SHAPE_SETS), default="default")
    args = ap.parse_args()
    global CONFIGS
    CONFIGS = CONFIG_SETS[args.configs]
    shapes = ([tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes
              else SHAPE_SETS[args.shape_set])
    rows = []
    for m, n, k in shapes:
        rows.append(row(m, n, k))
        r = rows[-1]
        best = r.get("best", {})
        print(f"{r['shape']}: torch {r['torch_ms'] * 1e3:.1f} us, auto x{r['auto_x_torch']:.2f} "
              f"({r['auto_kernel']}), best {best.get('config')} x{best.get('x_torch', 0):.2f}", flush=True)
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows))


if __name__ == "__main__":
    main()
