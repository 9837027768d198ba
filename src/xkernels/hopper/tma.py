"""The TMA operations the Hopper kernels use, under one set of names across the Triton releases they compile on.

Triton 3.9 renamed the bulk copies (`async_copy_global_to_shared` -> `async_load`, `async_copy_shared_to_global`
-> `async_store`; the old names now raise). The kernels call the new names; on 3.6 and 3.7 they are the old
builtins, which take the same arguments.
"""

from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import tma as _tma

async_load = getattr(_tma, "async_load", None) or _tma.async_copy_global_to_shared
async_store = getattr(_tma, "async_store", None) or _tma.async_copy_shared_to_global
store_wait = _tma.store_wait
make_tensor_descriptor = _tma.make_tensor_descriptor



@builtin
def _reduce_add(tensor_desc, coord, src, _semantic=None):
    """`cp.reduce.async.bulk.tensor ... .add`: add the shared-memory tile `src` into global memory at `coord`
    (element-wise, atomically per element), tracked like a TMA store (`store_wait`). Triton 3.6-3.7 build it but
    have no Gluon wrapper."""
    from triton._C.libtriton import ir

    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


async_reduce_add = _reduce_add

__all__ = ["async_load", "async_reduce_add", "async_store", "make_tensor_descriptor", "store_wait"]
