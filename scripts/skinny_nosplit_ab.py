"""What a CUDA graph pays for the few-row GEMM's K split, and whether unsplit narrow column blocks avoid it: device
time from CUDA-graph replay (interleaved rounds, `bench.timing.interleaved_graph_ms`) on Llama-8B's linear layers at
1-32 rows, B as [N, K], bf16, of

  * torch.matmul, and xkernels.matmul as shipped (under capture a split call zeroes a per-call counter set from the
    graph's pool: one fill node more per call),
  * the shipped config's kernel alone, its workspace zeroed once before capture (the split without the fill),
  * unsplit candidates (one program per BLOCK_N columns over all of K: no partials, no counters, nothing to zero).

Each candidate's output is checked against torch's first.

    python scripts/skinny_nosplit_ab.py --json skinny_nosplit.json [--md skinny_nosplit.md] [--ms 1 16 32]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import xkernels
from xkernels.bench.timing import interleaved_graph_ms
from xkernels.portable import configs
from xkernels.portable.configs import SkinnyGemmConfig

sys.path.insert(0, str(Path(__file__).parent))
from skinny_l2_ab import checked, setup  # noqa: E402  (the candidate launcher, checked against float64)

SHAPES = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))
UNSPLIT = [SkinnyGemmConfig(bn, bk, w, st) for bn, bk, w, st in
           ((32, 128, 4, 6), (32, 256, 4, 4), (16, 256, 4, 6), (64, 128, 4, 6), (32, 512, 4, 3))]


def main() -> None:
    args, sms, target, res = setup()
    for n, k in SHAPES:
        b = (torch.rand(n, k, device="cuda") - 0.5).bfloat16()
        for m in args.ms:
            a = (torch.rand(m, k, device="cuda") - 0.5).bfloat16()
            want = (a.double() @ b.double().T)
            shipped = configs.skinny_gemm_config(target, interpret=False, rows=m, n=n, k=k, sms=sms)
            fns = {"torch": lambda: a @ b.T, "xkernels": lambda: xkernels.matmul(a, b.T)}  # noqa: B023
            names = {"shipped kernel (no fill)": (shipped, True)}
            names |= {f"unsplit {c}": (c, False) for c in UNSPLIT}
            row = {"m": m, "n": n, "k": k, "shipped": str(shipped), "errors": {}, "slices": {}}
            for name, (cfg, split) in names.items():
                call = checked(a, [b], want, cfg, sms, split, row, name)
                if call is not None:
                    fns[name] = call
            got = xkernels.matmul(a, b.T)
            row["errors"]["xkernels"] = ((got.double() - want).norm() / want.norm()).item()
            row["ms"] = interleaved_graph_ms(fns, rounds=args.rounds)
            row["x_torch"] = {name: row["ms"]["torch"] / t for name, t in row["ms"].items()}
            res["rows"].append(row)
            print(f"M{m} N{n} K{k}: " + ", ".join(f"{name} {t * 1e3:.1f} us x{row['x_torch'][name]:.2f}"
                                                    for name, t in row["ms"].items()), flush=True)
            json.dump(res, open(args.json, "w"), indent=1)
    if args.md:
        cols = ["xkernels", "shipped kernel (no fill)"] + [f"unsplit {c}" for c in UNSPLIT]
        with open(args.md, "w") as f:
            f.write(f"# few-row GEMM, split vs unsplit, on {res['device']} (CUDA-graph replay, x torch.matmul)\n\n")
            f.write("| shape | torch us | " + " | ".join(cols) + " |\n|---|---|" + "---|" * len(cols) + "\n")
            for r in res["rows"]:
                cells = [f"{r['x_torch'][c]:.2f}" if c in r["x_torch"] else "-" for c in cols]
                f.write(f"| {r['m']} x {r['n']} x {r['k']} | {r['ms']['torch'] * 1e3:.1f} | " + " | ".join(cells)
                        + " |\n")


if __name__ == "__main__":
    main()
