"""Hardware counters for the Hopper GEMM's small shapes (one consumer, ping-pong, split-K) and torch.matmul (cuBLAS)
on the same inputs; run under ncu with `--profile-from-start off`:

    ncu --profile-from-start off --set full -o gemm python3 scripts/gemm_profile.py

Each config is compiled and warmed outside the profiled range; inside it every row launches once per config, so ncu
sees exactly those launches (the split-K workspace's counters are put back to zero by the kernel itself, so a
replayed pass starts from the state the first one saw).
"""

from __future__ import annotations

import torch

import xkernels

ROWS = {
    (1024, 1024, 1024): ["block_m=64,block_n=128,num_warps=4,stages=8,split_k=1",
                         "block_m=64,block_n=128,num_warps=4,stages=8,split_k=2",
                         "block_m=64,block_n=128,num_warps=4,stages=8,split_k=2,consumers=2"],
    (64, 4096, 4096): ["block_m=64,block_n=64,num_warps=4,stages=8,split_k=1",
                       "block_m=64,block_n=64,num_warps=4,stages=8,split_k=2",
                       "block_m=64,block_n=64,num_warps=4,stages=8,split_k=2,consumers=2"],
    (1536, 1536, 1536): ["block_m=64,block_n=128,num_warps=4,stages=8,split_k=1",
                         "block_m=64,block_n=128,num_warps=4,stages=8,split_k=1,consumers=2"],
}


def main() -> None:
    calls = []
    for (m, n, k), configs in ROWS.items():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        calls.append((f"torch {m}x{n}x{k}", lambda a=a, b=b: a @ b.T))
        for cfg in configs:
            calls.append((f"{m}x{n}x{k} {cfg}",
                          lambda a=a, b=b, cfg=cfg: xkernels.matmul(a, b, b_layout="nk", backend="hopper:" + cfg)))
    for _, fn in calls:
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, fn in calls:
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    for i, (name, _) in enumerate(calls):
        print(i, name)


if __name__ == "__main__":
    main()
