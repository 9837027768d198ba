"""Hypothesis shape fuzz (bounded example count) for both kernels, against the float64 reference."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xkernels
from tests.helpers import poisoned_like
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare_attention,
    compare_gemm,
    gemm_inputs,
    reference_attention,
    reference_matmul,
)

FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(recipe=st.sampled_from(list(ATTENTION_RECIPES)), d=st.sampled_from([64, 128, 256]),
       b=st.integers(1, 2), hkv=st.integers(1, 2), group=st.integers(1, 3), sq=st.integers(1, 90),
       skv=st.integers(1, 90), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_attention_fuzz(device, recipe, d, b, hkv, group, sq, skv, causal, seed):
    rec = ATTENTION_RECIPES[recipe]
    q, k, v = attention_inputs(b, hkv * group, sq, skv, d, rec.io_dtype, device, hkv=hkv, seed=seed)
    o = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, precision=recipe, out=poisoned_like(q))
    c = compare_attention(o, reference_attention(q, k, v, is_causal=causal), rec)
    assert c.passed, c


@FUZZ
@given(m=st.integers(1, 100), n=st.integers(1, 100), k=st.integers(1, 100), b_layout=st.sampled_from(["kn", "nk"]),
       walk=st.sampled_from(["row", "grouped", "zorder"]), dtype=st.sampled_from([torch.float16, torch.bfloat16]),
       seed=st.integers(0, 2**16))
def test_gemm_fuzz(device, m, n, k, b_layout, walk, dtype, seed):
    a, b = gemm_inputs(m, n, k, dtype, device, b_layout, seed=seed)
    c = xkernels.matmul(a, b, b_layout=b_layout, walk=walk, out=poisoned_like(a, shape=(m, n)))
    r = compare_gemm(c, reference_matmul(a, b, b_layout), k)
    assert r.passed, r
