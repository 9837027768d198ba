"""Packed sliding-window attention on the device: the Hopper varlen forward's band against the portable kernel's
band on the same batch, forward and forward + backward, interleaved rounds of CUDA-graph replay (device time). The
batch: 32 sequences of 256-4096 tokens (the varlen suite's anchor lengths), H32/8, bf16, causal with a 1K window.

    python scripts/varlen_window_ab.py --json varlen_window_ab.json [--md varlen_window_ab.md]
"""

from __future__ import annotations

import argparse
import json

import torch

import xkernels
from xkernels.bench.timing import interleaved_graph_ms
from xkernels.testing.cases import VarlenCase
from xkernels.testing.inputs import uniform


def calls(d: int, lens: list[int], cu: torch.Tensor, window: tuple[int, int]) -> dict:
    """(step, backend) -> a call of the packed batch at head dim d: the forward, or forward + backward."""
    g = torch.Generator(device="cuda").manual_seed(d)
    q = uniform((sum(lens), 32, d), torch.bfloat16, "cuda", g)
    k, v = (uniform((sum(lens), 8, d), torch.bfloat16, "cuda", g) for _ in range(2))
    do = torch.randn_like(q)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    kw = dict(is_causal=True, window_size=window)

    def fwd(backend):
        return lambda: xkernels.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), backend=backend, **kw)

    def step(backend):
        def run():
            o = xkernels.attention_varlen(*leaves, cu, cu, max(lens), max(lens), backend=backend, **kw)
            return torch.autograd.grad(o, leaves, do)
        return run

    return {("fwd", "default"): fwd(None), ("fwd", "portable"): fwd("portable"),
            ("fwd+bwd", "default"): step(None), ("fwd+bwd", "portable"): step("portable")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--window", type=int, default=1023)
    ap.add_argument("--dims", type=int, nargs="+", default=[128, 64])
    args = ap.parse_args()
    lens = VarlenCase(32, 256, 4096, 32, 8, 128, True).lengths
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    window = (args.window, 0)
    # attended (query, key) pairs of a causal window per sequence: row i sees min(i, w) + 1 keys
    pairs = sum(sum(min(i, args.window) + 1 for i in range(n)) for n in lens)
    rows, lines = [], ["| D | step | kernel | ms | TFLOP/s | x portable |", "|---|---|---|---|---|---|"]
    for d in args.dims:
        fns = calls(d, lens, cu, window)
        names = {}
        for key, fn in fns.items():
            fn()
            names[key] = xkernels.last_backend()
        torch.cuda.synchronize()
        ms = interleaved_graph_ms({f"{s}|{b}": fn for (s, b), fn in fns.items()})
        for (s, b) in fns:
            t = ms[f"{s}|{b}"]
            flops = 4 * d * pairs * 32 * (3.5 if s == "fwd+bwd" else 1.0)
            ratio = ms[f"{s}|portable"] / t
            rows.append(dict(d=d, step=s, backend=b, kernel=names[(s, b)], ms=t, tflops=flops / t / 1e9, x=ratio))
            lines.append(f"| {d} | {s} | {names[(s, b)]} | {t:.3f} | {flops / t / 1e9:.0f} | {ratio:.2f} |")
    print("\n".join(lines))
    json.dump(dict(lengths=lens, window=window, rows=rows), open(args.json, "w"), indent=1)
    if args.md:
        open(args.md, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
