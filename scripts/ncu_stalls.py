"""Every warp stall reason per launch, from `ncu --import REP --page raw --csv` on stdin, as a Markdown table on stdout:
cycles a warp spends stalled for each reason per issued instruction
(`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`), one column per launch, reasons sorted by
their largest value, only those at least 0.05 cycles anywhere.

    ncu --import attn-walk.ncu-rep --page raw --csv | python3 scripts/ncu_stalls.py > stalls.md
"""

from __future__ import annotations

import csv
import re
import sys

PATTERN = re.compile(r"smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def main() -> None:
    rows = list(csv.reader(sys.stdin))
    if len(rows) < 3:
        print("(no launches in the report)")
        return
    header, body = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]  # row 1 holds the units
    name_col = header.index("Kernel Name")
    launches = [f"{i}: {r[name_col][:40]}" for i, r in enumerate(body)]
    table = {}
    for j, metric in enumerate(header):
        m = PATTERN.match(metric)
        if m and not m.group(1).endswith("_not_issued"):
            try:
                table[m.group(1)] = [float(r[j].replace(",", "")) for r in body]
            except ValueError:
                continue
    reasons = sorted((k for k, v in table.items() if max(v) >= 0.05), key=lambda k: -max(table[k]))
    print("| reason | " + " | ".join(launches) + " |")
    print("|---|" + "---|" * len(launches))
    for k in reasons:
        print(f"| {k} | " + " | ".join(f"{x:.2f}" for x in table[k]) + " |")
    print("| **sum** | " + " | ".join(f"{sum(table[k][i] for k in table):.2f}" for i in range(len(launches))) + " |")


if __name__ == "__main__":
    main()
