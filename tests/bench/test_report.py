"""Bench reports from rows (no GPU needed): JSON written per row, Markdown, summary, and failed rows rendered."""

import json

from xkernels.bench import report
from xkernels.bench.ceilings import Ceilings
from xkernels.bench.runner import Row
from xkernels.bench.timing import Timing

CEILINGS = Ceilings("NVIDIA H200", 989.0, 800.0, 4.1)


def _rows() -> list[Row]:
    ok = Row("attention", "bf16", "B1 H32 8Kx8K D128", 10**12, {"passed": True, "reason": "", "rel_rms": 2e-3},
             "hopper.attention[bf16 BM128-BN128-S2-ov]", Timing(1.6, 1.5, 1.7, 60, 2, 30.0),
             {"SDPA-cuDNN": Timing(1.5, 1.4, 1.6, 60, 2, 10.0), "SDPA-efficient": "not supported here"})
    # what run_case records when a check raises (e.g. a forced config that cannot launch)
    broken = Row("attention", "bf16", "B4 H32 4Kx4K D64 [hopper consumers=3]", 10**11,
                 {"passed": False, "reason": "OutOfResources: shared memory", "rel_rms": float("nan")})
    return [ok, broken]


def test_json_is_written_per_row_and_reads_back(tmp_path):
    rows = _rows()
    path = tmp_path / "bench.json"
    report.write_json(rows[:1], CEILINGS, path, "xkernels bench")
    assert len(json.loads(path.read_text())["rows"]) == 1
    report.write_json(rows, CEILINGS, path, "xkernels bench")
    data = json.loads(path.read_text())
    assert [r["check"]["passed"] for r in data["rows"]] == [True, False]
    first = data["rows"][0]
    assert abs(first["speedup"]["SDPA-cuDNN"] - 1.5 / 1.6) < 1e-9  # ours / peer in throughput
    assert first["peers"]["SDPA-efficient"] == {"error": "not supported here"}
    assert abs(first["pct_matmul_ceiling"] - 100 * (10**12 / 1.6 / 1e9) / 800.0) < 1e-9


def test_outputs_render_failed_rows(tmp_path):
    written = report.write_outputs(_rows(), CEILINGS, tmp_path, tmp_path / "bench.json", "xkernels bench")
    md = (tmp_path / "bench.md").read_text()
    assert "FAIL OutOfResources" in md and "PASS" in md
    assert tmp_path / "bench.json" in written
    summary = report.summary_markdown(json.loads((tmp_path / "bench.json").read_text())["rows"])
    assert "B1 H32 8Kx8K D128" in summary and "consumers=3" not in summary  # only timed rows are summarized


def test_terminal_table_fits_120_columns_and_wide_has_every_peer():
    from rich.console import Console

    def render(wide):
        console = Console(width=250 if wide else 120, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        console.print(report.rich_table(_rows(), CEILINGS, wide=wide))
        return console.export_text()

    compact = render(False)
    assert max(len(line) for line in compact.splitlines()) <= 120
    assert "SDPA-cuDNN" in compact and "0.94" in compact and "FAIL" in compact  # best peer, ratio, failed row
    assert "SDPA-efficient" not in compact and "SDPA-efficient" in render(True)  # every peer only when wide
