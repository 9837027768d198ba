"""Per-instruction ncu samples, summarized: `ncu --import R --page source --csv --print-source sass` on stdin, a
Markdown report on stdout. For each profiled launch: the instructions grouped by how often each ran (a group is one
region of the program: the per-key-step loop, the per-tile epilogue, the masked tiles, ...) with its share of the
executed instructions, its stall samples and its commonest opcodes; then the instructions with the most samples of
each stall reason asked for (default: all samples, barrier). Warps that wait out the kernel at its exit barrier (the
producer warpgroup's idle warps) show here as a few NOPs with most of the barrier samples.

    ncu --import attn.ncu-rep --page source --csv --print-source sass | python3 scripts/ncu_source.py [--top N]
        [--reason COLUMN ...]
"""

import argparse
import collections
import csv
import sys

ALL = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def launches(rows):
    """[(kernel name, header, rows)] from the export: each launch starts with a "Kernel Name" line."""
    out = []
    for r in rows:
        if r and r[0] == "Kernel Name":
            out.append([r[1], None, []])
        elif r and r[0] == "Address" and out:
            out[-1][1] = r
        elif r and out and out[-1][1] is not None:
            out[-1][2].append(r)
    return out


def _num(x: str) -> float:
    try:
        return float(x or 0)
    except ValueError:
        return 0.0


def _opcode(source: str) -> str:
    parts = source.split()
    if not parts:
        return ""
    op = parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]
    return op.split(".")[0]


def report(name: str, header: list[str], rows: list[list[str]], top: int, reasons: list[str], groups: int) -> str:
    ie, ia = header.index(EXECUTED), header.index(ALL)
    total = sum(_num(r[ie]) for r in rows) or 1.0
    samples = sum(_num(r[ia]) for r in rows) or 1.0
    by_count: dict[int, list] = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
    for r in rows:
        n = int(_num(r[ie]))
        g = by_count[n]
        g[0] += n
        g[1] += _num(r[ia])
        g[2][_opcode(r[1])] += 1
    lines = [f"## {name}", "", f"{int(total):,} warp instructions executed, {int(samples):,} stall samples", "",
             "| runs per instruction | share of instructions | share of samples | instructions (commonest opcodes) |",
             "|---|---|---|---|"]
    for n, (ex, smp, ops) in sorted(by_count.items(), key=lambda kv: -kv[1][0])[:groups]:
        common = ", ".join(f"{op} {c}" for op, c in ops.most_common(8))
        lines.append(f"| {n:,} | {100 * ex / total:.1f} % | {100 * smp / samples:.1f} % | {sum(ops.values())}: "
                     f"{common} |")
    for reason in reasons:
        ci = header.index(reason)
        col_total = sum(_num(r[ci]) for r in rows) or 1.0
        lines += ["", f"Top {top} by `{reason}` ({int(col_total):,} samples):", "",
                  "| address | samples | share | runs | instruction |", "|---|---|---|---|---|"]
        for r in sorted(rows, key=lambda r: -_num(r[ci]))[:top]:
            lines.append(f"| {r[0][-5:]} | {int(_num(r[ci]))} | {100 * _num(r[ci]) / col_total:.1f} % | "
                         f"{int(_num(r[ie])):,} | `{r[1].strip()[:70]}` |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--groups", type=int, default=8, help="execution-count groups shown per launch")
    ap.add_argument("--reason", nargs="+", default=[ALL, "stall_barrier"])
    args = ap.parse_args()
    out = [report(n, h, r, args.top, args.reason, args.groups)
           for i, (n, h, r) in enumerate(launches(csv.reader(sys.stdin))) if h is not None]
    print("\n\n".join(out))


if __name__ == "__main__":
    main()
