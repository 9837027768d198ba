"""Launching compiled kernels at the cost of a driver call.

Triton's generic launch (`kernel[grid](...)`) binds every argument, recomputes the specialization key, looks the
kernel up, asks the global allocator for descriptor scratch and re-encodes each host tensor descriptor: 13-35 us of
host time per call on an H200 host. A plan (`xkernels.plans`) resolves all of that once per (shapes, strides, dtypes,
device) key; `Kernel.launch` then calls the compiled launcher directly with the argument values, the scratch a
kernel's in-kernel descriptors need comes from PyTorch's caching allocator (no `triton.set_allocator`), and host
descriptors are encoded once per (address, shape, strides) and cached as bytes, never holding the tensor.

The direct path calls Triton's CUDA launcher, whose calling convention changed between releases (3.6: a generated
launcher taking the kernel arguments spread; 3.7: one generic launcher taking an argument list with the kernel's
signature metadata). `Kernel` picks the convention from the launcher object it wraps, and the direct path is used only
on the releases in `runtime.TESTED_TRITON`; elsewhere (the interpreter, AMD, Intel, untested releases) launches take
Triton's generic path.
XKERNELS_DIRECT_LAUNCH=0 (read at import) sends every launch through the generic path, to compare the two.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import torch
import triton

from xkernels.common.runtime import INTERPRET, TRITON_TESTED

DIRECT_LAUNCH: bool = os.environ.get("XKERNELS_DIRECT_LAUNCH", "1") != "0"


def _torch_allocator(size: int, align: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _install_allocator() -> None:
    """Generic path only: in-kernel descriptors need per-program global scratch on GPUs that materialize them.
    Triton keeps the allocator in a context variable, so it is set in every context that launches (the autograd
    engine runs backward launches on its own thread), unless one is already set there."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_allocator)


def direct_launch_available(device: torch.device) -> bool:
    return (DIRECT_LAUNCH and device.type == "cuda" and TRITON_TESTED and not INTERPRET
            and torch.version.cuda is not None)


def _raw_launcher(runner):
    """The compiled C launcher under Triton's Python wrapper that re-encodes host descriptors on every call."""
    launch = runner.launch
    code = getattr(launch, "__code__", None)
    if code is None:
        return launch
    cells = dict(zip(code.co_freevars, launch.__closure__ or (), strict=True))
    return cells["launcher"].cell_contents


class Kernel:
    """One compiled kernel on one device, launched directly: `launch(grid, args)` with every runtime and constexpr
    argument in the kernel's parameter order (pointers as ints or tensors, host descriptors as `DescriptorSlot.at`
    lists spliced in by the caller)."""

    def __init__(self, compiled, device: torch.device):
        with torch.cuda.device(device):
            compiled._init_handles()
        runner = compiled.run
        if runner.profile_scratch_size:
            raise RuntimeError("kernels compiled with profiling scratch are launched through Triton's generic path")
        self._launch = _raw_launcher(runner)
        self._flags = (runner.launch_cooperative_grid, runner.launch_pdl)
        self._function = compiled.function
        self._packed = compiled.packed_metadata
        self._scratch = runner.global_scratch_size * runner.num_ctas
        # Triton >= 3.7: one launcher for every kernel, told how to read the argument list by these two objects.
        self._signature = ((runner.arg_annotations, runner.kernel_signature)
                           if hasattr(runner, "kernel_signature") else None)
        self.descriptor_meta = getattr(compiled.metadata, "tensordesc_meta", None) or []
        self.device = device
        self.index = device.index

    def launch(self, grid: int, args: Sequence[object], stream: int | None = None) -> None:
        """Launch on the current stream, or on `stream` (a raw CUDA stream handle: only for kernels that need no
        global scratch, which is allocated in the current stream's order)."""
        if stream is None:
            stream = torch._C._cuda_getCurrentRawStream(self.index)
        elif self._scratch:
            raise ValueError("Kernel.launch: a kernel that needs global scratch launches on the current stream")
        scratch = None
        if self._scratch:  # freed to the caching allocator after the launch: stream-ordered, like Triton's own.
            # (A buffer cached per stream would save this allocation, but a cached buffer made while inductor's
            # CUDA-graph trees warm up lives in the graph pool untracked, which they refuse.)
            scratch = torch.empty(grid * self._scratch, dtype=torch.uint8, device=self.device)
        if torch._C._cuda_getDevice() != self.index:
            with torch.cuda.device(self.index):
                self._call(grid, stream, scratch, args)
            return
        self._call(grid, stream, scratch, args)

    def _call(self, grid: int, stream: int, scratch, args: Sequence[object]) -> None:
        coop, pdl = self._flags
        if self._signature is None:  # 3.6: grid, stream, function, flags, scratch, profile scratch, metadata, hooks
            self._launch(grid, 1, 1, stream, self._function, coop, pdl, scratch, None, self._packed, None, None,
                         None, *args)
            return
        annotations, signature = self._signature  # 3.7: metadata and hooks first, then scratch, then the list
        self._launch(grid, 1, 1, stream, self._function, coop, pdl, self._packed, None, None, None, scratch, None,
                     annotations, signature, args)


