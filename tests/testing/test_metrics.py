"""Each check must fail on a broken kernel: zeros, a wrong scale, NaN, an unwritten element, a wrong layout."""

import math

import pytest
import torch

import xkernels
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare,
    compare_attention,
    compare_gemm,
    gemm_inputs,
    reference_attention,
    reference_matmul,
)


@pytest.fixture
def attn_case(device):
    q, k, v = attention_inputs(1, 2, 64, 64, 64, torch.float16, device, seed=7)
    return q, k, v, reference_attention(q, k, v)


def test_zero_output_fails_although_max_diff_alone_passes(device):
    # attention outputs of U(-0.5, 0.5) inputs shrink like 1/sqrt(Skv): at 1K keys they are all under 0.05
    q, k, v = attention_inputs(1, 1, 1024, 1024, 64, torch.float16, device, seed=7)
    ref = reference_attention(q, k, v)
    rec = ATTENTION_RECIPES["fp16"]
    c = compare_attention(torch.zeros_like(q), ref, rec)
    assert c.max_abs_diff < rec.max_abs_diff  # the seeds' bound alone is fooled by an all-zero output...
    assert not c.passed and "rel_rms" in c.reason  # ...the rel-RMS bound is not


def test_wrong_scale_fails(attn_case):
    q, k, v, ref = attn_case
    o = xkernels.attention(q, k, v, scale=2 / math.sqrt(q.shape[-1]))
    c = compare_attention(o, ref, ATTENTION_RECIPES["fp16"])
    assert not c.passed and "rel_rms" in c.reason


def test_wrong_causal_and_wrong_kv_head_fail(attn_case):
    q, k, v, ref = attn_case
    assert not compare_attention(xkernels.attention(q, k, v, is_causal=True), ref, ATTENTION_RECIPES["fp16"]).passed
    swapped = xkernels.attention(q, k.flip(1), v.flip(1))
    assert not compare_attention(swapped, ref, ATTENTION_RECIPES["fp16"]).passed


def test_nan_and_unwritten_fail(attn_case):
    q, k, v, ref = attn_case
    o = xkernels.attention(q, k, v)
    assert compare_attention(o, ref, ATTENTION_RECIPES["fp16"]).passed
    for poison in (float("nan"), float("inf")):
        bad = o.clone()
        bad[0, 1, 5, 3] = poison  # one element left unwritten in a NaN-poisoned buffer, or overflowed
        c = compare(bad, ref, rel_rms=1e9, max_abs=1e9)  # even absurd bounds never let a non-finite value pass
        assert not c.passed and c.nonfinite == 1


def test_gemm_checks_fail(device):
    a, b = gemm_inputs(64, 48, 80, torch.float16, device, "kn", seed=8)
    ref = reference_matmul(a, b)
    good = xkernels.matmul(a, b)
    assert compare_gemm(good, ref, 80).passed
    assert not compare_gemm(torch.zeros_like(good), ref, 80).passed
    assert not compare_gemm(xkernels.matmul(a, b.flip(0)), ref, 80).passed
    one_off = good.clone()
    i = (ref.abs() - ref.abs().median()).abs().argmin()  # a typical element
    one_off.view(-1)[i] *= 1.1  # a single element 10 % off: under the rel-RMS bound, caught per element
    c = compare_gemm(one_off, ref, 80)
    assert c.rel_rms < 5e-3 and not c.passed and c.outliers == 1


def test_a_wrong_row_fails_although_global_bounds_pass():
    # 262k query rows with the magnitudes of an 8K-key attention output (all < 0.01): one unwritten row moves the
    # global rel-RMS by sqrt(1 / 262144) = 1.95e-3 and the max-diff by < 0.05, both under the fp16 bounds
    g = torch.Generator().manual_seed(11)
    ref = torch.randn(1, 4, 65536, 16, dtype=torch.float64, generator=g) * 2e-3
    rec = ATTENTION_RECIPES["fp16"]
    bad = ref * (1 + 1e-4 * torch.randn(ref.shape, dtype=torch.float64, generator=g))
    bad[0, 1, 700] = 0
    c = compare_attention(bad, ref, rec)
    assert c.rel_rms < rec.rel_rms and c.max_abs_diff < rec.max_abs_diff  # the global bounds miss it...
    assert not c.passed and "worst row" in c.reason and c.worst_row_rel == 1.0  # ...the per-row bound does not


