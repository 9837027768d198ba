"""`xkernels.integrations.flash_attn.flash_attn_func` (flash_attn's (B, S, H, D) layout, run by the packed kernels
with one sequence per batch row) against the dense `xkernels.attention` on the same data, as the transformers
integration calls it ((B, H, S, D) views of the same memory, the output transposed back into a contiguous copy) and
on contiguous (B, H, S, D) tensors, and SDPA-cuDNN (K and V repeated for GQA outside the timing), in one process.
Forward device time from CUDA-graph replay (interleaved rounds), and caller time (50 back-to-back calls, host
included) of the forward and of forward + backward. Each output is first compared with the dense kernel's.

    python scripts/flash_attn_shim_ab.py --json shim.json [--md shim.md] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels.bench.timing import interleaved_graph_ms
from xkernels.integrations import flash_attn as fa

ROWS = ((16, 1024, 32, 32, 128, True), (4, 4096, 32, 8, 128, True), (1, 8192, 32, 32, 128, False),
        (8, 2048, 32, 32, 64, True))


def caller_ms(fn, calls: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def row(b, s, h, hkv, d, causal, rounds):
    g = torch.Generator(device="cuda").manual_seed(0)
    q_fa, k_fa, v_fa = (torch.rand((b, s, n, d), generator=g, device="cuda", dtype=torch.bfloat16) - 0.5
                        for n in (h, hkv, hkv))
    q_c, k_c, v_c = (t.transpose(1, 2).contiguous() for t in (q_fa, k_fa, v_fa))
    k_r, v_r = (t.repeat_interleave(h // hkv, 1) for t in (k_c, v_c))
    gqa = h != hkv

    def shim():
        return fa.flash_attn_func(q_fa, k_fa, v_fa, causal=causal)

    def dense_views():  # the views made per call, as a caller holding (B, S, H, D) tensors makes them
        return xkernels.attention(q_fa.transpose(1, 2), k_fa.transpose(1, 2), v_fa.transpose(1, 2), is_causal=causal,
                                  enable_gqa=gqa).transpose(1, 2).contiguous()

    def dense():
        return xkernels.attention(q_c, k_c, v_c, is_causal=causal, enable_gqa=gqa)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q_c, k_r, v_r, is_causal=causal)

    want = dense().transpose(1, 2).float()
    worst = (shim().float() - want).abs().max().item()
    fns = {"shim": shim, "dense-views": dense_views, "dense": dense, "SDPA-cuDNN": cudnn}
    device = interleaved_graph_ms(fns, rounds=rounds)
    caller = {name: caller_ms(fn) for name, fn in fns.items()}
    grads = {}
    for name, (fn, leaves) in {"shim": (shim, (q_fa, k_fa, v_fa)), "dense-views": (dense_views, (q_fa, k_fa, v_fa)),
                               "dense": (dense, (q_c, k_c, v_c))}.items():
        for t in leaves:
            t.requires_grad_(True)
        dout = torch.ones_like(fn())

        def step(fn=fn, leaves=leaves, dout=dout):
            return torch.autograd.grad(fn(), leaves, dout)

        grads[name] = caller_ms(step, calls=20)
        for t in leaves:
            t.requires_grad_(False)
    return {"shape": f"B{b} S{s} H{h}/{hkv} D{d} {'causal' if causal else 'full'}", "max_diff_vs_dense": worst,
            "device_ms": device, "caller_ms": caller, "caller_fwd_bwd_ms": grads}


def markdown(rows: list[dict], command: str) -> str:
    lines = [f"`{command}`", "", "| shape | max diff | device ms: shim / dense-views / dense / cuDNN | shim vs dense "
             "| caller ms: shim / dense-views / dense / cuDNN | fwd+bwd caller ms: shim / dense-views / dense |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        dv, cl, fb = r["device_ms"], r["caller_ms"], r["caller_fwd_bwd_ms"]
        names = ("shim", "dense-views", "dense", "SDPA-cuDNN")
        lines.append(f"| {r['shape']} | {r['max_diff_vs_dense']:.1e} | {' / '.join(f'{dv[n]:.3f}' for n in names)} "
                     f"| {dv['dense'] / dv['shim']:.2f} | {' / '.join(f'{cl[n]:.3f}' for n in names)} "
                     f"| {' / '.join(f'{fb[n]:.3f}' for n in names[:3])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True)
    parser.add_argument("--md")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for shape in ROWS:
        rows.append(row(*shape, args.rounds))
        print(json.dumps(rows[-1]), flush=True)
    command = "python scripts/flash_attn_shim_ab.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v)
    with open(args.json, "w") as f:
        json.dump({"command": command, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows, command))


if __name__ == "__main__":
    main()
