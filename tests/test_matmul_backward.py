"""`xkernels.matmul` through autograd: dA and dB against float64 autograd on the same quantized a, b and dC, with the
seeds' GEMM contract (rel-RMS and per-element bounds, non-finite first), for both B layouts, 2-D and batched
operands, broadcast batch dims (summed), fp32 outputs, one operand requiring grad, double backward, torch.compile of
a training step, and checks that fail on a broken backward."""

import pytest
import torch

import xkernels
from tests.helpers import assert_compiled_grads_match, assert_passes
from xkernels import ops
from xkernels.testing import compare_gemm


def _rand(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) - 0.5).to(dtype).to(device)


def _operands(a_shape, b_shape, b_layout, dtype, device, seed=0):
    """a, and b in the layout's storage: (..., K, N) for "kn", (..., N, K) for "nk"."""
    b = _rand(b_shape, dtype, device, seed + 1)
    return _rand(a_shape, dtype, device, seed), b if b_layout == "kn" else b.mT.contiguous()


def _grads(a, b, dc, b_layout, out_dtype=None):
    leaves = [t.detach().clone().requires_grad_() for t in (a, b)]
    c = xkernels.matmul(*leaves, b_layout=b_layout, out_dtype=out_dtype)
    c.backward(dc)
    return leaves[0].grad, leaves[1].grad


def _reference(a, b, dc, b_layout):
    """float64 autograd on the quantized operands and on dC as the kernels see it (rounded to the inputs' dtype)."""
    leaves = [t.detach().double().requires_grad_() for t in (a, b)]
    c = leaves[0] @ (leaves[1] if b_layout == "kn" else leaves[1].mT)
    c.backward(dc.to(a.dtype).double())
    return leaves[0].grad, leaves[1].grad


def _check(grads, refs, a, b, dc):
    """dA sums over N; dB over every row of every batch that broadcast to it."""
    inner_a, inner_b = dc.shape[-1], dc.numel() // (dc.shape[-1] * max(b.numel() // (b.shape[-1] * b.shape[-2]), 1))
    out = {}
    for name, g, ref, t, inner in (("da", grads[0], refs[0], a, inner_a), ("db", grads[1], refs[1], b, inner_b)):
        assert g.shape == t.shape and g.dtype == t.dtype, name
        out[name] = compare_gemm(g, ref, inner)
    return out



SHAPES = [((33, 40), (40, 24)),  # 2-D, tails
          ((2, 3, 17, 40), (40, 24)),  # batched activations against a weight: dB folds the batch into its rows
          ((2, 1, 17, 40), (3, 40, 24)),  # broadcast batch dims: dA summed over b's batch, dB over a's
          ((17, 40), (2, 40, 24))]  # a 2-D a against batched b: dA summed


@pytest.mark.parametrize("b_layout", ["kn", "nk"])
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gradients_match_float64(device, b_layout, a_shape, b_shape, dtype):
    a, b = _operands(a_shape, b_shape, b_layout, dtype, device, seed=len(a_shape))
    dc = _rand(torch.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1]), dtype, device, 9)
    assert_passes(_check(_grads(a, b, dc, b_layout), _reference(a, b, dc, b_layout), a, b, dc))


def test_fp32_outputs_round_dc_to_the_inputs_dtype(device):
    a, b = _operands((2, 17, 40), (40, 24), "nk", torch.bfloat16, device, seed=3)
    dc = _rand((2, 17, 24), torch.float32, device, 4)
    assert_passes(_check(_grads(a, b, dc, "nk", torch.float32), _reference(a, b, dc, "nk"), a, b, dc))


def test_only_the_operand_that_requires_grad_gets_a_product(device, monkeypatch):
    """A frozen activation (or weight) costs no product: the backward runs one matmul, not two."""
    a, b = _operands((16, 32), (32, 16), "kn", torch.float16, device)
    dc = _rand((16, 16), torch.float16, device, 5)
    calls = []
    real = ops.matmul_op
    monkeypatch.setattr(ops, "matmul_op", lambda *args: calls.append(args[0].shape) or real(*args))
    w = b.clone().requires_grad_()
    c = xkernels.matmul(a, w)
    calls.clear()  # the forward's call
    (db,) = torch.autograd.grad(c, (w,), dc)
    assert compare_gemm(db, _reference(a, b, dc, "kn")[1], 16).passed
    assert calls == [torch.Size([32, 16])], calls  # dB = A^T dC only
    x = a.clone().requires_grad_()
    c = xkernels.matmul(x, b)
    calls.clear()
    (da,) = torch.autograd.grad(c, (x,), dc)
    assert compare_gemm(da, _reference(a, b, dc, "kn")[0], 16).passed
    assert calls == [torch.Size([16, 16])], calls  # dA = dC B^T only