def _rounded_dq(q, k, v, do, lens_q, lens_k, dtype, with_o: bool = False):
    """dQ of packed sequences (causal bottom-right) as an exact backward kernel computes it: fp32 arithmetic, with O
    rounded to the I/O dtype before delta = rowsum(dO * O), and P and dS rounded to it before their matmuls;
    `with_o`: (dQ, that O)."""
    dq = torch.zeros(q.shape, dtype=torch.float32)
    out = torch.zeros(q.shape, dtype=torch.float32)
    group, d = q.shape[1] // k.shape[1], q.shape[2]
    a = b = 0
    for sq, sk in zip(lens_q, lens_k, strict=True):
        qs, dos = (t[a:a + sq].float().transpose(0, 1) for t in (q, do))
        ks, vs = (t[b:b + sk].float().transpose(0, 1).repeat_interleave(group, 0) for t in (k, v))
        if sq and sk:
            s = (qs @ ks.transpose(-1, -2) / math.sqrt(d)).masked_fill(
                torch.arange(sk)[None] > torch.arange(sq)[:, None] + sk - sq, float("-inf"))
            p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True)).nan_to_num(0.0)
            o = (p.to(dtype).float() @ vs).to(dtype).float()
            ds = p * (dos @ vs.transpose(-1, -2) - (o * dos).sum(-1, keepdim=True))
            dq[a:a + sq] = ((ds.to(dtype).float() @ ks) / math.sqrt(d)).transpose(0, 1)
            out[a:a + sq] = o.transpose(0, 1)
        a, b = a + sq, b + sk
    return (dq.to(dtype), out.to(dtype)) if with_o else dq.to(dtype)


@pytest.mark.parametrize("dtype,seed", [(torch.float16, 0), (torch.float16, 8), (torch.bfloat16, 1)])
def test_gradient_bounds_admit_an_exact_kernel_on_short_causal_rows(dtype, seed):
    """Bottom-right causal rows that see a few keys (Sq > Sk) have dS = P (dP - delta) cancel, so the rounding of O
    and P sets their error, not the kernel: a kernel exact up to that rounding reaches 3.5 % (fp16) and 19 % (bf16)
    on rows of about a tenth of the RMS row norm (these seeds are the worst of 16 and 8), and must pass; a row
    computed wrong (off by ~1) fails."""
    from tests.test_varlen_backward import _packed
    from xkernels.testing import compare_grad, reference_attention_varlen_grads

    lens_q, lens_k = [1, 200, 0, 333, 64, 129], [77, 200, 5, 130, 0, 300]
    q, k, v, do, cq, ck = _packed(lens_q, lens_k, 8, 2, 256, dtype, "cpu", seed=seed)
    ref = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=True)[0]
    dq = _rounded_dq(q, k, v, do, lens_q, lens_k, dtype)
    recipe = ATTENTION_RECIPES["fp16" if dtype == torch.float16 else "bf16"]
    c = compare_grad(dq, ref, recipe)
    assert c.passed and c.worst_row_rel > recipe.grad_row_rel / 10, c  # a real margin, and not a vacuous one
    dq[150] = -dq[150]  # one token of the 200-key sequence wrong
    assert not compare_grad(dq, ref, recipe).passed


def test_a_wrong_gradient_row_fails_although_the_rel_rms_passes():
    """compare_grad: among 64K gradient rows one 15 % off moves the rel-RMS by 0.15 / 256 = 6e-4, under fp16's 2e-3
    gradient bound; the per-row bound (0.1) fails it."""
    g = torch.Generator().manual_seed(12)
    ref = torch.randn(1, 2, 32768, 64, dtype=torch.float64, generator=g)
    bad = ref * (1 + 1e-4 * torch.randn(ref.shape, dtype=torch.float64, generator=g))
    bad[0, 1, 700] *= 1.15
    rec = ATTENTION_RECIPES["fp16"]
    from xkernels.testing import compare_grad

    c = compare_grad(bad, ref, rec)
    assert c.rel_rms < rec.grad_rel_rms and not c.passed and "worst row" in c.reason


def test_a_dq_missing_one_key_of_one_row_per_sequence_fails():
    """A broken dQ that drops the diagonal key of each sequence's last query row (4 causal sequences of 1024 keys,
    fp16, rounded as an exact kernel would): its rel-RMS passes, and the row bound must catch the rows (8 % off)."""
    from tests.test_varlen_backward import _packed
    from xkernels.testing import compare_grad, reference_attention_varlen_grads

    lens = [1024] * 4
    q, k, v, do, cq, ck = _packed(lens, lens, 4, 2, 64, torch.float16, "cpu", seed=0)
    ref = reference_attention_varlen_grads(q, k, v, do, cq, ck, is_causal=True)
    dq = ref[0].clone()
    for b in range(4):  # the last row's dQ without its diagonal key: dS[i, i] k_i * scale taken out
        i = 1024 * b + 1023
        qs, ks, vs, dos = (t[1024 * b:1024 * (b + 1)].double() for t in (q, k, v, do))
        kv = ks.repeat_interleave(2, 1)  # (1024, 4, 64)
        s_row = torch.einsum("hd,nhd->hn", qs[1023], kv) / 8.0
        p = torch.softmax(s_row, -1)
        dp = torch.einsum("hd,nhd->hn", dos[1023], vs.repeat_interleave(2, 1))
        ds_diag = p[:, 1023] * (dp[:, 1023] - (p * dp).sum(-1))
        dq[i] -= ds_diag[:, None] * kv[1023] / 8.0
    c = compare_grad(dq.half(), ref[0], ATTENTION_RECIPES["fp16"])
    assert c.rel_rms < ATTENTION_RECIPES["fp16"].grad_rel_rms and not c.passed and "worst row" in c.reason, c
