"""The sweep's few-row GEMM rows alone (`xkernels bench --suite sweep`'s method: back-to-back and CUDA-graph time,
ours and torch.matmul's), at 1, 16 and 32 rows against Llama-8B's weights as [N, K]: the graph cycling through
weights that span 4x the L2 (each call streams its weight from HBM, as a decode step's layers do), and on one
weight (in L2 between replays).

    python scripts/fewrow_sweep.py --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from xkernels.bench.host import markdown, run_host_case
from xkernels.bench.sweep import LLAMA8B_NK
from xkernels.testing.cases import GemmCase


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 16, 32])
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    rows = []
    for n, k in LLAMA8B_NK:
        for m in args.ms:
            rows.append(run_host_case(GemmCase(m, n, k, "bf16", "nk")).as_dict())
            r = rows[-1]
            print(r["shape"], {key: round(r[key], 3) for key in ("graph_speedup", "graph_l2_speedup", "b2b_speedup")
                               if r.get(key) is not None}, flush=True)
            (out / "fewrow.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    (out / "fewrow.md").write_text(markdown(rows, "python scripts/fewrow_sweep.py", device))


if __name__ == "__main__":
    main()
