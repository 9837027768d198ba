"""The backward on (B, S, H, D) views, one case per process (an illegal memory access ends a CUDA context, so one
bad case would hide the others): every head dim x (Sq, Skv, causal) of `small_shapes.py`'s views section, each
with CUDA_LAUNCH_BLOCKING=1 so the failing launch is the one named, checked against float64.

    python scripts/views_bwd_cases.py                      (every case; a table of passed / failed / crashed)
    python scripts/views_bwd_cases.py --case 64,130,77,0   (one case here: D, Sq, Skv, causal)
    compute-sanitizer --tool memcheck python scripts/views_bwd_cases.py --case ...   (the kernel and address)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CASES = [(d, sq, skv, causal) for d in (64, 128, 256)
         for sq, skv, causal in ((130, 77, False), (77, 77, True), (1, 77, False))]


def one(d: int, sq: int, skv: int, causal: bool, heads: tuple[int, int], batch: int, layout: str,
        deterministic: bool | None, force_fused: bool, no_specialize: bool = False) -> int:
    import torch

    import xkernels
    from xkernels import select
    from xkernels.recipes import ATTENTION_RECIPES
    from xkernels.testing import attention_inputs, compare_grad, reference_attention_grads

    hq, hkv = heads
    q, k, v = attention_inputs(batch, hq, sq, skv, d, torch.bfloat16, "cuda", hkv=hkv, seed=d + sq)
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    backend = "auto"
    if no_specialize:  # the dK/dV kernel with its integer shapes as runtime values (1 is no longer folded)
        from triton.experimental import gluon

        from xkernels.hopper import attention_bwd

        attention_bwd.attention_dkdv_kernel = gluon.jit(attention_bwd.attention_dkdv_kernel.fn,
                                                        do_not_specialize=["SQ", "SKV", "HQ", "HKV", "GROUP"])
    if force_fused:  # the fused-dQ kernel at any query count (`select.FUSED_DQ_MIN_QUERIES` keeps it off one block)
        select.FUSED_DQ_MIN_QUERIES = 1
        backend, deterministic = "hopper", False
    o = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, deterministic=deterministic, backend=backend)
    torch.cuda.synchronize()
    print("forward:", xkernels.last_backend(), flush=True)
    do = (torch.rand(o.shape[0], o.shape[2], o.shape[1], d, device="cuda") - 0.5).bfloat16().transpose(1, 2)
    if layout != "bshd":
        do = do.contiguous()
    grads = torch.autograd.grad(o, (q, k, v), do)
    torch.cuda.synchronize()
    print("backward:", xkernels.last_backend(), flush=True)
    refs = reference_attention_grads(q.detach(), k.detach(), v.detach(), do, is_causal=causal)
    bad = 0
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        c = compare_grad(g, r, ATTENTION_RECIPES["bf16"])
        if not c.passed:
            print(f"FAIL {name}: {c.reason}", flush=True)
            bad += 1
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", help="D,Sq,Skv,causal: run that case in this process")
    ap.add_argument("--heads", default="4,2", help="Hq,Hkv")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--layout", choices=("bshd", "contiguous"), default="bshd")
    ap.add_argument("--deterministic", choices=("none", "true", "false"), default="none")
    ap.add_argument("--force-fused", action="store_true", help="the fused-dQ backward even on one query block")
    ap.add_argument("--no-specialize", action="store_true",
                    help="compile the dK/dV kernel with Sq, Skv and the head counts as runtime integers")
    ap.add_argument("--cases", nargs="+", help="D,Sq,Skv,causal cases for the driver (default: small_shapes')")
    args = ap.parse_args()
    deterministic = {"none": None, "true": True, "false": False}[args.deterministic]
    heads = tuple(int(x) for x in args.heads.split(","))
    if args.case:
        d, sq, skv, causal = (int(x) for x in args.case.split(","))
        sys.exit(1 if one(d, sq, skv, bool(causal), heads, args.batch, args.layout, deterministic,
                              args.force_fused, args.no_specialize) else 0)
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    rows = []
    cases = args.cases or [f"{d},{sq},{skv},{int(causal)}" for d, sq, skv, causal in CASES]
    for case in cases:
        done = subprocess.run([sys.executable, __file__, "--case", case, "--heads", args.heads,
                               "--batch", str(args.batch), "--layout", args.layout, "--deterministic",
                               args.deterministic, *(["--force-fused"] if args.force_fused else []),
                               *(["--no-specialize"] if args.no_specialize else [])], env=env,
                              capture_output=True, text=True)
        text = (done.stdout + done.stderr).strip().splitlines()
        status = {0: "passed", 1: "failed"}.get(done.returncode, f"exit {done.returncode}")
        if "illegal memory access" in done.stdout + done.stderr:
            status = "crashed"
        backends = [ln for ln in text if ln.startswith(("forward:", "backward:"))]
        where = [ln.strip() for ln in text if "FAIL" in ln or "Error" in ln]
        rows.append((case, status, backends, where[-2:]))
        label = f"{case} {args.layout} H{args.heads} B{args.batch} det={args.deterministic}"
        label += " fused" * args.force_fused + " unspecialized" * args.no_specialize
        print(f"| {label} | {status} | {' / '.join(backends)} | {' '.join(rows[-1][3])} |", flush=True)
    sys.exit(1 if any(r[1] != "passed" for r in rows) else 0)


if __name__ == "__main__":
    main()
