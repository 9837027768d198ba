"""Test helpers: poisoned outputs and input snapshots (shared by the CPU and GPU suites)."""

import pytest
import torch

from xkernels.common.runtime import hopper_available

# the marks of a test of the Hopper (Gluon) kernels: a GPU test, skipped without sm_90 and a tested triton
NEEDS_HOPPER = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available()
                                                         and hopper_available(torch.device("cuda"))),
                                                    reason="needs sm_90 with a tested triton")]


def poison_gradient_buffers(monkeypatch) -> None:
    """Every gradient buffer the backward allocates (`backward.grad_like`) starts as NaN: an element it fails to
    write fails the check."""
    from xkernels import backward

    real = backward.grad_like
    monkeypatch.setattr(backward, "grad_like", lambda t: real(t).fill_(float("nan")))


def poison_attention_outputs(monkeypatch) -> None:
    """The gradient buffers (`poison_gradient_buffers`) and every varlen and KV-cache output (`varlen.output_like`)
    start as NaN."""
    from xkernels import varlen

    poison_gradient_buffers(monkeypatch)
    real = varlen.output_like
    monkeypatch.setattr(varlen, "output_like", lambda q: real(q).fill_(float("nan")))


def poisoned_like(t: torch.Tensor, shape=None, dtype=None) -> torch.Tensor:
    """NaN-filled output: any element the kernel fails to write fails the non-finite check."""
    return torch.full(t.shape if shape is None else shape, float("nan"), dtype=dtype or t.dtype, device=t.device)


def snapshot(*ts: torch.Tensor) -> list[torch.Tensor]:
    return [t.clone() for t in ts]


def assert_unchanged(before: list[torch.Tensor], *ts: torch.Tensor) -> None:
    for b, t in zip(before, ts, strict=True):
        assert torch.equal(b, t), "an input was modified"


def assert_passes(results: dict) -> None:
    """Every named `Comparison` passed; the failures' reasons otherwise."""
    failed = {n: c.reason for n, c in results.items() if not c.passed}
    assert not failed, failed


def assert_compiled_grads_match(loss, inputs) -> None:
    """torch.compile(fullgraph=True) of `loss` (inductor on a GPU, AOTAutograd's eager backend on the CPU) gives the
    eager gradients of every input, bitwise: the forward graph holds the ops and the backward graph their registered
    autograd."""
    def grads(fn):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        fn(*leaves).backward()
        return [t.grad for t in leaves]

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="inductor" if torch.cuda.is_available() else "aot_eager")
    for got, want in zip(grads(compiled), grads(loss), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
