"""The few-row GEMM (`gemm_skinny`): float64 references with one and several K slices, the selection boundary, bitwise
repeatability, and the same checks failing on a broken slice sum."""

import math
import re

import pytest
import torch

import xkernels
from tests.helpers import assert_unchanged, poisoned_like, snapshot
from xkernels.common import launch
from xkernels.portable import configs, gemm_skinny
from xkernels.testing import compare_gemm, gemm_inputs, reference_matmul

SHAPES = [(1, 64, 96), (5, 100, 200), (16, 64, 33), (29, 96, 130), (32, 40, 64), (2, 31, 1)]


def slices_ran() -> int:
    found = re.search(r"skinny.* slices=(\d+)", xkernels.last_backend() or "")
    assert found, xkernels.last_backend()
    return int(found.group(1))


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_few_rows_match_float64(device, dtype, b_layout, m, n, k):
    a, b = gemm_inputs(m, n, k, dtype, device, b_layout, seed=m + n + k)
    before = snapshot(a, b)
    out = poisoned_like(a, shape=(m, n))
    c = xkernels.matmul(a, b, b_layout=b_layout, out=out)
    assert c is out
    slices_ran()
    assert_unchanged(before, a, b)
    r = compare_gemm(c, reference_matmul(a, b, b_layout), k)
    assert r.passed, r
    again = xkernels.matmul(a, b, b_layout=b_layout)
    assert torch.equal(c, again), "the slice sum is in a fixed order: repeated calls agree bitwise"


def test_several_slices_fp32_out_and_folded_batch(device):
    a, b = gemm_inputs(24, 64, 256, torch.bfloat16, device, "nk", seed=3)
    c = xkernels.matmul(a, b, b_layout="nk", out_dtype=torch.float32)
    if device == "cpu" or configs.skinny_gemm_config() is configs.SKINNY_INTERPRETED:
        assert slices_ran() > 1  # the interpreted config splits K even here: the arrival counter is exercised
    assert c.dtype == torch.float32 and compare_gemm(c, reference_matmul(a, b, "nk"), 256).passed
    a3 = a.view(4, 6, 256)  # a's batch folds into 24 rows against a 2-D b
    c3 = xkernels.matmul(a3, b, b_layout="nk")
    slices_ran()
    assert c3.shape == (4, 6, 64) and compare_gemm(c3.view(24, 64), reference_matmul(a, b, "nk"), 256).passed


def test_selection_boundary(device):
    a, b = gemm_inputs(configs.SKINNY_MAX_M + 1, 32, 32, torch.float16, device, "kn", seed=1)
    xkernels.matmul(a, b)
    assert "skinny" not in xkernels.last_backend()  # more rows: the tiled kernel
    xkernels.matmul(a[:8], b, walk="row")
    assert "skinny" not in xkernels.last_backend()  # a walk order asks for output tiles
    xkernels.matmul(a[:8], b)
    assert "skinny" in xkernels.last_backend()


