"""What the direct launcher keys a compiled kernel on (`common/launch.py`): anything it cannot encode as Triton
would takes Triton's own launch path."""

import pytest
import torch

from xkernels.common import launch

hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
gl = pytest.importorskip("triton.experimental.gluon.language")


def _descriptor(**kwargs):
    t = torch.empty(256, 64, dtype=torch.bfloat16)
    layout = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    return hopper.TensorDescriptor(t, [256, 64], [64, 1], [64, 64], layout, **kwargs)


def test_ints_are_keyed_as_triton_types_them():
    """1, multiples of 16 and 32-bit range as Triton's launcher; a value Triton would type u64 is not keyed."""
    spec = launch._specialization
    assert spec(1) != spec(2) and spec(16) != spec(17) and spec(2**31) != spec(2**31 - 16)
    assert spec(2**62) is not None and spec(2**63) is None


def test_descriptors_with_what_the_slot_cannot_encode_are_not_keyed():
    """A default descriptor is keyed by its geometry and layout; one with NaN padding (or, from triton 3.7, TF32
    rounding) goes to Triton's launcher, as `DescriptorSlot` encodes zero padding and the plain element type."""
    assert launch._call_spec(_descriptor()) is not None
    assert launch._call_spec(_descriptor()) == launch._call_spec(_descriptor())
    assert launch._call_spec(_descriptor(padding="nan")) is None
