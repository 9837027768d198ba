"""Where the dense forward loses on (B, S, H, D) inputs read as (B, H, S, D) views (what projections produce, and
what transformers passes): the kernel each call runs (`last_backend()`, which names copied operands), and device
time from CUDA-graph replay of the dense kernel on contiguous (B, H, S, D), on the views with O left as (B, H, S, D),
on the views with O written back as a contiguous (B, S, H, D) copy, with O written in place through `out=` a
(B, S, H, D) buffer's view, and the flash_attn functions' packed route, interleaved in one process.

    python scripts/bshd_probe.py --json bshd.json [--md bshd.md]
"""

from __future__ import annotations

import argparse
import json

import torch

import xkernels
from xkernels.bench.timing import interleaved_graph_ms
from xkernels.integrations import flash_attn as fa

ROWS = ((16, 1024, 32, 128, True), (8, 2048, 32, 64, True), (4, 4096, 32, 128, True))


def row(b, s, h, d, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.rand((b, s, h, d), generator=g, device="cuda", dtype=torch.bfloat16) - 0.5 for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    qc, kc, vc = (t.contiguous() for t in (qt, kt, vt))
    out = torch.empty_like(q)
    fns = {"contiguous": lambda: xkernels.attention(qc, kc, vc, is_causal=causal),
           "views": lambda: xkernels.attention(qt, kt, vt, is_causal=causal),
           "views+copy": lambda: xkernels.attention(qt, kt, vt, is_causal=causal).transpose(1, 2).contiguous(),
           "views+out": lambda: xkernels.attention(qt, kt, vt, is_causal=causal, out=out.transpose(1, 2)),
           "packed": lambda: fa.flash_attn_func(q, k, v, causal=causal)}
    kernels = {}
    for name, fn in fns.items():
        fn()
        kernels[name] = xkernels.last_backend()
    return {"shape": f"B{b} S{s} H{h} D{d} {'causal' if causal else 'full'}", "kernels": kernels,
            "device_ms": interleaved_graph_ms(fns, rounds=3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--md")
    args = parser.parse_args()
    rows = []
    for shape in ROWS:
        rows.append(row(*shape))
        print(json.dumps(rows[-1]), flush=True)
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    if args.md:
        names = list(rows[0]["device_ms"])
        lines = ["| shape | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        lines += [f"| {r['shape']} | " + " | ".join(f"{r['device_ms'][n]:.3f}" for n in names) + " |" for r in rows]
        lines += ["", "Kernels:", ""]
        lines += [f"- {r['shape']} {n}: `{kern}`" for r in rows for n, kern in r["kernels"].items()]
        with open(args.md, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
