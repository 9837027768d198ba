"""Peak GPU memory of a forward + backward step, ours against SDPA's backends on the same inputs: the bytes allocated
beyond q, k, v and dO during `O = attention(q, k, v); O.backward(dO)`, gradients included.

  python scripts/bwd_memory.py --json out/bwd_memory.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels

ROWS = [(1, 32, 32, 8192, 128, False), (1, 32, 32, 8192, 128, True), (4, 32, 32, 4096, 64, False),
        (1, 32, 8, 8192, 128, True), (1, 16, 16, 8192, 256, False)]


def step_peak(fn, q, k, v, do) -> int:
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(*leaves).backward(do)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del leaves
    return peak


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default="bwd_memory.json")
    args = p.parse_args()
    out = []
    for b, hq, hkv, s, d, causal in ROWS:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = (torch.rand((b, hq, s, d), generator=g, device="cuda") - 0.5).to(torch.bfloat16)
        k, v = ((torch.rand((b, hkv, s, d), generator=g, device="cuda") - 0.5).to(torch.bfloat16) for _ in range(2))
        do = torch.rand_like(q) - 0.5
        gqa = hq != hkv
        def ours(q, k, v, causal=causal, gqa=gqa):
            return xkernels.attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        kernels = {"xkernels": ours}
        for name, backend in (("SDPA-cuDNN", SDPBackend.CUDNN_ATTENTION), ("SDPA-flash", SDPBackend.FLASH_ATTENTION)):
            def sdpa(q, k, v, backend=backend, causal=causal, gqa=gqa):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            kernels[name] = sdpa
        row = {"shape": f"B{b} H{hq}/{hkv} {s} D{d}{' causal' if causal else ''}",
               "inputs_mib": sum(t.numel() * t.element_size() for t in (q, k, v, do)) / 2**20, "peak_mib": {}}
        for name, fn in kernels.items():
            try:
                step_peak(fn, q, k, v, do)  # a first call may allocate workspaces that later calls reuse
                row["peak_mib"][name] = step_peak(fn, q, k, v, do) / 2**20
            except RuntimeError as e:
                row["peak_mib"][name] = str(e).splitlines()[0][:120]
        print(json.dumps(row), flush=True)
        out.append(row)
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
