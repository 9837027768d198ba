"""The few-row GEMM's two sm_90 configs (`skinny`, `skinny_rows`) against torch.matmul on Llama-8B's layers at 8-32
rows, interleaved rounds of CUDA-graph replay (`bench.timing.interleaved_graph_ms`), B as [N, K], bf16; also what
`xkernels.matmul` picks. Each output is checked against torch's first.

    python scripts/skinny_rows_ab.py --json skinny_rows_ab.json [--md skinny_rows_ab.md] [--ms 8 9 16 32]
"""

from __future__ import annotations

import argparse
import json

import torch
from skinny_tiles import SHAPES, run  # scripts/ is on sys.path when this runs as a script

import xkernels
from xkernels.bench.timing import interleaved_graph_ms
from xkernels.common.runtime import sm_count
from xkernels.portable import configs
from xkernels.select import _target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--ms", type=int, nargs="+", default=[8, 9, 16, 24, 32])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    sms = sm_count(0)
    table = configs.table_for(_target(torch.device("cuda")))
    rows, lines = [], ["| shape | torch us | skinny | skinny_rows | xkernels.matmul | pick |",
                       "|---|---|---|---|---|---|"]
    for n, k in SHAPES:
        b = (torch.rand(n, k, device="cuda") - 0.5).bfloat16()
        for m in args.ms:
            a = (torch.rand(m, k, device="cuda") - 0.5).bfloat16()
            want = (a @ b.T).float()
            outs = {name: torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for name in ("skinny", "rows")}
            fns = {"torch": lambda a=a, b=b: a @ b.T,
                   "skinny": lambda a=a, b=b, o=outs["skinny"]: run(a, b, o, table.skinny, sms),
                   "rows": lambda a=a, b=b, o=outs["rows"]: run(a, b, o, table.skinny_rows, sms),
                   "matmul": lambda a=a, b=b: xkernels.matmul(a, b, b_layout="nk")}
            for name in ("skinny", "rows"):
                fns[name]()
                err = ((outs[name].float() - want).norm() / want.norm()).item()
                assert err < 1e-2, (name, err)
            got = fns["matmul"]().float()
            assert ((got - want).norm() / want.norm()).item() < 1e-2
            pick = xkernels.last_backend()
            t = interleaved_graph_ms(fns, rounds=args.rounds)
            row = {"m": m, "n": n, "k": k, "torch_us": 1e3 * t["torch"], "pick": pick,
                   **{f"x_{name}": t["torch"] / t[name] for name in ("skinny", "rows", "matmul")}}
            rows.append(row)
            lines.append(f"| {m}x{n}x{k} | {row['torch_us']:.1f} | {row['x_skinny']:.2f} | {row['x_rows']:.2f} | "
                         f"{row['x_matmul']:.2f} | {pick} |")
            print(lines[-1], flush=True)
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(args.json, "w"), indent=1)
    if args.md:
        open(args.md, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
