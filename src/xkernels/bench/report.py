"""Bench output: a rich table on the terminal, and JSON, Markdown and a PNG plot under the output folder."""

from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from xkernels.bench.ceilings import Ceilings
from xkernels.bench.runner import Row


def check_summary(checks: list[dict]) -> list[str]:
    """Markdown lines closing an A/B script's table: how many of its float64 checks (dicts with "passed") passed,
    then each failed one."""
    failed = [c for c in checks if not c["passed"]]
    return [f"\nfloat64 checks: {len(checks) - len(failed)}/{len(checks)} passed"] + [f"- FAILED {c}" for c in failed]


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
        return [r.kernel, r.recipe, r.shape, check, f"{r.check['rel_rms']:.1e}"] + ["—"] * (5 + 2 * len(peers) + 1)
    times = f"{r.ours.median_ms:.3f} [{r.ours.min_ms:.3f}-{r.ours.max_ms:.3f}]"
    if r.bytes_read:  # memory-bound: TB/s, and % of the copy ceiling in the "% peak" column
        tb = r.tbps(r.ours)
        cells = [r.kernel, r.recipe, r.shape, check, f"{r.check['rel_rms']:.1e}", times, _f(r.ours.host_us),
                 f"{tb:.2f} TB/s", _f(100 * tb / ceilings.copy_tbps) + " copy", "—"]
        for p in peers:
            cells += [_f(r.tbps(r.peers.get(p)), ".2f"), _f(r.speedup(p), ".2f")]
    else:
        ours = r.tflops(r.ours)
        pct = 100 * ours / ceilings.datasheet_tflops if ceilings.datasheet_tflops else None
        cells = [r.kernel, r.recipe, r.shape, check, f"{r.check['rel_rms']:.1e}", times, _f(r.ours.host_us),
                 _f(ours), _f(pct), _f(100 * ours / ceilings.matmul_tflops)]
        for p in peers:
            cells += [_f(r.tflops(r.peers.get(p))), _f(r.speedup(p), ".2f")]
    best = r.best_peer()
    cells.append(_f(r.speedup(best), ".2f") if best else "—")
    return cells


def headers(peers: list[str]) -> list[str]:
    cols = ["kernel", "recipe", "shape", "check", "rel-RMS", "ms median [min-max]", "host us", "TFLOP/s", "% peak",
            "% mm ceil"]
    for p in peers:
        cols += [f"{p} TFLOP/s (TB/s)", f"x{p}"]
    return cols + ["x best"]


COMPACT_HEADERS = ["kernel", "recipe", "shape", "check", "ms", "host us", "ours", "best peer", "x best"]


def _compact_cells(r: Row) -> list[str]:
    """One row of the terminal's default table: the timing, our throughput, and the best peer's, no spread."""
    check = "PASS" if r.passed else "FAIL " + str(r.check["reason"])
    if r.ours is None:
        return [r.kernel, r.recipe, r.shape, check] + ["—"] * 5
    unit, rate = (("TB/s", r.tbps) if r.bytes_read else ("TFLOP/s", r.tflops))
    best = r.best_peer()
    peer = f"{best} {rate(r.peers[best]):.2f}" if best and r.bytes_read else (
        f"{best} {rate(r.peers[best]):.0f}" if best else "—")
    ours = f"{rate(r.ours):.2f} {unit}" if r.bytes_read else f"{rate(r.ours):.0f} {unit}"
    return [r.kernel, r.recipe, r.shape, check, f"{r.ours.median_ms:.3f}", _f(r.ours.host_us), ours, peer,
            _f(r.speedup(best), ".2f") if best else "—"]


