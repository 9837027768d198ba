"""`xkernels bench --suite sweep`: where we stand against torch at every size a model calls, device and caller time.

Attention at S in {512, 1K, 2K, 4K, 8K, 16K} with B * S = 16K tokens, H32, causal and full, D 64 / 128 / 256, and
GQA 32/8 at D128, against SDPA's default choice; GEMM with M in {1, 16, 128, 1024, 4096, 8192} against the (N, K) of
Llama-8B's linear layers (weights as [N, K], `b_layout="nk"`), against torch.matmul. Each row is checked against
float64 first, then timed as in `--suite host`: back-to-back calls (caller) and the same calls replayed from one
CUDA graph (device), both cycling through input sets that span 4x the L2 as a model's layers do (a few-row GEMM
then streams its weight from HBM; the graph on one set, weight in L2, is reported beside it). The plot shows torch
time / ours against size, one line per series.
"""

from __future__ import annotations

from xkernels.bench.report import pyplot
from xkernels.testing.cases import AttentionCase, Case, GemmCase

TOKENS = 16 * 1024
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
LLAMA8B_NK = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))  # o, qkv, gate+up, down
MS = (1, 16, 128, 1024, 4096, 8192)


def sweep_cases(quick: bool) -> list[Case]:
    lengths = (512, 2048, 8192) if quick else LENGTHS
    heads = ((32, 32, 128),) if quick else ((32, 32, 64), (32, 32, 128), (32, 32, 256), (32, 8, 128))
    cases: list[Case] = [AttentionCase(TOKENS // s, hq, hkv, s, s, d, causal, "bf16")
                         for hq, hkv, d in heads for causal in (True, False) for s in lengths]
    shapes = LLAMA8B_NK[:2] if quick else LLAMA8B_NK
    ms = (1, 128, 4096) if quick else MS
    cases += [GemmCase(m, n, k, "bf16", "nk") for n, k in shapes for m in ms]
    return cases


def series(row: dict) -> tuple[str, int]:
    """(series name, x) of a sweep row: attention by head dim, mask and heads against S; GEMM by (N, K) against M."""
    shape = row["shape"]
    if row["kernel"] == "attention":  # "B32 H32 512x512 D128 causal"
        parts = shape.split()
        s = int(parts[2].split("x")[0].replace("K", "")) * (1024 if "K" in parts[2].split("x")[0] else 1)
        return f"{parts[1]} {parts[3]}{' causal' if 'causal' in shape else ''}", s
    m, n, k = (int(x) for x in shape.split()[0].split("x"))  # "4096x6144x4096 nk auto"
    return f"N{n} K{k}", m


def plot(rows: list[dict], path) -> bool:
    """torch time / ours (device: solid, caller: dashed) against size, a panel per kernel; False without
    matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    rows = [r for r in rows if r.get("ours")]
    if not rows:
        return False
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    fig, axes = plt.subplots(1, len(kernels), figsize=(7 * len(kernels), 4.5), squeeze=False)
    for ax, kernel in zip(axes[0], kernels, strict=True):
        by: dict[str, list[tuple[int, float, float]]] = {}
        for r in rows:
            if r["kernel"] == kernel:
                name, x = series(r)
                by.setdefault(name, []).append((x, r["graph_speedup"], r["b2b_speedup"]))
        for name, pts in by.items():
            pts.sort()
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{name} device")
            ax.plot([p[0] for p in pts], [p[2] for p in pts], linestyle="--", color=line.get_color(), alpha=0.6)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("S (B * S = 16K tokens)" if kernel == "attention" else "M")
        ax.set_ylabel("torch time / xkernels time (> 1: ours faster)")
        ax.set_title(f"{kernel}: device (solid) and caller (dashed)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
