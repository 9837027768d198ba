"""The packed backward on the bench's batches (32 sequences of 256-4096 tokens, bf16): the portable kernels
(backend="portable") and the default (on sm_90 the Gluon kernels' VARLEN variants) against SDPA-cuDNN and
SDPA-flash on the batch padded to its longest sequence (dO zero on the padding), backward only
(`torch.autograd.grad` of a saved forward), device time from CUDA-graph replay in interleaved shuffled
rounds. Each variant's gradients are compared with the portable kernels' (relative RMS per gradient).

    python scripts/varlen_bwd_ab.py --json varlen_bwd_ab.json [--md varlen_bwd_ab.md] [--rounds 3] [--mask-split-ab]

--mask-split-ab: also the Gluon kernels with the dK/dV config's `mask_split` flipped ("hopper, mask_split=N"), in the
same interleaved rounds: the shipped config swapped in the table for that variant's calls only (script-side).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels import plans
from xkernels.bench.timing import graph_ms, interleaved_graph_ms
from xkernels.hopper import configs
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


def flipped_mask_split(d: int, fn):
    """`fn` run with the dK/dV config of head dim `d` walking its queries the other way (`mask_split` flipped), and
    the plans that cache configs dropped before and after, so only this call sees it."""
    def call():
        shipped = configs.ATTENTION_BWD_CONFIGS[d]
        configs.ATTENTION_BWD_CONFIGS[d] = dataclasses.replace(shipped, mask_split=1 - shipped.mask_split)
        plans._PLANS.clear()
        try:
            return fn()
        finally:
            configs.ATTENTION_BWD_CONFIGS[d] = shipped
            plans._PLANS.clear()
    return call


def row(case: VarlenGradCase, rounds: int, mask_split_ab: bool = False) -> dict:
    inputs = case.inputs("cuda")
    q, k, v, cu, longest, do = inputs
    gqa = case.hq != case.hkv
    out = {"shape": case.shape, "variants": {}}
    fns, kernels, grads = {}, {}, {}
    variants = [("portable", "portable"), ("hopper", "auto")]
    flipped = f"hopper, mask_split={1 - configs.ATTENTION_BWD_CONFIGS[case.d].mask_split}"
    if mask_split_ab:
        variants.append((flipped, "auto"))
    for name, backend in variants:
        try:
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            o = xkernels.attention_varlen(*leaves, cu, cu, longest, longest, is_causal=case.causal, backend=backend)
            fn = (lambda o=o, leaves=leaves: torch.autograd.grad(o, leaves, do, retain_graph=True))
            if name == flipped:
                fn = flipped_mask_split(case.d, fn)
            grads[name] = fn()
            kernels[name] = xkernels.last_backend()
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
    names = ["portable", "hopper"] + sorted({n for r in rows for n in r["variants"] if n.startswith("hopper, ")})
    names += ["cuDNN padded", "FA2 padded"]
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
    ap.add_argument("--mask-split-ab", action="store_true", help="also the dK/dV config's mask_split flipped")
    args = ap.parse_args()
    _first_capture()
    rows = [row(c, args.rounds, args.mask_split_ab) for c in CASES]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows))


if __name__ == "__main__":
    main()