@pytest.mark.parametrize("a_shape,b_shape", [((5, 0), (0, 4)), ((2, 3, 5, 0), (0, 4)), ((2, 3, 5, 8), (8, 0))])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_empty_inner_or_outer_dims(device, a_shape, b_shape, b_layout):
    """K = 0 (C is zeros, so are both gradients) and N = 0 (no output, zero gradients), as torch.matmul."""
    a, b = _operands(a_shape, b_shape, b_layout, torch.float16, device)
    c_shape = (*a_shape[:-1], b_shape[-1])
    da, db = _grads(a, b, torch.ones(c_shape, dtype=torch.float16, device=device), b_layout)
    assert da.shape == a.shape and db.shape == b.shape
    assert not da.any() and not db.any()


def test_a_forced_layer_applies_to_the_forward(device):
    """The backward's products differ from the forward's (batched, or fp32 where batches are summed): a config
    override does not follow them, so a forward that a forced config serves trains too."""
    a, b = _operands((17, 40), (2, 40, 24), "kn", torch.float16, device, seed=12)
    leaves = [t.clone().requires_grad_() for t in (a, b)]
    dc = _rand((2, 17, 24), torch.float16, device, 13)
    xkernels.matmul(*leaves, backend="portable").backward(dc)
    assert_passes(_check([t.grad for t in leaves], _reference(a, b, dc, "kn"), a, b, dc))


def test_double_backward(device):
    """The backward is made of matmuls, so it is differentiable again: d/da of sum(dA^2) against float64."""
    a, b = _operands((16, 32), (32, 16), "kn", torch.float16, device, seed=6)
    dc = _rand((16, 16), torch.float16, device, 7)
    aa, bb = a.clone().requires_grad_(), b.clone().requires_grad_()
    (da,) = torch.autograd.grad(xkernels.matmul(aa, bb), (aa,), dc, create_graph=True)
    (db2,) = torch.autograd.grad(da.float().square().sum(), (bb,))
    a64, b64 = a.double().requires_grad_(), b.double().requires_grad_()
    (ref_da,) = torch.autograd.grad(a64 @ b64, (a64,), dc.double(), create_graph=True)
    (ref,) = torch.autograd.grad(ref_da.square().sum(), (b64,))
    assert compare_gemm(db2, ref, 16).passed


def test_opcheck_and_compiled_training_step(device):
    a, b = _operands((2, 16, 32), (32, 16), "nk", torch.float16, device, seed=8)
    torch.library.opcheck(ops.matmul_op, (a.clone().requires_grad_(), b.clone().requires_grad_(), "nk", "auto",
                                          None, "auto"))

    def loss(a, b):
        return xkernels.matmul(a, b, b_layout="nk").float().square().sum()

    assert_compiled_grads_match(loss, (a, b))


@pytest.mark.parametrize("broken", ["da without the transpose", "db from one batch", "db of half the rows", "nan"])
def test_each_check_fails_on_a_broken_backward(device, broken):
    """K = N, so the wrong formulas have the right shapes."""
    a, b = _operands((2, 1, 24, 32), (3, 32, 32), "kn", torch.float16, device, seed=10)
    dc = _rand((2, 3, 24, 32), torch.float16, device, 11)
    da, db = (g.clone() for g in _grads(a, b, dc, "kn"))
    if broken == "da without the transpose":  # dC B instead of dC B^T
        da = (dc.float() @ b.float()).sum(1, keepdim=True).half()
    elif broken == "db from one batch":  # a's broadcast batch not summed: one slice
        db = (a[0].float().mT @ dc[0].float()).half()
    elif broken == "db of half the rows":  # a fold that drops rows: half of each product's inner dim
        db = (a[..., :12, :].float().mT @ dc[..., :12, :].float()).sum(0).half()
    else:
        da[1, 0, 3, 5] = float("nan")
    results = _check((da, db), _reference(a, b, dc, "kn"), a, b, dc)
    assert not all(c.passed for c in results.values()), {n: c.reason for n, c in results.items()}
