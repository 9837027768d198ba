"""Hopper backward tile variants on the H200, per head dim, against the portable backward and SDPA-cuDNN's in the
same process. D256: the dK/dV kernel with its head dim split across the two warpgroups (`split_d` 1: each computes
S^T and dP^T; 2: one each, exchanged through shared memory) and the Gluon dQ on 32-key tiles; D64/D128: ring depths
of the dK/dV and dQ kernels and the dQ's key tile; D64 also the fused-dQ kernel (dQ's two column halves, or
`fused_dq=3`: the warpgroups taking turns at the whole partial), and K and V as register operands (`kv_regs`).
Every variant's dQ, dK and dV are first checked against float64 autograd on small shapes (tails, causal with
Sq != Skv, GQA); timing is device time of the whole backward (CUDA events behind a GPU-side sleep), cuDNN's and
every variant's in three interleaved rounds (`time_rounds`), median of the pooled 30 runs.

    python scripts/bwd_ab.py --dims 256 --json bwd_ab.json [--md bwd_ab.md] [--skip dq3]
                             [--mask-split | --even-keys | --rotate | --group-parts]

--even-keys: the shipped configs as shipped and with `even_keys` ("... -ek": dense full rows over whole key blocks
walk one unmasked loop); causal rows run the same program both ways.
--group-parts: the split pair with each key block's GQA group over 1, 2 and 4 programs (`group_parts`), on GQA rows
with few dK/dV programs (`GROUP_ROWS`); the rule's pick (`select.group_parts`) is named in each row.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xkernels
from xkernels import backward, select
from xkernels.bench.report import check_summary
from xkernels.bench.timing import time_rounds
from xkernels.hopper.configs import (
    ATTENTION_BWD_CONFIGS,
    FUSED_BWD_CONFIGS,
    HopperAttentionBwdConfig,
    HopperAttentionDqConfig,
)
from xkernels.portable import attention_bwd as portable_bwd
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_grad, reference_attention_grads

CUDNN = "SDPA-cuDNN"
ROWS = {256: ((1, 16, 8192, False), (1, 16, 8192, True), (2, 16, 4096, False), (4, 16, 2048, True)),
        128: ((1, 32, 8192, False), (1, 32, 8192, True), (2, 16, 4096, True)),
        64: ((4, 32, 4096, False), (4, 32, 4096, True))}
# GQA rows with few dK/dV programs (B x Hkv x key blocks of 128): (B, Hq, Hkv, S, causal)
GROUP_ROWS = {128: ((1, 16, 4, 4096, True), (1, 32, 8, 2048, True), (1, 8, 2, 4096, True), (1, 32, 8, 4096, True),
                    (1, 16, 4, 4096, False)),
              64: ((1, 32, 4, 4096, True), (1, 32, 8, 2048, True), (1, 32, 8, 4096, True))}
CHECKS = ((1, 4, 2, 777, 777, False), (1, 4, 2, 300, 777, True), (2, 2, 2, 130, 65, False), (1, 4, 4, 1, 200, True),
          (2, 4, 2, 200, 256, False))  # the last: whole key blocks (EVEN_KEYS), a query tail


def variants(d: int, portable_cfg) -> dict:
    """name -> HopperBackward, or None for the portable backward (the shipped config first); each walks its queries
    as the head dim's shipped config does (`mask_split`)."""
    walk = ATTENTION_BWD_CONFIGS[d].mask_split

    def hb(bm, bn, st, split=0, dq_bn=32, dq_st=2, concurrent=True, dq=True):
        return select.HopperBackward(HopperAttentionBwdConfig(bm, bn, st, split_d=split, mask_split=walk),
                                     portable_cfg, HopperAttentionDqConfig(dq_bn, dq_st) if dq else None, concurrent)

    if d == 256:
        return {"sd2-32-s3 dq32-s2 conc": hb(32, 64, 3, 2), "sd1-32-s3 dq32-s2 conc": hb(32, 64, 3, 1),
                "sd2-32-s2 dq32-s2 conc": hb(32, 64, 2, 2), "sd2-32-s3 dq32-s3 conc": hb(32, 64, 3, 2, dq_st=3),
                "sd2-32-s3 dq32-s2 seq": hb(32, 64, 3, 2, concurrent=False),
                "sd2-32-s3 portable-dq": hb(32, 64, 3, 2, dq=False), "portable": None}
    dq_bn = 128 if d == 64 else 64  # the shipped dQ key tile
    other = 64 if d == 64 else 128
    if d == 64:  # the split and fused paths, with K and V as register operands (kv_regs) and a deeper ring
        def fused(st=2, n=1, kvr=0):
            return select.HopperBackward(HopperAttentionBwdConfig(64, 128, st, fused_dq=n, kv_regs=kvr,
                                                                  mask_split=FUSED_BWD_CONFIGS[64].mask_split),
                                         portable_cfg, None)
        return {f"s2 dq{dq_bn}-s2": hb(64, 128, 2, dq_bn=dq_bn),
                f"s2-kvr dq{dq_bn}-s2": select.HopperBackward(
                    HopperAttentionBwdConfig(64, 128, 2, kv_regs=1, mask_split=walk), portable_cfg,
                    HopperAttentionDqConfig(dq_bn, 2)),
                "fused dq1 s2": fused(), "fused dq1 s2-kvr": fused(kvr=1), "fused dq2 s2-kvr": fused(n=2, kvr=1),
                "fused dq3 s2": fused(n=3), "fused dq3 s2-kvr": fused(n=3, kvr=1),
                "fused dq3 s4-kvr": fused(st=4, n=3, kvr=1),
                "fused dq1 s4-kvr": fused(st=4, kvr=1), "fused dq1 s4": fused(st=4)}  # (fused: 2^n stages)
    return {f"s2 dq{dq_bn}-s2": hb(64, 128, 2, dq_bn=dq_bn), f"s3 dq{dq_bn}-s2": hb(64, 128, 3, dq_bn=dq_bn),
            f"s2 dq{dq_bn}-s3": hb(64, 128, 2, dq_bn=dq_bn, dq_st=3),
            f"s3 dq{dq_bn}-s3": hb(64, 128, 3, dq_bn=dq_bn, dq_st=3),
            f"s2 dq{other}-{3 if other == 64 else 2}": hb(64, 128, 2, dq_bn=other, dq_st=3 if other == 64 else 2),
            "portable": None}


