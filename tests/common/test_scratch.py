"""`common.scratch`: split-K counters and partials kept per stream across calls. The kept counters must be back at
zero after every launch (the kernel resets them); a set left non-zero must make the next call visibly wrong, so the
float64 check below can catch a kernel that stops resetting them."""

import pytest
import torch

import xkernels
from tests.helpers import poisoned_like
from xkernels.common import scratch
from xkernels.portable import configs
from xkernels.testing import compare_gemm, gemm_inputs, reference_matmul


@pytest.fixture(autouse=True)
def fresh_sets():
    scratch.clear()
    yield
    scratch.clear()


def test_sets_are_zeroed_kept_and_grown():
    cpu = torch.device("cpu")
    c, p = scratch.split_k(cpu, 3, 10)
    assert c.dtype == torch.int32 and p.dtype == torch.float32 and (c == 0).all()
    assert c.numel() >= 3 and p.numel() >= 10
    c2, p2 = scratch.split_k(cpu, 2, 8)  # smaller: the same buffers
    assert c2.data_ptr() == c.data_ptr() and p2.data_ptr() == p.data_ptr()
    c3, p3 = scratch.split_k(cpu, 5, 4)  # more counters: a new zeroed set, partials kept at least as large
    assert c3.numel() >= 5 and (c3 == 0).all() and p3.numel() >= 10
    assert scratch.split_k(cpu, 1, scratch.MAX_BYTES // 4 + 1) is None  # too large to keep: per call


def _few_rows(device):
    cfg = configs.skinny_gemm_config()
    m, n, k = 8, 2 * cfg.block_n, 8 * cfg.block_k
    a, b = gemm_inputs(m, n, k, torch.float16, device, "kn", seed=11)
    return a, b, reference_matmul(a, b, "kn"), k


def _kept_counters():
    return [s.counters for s in scratch._SETS.values()]


def test_the_few_row_kernel_leaves_kept_counters_at_zero(device):
    a, b, want, k = _few_rows(device)
    for _ in range(3):  # each call reuses the set the one before left
        c = xkernels.matmul(a, b, out=poisoned_like(a, shape=want.shape))
        assert "skinny" in xkernels.last_backend() and "slices=1]" not in xkernels.last_backend()
        assert compare_gemm(c, want, k).passed
        kept = _kept_counters()
        assert len(kept) == 1 and (kept[0] == 0).all(), "the kernel puts every counter back to zero"


def test_a_set_left_nonzero_is_caught(device):
    """The invariant matters: counters left at a previous count make no program see itself last, so C keeps its
    poison and the float64 comparison fails."""
    a, b, want, k = _few_rows(device)
    xkernels.matmul(a, b)
    _kept_counters()[0].fill_(1 << 20)
    c = xkernels.matmul(a, b, out=poisoned_like(a, shape=want.shape))
    assert not compare_gemm(c, want, k).passed
