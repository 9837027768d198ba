"""A/B of the dK/dV kernel's layout (run 10 of 2026-11-30): the kernel with queries on rows (P^T and dS^T transposed
in registers; shipped until then, copied here) against the shipped one with keys on rows, same tiles, device time of
the dK/dV kernel alone. Prints and writes TFLOP/s of its four matmuls.

  python scripts/dkdv_layout_ab.py out/dkdv_ab.json
"""

import functools
import json
import math
import sys

import torch
import triton
import triton.language as tl

import xkernels
from xkernels.bench.timing import time_cuda
from xkernels.portable.attention_bwd import _tile, dkdv_kernel
from xkernels.portable.dot import mma


@triton.jit
def dkdv_rows_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss,
                do_sb, do_sh, do_ss, dk_sb, dk_sh, dk_ss, dv_sb, dv_sh, dv_ss, HQ, HKV, GROUP, SQ, SKV, scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                INTERPRET: tl.constexpr):
    n_blocks = tl.cdiv(SKV, BLOCK_N)
    bhk = (tl.program_id(0) // n_blocks).to(tl.int64)
    b, hk = bhk // HKV, bhk % HKV
    start_n = (tl.program_id(0) % n_blocks) * BLOCK_N
    keys = start_n + tl.arange(0, BLOCK_N)
    k = _tile(K + b * k_sb + hk * k_sh, k_ss, start_n, SKV, HEAD_DIM, BLOCK_N)
    v = _tile(V + b * v_sb + hk * v_sh, v_ss, start_n, SKV, HEAD_DIM, BLOCK_N)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0  # causal: earlier queries see none of these keys
    qk_scale = scale * 1.4426950408889634
    for g in range(GROUP):
        h = (hk * GROUP + g).to(tl.int64)
        bh = b * HQ + h
        for start_m in range(lo, SQ, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            q = _tile(Q + b * q_sb + h * q_sh, q_ss, start_m, SQ, HEAD_DIM, BLOCK_M)
            do = _tile(DO + b * do_sb + h * do_sh, do_ss, start_m, SQ, HEAD_DIM, BLOCK_M)
            lse = tl.load(LSE + bh * SQ + rows, mask=rows < SQ, other=0.0)
            delta = tl.load(DELTA + bh * SQ + rows, mask=rows < SQ, other=0.0)
            s = mma(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), INTERPRET)
            keep = (rows[:, None] < SQ) & (keys[None, :] < SKV)
            if CAUSAL:
                keep = keep & (keys[None, :] <= rows[:, None])
            p = tl.where(keep, tl.math.exp2(s * qk_scale - lse[:, None] * 1.4426950408889634), 0.0)
            dv = mma(tl.trans(p.to(do.dtype)), do, dv, INTERPRET)
            dp = mma(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), INTERPRET)
            ds = p * (dp - delta[:, None])
            dk = mma(tl.trans(ds.to(q.dtype)), q, dk, INTERPRET)
    cols = tl.arange(0, HEAD_DIM)
    keep_n = keys[:, None] < SKV
    tl.store(DK + b * dk_sb + hk * dk_sh + keys[:, None] * dk_ss + cols[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=keep_n)
    tl.store(DV + b * dv_sb + hk * dv_sh + keys[:, None] * dv_ss + cols[None, :], dv.to(DV.dtype.element_ty),
             mask=keep_n)



SHAPES = [(1, 32, 8192, 128, False), (1, 32, 8192, 128, True), (4, 32, 4096, 64, False), (1, 16, 8192, 256, False)]
CANDIDATES = {64: [(64, 64, 4, 2), (64, 128, 8, 2), (32, 128, 8, 2), (64, 64, 8, 2)],
              128: [(128, 64, 8, 1), (64, 128, 8, 1), (64, 64, 8, 1), (32, 128, 8, 1), (64, 128, 8, 2)],
              256: [(32, 64, 8, 1), (64, 64, 8, 1), (32, 128, 8, 1), (64, 32, 8, 1)]}


def launch(fn, q, k, v, do, lse, delta, dk, dv, causal, kv_m, kv_n, warps, stages, _=None):
    b, h, s, d = q.shape
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dk.stride()[:3],
               *dv.stride()[:3])
    grid, sizes = (triton.cdiv(s, kv_n) * b * h,), (h, h, 1, s, s, 1 / math.sqrt(d))
    constexprs = dict(HEAD_DIM=d, BLOCK_M=kv_m, BLOCK_N=kv_n, CAUSAL=causal, INTERPRET=False, num_warps=warps,
                      num_stages=stages)
    if fn is dkdv_kernel:  # the library's kernel also serves packed batches: cu_seqlens, the packed LSE's head stride
        fn[grid](q, k, v, do, lse, delta, dk, dv, q, q, *strides, 0, *sizes, VARLEN=False, **constexprs)
    else:
        fn[grid](q, k, v, do, lse, delta, dk, dv, *strides, *sizes, **constexprs)


def main() -> None:
    out = []
    for b, h, s, d, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = ((torch.rand((b, h, s, d), generator=g, device="cuda") - 0.5).to(torch.bfloat16)
                       for _ in range(4))
        with torch.no_grad():
            o, lse = xkernels.attention(q, k, v, is_causal=causal, return_lse=True)
        delta = (o.float() * do.float()).sum(-1).contiguous()
        pairs = s * (s + 1) // 2 if causal else s * s
        flops = 4 * 2 * d * pairs * b * h  # dK/dV's four matmuls
        row = {"shape": f"B{b} H{h} {s} D{d} causal={causal}", "results": {}}
        ref = None
        for kv_m, kv_n, warps, stages in CANDIDATES[d]:
            for name, fn in (("keys_on_rows", dkdv_kernel), ("queries_on_rows", dkdv_rows_kernel)):
                dk, dv = torch.empty_like(k), torch.empty_like(v)
                run = functools.partial(launch, fn, q, k, v, do, lse, delta, dk, dv, causal, kv_m, kv_n, warps,
                                        stages)
                key = f"{name} KV{kv_m}x{kv_n}-W{warps}-S{stages}"
                try:
                    run()
                    ref = ref or (dk.clone(), dv.clone())
                    err = max(((a.float() - r.float()).norm() / r.float().norm()).item()
                              for a, r in zip((dk, dv), ref, strict=True))
                    ms = time_cuda(run, [None], warmup=20, iters=20).median_ms
                    row["results"][key] = {"ms": ms, "tflops": flops / ms / 1e9, "diff_vs_first": err}
                except Exception as e:  # noqa: BLE001 - a tile that cannot run is a result
                    row["results"][key] = {"error": str(e)[:200]}
        print(json.dumps(row), flush=True)
        out.append(row)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
