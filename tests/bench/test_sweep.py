"""The sweep suite's rows: sizes as the issue asks (B * S = 16K tokens; Llama-8B's layers), the series each row
belongs to, and the ratio plot drawn from JSON rows."""

import importlib.util

from xkernels.bench import sweep
from xkernels.testing.cases import AttentionCase, GemmCase


def test_cases_cover_the_sweep():
    cases = sweep.sweep_cases(quick=False)
    attention = [c for c in cases if isinstance(c, AttentionCase)]
    gemm = [c for c in cases if isinstance(c, GemmCase)]
    assert {c.sq for c in attention} == set(sweep.LENGTHS) and all(c.b * c.sq == sweep.TOKENS for c in attention)
    assert {c.d for c in attention} == {64, 128, 256} and any(c.hkv != c.hq for c in attention)
    assert {c.m for c in gemm} == set(sweep.MS) and all(c.b_layout == "nk" for c in gemm)


def _row(case, ratio):
    timing = {"host_us": 10.0, "b2b_us": 20.0, "graph_us": 10.0}
    kernel = "gemm" if isinstance(case, GemmCase) else "attention"
    return {"kernel": kernel, "shape": case.shape, "ours": timing, "torch": timing, "graph_speedup": ratio,
            "b2b_speedup": ratio * 0.9}


def test_series_and_plot(tmp_path):
    a = AttentionCase(16, 32, 8, 1024, 1024, 128, True, "bf16")
    g = GemmCase(16, 6144, 4096, "bf16", "nk")
    assert sweep.series(_row(a, 1.0)) == ("H32/8 D128 causal", 1024)
    assert sweep.series(_row(g, 1.0)) == ("N6144 K4096", 16)
    rows = [_row(c, 0.5 + i / 10) for i, c in enumerate(sweep.sweep_cases(quick=True))]
    drawn = sweep.plot(rows, tmp_path / "sweep.png")
    assert drawn == (importlib.util.find_spec("matplotlib") is not None)  # the [bench] extra draws it
    if drawn:
        assert (tmp_path / "sweep.png").stat().st_size > 10_000
