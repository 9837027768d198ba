"""`xkernels bench`: the seeds' performance method against peers in the same run; CPU: the correctness sweep only."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress


def run_bench(device: str, args: argparse.Namespace) -> int:
    console = Console(width=None if sys.stdout.isatty() else 250)
    if device != "cuda":
        console.print("[bold yellow]No CUDA device: nothing can be timed here, and no timings are made up.[/] "
                      "Running the CPU correctness sweep instead.")
        from xkernels.cli.check import run_check

        return run_check(device, args.json)
    if args.warmup < 20 or args.iters < 1:
        console.print("[red]--warmup must be >= 20 (the seeds' rule) and --iters >= 1")
        return 2

    if args.suite in ("host", "sweep"):
        return _run_host(console, args)
    from xkernels.bench import report
    from xkernels.bench.ceilings import measure_ceilings
    from xkernels.bench.runner import run_case
    from xkernels.bench.suites import (
        attention_bwd_suite,
        attention_suite,
        decode_suite,
        gemm_suite,
        varlen_suite,
        window_suite,
    )

    plan: list[tuple[object, bool]] = []
    if args.suite in ("all", "gemm"):
        gate, timed = gemm_suite(args.quick)
        plan += [(c, False) for c in gate] + [(c, True) for c in timed]
    if args.suite in ("all", "attention"):
        plan += [(c, True) for c in attention_suite(args.quick)]
    if args.suite in ("all", "attention-bwd"):
        plan += [(c, True) for c in attention_bwd_suite(args.quick)]
    if args.suite in ("all", "decode"):
        plan += [(c, True) for c in decode_suite(args.quick)]
    if args.suite in ("all", "varlen"):
        plan += [(c, True) for c in varlen_suite(args.quick)]
    if args.suite in ("all", "window"):
        plan += [(c, True) for c in window_suite(args.quick)]

    command = "xkernels " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out_dir = Path(args.out)
    json_path = Path(args.json) if args.json else out_dir / "bench.json"
    rows = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("ceilings", total=len(plan) + 1)
        ceilings = measure_ceilings()
        progress.advance(task)
        for case, timed in plan:
            progress.update(task, description=f"{case.recipe} {case.shape}")
            rows.append(run_case(case, timed=timed, warmup=args.warmup, iters=args.iters, sleep_s=args.sleep))
            report.write_json(rows, ceilings, json_path, command)
            progress.advance(task)
    console.print(report.rich_table(rows, ceilings, wide=args.wide))
    written = report.write_outputs(rows, ceilings, out_dir, json_path, command)
    console.print("wrote " + ", ".join(map(str, written)))
    failed = [r for r in rows if not r.passed]
    for r in failed:
        console.print(f"[red]FAIL[/] {r.kernel} {r.recipe} {escape(r.shape)}: {escape(str(r.check['reason']))}")
    return 1 if failed else 0


def _run_host(console: Console, args: argparse.Namespace) -> int:
    import json

    import torch
    from rich.table import Table

    from xkernels.bench import sweep
    from xkernels.bench.host import host_cases, markdown, plot, run_host_case

    command = "xkernels " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    rows = []
    cases = sweep.sweep_cases(args.quick) if args.suite == "sweep" else host_cases()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("host", total=len(cases))
        for case in cases:
            progress.update(task, description=case.shape)
            rows.append(run_host_case(case).as_dict())
            (out_dir / "host.json").write_text(json.dumps({"command": command, "device": device, "rows": rows},
                                                          indent=1))
            progress.advance(task)
    (out_dir / "host.md").write_text(markdown(rows, command, device))
    plot(rows, out_dir / "host.png")
    if args.suite == "sweep":
        sweep.plot(rows, out_dir / "sweep.png")
    table = Table(title=f"host cost per call on {device} (us; speedup = torch / ours)")
    for h in ("kernel", "shape", "host ours", "host torch", "ratio", "b2b ours", "graph ours", "b2b torch",
              "graph torch", "b2b speedup", "graph speedup", "in L2"):
        table.add_column(h)
    for r in rows:
        if r.get("ours"):
            o, t = r["ours"], r["torch"]
            table.add_row(r["kernel"], escape(r["shape"]), f"{o['host_us']:.1f}", f"{t['host_us']:.1f}",
                          f"{r['host_ratio']:.2f}", f"{o['b2b_us']:.1f}", f"{o['graph_us']:.1f}",
                          f"{t['b2b_us']:.1f}", f"{t['graph_us']:.1f}", f"{r['b2b_speedup']:.2f}",
                          f"{r['graph_speedup']:.2f}",
                          "-" if r.get("graph_l2_speedup") is None else f"{r['graph_l2_speedup']:.2f}")
        else:
            table.add_row(r["kernel"], escape(r["shape"]), "FAIL", escape(str(r["check"].get("reason"))))
    console.print(table)
    console.print(f"wrote {out_dir / 'host.json'}, {out_dir / 'host.md'}")
    return int(any(not r.get("ours") for r in rows))
