"""What both config lists share: the window, soft cap and sinks variants the compile gate builds, and the attention
kernels' argument types and 16-divisible arguments (as Triton's launcher specializes them)."""

from __future__ import annotations

import torch

from xkernels.common.dtypes import POINTER_TYPE
from xkernels.common.seqlen import Band

# the sliding window and soft cap the compile gate builds the portable kernels' windowed variants with (Gemma 2's:
# the superset of Mistral's window alone); the forward kernels' also read attention sinks (gpt-oss)
WINDOW = Band.of(True, (4095, 0))
SOFTCAP = 50.0
# non-causal windows the Gluon kernels also compile with at D128 bf16: both sides (the diagonal shifted: SHIFT > 0)
# and a lower side alone (CAUSAL off, BAND on)
SIDE_WINDOWS = (Band.of(False, (100, 60)), Band.of(False, (77, -1)))

# runtime arguments compiled as multiples of 16 (`report.KernelConfig.divisible`)
ATTENTION_DIVISIBLE = ("Q", "K", "V", "O", "LSE", "q_sb", "q_sh", "q_ss", "k_sb", "k_sh", "k_ss", "v_sb", "v_sh",
                       "v_ss", "o_sb", "o_sh", "o_ss", "SQ", "SKV")
GEMM_DIVISIBLE = ("A", "B", "C", "M", "N", "K", "a_sb", "a_sm", "b_sb", "b_s0", "c_sb", "c_sm")


def attention_types(io: torch.dtype, v: torch.dtype | None = None) -> dict[str, str]:
    """Argument types of the attention kernels' shared runtime arguments (`plans.attention_args`)."""
    p = POINTER_TYPE[io]
    return {"Q": p, "K": p, "V": POINTER_TYPE[v or io], "O": p, "LSE": "*fp32", "qk_scale": "fp32", "SINKS": "*fp32"}
