"""The varlen forward's Hopper kernels on the bench's packed batches (32 sequences of 256-4096 tokens, H32 or H32/8,
D64/D128, full and causal), device time from CUDA-graph replay (no host read of cu_seqlens happens under capture),
against SDPA-cuDNN on the batch padded to its longest sequence, in the same process: the per-sequence kernel
(`hopper:persistent=0`), the persistent one as shipped (`hopper:persistent=2`: V's tail rows zeroed by warpgroup 0
alone behind a barrier), the same on the head-major walk (`walk=1`: units of real tiles, a head's blocks or causal
pairs of them, dealt round-robin), optionally with the kernel's switches (`--ablate ZERO_TAIL=0 CHAIN=0`:
no tail zeroing, the per-tile cost of making a neighbour's rows safe; unchained tiles), and the default's pick.
Each output is compared bitwise with the per-sequence kernel's first (the same per-row arithmetic in another order).

    python scripts/varlen_ab.py --json varlen_ab.json [--md varlen_ab.md] [--rounds 3] [--ablate ZERO_TAIL=0]
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels import select, varlen
from xkernels.bench.timing import interleaved_graph_ms
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing.cases import VarlenCase

CASES = [VarlenCase(32, 256, 4096, 32, 32, 128, False), VarlenCase(32, 256, 4096, 32, 32, 128, True),
         VarlenCase(32, 256, 4096, 32, 8, 128, False), VarlenCase(32, 256, 4096, 32, 8, 128, True),
         VarlenCase(32, 256, 4096, 32, 32, 64, False), VarlenCase(32, 256, 4096, 32, 32, 64, True)]


def row(case: VarlenCase, rounds: int, ablations: dict[str, dict] | None = None) -> dict:
    inputs = case.inputs("cuda")
    q, k, v, cu, longest = inputs
    gqa = case.hq != case.hkv
    pq, pk, pv = case.padded(inputs)
    out = {"shape": case.shape, "variants": {}}

    def ours(backend):
        return lambda: xkernels.attention_varlen(q, k, v, cu, cu, longest, longest, is_causal=case.causal,
                                                 backend=backend)

    def ablated(knobs):
        def fn():
            o = torch.empty_like(q)
            _, choice = select.resolve_attention_varlen(q, k, v, cu, cu, longest, longest, precision="bf16",
                                                        backend="hopper:persistent=2")
            varlen._run_persistent(q, k, v, o, None, cu, cu, longest, case.d ** -0.5 * math.log2(math.e),
                                   is_causal=case.causal, positive_scale=True, recipe=ATTENTION_RECIPES["bf16"],
                                   cfg=choice.config.persistent, knobs=knobs)
            return o
        return fn

    ours("auto")()
    out["auto_kernel"] = xkernels.last_backend()
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        def cudnn():  # the padded rows' outputs are what a caller without varlen throws away
            return F.scaled_dot_product_attention(pq, pk, pv, is_causal=case.causal, enable_gqa=gqa)
        cudnn()
    base = ours("hopper:persistent=0")()
    fns = {"cuDNN padded": cudnn, "per-sequence": ours("hopper:persistent=0"),
           "persistent": ours("hopper:persistent=2"), "persistent walk=1": ours("hopper:persistent=2,walk=1"),
           "auto": ours("auto")}
    for name, knobs in (ablations or {}).items():
        fns[f"persistent {name}"] = ablated(knobs)
    for name, fn in list(fns.items())[1:]:
        try:
            o = fn()
            out["variants"][name] = {"bitwise_equal": bool(torch.equal(o, base))}
        except Exception as e:  # a variant that cannot run this row is recorded
            out["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            del fns[name]
    # interleaved rounds in shuffled orders (`interleaved_graph_ms`): the same kernel on the same batch measured 12 %
    # apart in two calls
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        med = interleaved_graph_ms(fns, rounds)
    out["cudnn_padded_ms"] = med.pop("cuDNN padded")
    for name, t in med.items():
        r = out["variants"][name]
        r["ms"] = t
        r["tflops"] = case.flops / r["ms"] / 1e9
        r["x_cudnn_padded"] = out["cudnn_padded_ms"] / r["ms"]
    print(out["shape"], f"cuDNN padded {out['cudnn_padded_ms']:.3f} ms;", "; ".join(
        f"{n} {r['ms']:.3f} ms x{r['x_cudnn_padded']:.2f}{'' if r['bitwise_equal'] else ' (not bitwise)'}"
        if "ms" in r else f"{n} {r['error']}" for n, r in out["variants"].items()), flush=True)
    return out


def markdown(rows: list[dict]) -> str:
    names = list(rows[0]["variants"])
    lines = ["| batch | cuDNN padded ms | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for r in rows:
        cells = [f"{v['ms']:.3f} ms, x{v['x_cudnn_padded']:.2f}" if "ms" in v else "error"
                 for v in r["variants"].values()]
        lines.append(f"| {r['shape']} | {r['cudnn_padded_ms']:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median)")
    ap.add_argument("--zero-tail-1", action="store_true", help="also time the ZERO_TAIL=1 ablation")
    ap.add_argument("--ablate", nargs="*", default=[], metavar="KNOB=VALUE",
                    help="also time the persistent kernel with these switches, each alone: ZERO_TAIL=0 (no tail "
                         "zeroing: unsafe where a neighbour's V holds inf, the zeroing's cost), ZERO_TAIL=1, "
                         "ZERO_TAIL=2 (every chunk of the tail tile; 3, the default, only those past the end), "
                         "CHAIN=0, O_TMA=0 (masked stores for every block; 1, the default, TMA-stores the 64-row "
                         "blocks inside a sequence)")
    args = ap.parse_args()
    knobs = args.ablate + ["ZERO_TAIL=1"] * args.zero_tail_1
    ablations = {kv: {kv.split("=")[0]: int(kv.split("=")[1])} for kv in knobs}
    for kv in ablations.values():
        for name in ("CHAIN", "O_TMA"):
            if name in kv:
                kv[name] = bool(kv[name])
    rows = [row(c, args.rounds, ablations) for c in CASES]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows))


if __name__ == "__main__":
    main()
