"""Few-row GEMM candidates with the weight in L2 and streamed from HBM: device time from CUDA-graph replay
(interleaved rounds, `bench.timing.interleaved_graph_ms`) on Llama-8B's linear layers at 1-32 rows, B as [N, K], of

  * torch.matmul, and xkernels.matmul as shipped (under capture a split call adds a counter fill),
  * few-row kernel candidates (`SkinnyGemmConfig`), K split by the config's own rule (its workspace zeroed once,
    outside the capture: the kernel puts every counter back) or unsplit,

each timed twice: every call on one weight (32 MB for 4096 x 4096: it stays in the 50 MB L2 between replays), and the
calls cycling through weights that span 4x the L2 (`bench.timing.rotation_count`), as a decode step's layers do.

Every program of a column block reads all of A's rows for its K range, so A's traffic is (N / BLOCK_N) * M * K * 2
bytes: at 32 rows and BLOCK_N 32 as much as the weight's. Wider column blocks cut it, at the price of a K split.

With --swap the candidates are the target's shipped few-row configs of 64 columns or more, split by their rule and
unsplit, each beside its `swap` twin (the weight's tile as the product's first operand: a wgmma with the rows as
its N side, where the rows-first product is an mma.sync).

    python scripts/skinny_l2_ab.py --json skinny_l2.json [--md skinny_l2.md] [--ms 1 16 32] [--swap]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json

import torch
import triton

import xkernels
from xkernels.bench.timing import interleaved_graph_ms, rotation_count
from xkernels.common import launch
from xkernels.common.runtime import sm_count
from xkernels.portable import configs, gemm_skinny
from xkernels.portable.configs import SkinnyGemmConfig
from xkernels.select import _target

SHAPES = ((4096, 4096), (6144, 4096), (4096, 14336))
CANDIDATES = [  # (config, split K by its rule)
    (SkinnyGemmConfig(32, 256, 4, 4, programs_per_sm=1), False),
    (SkinnyGemmConfig(32, 256, 4, 7, programs_per_sm=1), False),  # more bytes in flight per SM (Little's law)
    (SkinnyGemmConfig(32, 128, 4, 12, programs_per_sm=1), False),
    (SkinnyGemmConfig(64, 256, 4, 5, programs_per_sm=1), True),
    (SkinnyGemmConfig(64, 256, 4, 3, programs_per_sm=2), True),
    (SkinnyGemmConfig(128, 128, 4, 3, programs_per_sm=2), True),
    (SkinnyGemmConfig(128, 256, 4, 3, programs_per_sm=1), True),
    (SkinnyGemmConfig(128, 128, 4, 4, programs_per_sm=1), True),
    (SkinnyGemmConfig(256, 64, 4, 4, programs_per_sm=1), True),
    (SkinnyGemmConfig(256, 128, 8, 3, programs_per_sm=1), True),
]


def swap_candidates(target) -> list[tuple[SkinnyGemmConfig, bool]]:
    """--swap: each shipped few-row config of the target with at least 64 columns (wgmma's smallest M), split by
    its rule and unsplit, then its `swap` twin."""
    table = configs.table_for(target)
    shipped = [c for c in (table.skinny, table.skinny_rows, table.skinny_wide_rows) if c is not None
               and c.block_n >= 64]
    return [(c, split) for base in shipped for split in (True, False)
            for c in (base, dataclasses.replace(base, swap=True))]


def launcher(a, bs, out, cfg: SkinnyGemmConfig, sms: int, split: bool):
    """A call of the few-row kernel with `cfg` that cycles through the weights `bs` (one weight: every call on it)."""
    m, k = a.shape
    n = bs[0].shape[0]
    if split:
        grid, slices, k_slice, cx, opts = gemm_skinny.launch_spec(m, n, k, b_layout="nk", cfg=cfg, sms=sms)
    else:
        slices, k_slice = 1, triton.cdiv(k, cfg.block_k) * cfg.block_k
        grid, cx, opts = triton.cdiv(n, cfg.block_n), cfg.constexprs(gemm_skinny.block_m(m), 1, "nk"), cfg.options()
    # zeroed once, here, outside any capture: the kernels put every counter back to zero; calls on one stream
    # run one after another, so the weights share it
    arrivals = torch.zeros(triton.cdiv(n, cfg.block_n), dtype=torch.int32, device=a.device)
    partials = torch.empty((slices, m, n), dtype=torch.float32, device=a.device) if slices > 1 else out
    cycle = itertools.cycle(bs)

    def call():
        b = next(cycle)
        launch.generic_launch(gemm_skinny.skinny_gemm_kernel, grid, (a, b, out, partials, arrivals, m, n, k,
                                                                     a.stride(0), b.stride(0), out.stride(0),
                                                                     k_slice), cx, opts)
    return call, slices


def checked(a, bs, want, cfg: SkinnyGemmConfig, sms: int, split: bool, row: dict, name: str):
    """`launcher`'s call over the weights `bs` once its output on bs[0] is within 1e-2 rel-RMS of `want` (recorded
    in row["errors"] and row["slices"]), else None; a candidate that does not compile or fit is recorded too."""
    out = torch.empty(a.shape[0], bs[0].shape[0], dtype=torch.bfloat16, device="cuda")
    try:
        check, slices = launcher(a, bs[:1], out, cfg, sms, split)
        check()
        torch.cuda.synchronize()
    except Exception as e:  # not fatal: the other candidates still run
        row["errors"][name] = repr(e)[:200]
        return None
    err = ((out.double() - want).norm() / want.norm()).item()
    row["errors"][name], row["slices"][name] = err, slices
    return launcher(a, bs, out, cfg, sms, split)[0] if err < 1e-2 else None


def setup() -> tuple[argparse.Namespace, int, object, dict]:
    """(--json, --md, --ms, --rounds; the SM count; the device's config target; the results' head)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 16, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--swap", action="store_true", help="the shipped configs beside their `swap` twins")
    sms = sm_count(0)
    return ap.parse_args(), sms, _target(torch.device("cuda")), {"device": torch.cuda.get_device_name(), "sms": sms,
                                                                 "rows": []}


