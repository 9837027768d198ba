"""Compile every shipped kernel config for a target without a GPU and read what the compiler made of it.

The seeds' "check for spills before benchmarking" step, per target (`common/targets.py`): registers (VGPRs on AMD),
stack/local memory or scratch (spills), shared memory against the target's limit, and counts of the instructions
that matter: the matrix instruction (HGMMA on sm_90, HMMA = mma.sync elsewhere on NVIDIA, v_mfma on AMD), TMA or
async copies, 16-byte and 2-byte global loads, barriers and local-memory traffic. NVIDIA cubins are read with the
cuobjdump and nvdisasm in triton's wheel, AMD code from the AMDGCN assembly and its metadata.

  report.py    compile one config, read its registers, spills, shared memory and instruction counts
  portable.py  the portable kernels' shipped configs per target
  hopper.py    the Gluon kernels' shipped configs (sm_90) and the opt-in variants
  variants.py  the window / soft cap / sinks variants and argument types both lists share
"""

from __future__ import annotations

from collections.abc import Iterator

from xkernels.common.targets import TARGETS, Target
from xkernels.inspection.hopper import hopper_configs
from xkernels.inspection.portable import portable_configs
from xkernels.inspection.report import KernelConfig, Report, analyse, compile_config, ops_for

__all__ = ["KernelConfig", "Report", "all_configs", "analyse", "compile_config", "hopper_configs", "ops_for",
           "portable_configs"]


def all_configs(target: Target = TARGETS["sm_90"]) -> Iterator[KernelConfig]:
    """Every config shipped for `target`: the portable ones the target's config tables pick, and on sm_90 the Gluon
    ones (on the triton releases in `runtime.GLUON_COMPILES`)."""
    from xkernels.common.runtime import GLUON_COMPILED

    yield from portable_configs(target)
    if GLUON_COMPILED and target.name == "sm_90":
        yield from hopper_configs()