def rich_table(rows: list[Row], ceilings: Ceilings, *, wide: bool = False) -> Table:
    """The terminal's table: by default the columns that fit ~120 characters (time, host time, throughput, the best
    peer and the ratio to it); `wide`: every column of the Markdown report (spread, ceilings, each peer)."""
    peers = _peer_names(rows)
    t = Table(title=f"xkernels bench on {ceilings.device}: matmul ceiling {ceilings.matmul_tflops:.0f} TFLOP/s, "
                    f"copy {ceilings.copy_tbps:.2f} TB/s, datasheet {_f(ceilings.datasheet_tflops)} TFLOP/s")
    for h in headers(peers) if wide else COMPACT_HEADERS:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*(escape(c) for c in (_cells(r, ceilings, peers) if wide else _compact_cells(r))))
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


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(rows: list[dict], path: Path) -> bool:
    """TFLOP/s per config, one panel per kernel, ours next to each peer that ran; False without matplotlib.

    Works on the JSON rows, so `python -m xkernels.bench.report bench.json` redraws a committed run."""
    plt = pyplot()
    if plt is None:
        return False
    panels = {}
    for r in rows:
        if r["ours_tflops"]:
            panels.setdefault(r["kernel"], []).append(r)
    if not panels:
        return False
    fig, axes = plt.subplots(len(panels), 1, figsize=(14, 4.5 * len(panels)), squeeze=False)
    for ax, (kernel, prow) in zip(axes[:, 0], panels.items(), strict=True):
        peers = list(dict.fromkeys(n for r in prow for n, p in r["peers"].items() if "tflops" in p))
        series = ["xkernels", *peers]
        width = 0.8 / len(series)
        unit = "tbps" if prow[0].get("bytes_read") else "tflops"  # memory-bound rows plot bandwidth
        for i, s in enumerate(series):
            vals = [r[f"ours_{unit}"] if s == "xkernels" else r["peers"].get(s, {}).get(unit) or 0 for r in prow]
            ax.bar([j + i * width for j in range(len(prow))], vals, width, label=s)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(prow))])
        ax.set_xticklabels([f"{r['recipe']} {r['shape']}" for r in prow], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TB/s (K and V bytes read once)" if unit == "tbps" else "TFLOP/s")
        ax.set_title(kernel)
        ax.legend(fontsize=7, ncol=len(series))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def summary_markdown(rows: list[dict]) -> str:
    """A compact table per kernel from the JSON rows: ours against each peer that ran (for the README)."""
    out = []
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        krows = [r for r in rows if r["kernel"] == kernel and r["ours_tflops"]]
        if not krows:
            continue
        peers = list(dict.fromkeys(n for r in krows for n, p in r["peers"].items() if "tflops" in p))
        tb = bool(krows[0].get("bytes_read"))  # memory-bound rows: TB/s and % of the copy ceiling
        unit, pct, fmt = ("tbps", "pct_copy_ceiling", ".2f") if tb else ("tflops", "pct_datasheet", ".0f")
        out += [f"| recipe | shape | rel-RMS | xkernels {'TB/s' if tb else 'TFLOP/s'} | "
                f"{'% copy' if tb else '% peak'} | " + " | ".join(f"{p} | x{p}" for p in peers) + " |",
                "|---" * (5 + 2 * len(peers)) + "|"]
        for r in krows:
            cells = [r["recipe"], r["shape"], f"{r['check']['rel_rms']:.1e}", _f(r[f"ours_{unit}"], fmt),
                     _f(r[pct])]
            for p in peers:
                cells += [_f(r["peers"].get(p, {}).get(unit), fmt), _f(r["speedup"].get(p), ".2f")]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def write_json(rows: list[Row], ceilings: Ceilings, json_path: Path, command: str) -> list[dict]:
    """The rows so far: written after every row, so a run cut short by a time limit keeps what it measured
    (`python -m xkernels.bench.report bench.json` then draws the summary and plot)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    dict_rows = [r.as_dict(ceilings) for r in rows]
    json_path.write_text(json.dumps({"command": command, "ceilings": ceilings.as_dict(), "rows": dict_rows},
                                    indent=1))
    return dict_rows


def write_outputs(rows: list[Row], ceilings: Ceilings, out_dir: Path, json_path: Path, command: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    dict_rows = write_json(rows, ceilings, json_path, command)
    md = out_dir / "bench.md"
    md.write_text(markdown(rows, ceilings, command))
    written = [json_path, md]
    png = out_dir / "bench.png"
    if plot(dict_rows, png):
        written.append(png)
    return written


if __name__ == "__main__":
    import sys

    src = Path(sys.argv[1])
    data = json.loads(src.read_text())["rows"]
    src.with_name("summary.md").write_text(summary_markdown(data))
    ok = plot(data, src.with_suffix(".png"))
    print(f"wrote {src.with_name('summary.md')}" + (f", {src.with_suffix('.png')}" if ok else ""))