def mask_split_variants(d: int, portable_cfg) -> dict:
    """The shipped backward configs (the split pair and, where the head dim has it, the fused-dQ kernel), each with
    every step masked ("split", "fused") and with `mask_split` ("... -ms": the query walk's unmasked steps in a loop
    of their own), whichever of the two ships."""
    out = {}
    fused_dims = select.FUSED_DQ_HEAD_DIMS
    for fused in (False, True) if d in fused_dims else (False,):
        hb = select.hopper_backward(d, portable_cfg, fused_dq=fused)
        name = "fused" if fused else "split"
        out[name] = dataclasses.replace(hb, dkdv=dataclasses.replace(hb.dkdv, mask_split=0))
        out[f"{name} -ms"] = dataclasses.replace(hb, dkdv=dataclasses.replace(hb.dkdv, mask_split=1))
    return out


def even_keys_variants(d: int, portable_cfg) -> dict:
    """The shipped backward configs (split pair and, where the head dim has it, fused), as shipped and with
    `even_keys` (dense full rows over whole key blocks: one unmasked loop)."""
    out = {}
    for fused in (False, True) if d in select.FUSED_DQ_HEAD_DIMS else (False,):
        hb = select.hopper_backward(d, portable_cfg, fused_dq=fused)
        name = "fused" if fused else "split"
        out[name] = hb
        out[f"{name} -ek"] = dataclasses.replace(hb, dkdv=dataclasses.replace(hb.dkdv, even_keys=1))
    return out


