"""The packed backward on the bench's batches (32 sequences of 256-4096 tokens, bf16): the portable kernels
(backend="portable") and the default (on sm_90 the Gluon kernels' VARLEN variants) against SDPA-cuDNN and
SDPA-flash on the batch padded to its longest sequence (dO zero on the padding), backward only
(`torch.autograd.grad` of a saved forward), device time from CUDA-graph replay in interleaved shuffled
rounds. Each variant's gradients are compared with the portable kernels' (relative RMS per gradient).

    python scripts/varlen_bwd_ab.py --json varlen_bwd_ab.json [--md varlen_bwd_ab.md] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels.bench.timing import graph_ms, interleaved_graph_ms
from xkernels.testing.cases import VarlenGradCase

CASES = [VarlenGradCase(32, 256, 4096, 32, 32, 128, False), VarlenGradCase(32, 256, 4096, 32, 32, 128, True),
         VarlenGradCase(32, 256, 4096, 32, 8, 128, True), VarlenGradCase(32, 256, 4096, 32, 32, 64, False)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _first_capture() -> None:
    """A process's first capture of a backward whose forward ran eagerly fails for any op (a torch matmul included,
    scripts/capture_probe.py) and later ones succeed: spend it on a matmul, so no variant's row loses its timing."""
    x = torch.randn(64, 64, device="cuda", requires_grad=True)
    y = (x @ x).sum()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            torch.autograd.grad(y, x, retain_graph=True)
    except Exception:  # noqa: BLE001 (torch.AcceleratorError: the expected failure)
        pass
    torch.cuda.synchronize()


def row(case: VarlenGradCase, rounds: int) -> dict:
    inputs = case.inputs("cuda")
    q, k, v, cu, longest, do = inputs
    gqa = case.hq != case.hkv
    out = {"shape": case.shape, "variants": {}}
    fns, kernels, grads = {}, {}, {}
    for name, backend in (("portable", "portable"), ("hopper", "auto")):
        try:
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            o = xkernels.attention_varlen(*leaves, cu, cu, longest, longest, is_causal=case.causal, backend=backend)
            grads[name] = torch.autograd.grad(o, leaves, do, retain_graph=True)
            kernels[name] = xkernels.last_backend()
            fn = (lambda o=o, leaves=leaves: torch.autograd.grad(o, leaves, do, retain_graph=True))
            graph_ms(fn, reps=1, repeats=1)  # it captures (a failure is recorded, not fatal)
            fns[name] = fn
        except Exception as e:  # a variant that cannot run this row is recorded, with where it failed
            out["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}",
                                     "traceback": traceback.format_exc()[-3000:]}
            print(out["variants"][name]["traceback"], flush=True)
    padded = case.padded(inputs)
    for name, backend in (("cuDNN padded", SDPBackend.CUDNN_ATTENTION), ("FA2 padded", SDPBackend.FLASH_ATTENTION)):
        leaves = [t.detach().clone().requires_grad_() for t in padded[:3]]
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(*leaves, is_causal=case.causal, enable_gqa=gqa)
        fns[name] = (lambda o=o, leaves=leaves: torch.autograd.grad(o, leaves, padded[3], retain_graph=True))
    med = interleaved_graph_ms(fns, rounds)
    for name, ms in med.items():
        r = out["variants"].setdefault(name, {})
        r.update(ms=ms, tflops=case.flops / ms / 1e9)
        if name in kernels:
            r["kernel"] = kernels[name]
        if name in grads and "portable" in grads:
            r["rel_vs_portable"] = [_rel(g, p) for g, p in zip(grads[name], grads["portable"], strict=True)]
    for r in out["variants"].values():
        if "ms" in r:
            r["x_cudnn_padded"] = med["cuDNN padded"] / r["ms"]
    print(out["shape"], "; ".join(f"{n} {r['ms']:.3f} ms x{r['x_cudnn_padded']:.2f}" if "ms" in r else
                                  f"{n} {r['error']}" for n, r in out["variants"].items()), flush=True)
    return out


def markdown(rows: list[dict]) -> str:
    names = ["portable", "hopper", "cuDNN padded", "FA2 padded"]
    lines = ["| batch | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in rows:
        cells = [f"{v['ms']:.3f} ms ({v['tflops']:.0f} TFLOP/s), x{v['x_cudnn_padded']:.2f}" if "ms" in v
                 else "error" for v in (r["variants"].get(n, {}) for n in names)]
        lines.append(f"| {r['shape']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median)")
    args = ap.parse_args()
    _first_capture()
    rows = [row(c, args.rounds) for c in CASES]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows))


if __name__ == "__main__":
    main()
