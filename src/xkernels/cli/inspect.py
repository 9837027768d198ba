"""`xkernels inspect`: compile each shipped config for sm_90 and report registers, spills, shared memory, SASS."""

from __future__ import annotations

import json
import os
import sys

from rich.console import Console
from rich.progress import track
from rich.table import Table


def run_inspect(kernel: str, json_path: str | None) -> int:
    console = Console(width=None if sys.stdout.isatty() else 200)
    if os.environ.get("TRITON_INTERPRET") == "1":
        console.print("[red]inspect compiles kernels: unset TRITON_INTERPRET")
        return 2
    import triton

    from xkernels.common.runtime import GLUON_COMPILES, TESTED_TRITON
    from xkernels.inspection import SASS_OPS, all_configs, analyse

    if not triton.__version__.startswith(GLUON_COMPILES):
        console.print(f"[yellow]triton {triton.__version__}: the Gluon (hopper.*) configs compile on triton "
                      f"{'/'.join(GLUON_COMPILES)}x and are not compiled here; kernel selection never runs them either")
    elif not triton.__version__.startswith(TESTED_TRITON):
        console.print(f"[yellow]triton {triton.__version__}: the Gluon configs compile here, but they run only on "
                      f"triton {'/'.join(TESTED_TRITON)}x until a GPU run covers this release")
    configs = [c for c in all_configs() if kernel == "all" or f".{kernel} " in c.name]
    reports = [analyse(c) for c in track(configs, description="compiling for sm_90", console=console,
                                         transient=True)]
    table = Table(title="Hopper (sm_90) compile report")
    for col in ("kernel config", "regs", "stack", "local", "shared B", *SASS_OPS, "spill-free req.", "result"):
        table.add_column(col)
    for r in reports:
        verdict = "[green]ok" if r.ok else ("[red]SPILLS" if r.spills else "[red]no HGMMA")
        table.add_row(r.name, str(r.registers), str(r.stack), str(r.local), str(r.shared),
                      *(str(r.sass[o]) for o in SASS_OPS), "yes" if r.spill_free_required else "no", verdict)
    console.print(table)
    bad = [r for r in reports if not r.ok]
    console.print(f"{len(reports) - len(bad)} passed, {len(bad)} failed")
    if json_path:
        with open(json_path, "w") as f:
            json.dump([r.__dict__ | {"spills": r.spills, "ok": r.ok} for r in reports], f, indent=1)
    return 1 if bad else 0