def rotate_variants(d: int, portable_cfg) -> dict:
    """The fused backward config as shipped and with `rotate` ("-rot": each key block's query walk starts at its own
    block, so a head's programs reduce dQ into different rows at a time; dense full rows only), and the split pair
    as a control."""
    hb = select.hopper_backward(d, portable_cfg, fused_dq=True)
    return {"split": select.hopper_backward(d, portable_cfg), "fused": hb,
            "fused -rot": dataclasses.replace(hb, dkdv=dataclasses.replace(hb.dkdv, rotate=1))}


def group_parts_variants(d: int, portable_cfg) -> dict:
    """The shipped split pair with each key block's GQA group over 1, 2 and 4 programs ("-gpN")."""
    hb = select.hopper_backward(d, portable_cfg)
    return {"split" if n == 1 else f"split -gp{n}": dataclasses.replace(hb, dkdv=dataclasses.replace(hb.dkdv,
                                                                                                  group_parts=n))
            for n in (1, 2, 4)}


def fits(cfg, hq: int, hkv: int) -> bool:
    """Whether a variant can run with this GQA group (its parts divide the group)."""
    return cfg is None or (hq // hkv) % cfg.dkdv.group_parts == 0


def run(q, k, v, do, o, lse, cfg, causal, portable_cfg, poison=False):
    """The backward into fresh gradient buffers (NaN-filled for the checks, so a row a kernel skips fails; left
    uninitialized when timed, so no fill is counted against our kernels that cuDNN's do not pay)."""
    grads = [torch.full_like(t, float("nan")) if poison else torch.empty_like(t) for t in (q, k, v)]
    scale = q.shape[-1] ** -0.5
    if cfg is None:
        portable_bwd.launch(q, k, v, o, lse, do, *grads, None, is_causal=causal, scale=scale, cfg=portable_cfg)
    else:
        backward._hopper(q, k, v, o, lse, do, *grads, None, is_causal=causal, scale=scale, cfg=cfg)
    return grads


def setup(b, hq, hkv, sq, skv, d, causal, seed=0):
    q, k, v = attention_inputs(b, hq, sq, skv, d, torch.bfloat16, "cuda", hkv=hkv, seed=seed)
    do = (torch.rand(q.shape, device="cuda") - 0.5).to(q.dtype)
    o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
    _, choice = select.resolve_attention_backward(do, q, k, v, o, lse, None, enable_gqa=True, precision="auto",
                                                  backend="portable")
    return q, k, v, do, o.detach(), lse.detach(), choice.config


def markdown(res: dict) -> str:
    lines: list[str] = []
    head = ""
    for r in res["rows"]:  # a table per run of rows with the same variants (one per head dim)
        names = list(r["x_cudnn"])
        if head != (head := "| shape | cuDNN ms | " + " | ".join(names) + " |"):
            lines += ["", head, "|---" * (2 + len(names)) + "|"]
        lines.append(f"| {r['shape']} | {r['cudnn_ms']:.3f} | "
                     + " | ".join(f"{r['x_cudnn'][n]:.2f}" for n in names) + " |")
    return "\n".join(lines + check_summary(res["check"])) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--dims", type=int, nargs="+", default=[256], choices=sorted(ROWS))
    ap.add_argument("--skip", default="", help="leave out the variants whose name contains this string")
    ap.add_argument("--mask-split", action="store_true", help="the shipped configs with and without mask_split "
                    "(`mask_split_variants`) in place of the tile variants")
    ap.add_argument("--even-keys", action="store_true", help="the shipped configs with and without EVEN_KEYS "
                    "(`even_keys_variants`) in place of the tile variants")
    ap.add_argument("--rotate", action="store_true", help="the fused config with and without `rotate` "
                    "(`rotate_variants`) in place of the tile variants")
    ap.add_argument("--group-parts", action="store_true", help="the split pair over 1, 2, 4 programs per key "
                    "block's GQA group (`group_parts_variants`) on `GROUP_ROWS`")
    args = ap.parse_args()

    def chosen(d, pcfg) -> dict:
        pick = (mask_split_variants if args.mask_split else even_keys_variants if args.even_keys
                else rotate_variants if args.rotate else group_parts_variants if args.group_parts else variants)
        every = pick(d, pcfg)
        return {n: c for n, c in every.items() if not (args.skip and args.skip in n)}

    res: dict = {"device": torch.cuda.get_device_name(), "check": [], "rows": []}
    recipe = ATTENTION_RECIPES["bf16"]
    for d in args.dims:
        checks = CHECKS + ((1, 8, 2, 300, 777, True), (2, 8, 2, 1000, 1000, True)) * args.group_parts
        for b, hq, hkv, sq, skv, causal in checks:
            q, k, v, do, o, lse, pcfg = setup(b, hq, hkv, sq, skv, d, causal, seed=sq + skv)
            refs = reference_attention_grads(q, k, v, do, is_causal=causal)
            for name, cfg in chosen(d, pcfg).items():
                if not fits(cfg, hq, hkv):
                    continue
                grads = run(q, k, v, do, o, lse, cfg, causal, pcfg, poison=True)
                torch.cuda.synchronize()
                for g, ref, which in zip(grads, refs, "qkv", strict=True):
                    c = compare_grad(g, ref, recipe)
                    res["check"].append({"variant": name, "grad": which, "shape": [b, hq, hkv, sq, skv, d, causal],
                                         "passed": c.passed, "reason": c.reason, "rel_rms": c.rel_rms})
                    if not c.passed:
                        print("FAILED", res["check"][-1], flush=True)
        print(f"checks: {sum(c['passed'] for c in res['check'])}/{len(res['check'])} passed", flush=True)
        rows = GROUP_ROWS[d] if args.group_parts else [(b, h, h, s, causal) for b, h, s, causal in ROWS[d]]
        for b, h, hkv, s, causal in rows:
            q, k, v, do, o, lse, pcfg = setup(b, h, hkv, s, s, d, causal)
            # GQA: cuDNN on K and V repeated over each group beforehand (its time leaves out the repeat and the sum
            # of dK and dV over the group that a GQA caller of it would add)
            leaves = [t.detach().repeat_interleave(r, dim=1).requires_grad_() for t, r in ((q, 1), (k, h // hkv),
                                                                                            (v, h // hkv))]
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
            # cuDNN and every variant in interleaved rounds (`time_rounds`): no variant always runs last
            runs = {CUDNN: (lambda _: torch.autograd.grad(out, leaves, do, retain_graph=True), [None],  # noqa: B023
                            lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION]))}
            runs |= {name: (lambda _, c=cfg: run(q, k, v, do, o, lse, c, causal, pcfg), [None],  # noqa: B023
                            contextlib.nullcontext) for name, cfg in chosen(d, pcfg).items() if fits(cfg, h, hkv)}
            timed = time_rounds(runs, iters=30)
            cudnn_ms = timed.pop(CUDNN).median_ms
            flops = 4 * d * s * s * b * h * 2.5 / (2 if causal else 1)
            pick = select.group_parts(d, b, h, hkv, s, s, torch.cuda.get_device_properties(0).multi_processor_count)
            shape = f"B{b} H{h}" + f"/{hkv}" * (hkv != h) + f" {s} D{d}{' causal' if causal else ''}"
            row = {"shape": shape + f" (rule: gp{pick})" * args.group_parts, "cudnn_ms": cudnn_ms,
                   "cudnn_tflops": flops / cudnn_ms / 1e9, "ms": {}, "x_cudnn": {}}
            for name, t in timed.items():
                if isinstance(t, str):
                    row["ms"][name] = t
                    continue
                row["ms"][name], row["x_cudnn"][name] = t.median_ms, cudnn_ms / t.median_ms
            res["rows"].append(row)
            print(row, flush=True)
            json.dump(res, open(args.json, "w"), indent=1)
    json.dump(res, open(args.json, "w"), indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(res))


if __name__ == "__main__":
    main()