_COMPILED: dict = {}
_COMPILED_MAX = 512


def _specialization(a: object) -> tuple | None:
    """What Triton's launcher specializes an argument on: a tensor's dtype and 16-byte alignment, an int's being 1,
    a multiple of 16 and 32- or 64-bit; None for anything else (a host descriptor, an int Triton would type u64),
    which is not cached."""
    if isinstance(a, torch.Tensor):
        return ("t", a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool):
        return ("b",)
    if isinstance(a, int):
        return ("i", a == 1, a % 16 == 0, -(2**31) <= a < 2**31) if -(2**63) <= a < 2**63 else None
    if isinstance(a, float):
        return ("f",)
    return None


def compile_kernel(fn, grid: int, args: Sequence[object], constexprs: dict[str, object], options: dict[str, int],
                   device: torch.device) -> Kernel:
    """Compile `fn` for these arguments (no launch) on `device` and wrap it for direct launches. The result is shared
    by every call whose arguments specialize alike (a decode step whose cache grew by one token reuses the kernel of
    the step before; Triton's own lookup of it costs ~0.5 ms of host time)."""
    specs = tuple(_specialization(a) for a in args)
    key = None
    if all(s is not None for s in specs):
        key = (fn, device, specs, tuple((k, str(v)) for k, v in constexprs.items()), tuple(sorted(options.items())))
        hit = _COMPILED.get(key)
        if hit is not None:
            return hit
    with torch.cuda.device(device):
        compiled = fn.warmup(*args, grid=(grid,), **constexprs, **options)
    kernel = Kernel(compiled, device)
    if key is not None:
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        _COMPILED[key] = kernel
    return kernel


def constexpr_tail(fn, constexprs: dict[str, object]) -> tuple:
    """Constexpr values in parameter order; they come after every runtime parameter in our kernels."""
    names = fn.arg_names
    first = min(names.index(n) for n in constexprs)
    assert set(names[first:]) == set(constexprs), f"{fn}: constexprs must be its last parameters"
    return tuple(constexprs[n] for n in names[first:])


def generic_launch(fn, grid: int, args: Sequence[object], constexprs: dict[str, object],
                   options: dict[str, int]) -> None:
    """Triton's own launch path: the interpreter, non-CUDA backends and untested triton releases."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
    if INTERPRET or device is None:
        fn[(grid,)](*args, **constexprs, **options)
        return
    _install_allocator()
    with torch.cuda.device(device):  # Triton launches on the current device, not the tensors'
        fn[(grid,)](*args, **constexprs, **options)


def _is_descriptor(a: object) -> bool:
    return hasattr(a, "block_shape") and hasattr(a, "base")


def _call_spec(a: object) -> tuple | None:
    """`_specialization`, and for a host tensor descriptor what its compiled launch depends on (dtype, alignment,
    block and layout) and what its cached encodings assume (shape and strides); None for a descriptor with
    non-default padding or TF32 rounding, which `DescriptorSlot` does not encode."""
    if _is_descriptor(a):
        if getattr(a, "padding", "zero") not in ("zero", None) or getattr(a, "round_f32_to_tf32", False):
            return None
        base = a.base
        return ("d", base.dtype, base.data_ptr() % 16 == 0, tuple(a.shape), tuple(a.strides), tuple(a.block_shape),
                getattr(a, "layout", None))
    return _specialization(a)


_CALLS: dict = {}


def run(fn, grid: int, args: Sequence[object], constexprs: dict[str, object], options: dict[str, int]) -> None:
    """Launch `fn` directly when the direct path is available and every argument is a tensor, a host tensor
    descriptor, an int, a bool or a float: the compiled kernel is found by what its launch specializes on (each
    tensor's dtype and 16-byte alignment, each int's being 1, a multiple of 16 and 32-bit, each descriptor's
    geometry, the constexprs), and descriptors are encoded once per address (`DescriptorSlot`). A call costs a few
    microseconds of host time where Triton's generic path costs 50-200 (binder, specialization key, cache lookup,
    descriptor encoding). Anything else takes `generic_launch`."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
    if device is None or not direct_launch_available(device):
        generic_launch(fn, grid, args, constexprs, options)
        return
    specs = tuple(_call_spec(a) for a in args)
    if None in specs:
        generic_launch(fn, grid, args, constexprs, options)
        return
    key = (fn, device.index, specs, tuple((k, str(v)) for k, v in constexprs.items()), tuple(options.items()))
    entry = _CALLS.get(key)
    if entry is None:
        kernel = compile_kernel(fn, grid, args, constexprs, options, device)
        descs = [a for a in args if _is_descriptor(a)]
        slots = [DescriptorSlot(meta, tuple(d.shape), tuple(d.strides))
                 for meta, d in zip(kernel.descriptor_meta, descs, strict=True)]
        if len(_CALLS) >= _COMPILED_MAX:
            _CALLS.clear()
        entry = _CALLS[key] = (kernel, slots, constexpr_tail(fn, constexprs))
    kernel, slots, tail = entry
    flat: list[object] = []
    next_slot = iter(slots)
    for a, spec in zip(args, specs, strict=True):  # the specs already tell tensors ("t") and descriptors ("d")
        if spec[0] == "t":
            flat.append(a.data_ptr())
        elif spec[0] == "d":
            flat.extend(next(next_slot).at(a.base.data_ptr()))
        else:
            flat.append(a)
    kernel.launch(grid, (*flat, *tail))


