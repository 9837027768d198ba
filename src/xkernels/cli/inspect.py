"""`xkernels inspect`: compile each shipped config for one or more targets (no GPU needed) and report registers,
spills, shared memory against the target's limit, and the instructions that matter there."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

from rich import box
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

_WORK: list = []  # (config, target) pairs; forked workers inherit them (kernel functions do not pickle)


def _analyse(index: int):
    from xkernels.inspection import analyse

    cfg, target = _WORK[index]
    return analyse(cfg, target)


def run_inspect(kernel: str, targets: list[str], json_path: str | None, jobs: int = 1) -> int:
    console = Console(width=None if sys.stdout.isatty() else 220)
    if os.environ.get("TRITON_INTERPRET") == "1":
        console.print("[red]inspect compiles kernels: unset TRITON_INTERPRET")
        return 2
    if json_path and not os.path.isdir(os.path.dirname(os.path.abspath(json_path))):
        console.print(f"[red]--json: the folder of {json_path} does not exist")
        return 2
    import triton
    from triton.backends import backends

    from xkernels.common.runtime import GLUON_COMPILES, TESTED_TRITON
    from xkernels.common.targets import INTEL_TARGETS, TARGETS
    from xkernels.inspection import all_configs, ops_for

    intel = "intel" in backends  # triton-xpu; the CUDA/ROCm triton has no Intel backend, and vice versa
    names = [t for t in TARGETS if (t in INTEL_TARGETS) == intel] if "all" in targets else targets
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        console.print(f"[red]--target: {unknown} are not among {sorted(TARGETS)}")
        return 2
    wrong = sorted(t for t in names if (t in INTEL_TARGETS) != intel)
    if wrong:
        console.print(f"[red]--target: {wrong} need {'the CUDA/ROCm triton' if intel else 'the Intel backend'} "
                      f"(this is triton {triton.__version__} with backends {sorted(backends)}); "
                      "see benchmarks/README.md for the Intel setup")
        return 2
    if intel:
        console.print("[yellow]Intel backend: registers are allocated when the driver loads the SPIR-V, so spills "
                      "are not known offline; the report counts DPAS (matrix_mad) calls in the LLVM IR")
    elif not triton.__version__.startswith(GLUON_COMPILES):
        console.print(f"[yellow]triton {triton.__version__}: the Gluon (hopper.*) configs compile on triton "
                      f"{'/'.join(GLUON_COMPILES)}x and are not compiled here; kernel selection never runs them either")
    elif not triton.__version__.startswith(TESTED_TRITON):
        console.print(f"[yellow]triton {triton.__version__}: the Gluon configs compile here, but they run only on "
                      f"triton {'/'.join(TESTED_TRITON)}x until a GPU run covers this release")
    _WORK[:] = [(c, TARGETS[t]) for t in names for c in all_configs(TARGETS[t])
                if kernel in ("all", c.name.split()[0].split(".")[1])]
    context = multiprocessing.get_context("fork")
    with Progress(console=console, transient=True) as progress, \
            ProcessPoolExecutor(max(jobs, 1), mp_context=context) as pool:
        task = progress.add_task(f"compiling for {', '.join(names)}", total=len(_WORK))
        reports = []
        for r in pool.map(_analyse, range(len(_WORK))):
            reports.append(r)
            progress.advance(task)
    bad = []
    for name in names:
        rows = [r for r in reports if r.target == name]
        # to fit a terminal: an instruction column no config of the target has is left out (named below the
        # table; the JSON keeps every count), numbers never wrap, the config names fold
        ops = [o for o in ops_for(TARGETS[name]) if any(r.sass.get(o) for r in rows)]
        absent = [o for o in ops_for(TARGETS[name]) if o not in ops]
        table = Table(title=f"{name} compile report (shared memory limit {TARGETS[name].smem // 1024} KB)",
                      box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                      caption=f"no {', '.join(absent)} in any config" if absent else None)
        table.add_column("kernel config", overflow="fold", min_width=16, ratio=1)
        for col in ("regs", "stack", "local", "smem B", *ops):
            table.add_column(col, justify="right", no_wrap=True)
        table.add_column("result", overflow="fold", min_width=6)
        for r in rows:
            verdict = r.verdict()
            regs = (str(r.registers), str(r.stack), str(r.local)) if r.allocated else ("—", "—", "—")
            table.add_row(r.name, *regs, str(r.shared),
                          *(str(r.sass[o]) for o in ops), f"[green]{verdict}" if r.ok else f"[red]{verdict}")
        console.print(table)
        bad += [r for r in rows if not r.ok]
    console.print(f"{len(reports) - len(bad)} passed, {len(bad)} failed")
    if json_path:
        with open(json_path, "w") as f:
            json.dump([r.__dict__ | {"spills": r.spills, "ok": r.ok, "verdict": r.verdict()} for r in reports], f,
                      indent=1)
    return 1 if bad else 0
