"""`xkernels` entry point. Chooses GPU or interpreter before any kernel module is imported."""

from __future__ import annotations

import argparse
import os
import sys


def select_device() -> str:
    """'cuda' when a CUDA device is present; otherwise switch the kernels to the Triton interpreter and say so."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    os.environ["TRITON_INTERPRET"] = "1"
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xkernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="the seeds' correctness sweep on the best available device")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")

    p = sub.add_parser("bench", help="benchmark against peers timed in the same run (GPU)")
    p.add_argument("--suite",
                   choices=["all", "gemm", "attention", "attention-bwd", "decode", "varlen", "window", "host",
                            "sweep"],
                   default="all",
                   help="host: per-call host, back-to-back and CUDA-graph time, ours and torch's; sweep: the same "
                        "over attention lengths (16K tokens a call) and GEMM M on Llama-8B's layers, with a ratio "
                        "plot")
    p.add_argument("--quick", action="store_true", help="a short run (about 2 minutes) for routine device calls")
    p.add_argument("--iters", type=int, default=100, help="timed runs per row (seeds: 1000 for compute-bound)")
    p.add_argument("--warmup", type=int, default=20, help="warm-up runs per row (at least 20)")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep before each row's timings (seeds: 5)")
    p.add_argument("--out", metavar="DIR", default="bench-out", help="folder for the JSON, Markdown and PNG")
    p.add_argument("--wide", action="store_true",
                   help="every column on the terminal (spread, ceilings, each peer), as in the Markdown report")
    p.add_argument("--json", metavar="PATH", help="JSON path (default: DIR/bench.json)")

    p = sub.add_parser("inspect", help="compile each kernel config for a target (no GPU needed): registers, spills, "
                                       "shared memory, instruction counts")
    p.add_argument("--target", action="append", default=None, metavar="NAME",
                   help="sm_90 (default), sm_80, sm_89, sm_120, gfx942, gfx950, or all; repeatable")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="compiles in parallel")
    p.add_argument("--kernel", choices=["all", "attention", "attention_varlen", "decode", "attention_bwd", "gemm"],
                   default="all")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")

    args = parser.parse_args(argv)
    if args.command == "check":
        device = select_device()  # before the import below pulls in any kernel module
        from xkernels.cli.check import run_check

        return run_check(device, args.json)
    if args.command == "bench":
        device = select_device()
        from xkernels.cli.bench import run_bench

        return run_bench(device, args)
    from xkernels.cli.inspect import run_inspect

    return run_inspect(args.kernel, args.target or ["sm_90"], args.json, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
