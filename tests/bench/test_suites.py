"""The benchmark suites' cases: the decode suite times each cache call with and without the host read of its checks,
and a `sync_checks=False` case runs and passes its float64 check like the synchronized one; the packed training
step's case checks its gradients and pads dO for its peers; soft-capped and sink cases check what they name."""

from xkernels.bench.suites import DECODE_ROWS, decode_suite
from xkernels.testing.cases import DecodeCase


def test_decode_suite_has_each_cache_call_with_and_without_the_host_read():
    for quick in (True, False):
        shapes = [c.shape for c in decode_suite(quick)]
        synced = [s for s in shapes if " dense" in s and "nosync" not in s and "dense-api" not in s
                  and "window" not in s]
        assert len(synced) == len(DECODE_ROWS)
        assert all(s + " nosync" in shapes for s in synced)
        assert not any("dense-api nosync" in s for s in shapes)  # the dense API has no cache checks


def test_nosync_decode_case_runs_and_passes(device):
    for cache in ("dense", "paged16"):
        case = DecodeCase(2, 4, 2, 80, 64, cache=cache, sync_checks=False)
        assert case.check(case.inputs(device)).passed


def test_varlen_grad_case_checks_and_pads_its_gradient(device):
    """The packed training step's case: its float64 check passes, its padded peer inputs carry dO with zero padding,
    and its "bwd" step runs from the prepared forward."""
    import dataclasses

    import torch

    from xkernels.bench.suites import varlen_suite
    from xkernels.testing.cases import VarlenGradCase

    assert any(isinstance(c, VarlenGradCase) for c in varlen_suite(True))
    case = VarlenGradCase(3, 5, 40, 4, 2, 64, True, step="fwd+bwd")
    inputs = case.inputs(device)
    assert case.check(inputs).passed
    q, k, v, do = case.padded(inputs)
    lengths = case.lengths
    assert do.shape == q.shape == (3, 4, max(lengths), 64)
    assert all(do[i, :, n:].abs().sum() == 0 for i, n in enumerate(lengths))
    prepared = dataclasses.replace(case, step="bwd").prepare(inputs)
    grads = dataclasses.replace(case, step="bwd").run(prepared)
    assert all(torch.isfinite(g).all() for g in grads)


def test_windowed_decode_case_reads_its_window(device):
    """A sliding-window decode case: its FLOPs and bytes count the window's keys, its float64 check passes, and
    its SDPA peer gets exactly the window's keys."""
    import pytest

    case = DecodeCase(2, 4, 2, 90, 64, cache="paged16", window=20)
    assert case.keys == 21 and case.bytes_read == 2 * 2 * 2 * 2 * 21 * 64
    inputs = case.inputs(device)
    assert case.check(inputs).passed
    assert case.dense(inputs)[1].shape == (2, 2, 21, 64)
    with pytest.raises(ValueError, match="window"):
        DecodeCase(2, 4, 2, 90, 64, window=20)  # the dense API aligns windows top-left: not a decode step


def test_windowed_attention_cases_count_the_band_and_check(device):
    """The window suite's cases: FLOPs count exactly the pairs the mask keeps (the mask an SDPA peer is given), the
    float64 checks (forward, and the training step's gradients) pass, and each suite has a windowed forward and
    training step beside the unwindowed call."""
    import torch

    from xkernels.bench.suites import window_suite
    from xkernels.testing.cases import AttentionCase, AttentionGradCase

    for quick in (True, False):
        cases = window_suite(quick)
        assert any(isinstance(c, AttentionGradCase) and c.window != (-1, -1) for c in cases)
        assert any(type(c) is AttentionCase and c.window == (-1, -1) for c in cases)
    for window, causal in (((9, 0), True), ((5, 7), False), ((-1, 3), False)):
        case = AttentionCase(1, 4, 2, 40, 56, 64, causal, "fp16", window=window)
        assert case.flops == 4 * 64 * 4 * int(case.mask("cpu").sum())
        assert case.check(case.inputs(device)).passed
    grad = AttentionGradCase(1, 2, 1, 40, 40, 64, True, "fp16", window=(6, 0), step="fwd+bwd")
    assert grad.check(grad.inputs(device)).passed
    assert "window 6,0" in grad.shape and torch.equal(grad.mask("cpu"), grad.mask("cpu").tril())


def test_soft_capped_and_sink_cases_check_and_fail_without_what_they_name(device):
    """A case with a soft cap or sinks runs and checks them (forward, and the training step's dQ, dK, dV), has no
    SDPA peer (no backend has either), and its check fails against a call that drops the cap or the sinks."""
    import dataclasses

    from xkernels.bench.peers import peers_for
    from xkernels.testing.cases import AttentionCase, AttentionGradCase

    class Dropped(AttentionCase):  # runs the call without its cap and sinks, checks against the case's references
        def run(self, inputs, out=None, return_lse=False):
            plain = AttentionCase(**(dataclasses.asdict(self) | dict(softcap=0.0, sinks=False)))
            return plain.run(inputs[:3], out=out, return_lse=return_lse)

    for extra in (dict(softcap=3.0), dict(sinks=True), dict(softcap=50.0, sinks=True, window=(9, 0))):
        case = AttentionCase(1, 4, 2, 40, 56, 64, True, "bf16", **extra)
        inputs = case.inputs(device)
        assert case.check(inputs).passed and not peers_for(case)
        assert not Dropped(**dataclasses.asdict(case)).check(inputs).passed, extra
        if extra.get("softcap", 0.0) <= 3.0:  # (scores a quarter of a cap of 50 make dQ's rows too peaky for bf16)
            grad = AttentionGradCase(1, 4, 2, 40, 40, 64, True, "bf16", step="fwd+bwd", **extra)
            assert grad.check(grad.inputs(device)).passed


def test_the_backward_suite_has_each_row_in_both_determinism_modes(device):
    """The full attention-bwd suite runs every bwd and fwd+bwd row with the API's default `deterministic` (None,
    unnamed) and also with deterministic=True (but D256, whose backward has no fused variant), named so; the quick
    suite has the defaults only. A nondeterministic case checks against float64 like any other."""
    from xkernels.bench.suites import attention_bwd_suite
    from xkernels.testing.cases import AttentionGradCase

    cases = [c for c in attention_bwd_suite(quick=False) if isinstance(c, AttentionGradCase)]
    exact = [c for c in cases if c.deterministic is True]
    assert len(exact) == 6 and all(c.d != 256 and " deterministic" in c.shape for c in exact)
    assert all("deterministic" not in c.shape for c in cases if c.deterministic is None)
    assert all(c.deterministic is None for c in attention_bwd_suite(quick=True))
    case = AttentionGradCase(1, 2, 2, 40, 40, 64, True, "bf16", deterministic=False)
    assert case.check(case.inputs(device)).passed