def main() -> None:
    args, sms, target, res = setup()
    candidates = swap_candidates(target) if args.swap else CANDIDATES
    for n, k in SHAPES:
        ws = [(torch.rand(n, k, device="cuda") - 0.5).bfloat16() for _ in range(rotation_count(n * k * 2))]
        for m in args.ms:
            a = (torch.rand(m, k, device="cuda") - 0.5).bfloat16()
            want = a.double() @ ws[0].double().T
            shipped = configs.skinny_gemm_config(target, interpret=False, rows=m, n=n, k=k, sms=sms)
            row = {"m": m, "n": n, "k": k, "weights": len(ws), "shipped": str(shipped), "errors": {}, "slices": {},
                   "ms": {}, "x_torch": {}}
            for where, bs in (("L2", ws[:1]), ("HBM", ws)):
                cyc_t, cyc_x = itertools.cycle(bs), itertools.cycle(bs)
                fns = {"torch": lambda a=a, c=cyc_t: a @ next(c).T,
                       "xkernels": lambda a=a, c=cyc_x: xkernels.matmul(a, next(c).T)}
                for cfg, split in candidates:
                    name = f"{cfg}{' split' if split else ''}"
                    call = checked(a, bs, want, cfg, sms, split, row, name)
                    if call is not None:
                        fns[name] = call
                ms = interleaved_graph_ms(fns, rounds=args.rounds)
                row["ms"][where] = ms
                row["x_torch"][where] = {name: ms["torch"] / t for name, t in ms.items()}
                print(f"{where} M{m} N{n} K{k}: " + ", ".join(f"{name} {t * 1e3:.1f} us x{ms['torch'] / t:.2f}"
                                                            for name, t in ms.items()), flush=True)
            got = xkernels.matmul(a, ws[0].T)
            row["errors"]["xkernels"] = ((got.double() - want).norm() / want.norm()).item()
            res["rows"].append(row)
            json.dump(res, open(args.json, "w"), indent=1)
    if args.md:
        cols = ["xkernels"] + [f"{c}{' split' if s else ''}" for c, s in candidates]
        with open(args.md, "w") as f:
            f.write(f"# few-row GEMM candidates, weight in L2 / from HBM, on {res['device']} (CUDA-graph replay, "
                    "torch time / ours)\n\nEach cell: weight in L2 / weights rotated through 4x the L2.\n\n")
            f.write("| shape | torch us (L2 / HBM) | " + " | ".join(cols) + " |\n|---|---|" + "---|" * len(cols)
                    + "\n")
            for r in res["rows"]:
                cells = [" / ".join(f"{r['x_torch'][w][c]:.2f}" if c in r["x_torch"][w] else "-"
                                    for w in ("L2", "HBM")) for c in cols]
                f.write(f"| {r['m']} x {r['n']} x {r['k']} | {r['ms']['L2']['torch'] * 1e3:.1f} / "
                        f"{r['ms']['HBM']['torch'] * 1e3:.1f} | " + " | ".join(cells) + " |\n")


if __name__ == "__main__":
    main()
