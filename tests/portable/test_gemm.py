"""GEMM against the float64 reference: dtypes x B layouts x walk orders x tails, outputs poisoned."""

import pytest
import torch

import xkernels
from tests.helpers import assert_unchanged, poisoned_like, snapshot
from xkernels.testing import compare_gemm, gemm_inputs, reference_matmul

SHAPES = [(1, 1, 1), (17, 33, 65), (96, 64, 128), (130, 70, 31), (64, 200, 40)]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("walk", ["row", "grouped", "zorder"])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemm_matrix(device, dtype, b_layout, walk, m, n, k):
    a, b = gemm_inputs(m, n, k, dtype, device, b_layout, seed=m + n + k)
    before = snapshot(a, b)
    out = poisoned_like(a, shape=(m, n))
    c = xkernels.matmul(a, b, b_layout=b_layout, walk=walk, out=out)
    assert c is out
    assert f"gemm[{b_layout} {walk}" in xkernels.last_backend()  # portable, or the Hopper layer on an H100/H200
    assert_unchanged(before, a, b)
    r = compare_gemm(c, reference_matmul(a, b, b_layout), k)
    assert r.passed, r


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_gemm_batched_broadcast(device, out_dtype):
    g = torch.Generator(device=device).manual_seed(5)
    a = (torch.rand(3, 1, 20, 40, device=device, generator=g) - 0.5).half()
    b = (torch.rand(2, 40, 24, device=device, generator=g) - 0.5).half()
    c = xkernels.matmul(a, b, out_dtype=out_dtype)
    assert c.shape == (3, 2, 20, 24) and c.dtype == (out_dtype or torch.float16)
    assert compare_gemm(c, a.double() @ b.double(), 40).passed
    c2 = xkernels.matmul(a, b[0])  # shared b: a's batch folds into M
    assert compare_gemm(c2, a.double() @ b[0].double(), 40).passed


def test_gemm_transposed_view_and_zero_k(device):
    a, b = gemm_inputs(40, 24, 32, torch.bfloat16, device, "kn", seed=6)
    at = a.t().contiguous().t()  # column-major a: not descriptor-ready, copied visibly
    c = xkernels.matmul(at, b)
    assert "copied:a" in xkernels.last_backend()
    assert compare_gemm(c, reference_matmul(a, b), 32).passed
    z = xkernels.matmul(a[:, :0], b[:0])
    assert z.shape == (40, 24) and torch.count_nonzero(z) == 0


@pytest.mark.parametrize("m", [3, 40])  # the few-row kernel and the tiled one
def test_column_major_b_is_read_as_nk(device, m):
    """b = w.T of a row-major (N, K) weight (F.linear's callers' spelling) runs the "nk" kernel on w in place, with
    no copy, the same bits as b_layout="nk" on w, and gradients through the view."""
    a, w = gemm_inputs(m, 24, 32, torch.bfloat16, device, "nk", seed=m)
    before = snapshot(a, w)
    c = xkernels.matmul(a, w.T)
    backend = xkernels.last_backend()
    assert "[nk " in backend and "copied" not in backend, backend
    assert_unchanged(before, a, w)
    assert torch.equal(c, xkernels.matmul(a, w, b_layout="nk"))
    assert compare_gemm(c, reference_matmul(a, w, "nk"), 32).passed
    batched = torch.stack([w, w.flip(0)])  # (2, N, K): the batch's (K, N) views are column-major too
    cb = xkernels.matmul(a, batched.mT)
    assert "copied" not in xkernels.last_backend(), xkernels.last_backend()
    assert compare_gemm(cb, a.double() @ batched.double().mT, 32).passed
    expanded = w[:1].T.expand(32, 24)  # column-major-looking strides (1, 0): not a layout to read in place
    ce = xkernels.matmul(a, expanded)
    assert "copied:b" in xkernels.last_backend() and compare_gemm(ce, a.double() @ expanded.double(), 32).passed
    with pytest.raises(ValueError, match="b"):  # a mismatch names the operands as given
        xkernels.matmul(a, w[:, :31].T)
    wl = w.detach().clone().requires_grad_()
    al = a.detach().clone().requires_grad_()
    g = (torch.rand(m, 24, device=device) - 0.5).to(a.dtype)
    da, dw = torch.autograd.grad(xkernels.matmul(al, wl.T), (al, wl), g)
    assert dw.shape == w.shape and compare_gemm(dw, g.double().T @ a.double(), m).passed
    assert compare_gemm(da, g.double() @ w.double(), 24).passed
