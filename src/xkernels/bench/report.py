"""Bench output: a rich table on the terminal, and JSON, Markdown and a PNG plot under the output folder."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from xkernels.bench.ceilings import Ceilings
from xkernels.bench.runner import Row


def _f(x: float | None, fmt: str = ".0f") -> str:
    return "—" if x is None else format(x, fmt)


def _peer_names(rows: list[Row]) -> list[str]:
    names: list[str] = []
    for r in rows:
        names += [n for n in r.peers if n not in names]
    return names


def _cells(r: Row, ceilings: Ceilings, peers: list[str]) -> list[str]:
    check = "PASS" if r.passed else "FAIL " + str(r.check["reason"])
    if r.ours is None:
        return [r.kernel, r.recipe, r.shape, check, f"{r.check['rel_rms']:.1e}"] + ["—"] * (4 + 2 * len(peers) + 1)
    ours = r.tflops(r.ours)
    pct = 100 * ours / ceilings.datasheet_tflops if ceilings.datasheet_tflops else None
    cells = [r.kernel, r.recipe, r.shape, check, f"{r.check['rel_rms']:.1e}",
             f"{r.ours.median_ms:.3f} [{r.ours.min_ms:.3f}-{r.ours.max_ms:.3f}]", _f(ours), _f(pct),
             _f(100 * ours / ceilings.matmul_tflops)]
    for p in peers:
        cells += [_f(r.tflops(r.peers.get(p))), _f(r.speedup(p), ".2f")]
    best = r.best_peer()
    cells.append(_f(r.speedup(best), ".2f") if best else "—")
    return cells


def headers(peers: list[str]) -> list[str]:
    cols = ["kernel", "recipe", "shape", "check", "rel-RMS", "ms median [min-max]", "TFLOP/s", "% peak", "% mm ceil"]
    for p in peers:
        cols += [f"{p} TFLOP/s", f"x{p}"]
    return cols + ["x best"]


def rich_table(rows: list[Row], ceilings: Ceilings) -> Table:
    peers = _peer_names(rows)
    t = Table(title=f"xkernels bench on {ceilings.device}: matmul ceiling {ceilings.matmul_tflops:.0f} TFLOP/s, "
                    f"copy {ceilings.copy_tbps:.2f} TB/s, datasheet {_f(ceilings.datasheet_tflops)} TFLOP/s")
    for h in headers(peers):
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*_cells(r, ceilings, peers))
    return t


def seeds_ratios(rows: list[Row]) -> list[tuple[str, float | None, float | None]]:
    """The seeds' columns per attention shape: bf16 time / fp16 time and bf16io time / fp16 time."""
    by_shape: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.kernel == "attention" and r.ours:
            by_shape.setdefault(r.shape, {})[r.recipe] = r.ours.median_ms
    out = []
    for shape, t in by_shape.items():
        fp16 = t.get("fp16")
        out.append((shape, t["bf16"] / fp16 if fp16 and "bf16" in t else None,
                    t["bf16io"] / fp16 if fp16 and "bf16io" in t else None))
    return out


def markdown(rows: list[Row], ceilings: Ceilings, command: str) -> str:
    peers = _peer_names(rows)
    hs = headers(peers)
    lines = [f"# xkernels bench: {ceilings.device}", "", f"Command: `{command}`", "",
             f"Ceilings measured in this run: torch.matmul bf16 8192^3 = {ceilings.matmul_tflops:.0f} TFLOP/s; "
             f"device-to-device copy = {ceilings.copy_tbps:.2f} TB/s (read + write); datasheet "
             f"{_f(ceilings.datasheet_tflops)} TFLOP/s. `xP` = ours / peer in throughput (> 1: ours faster).", "",
             "| " + " | ".join(hs) + " |", "|" + "---|" * len(hs)]
    lines += ["| " + " | ".join(_cells(r, ceilings, peers)) + " |" for r in rows]
    ratios = seeds_ratios(rows)
    if ratios:
        lines += ["", "Seeds' ratio columns (time / fp16 time):", "", "| shape | bf16 | bf16io |", "|---|---|---|"]
        lines += [f"| {s} | {_f(a, '.3f')} | {_f(b, '.3f')} |" for s, a, b in ratios]
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], path: Path) -> bool:
    """TFLOP/s per config, ours next to each peer; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    timed = [r for r in rows if r.ours]
    if not timed:
        return False
    peers = _peer_names(timed)
    series = ["xkernels"] + peers
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(timed)), 5))
    for i, s in enumerate(series):
        vals = [(r.tflops(r.ours) if s == "xkernels" else r.tflops(r.peers.get(s))) or 0 for r in timed]
        ax.bar([j + i * width for j in range(len(timed))], vals, width, label=s)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(timed))])
    ax.set_xticklabels([f"{r.kernel} {r.recipe}\n{r.shape}" for r in timed], rotation=75, fontsize=6)
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def write_outputs(rows: list[Row], ceilings: Ceilings, out_dir: Path, json_path: Path, command: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"command": command, "ceilings": ceilings.as_dict(),
                                     "rows": [r.as_dict(ceilings) for r in rows]}, indent=1))
    md = out_dir / "bench.md"
    md.write_text(markdown(rows, ceilings, command))
    written = [json_path, md]
    png = out_dir / "bench.png"
    if plot(rows, png):
        written.append(png)
    return written
