"""The device check of packed batches' cu_seqlens against the host check (`validation.check_cu_seqlens`): random
good and bad values agree, a good call passes its values and leaves the outputs alone, a bad one zeroes both copies
and fills every output (permuted and in several dtypes) with NaN, and the inputs are never written."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xkernels.portable.cu_seqlens import checked_on_device
from xkernels.validation import check_cu_seqlens


def _host_bad(cu: list[int], total: int, max_seqlen: int) -> bool:
    try:
        check_cu_seqlens(cu, total, max_seqlen, "cu", "max")
    except ValueError:
        return True
    return False


def _outputs(device):
    return (torch.zeros(7, 3, 8, dtype=torch.bfloat16, device=device),
            torch.zeros(5, 300, device=device).t(),  # a permuted dense buffer, as empty_like of a transposed tensor
            torch.zeros(0, dtype=torch.float16, device=device))


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=300), edit=st.sampled_from(
    ["none", "first", "last", "short", "decrease", "long"]), max_slack=st.integers(0, 2))
def test_device_check_agrees_with_the_host_check(lengths, edit, max_slack):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    total, longest = cu[-1], max(lengths)
    if edit == "first":
        cu[0] = 1
    elif edit == "last":
        cu[-1] += 1
    elif edit == "short":  # short of the packed total (non-decreasing where the last sequence is not empty)
        cu[-1] -= 1
    elif edit == "decrease" and len(cu) > 2:
        cu[len(cu) // 2] = cu[len(cu) // 2 - 1] - 1
    max_seqlen = longest - 1 if edit == "long" else longest + max_slack  # each side of the boundary
    bad = _host_bad(cu, total, max_seqlen)
    good_k = torch.tensor([0] * len(cu), dtype=torch.int32, device=device)
    for cu_q, cu_k, total_q, total_k, max_q, max_k in (
            (torch.tensor(cu, dtype=torch.int32, device=device), good_k, total, 0, max_seqlen, 0),
            (good_k, torch.tensor(cu, dtype=torch.int32, device=device), 0, total, 0, max_seqlen)):
        before = (cu_q.clone(), cu_k.clone())
        outs = _outputs(device)
        got_q, got_k = checked_on_device(cu_q, cu_k, total_q, total_k, max_q, max_k, outs)
        assert torch.equal(cu_q, before[0]) and torch.equal(cu_k, before[1]), "an input was written"
        if bad:
            assert not got_q.any() and not got_k.any(), (cu, max_seqlen)
            assert all(torch.isnan(t).all() for t in outs), (cu, max_seqlen)
        else:
            assert torch.equal(got_q, cu_q) and torch.equal(got_k, cu_k), (cu, max_seqlen)
            assert all((t == 0).all() for t in outs), "a good call wrote an output"


def test_more_than_three_outputs_or_a_sparse_one_is_refused():
    cu = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="at most three dense"):
        checked_on_device(cu, cu, 2, 2, 2, 2, tuple(torch.zeros(2) for _ in range(4)))
    with pytest.raises(ValueError, match="at most three dense"):
        checked_on_device(cu, cu, 2, 2, 2, 2, (torch.zeros(4, 4)[:, :2],))


def test_a_step_that_wraps_in_int32_is_refused():
    """2^31 - 1 then -2^31: an int32 difference reads a step of 1; the lengths are taken in int64."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cu = torch.tensor([0, 2**31 - 1, -(2**31), -1, 5], dtype=torch.int32, device=device)
    good = torch.tensor([0, 0, 0, 0, 5], dtype=torch.int32, device=device)
    out = torch.zeros(5, 2, dtype=torch.float16, device=device)
    assert _host_bad(cu.tolist(), 5, 2**31 - 1)
    got_q, got_k = checked_on_device(cu, good, 5, 5, 2**31 - 1, 5, (out,))
    assert not got_q.any() and not got_k.any() and torch.isnan(out).all()