class Prepared:
    """One kernel launch of a plan (`xkernels.backward.BackwardPlan`) whose key fixes what each argument is, so a call
    flattens its arguments without asking: the first call compiles against them and notes each one's kind (a tensor,
    passed as its address; a host descriptor over a tensor, with the geometry given for its position; a value).
    Every later call must pass tensors at the same positions, 16-byte aligned where the first call's were, ints that
    specialize alike (the plan's key fixes them) and the same constexprs: the caller's plan sees to it.

    `descriptors` maps an argument position to (shape, strides, block_shape, layout): there the call passes the tensor
    the descriptor is over (its base), and the encodings are cached per address (`DescriptorSlot`)."""

    def __init__(self, fn, grid: int, constexprs: dict[str, object], options: dict[str, int],
                 descriptors: dict[int, tuple] | None = None):
        self.fn, self.grid, self.constexprs, self.options = fn, grid, constexprs, options
        self.geometry = descriptors or {}
        self.kernel: Kernel | None = None
        self.kinds: tuple[int, ...] = ()
        self.slots: dict[int, DescriptorSlot] = {}
        self.tail = constexpr_tail(fn, constexprs)

    _POINTER, _DESCRIPTOR, _VALUE = 0, 1, 2

    def __call__(self, args: Sequence[object], stream: int | None = None) -> None:
        if self.kernel is None:
            self._compile(args)
        flat: list[object] = []
        for i, (kind, a) in enumerate(zip(self.kinds, args, strict=True)):
            if kind == self._POINTER:
                flat.append(a.data_ptr())
            elif kind == self._DESCRIPTOR:
                flat.extend(self.slots[i].at(a.data_ptr()))
            else:
                flat.append(a)
        self.kernel.launch(self.grid, (*flat, *self.tail), stream)

    def _compile(self, args: Sequence[object]) -> None:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        real = [TensorDescriptor(a, *self.geometry[i]) if i in self.geometry else a for i, a in enumerate(args)]
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        kernel = compile_kernel(self.fn, self.grid, real, self.constexprs, self.options, device)
        positions = sorted(self.geometry)
        self.slots = {i: DescriptorSlot(meta, tuple(self.geometry[i][0]), tuple(self.geometry[i][1]))
                      for i, meta in zip(positions, kernel.descriptor_meta, strict=True)}
        self.kinds = tuple(self._DESCRIPTOR if i in self.geometry else
                           self._POINTER if isinstance(a, torch.Tensor) else self._VALUE for i, a in enumerate(args))
        self.kernel = kernel


# The TMA dtype enum differs between the device-side metadata and the host encoder (triton's driver has the same map).
_TMA_DTYPE_DEVICE_TO_HOST = {i: i for i in range(16)} | {8: 10, 9: 8, 10: 9}


@functools.cache
def _fill_tma_descriptor():
    utils = triton.runtime.driver.active.utils
    return getattr(utils, "fill_tma_descriptor_tiled", None) or utils.fill_tma_descriptor  # renamed in 3.7


class DescriptorSlot:
    """One host tensor-descriptor argument of a plan: its shape, strides and box are fixed, so the launcher
    arguments ([CUtensorMap, *shape, *strides]) depend only on the address. Encodings are cached per address: a
    number, so no tensor is kept alive, and an equal address always encodes equal bytes."""

    MAX = 64

    def __init__(self, meta: dict, shape: tuple[int, ...], strides: tuple[int, ...]):
        self.meta, self.shape, self.strides = meta, list(shape), list(strides)
        self.by_address: dict[int, list] = {}

    def at(self, ptr: int) -> list:
        hit = self.by_address.get(ptr)
        if hit is None:
            m = self.meta
            args = (ptr, m["swizzle"], m["elem_size"], _TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]], m["block_size"],
                    self.shape, self.strides, 0)
            try:
                tmap = _fill_tma_descriptor()(*args)
            except RuntimeError as e:
                # a thread that has made no CUDA runtime call yet (autograd's device thread before its first
                # kernel, a user's worker thread) has no current context, and the encoder needs one: a runtime
                # call binds the device's primary context to this thread (cudaMemGetInfo: no sync, no stream op)
                if "context" not in str(e):
                    raise
                torch.cuda.mem_get_info()
                tmap = _fill_tma_descriptor()(*args)
            if len(self.by_address) >= self.MAX:
                self.by_address.clear()
            hit = self.by_address[ptr] = [tmap, *self.shape, *self.strides]
        return hit