def _launch_raw(a, b, out, *, slices, k_slice, arrivals, cfg=None, b_layout="kn"):
    cfg = cfg or configs.skinny_gemm_config()
    m, k = a.shape
    n = b.shape[0] if b_layout == "nk" else b.shape[1]
    partials = torch.full((slices, m, n), float("nan"), dtype=torch.float32, device=a.device)
    grid = -(-n // cfg.block_n) * slices
    launch.generic_launch(gemm_skinny.skinny_gemm_kernel, grid,
                          (a, b, out, partials, arrivals, m, n, k, a.stride(0), b.stride(0), out.stride(0), k_slice),
                          cfg.constexprs(gemm_skinny.block_m(m), slices, b_layout), cfg.options())
    return out


# (16-byte row strides: the raw launch takes the kernel's descriptor loads, which the plans give aligned layouts)
@pytest.mark.parametrize("m,n,k,slices", [(1, 64, 96, 1), (5, 104, 200, 3), (16, 64, 40, 1), (29, 96, 136, 2),
                                          (32, 40, 64, 2)])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_swapped_operands_match_float64(device, b_layout, m, n, k, slices):
    """`swap` (the weight's tile as the product's first operand, C^T = B^T A^T, transposed back before the store):
    within the GEMM bounds of float64, with one and several K slices (the slice sum reads the transposed-back
    partials), tails in every dim, both B layouts; a broken transpose (the rows' tile read as columns) fails."""
    import dataclasses

    base = configs.skinny_gemm_config()
    cfg = dataclasses.replace(base, swap=True)
    assert str(cfg) == f"{base}-T" and cfg.constexprs(16, 1, "nk")["SWAP"]
    a, b = gemm_inputs(m, n, k, torch.bfloat16, device, b_layout, seed=m * n + k)
    want = reference_matmul(a, b, b_layout)
    steps = math.ceil(math.ceil(k / cfg.block_k) / slices)  # k-steps per slice; no slice left empty
    slices, k_slice = math.ceil(math.ceil(k / cfg.block_k) / steps), steps * cfg.block_k
    zeros = torch.zeros(-(-n // cfg.block_n), dtype=torch.int32, device=device)
    c = _launch_raw(a, b, poisoned_like(a, shape=(m, n)), slices=slices, k_slice=k_slice, arrivals=zeros.clone(),
                    cfg=cfg, b_layout=b_layout)
    r = compare_gemm(c, want, k)
    assert r.passed, r
    if m > 1:
        assert not compare_gemm(c.flip(0), want, k).passed


def test_checks_fail_on_a_broken_slice_sum(device):
    """The float64 comparison rejects the likeliest split-K bugs, made by launching the real kernel wrongly: a K
    slice left out, and arrival counters left at a previous call's count (no program then sees itself last, and C
    keeps its poison)."""
    cfg = configs.skinny_gemm_config()
    m, n, k = 8, 2 * cfg.block_n, 4 * cfg.block_k
    a, b = gemm_inputs(m, n, k, torch.float16, device, "kn", seed=7)
    want = reference_matmul(a, b, "kn")
    zeros = torch.zeros(2, dtype=torch.int32, device=device)
    ok = _launch_raw(a, b, poisoned_like(a, shape=(m, n)), slices=4, k_slice=cfg.block_k, arrivals=zeros.clone())
    assert compare_gemm(ok, want, k).passed
    dropped = _launch_raw(a, b, poisoned_like(a, shape=(m, n)), slices=3, k_slice=cfg.block_k, arrivals=zeros.clone())
    assert not compare_gemm(dropped, want, k).passed
    stale = _launch_raw(a, b, poisoned_like(a, shape=(m, n)), slices=4, k_slice=cfg.block_k,
                        arrivals=torch.full((2,), 4, dtype=torch.int32, device=device))
    assert not compare_gemm(stale, want, k).passed


@pytest.mark.parametrize("rows,n,k,pick", [(16, 4096, 4096, "wide"), (32, 6144, 4096, "wide"),
                                           (9, 4096, 14336, "wide"), (16, 3072, 4096, "rows"), (32, 1024, 4096, "rows"),
                                           (8, 4096, 4096, "wide"), (1, 4096, 4096, "wide"), (1, 6144, 4096, "wide"),
                                           (1, 3072, 4096, "skinny"), (8, 1024, 4096, "skinny"),
                                           (1, 28672, 4096, "skinny"), (16, 28672, 4096, "skinny"),
                                           (32, 28672, 4096, "skinny")])
def test_narrow_unsplit_blocks_where_they_fill_the_sms_and_k_would_be_split(rows, n, k, pick):
    """On sm_90, a weight whose column blocks alone do not fill the SMs (`skinny` would split K) takes
    `skinny_wide_rows` (32-column blocks over all of K) where those fill the SMs, else, above SKINNY_FEW_ROWS rows,
    `skinny_rows` (64 x 256-deep steps, K split); fewer rows there, or a weight wide enough for one slice, the
    default; other targets and symbolic sizes the default; the interpreter its own."""
    from xkernels.common.targets import TARGETS

    hopper = TARGETS["sm_90"]
    table = configs.table_for(hopper)
    got = configs.skinny_gemm_config(hopper, interpret=False, rows=rows, n=n, k=k, sms=132)
    assert got is {"wide": table.skinny_wide_rows, "rows": table.skinny_rows, "skinny": table.skinny}[pick]
    if pick == "wide":  # 4096+ columns in blocks of 32 fill the 132 SMs without a K split
        assert got.slices(n, k, 132) == 1
    if pick == "rows":  # the split keeps the SMs busy where the 32-column blocks alone would not
        assert got.slices(n, k, 132) > 1
    if pick != "skinny" or rows > configs.SKINNY_FEW_ROWS:  # off the default only where it would split K
        assert (table.skinny.slices(n, k, 132) > 1) is (pick != "skinny")
    assert configs.skinny_gemm_config(hopper, interpret=False, rows=rows, n=n, k=k) is table.skinny  # no SM count
    ampere = TARGETS["sm_80"]
    assert configs.skinny_gemm_config(ampere, interpret=False, rows=rows, n=n, k=k, sms=108) is \
        configs.table_for(ampere).skinny
    assert configs.skinny_gemm_config(hopper, interpret=True, rows=rows, n=n, k=k, sms=132) is \
        configs.SKINNY_INTERPRETED
    symbolic = type("SymLike", (), {"__gt__": lambda self, other: True})()  # stands in for a SymInt
    assert configs.skinny_gemm_config(hopper, interpret=False, rows=symbolic, n=n, k=k, sms=132) is table.skinny


def test_slices_match_the_launch_spec():
    cfg = configs.SkinnyGemmConfig(64, 256, 4, 3, programs_per_sm=2)
    for n, k in ((4096, 4096), (28672, 4096), (4096, 14336), (64, 64)):
        assert gemm_skinny.slices(n, k, cfg, 132) == cfg.slices(n, k, 132)
        grid, parts, k_slice, _, _ = gemm_skinny.launch_spec(16, n, k, b_layout="nk", cfg=cfg, sms=132)
        assert parts <= cfg.slices(n, k, 132) and parts * k_slice >= k and grid == -(-n // 64) * parts
