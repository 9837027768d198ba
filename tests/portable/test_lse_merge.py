"""The ring's in-place LSE merge against float64: views into larger buffers, rows one side never saw, an
uninitialized (NaN) running buffer, and a merge that drops a side's weight failing the same check."""

import pytest
import torch

from xkernels.portable.lse_merge import merge_into


def reference(acc, acc_lse, out, lse):
    a, la, o, lb = (t.double() for t in (acc, acc_lse, out, lse))
    new = torch.logaddexp(la, lb)
    seen = new > float("-inf")
    wa = torch.where(seen & (la > float("-inf")), torch.exp(la - new), 0.0).unsqueeze(-1)
    wb = torch.where(seen & (lb > float("-inf")), torch.exp(lb - new), 0.0).unsqueeze(-1)
    merged = torch.where(wa > 0, a * wa, 0.0) + torch.where(wb > 0, o * wb, 0.0)
    return merged, new


def inputs(device, b, h, rows, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    acc = torch.randn(b, h, rows + 7, d, generator=g).to(device)  # a view of rows 3..3+rows below
    acc_lse = torch.randn(b, h, rows + 7, generator=g).to(device) * 4
    out = torch.randn(b, h, rows, d, generator=g).to(device, dtype)
    lse = torch.randn(b, h, rows, generator=g).to(device) * 4
    acc_lse[..., 3:6] = float("-inf")  # the running side has not seen these rows yet
    acc[..., 3:6, :] = float("nan")  # ... and holds garbage there (torch.empty)
    lse[..., 1:4] = float("-inf")  # the partial saw no key for these (rows 4, 5: neither side)
    out[..., 1:4, :] = 0
    return acc, acc_lse, out, lse


@pytest.mark.parametrize("d", [64, 96, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_merge_matches_float64(device, d, dtype):
    acc_full, lse_full, out, lse = inputs(device, 2, 3, 37, d, dtype, seed=d)
    acc, acc_lse = acc_full[:, :, 3:40], lse_full[:, :, 3:40]
    want_o, want_lse = reference(acc, acc_lse, out, lse)
    before = acc_full.clone(), lse_full.clone()
    merge_into(acc, acc_lse, out, lse)
    assert not acc.isnan().any()
    assert torch.equal(acc_lse.isinf(), want_lse.isinf())  # rows 4, 5: still -inf
    assert (acc[..., 1:3, :] == 0).all()
    torch.testing.assert_close(acc.double(), want_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(acc_lse.double(), want_lse, rtol=1e-6, atol=1e-6)
    for full, old in zip((acc_full, lse_full), before, strict=True):  # rows outside the view untouched
        torch.testing.assert_close(full[:, :, :3], old[:, :, :3], equal_nan=True)
        torch.testing.assert_close(full[:, :, 40:], old[:, :, 40:], equal_nan=True)


def test_nan_partial_propagates(device):
    """A NaN in one partial (a NaN key or query somewhere in a shard) makes the row NaN, as SDPA would, instead of the
    row being treated as unseen and overwritten by the next merge."""
    acc = torch.full((1, 1, 4, 64), float("nan"), device=device)
    acc_lse = torch.full((1, 1, 4), float("-inf"), device=device)
    o1, l1 = torch.rand(1, 1, 4, 64, device=device), torch.rand(1, 1, 4, device=device)
    merge_into(acc, acc_lse, o1, l1)
    o2, l2 = torch.rand(1, 1, 4, 64, device=device), torch.rand(1, 1, 4, device=device)
    l2[0, 0, 1], o2[0, 0, 1] = float("nan"), float("nan")
    merge_into(acc, acc_lse, o2, l2)
    assert acc_lse[0, 0, 1].isnan() and acc[0, 0, 1].isnan().all()
    keep = [0, 2, 3]
    assert torch.isfinite(acc[0, 0, keep]).all() and torch.isfinite(acc_lse[0, 0, keep]).all()


def test_reference_catches_a_dropped_weight(device):
    acc_full, lse_full, out, lse = inputs(device, 1, 2, 19, 64, torch.float32, seed=1)
    acc, acc_lse = acc_full[:, :, 3:22], lse_full[:, :, 3:22]
    want_o, _ = reference(acc, acc_lse, out, lse)
    broken, _ = reference(acc, acc_lse, out, lse.new_full(lse.shape, float("-inf")))  # the partial ignored
    assert not torch.allclose(broken, want_o, rtol=1e-5, atol=1e-5)


def test_shape_mismatch_is_refused(device):
    acc = torch.zeros(1, 2, 8, 64, device=device)
    with pytest.raises(ValueError, match="shapes"):
        merge_into(acc, torch.zeros(1, 2, 8, device=device), torch.zeros(1, 2, 7, 64, device=device),
                   torch.zeros(1, 2, 7, device=device))
    with pytest.raises(TypeError, match="float32"):
        lse64 = torch.zeros(1, 2, 8, device=device, dtype=torch.float64)
        merge_into(acc, lse64, acc, torch.zeros(1, 2, 8, device=device))


def test_tensors_on_another_device_are_refused(device):
    """The launch passes addresses: a partial on another device is refused, not read from there."""
    acc, acc_lse = torch.zeros(1, 2, 8, 64, device=device), torch.zeros(1, 2, 8, device=device)
    with pytest.raises(ValueError, match="one device"):
        merge_into(acc, acc_lse, torch.zeros(1, 2, 8, 64, device="meta"), torch.zeros(1, 2, 8, device=device))
