"""`xkernels check`: the seeds' correctness sweep, as a table; non-zero exit on any FAIL."""

from __future__ import annotations

import json
import sys

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import track
from rich.table import Table

from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing.cases import (
    AttentionCase,
    AttentionGradCase,
    Case,
    DecodeCase,
    GemmCase,
    VarlenCase,
    VarlenGradCase,
    kernel_name,
    threshold,
)


def check_cases(device: str) -> list[Case]:
    """GPU: the seeds' 1K x 1K and 512 x 1K plus 8K x 8K (32 heads, D128), GEMM 256^3 first, then 4096^3; then
    decode (dense API, dense and paged caches), a packed varlen batch, the gradients of a dense and a packed
    training step, and the sliding windows, soft caps and sinks of Mistral, Gemma 2 and gpt-oss. CPU
    (interpreter): the same kinds of case at small shapes."""
    if device == "cuda":
        attn = [(32, 1024, 1024, False), (32, 512, 1024, False), (32, 1024, 1024, True), (32, 8192, 8192, False)]
        gemm = [256, 4096]
    else:
        attn = [(2, 128, 128, False), (2, 64, 128, False), (2, 128, 128, True)]
        gemm = [256]
    cases: list[Case] = [AttentionCase(1, h, h, sq, skv, 128, causal, r)
                         for h, sq, skv, causal in attn for r in ATTENTION_RECIPES]
    cases += [GemmCase(n, n, n, dt, lay) for n in gemm for dt in ("fp16", "bf16") for lay in ("kn", "nk")]
    if device == "cuda":
        cases += [DecodeCase(8, 32, 8, 8192, 128, cache=c) for c in ("dense-api", "dense", "paged16")]
        cases += [VarlenCase(8, 256, 2048, 32, 8, 128, True)]
        cases += [AttentionGradCase(1, 16, 16, 2048, 2048, 128, True, "bf16", step="fwd+bwd"),
                  VarlenGradCase(8, 256, 2048, 16, 4, 128, True, step="fwd+bwd"),
                  AttentionGradCase(1, 16, 4, 2048, 2048, 128, True, "bf16", window=(511, 0), step="fwd+bwd")]
        # Gemma 2's capped windowed layer, gpt-oss's sink layer, and a training step with both
        cases += [AttentionCase(1, 16, 8, 2048, 2048, 256, True, "bf16", window=(1023, 0), softcap=50.0),
                  AttentionCase(1, 64, 8, 2048, 2048, 64, True, "bf16", window=(127, 0), sinks=True),
                  AttentionGradCase(1, 16, 4, 1024, 1024, 128, True, "bf16", softcap=3.0, sinks=True,
                                    step="fwd+bwd")]
    else:
        cases += [DecodeCase(2, 4, 2, 100, 64, cache=c) for c in ("dense-api", "dense", "paged16")]
        cases += [VarlenCase(3, 5, 60, 4, 2, 64, True)]
        cases += [AttentionGradCase(1, 2, 2, 40, 40, 64, True, "fp16", step="fwd+bwd"),
                  VarlenGradCase(3, 5, 40, 4, 2, 64, True, "fp16", step="fwd+bwd"),
                  AttentionGradCase(1, 2, 1, 40, 40, 64, True, "fp16", window=(9, 0), step="fwd+bwd")]
        cases += [AttentionCase(1, 4, 2, 40, 56, 64, True, "bf16", window=(9, 0), softcap=50.0, sinks=True),
                  AttentionGradCase(1, 4, 2, 40, 40, 64, True, "bf16", softcap=3.0, sinks=True, step="fwd+bwd")]
    return cases


def run_check(device: str, json_path: str | None) -> int:
    import xkernels

    console = Console(width=None if sys.stdout.isatty() else 160)
    where = "CUDA " + _gpu_name() if device == "cuda" else "CPU through the Triton interpreter (no CUDA device)"
    console.print(f"[bold]xkernels check[/] on {where}")
    rows = []
    for case in track(check_cases(device), description="checking", console=console, transient=True):
        c = case.check(case.inputs(device, seed=len(rows)))
        rows.append({"kernel": kernel_name(case), "recipe": case.recipe, "shape": case.shape,
                     "backend": xkernels.last_backend(), "threshold": threshold(case), **c.row()})
    table = Table(title="correctness (float64 reference on the kernel's quantized inputs)", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for col in ("kernel", "recipe"):  # names and numbers whole; shapes, bounds and reasons wrap
        table.add_column(col, no_wrap=True)
    table.add_column("shape", overflow="fold", ratio=1)
    for col in ("rel-RMS", "max-diff"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("threshold", min_width=9)
    table.add_column("result", overflow="fold", min_width=4)
    for r in rows:
        verdict = "[green]PASS" if r["passed"] else f"[red]FAIL[/] {escape(r['reason'])}"
        table.add_row(r["kernel"], r["recipe"], escape(r["shape"]), f"{r['rel_rms']:.2e}", f"{r['max_abs_diff']:.2e}",
                      r["threshold"], verdict)
    console.print(table)
    failed = sum(not r["passed"] for r in rows)
    console.print(f"{len(rows) - failed} passed, {failed} failed")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"device": where, "rows": rows}, f, indent=1)
    return 1 if failed else 0


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()
