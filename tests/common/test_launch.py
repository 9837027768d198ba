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


class _Recording:
    """A stand-in for a compiled kernel: what `Prepared` would launch (descriptor meta as Triton reports it)."""

    def __init__(self, descriptors: int):
        self.descriptor_meta = [{"slot": i} for i in range(descriptors)]
        self.launches = []

    def launch(self, grid, args, stream=None):
        self.launches.append((grid, args, stream))


def test_prepared_flattens_by_the_first_calls_kinds(monkeypatch):
    """The first call compiles against real descriptors built from the geometry given for their positions; every
    call passes tensors as addresses, descriptor positions as their slot's encoding of the tensor's address (cached
    per address), values as they are, then the constexprs, on the stream asked for."""
    compiled = []

    def compile_kernel(fn, grid, args, constexprs, options, device):
        compiled.append(args)
        return kernel

    kernel = _Recording(descriptors=2)
    monkeypatch.setattr(launch, "compile_kernel", compile_kernel)
    encoded = []

    def at(self, ptr):
        encoded.append((self.meta["slot"], ptr))
        return [f"tmap{self.meta['slot']}@{ptr}", *self.shape, *self.strides]

    monkeypatch.setattr(launch.DescriptorSlot, "at", at)

    def fn(X, d0, n, d1, scale, BLOCK):  # the parameter list Prepared reads the constexpr tail from
        pass

    fn.arg_names = ["X", "d0", "n", "d1", "scale", "BLOCK"]
    layout = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    geometry = ([256, 64], [64, 1], [64, 64], layout)
    prepared = launch.Prepared(fn, 7, dict(BLOCK=64), {}, {1: geometry, 3: geometry})
    x, a, b = (torch.empty(256, 64, dtype=torch.bfloat16) for _ in range(3))
    prepared((x, a, 5, b, 0.5))
    prepared((x, b, 5, a, 0.25), stream=1234)
    assert len(compiled) == 1 and isinstance(compiled[0][1], hopper.TensorDescriptor)
    assert compiled[0][1].base is a and compiled[0][3].base is b and compiled[0][2] == 5
    first, second = kernel.launches
    assert first == (7, (x.data_ptr(), f"tmap0@{a.data_ptr()}", 256, 64, 64, 1, 5,
                         f"tmap1@{b.data_ptr()}", 256, 64, 64, 1, 0.5, 64), None)
    assert second[1][1] == f"tmap0@{b.data_ptr()}" and second[1][7] == f"tmap1@{a.data_ptr()}"
    assert second[1][12] == 0.25 and second[2] == 1234
