"""The portable kernels' path without tensor descriptors (masked pointer tiles, for Triton builds without them such
as the Intel backend): the same results as the descriptor path against the float64 references, tails included."""

import pytest
import torch

import xkernels
from tests.helpers import poisoned_like
from xkernels import plans
from xkernels.portable import configs
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare_attention,
    compare_gemm,
    gemm_inputs,
    reference_attention,
    reference_matmul,
)


@pytest.fixture
def pointer_tiles(monkeypatch):
    monkeypatch.setattr(configs, "TENSOR_DESCRIPTORS", False)
    plans._PLANS.clear()  # plans hold their kernels' constexprs
    yield
    plans._PLANS.clear()


@pytest.mark.parametrize("recipe", list(ATTENTION_RECIPES))
@pytest.mark.parametrize("causal", [False, True])
def test_attention_without_descriptors(device, pointer_tiles, recipe, causal):
    rec = ATTENTION_RECIPES[recipe]
    q, k, v = attention_inputs(1, 4, 37, 50, 64, rec.io_dtype, device, hkv=2, seed=3)
    out = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, precision=recipe, out=poisoned_like(q),
                             backend="portable")
    c = compare_attention(out, reference_attention(q, k, v, is_causal=causal), rec)
    assert c.passed, c.reason


@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_gemm_without_descriptors(device, pointer_tiles, b_layout):
    a, b = gemm_inputs(45, 70, 50, torch.bfloat16, device, b_layout, seed=4)
    c = xkernels.matmul(a, b, b_layout=b_layout, out=poisoned_like(a, shape=(45, 70)), backend="portable")
    r = compare_gemm(c, reference_matmul(a, b, b_layout), 50)
    assert r.passed, r.reason


def test_the_switch_reaches_the_kernels(pointer_tiles):
    rec = ATTENTION_RECIPES["fp16"]
    attention = configs.AttentionConfig(32, 16, 4, 1).constexprs(64, rec, causal=False, write_lse=False)
    assert attention["DESCRIPTORS"] is False
    assert configs.GemmConfig(32, 32, 32, 4, 1).constexprs("kn", "row")["DESCRIPTORS"] is False
