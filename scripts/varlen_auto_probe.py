"""Why `attention_varlen` with backend="auto" can time apart from the same kernel forced ("hopper:persistent=2"):
the kernels each call launches (torch.profiler, one eager call and one CUDA-graph replay each) and their graph times
in alternating order, on one packed batch of `scripts/varlen_ab.py`.

    python3 scripts/varlen_auto_probe.py [--case N] [--out FILE]
"""

import argparse
import json
import os
import sys

import torch

import xkernels
from xkernels.bench.timing import interleaved_graph_ms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from varlen_ab import CASES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    case = CASES[args.case]
    q, k, v, cu, longest = case.inputs("cuda")
    result = {"shape": case.shape, "kernels": {}}
    fns = {}
    for backend in ("auto", "hopper:persistent=2"):
        def fn(backend=backend):
            return xkernels.attention_varlen(q, k, v, cu, cu, longest, longest, is_causal=case.causal,
                                             backend=backend)
        fn()
        result["kernels"][backend] = {"name": xkernels.last_backend()}
        fns[backend] = fn
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        result["kernels"][backend]["launches"] = [
            (e.key[:80], round(e.device_time_total / 1000, 3)) for e in prof.key_averages() if e.device_time_total > 0]
    result["graph_ms"] = interleaved_graph_ms(fns, rounds=5)
    print(json.dumps(result, indent=1, default=str))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
