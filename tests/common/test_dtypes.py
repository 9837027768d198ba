"""The dtype maps and the host-descriptor layout cache (`common/dtypes.py`)."""

import pytest
import torch

from xkernels.common.dtypes import gl_dtype, smem_layout

gl = pytest.importorskip("triton.experimental.gluon.language")


@pytest.mark.parametrize("block,dtype", [((64, 128), torch.bfloat16), ((128, 64), torch.float16),
                                         ((64, 32), torch.float32), ((32, 256), torch.bfloat16)])
def test_smem_layout_is_gluons_default_built_once(block, dtype):
    """The cached layout equals `get_default_for` of the same box and dtype (the one a kernel's descriptor was
    compiled for), and a second call returns the same (frozen) object."""
    assert smem_layout(block, dtype) == gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype(dtype))
    assert smem_layout(block, dtype) is smem_layout(block, dtype)
