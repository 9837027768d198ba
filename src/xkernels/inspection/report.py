"""Compile one kernel config for a target and read what the compiler made of it: registers (VGPRs on AMD),
stack/local memory or scratch (spills), shared memory against the target's limit, and counts of the instructions
that matter. NVIDIA cubins are read with the cuobjdump and nvdisasm in triton's wheel, AMD code from the AMDGCN
assembly and its metadata, Intel code from the LLVM IR its SPIR-V is made from.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton

from xkernels.common.targets import TARGETS, Target

# instruction counts per backend, label -> regex: the matrix op first, then copies and loads (16-byte vs 2-byte),
# barriers, and local-memory (spill) traffic
_MATRIX = {"HGMMA": r"\bHGMMA\.", "HMMA": r"\bHMMA\.", "v_mfma": r"\bv_mfma"}
_SASS_COMMON = {"LDG.128": r"\bLDG\.[\w.]*128\b", "LDG.U16": r"\bLDG\.[\w.]*U16\b", "BAR": r"\bBAR\.",
                "LDL": r"\bLDL\b", "STL": r"\bSTL\b"}
SASS_OPS = {"sm_90": {"HGMMA": _MATRIX["HGMMA"], "HMMA": _MATRIX["HMMA"], "UTMALDG": r"\bUTMALDG\b",
                      "UTMASTG": r"\bUTMASTG\b", **_SASS_COMMON},
            "cuda": {"HMMA": _MATRIX["HMMA"], "UTMALDG": r"\bUTMALDG\b", "LDGSTS": r"\bLDGSTS\b",
                     "LDGSTS.128": r"\bLDGSTS\.[\w.]*128\b", **_SASS_COMMON}}
AMDGCN_OPS = {"v_mfma": _MATRIX["v_mfma"], "load_dwordx4": r"_load_dwordx4\b", "load_ushort": r"_load_ushort\b",
              "ds_read": r"\bds_read", "s_barrier": r"\bs_barrier\b"}
# Intel: counted in the LLVM IR the SPIR-V is made from (IGC allocates registers when the driver loads it): calls of
# the DPAS builtin, 2D block loads, and work-group barriers
XPU_OPS = {"matrix_mad": r"call[^\n]*matrix_mad_k16", "block_load_2d": r"call[^\n]*2d_block_read",
           "barrier": r"call[^\n]*(?:barrier|__spirv_ControlBarrier)"}



def ops_for(target: Target) -> dict[str, str]:
    if target.backend == "xpu":
        return XPU_OPS
    return AMDGCN_OPS if target.backend == "hip" else SASS_OPS.get(target.name, SASS_OPS["cuda"])



@dataclass(frozen=True)
class KernelConfig:
    name: str
    fn: object  # a @triton.jit or @gluon.jit function
    arg_types: dict[str, str]  # argument -> triton type string; every other runtime argument is i32
    constexprs: dict[str, object]
    num_warps: int
    num_stages: int = 1
    gluon: bool = False
    spill_free: bool = True  # CI fails when a config marked spill-free spills
    max_stack: int | None = None  # where spills are tolerated, the most stack bytes CI lets through (None: any)
    # runtime arguments compiled as multiples of 16 (the common launch: aligned pointers, sizes and strides), as
    # Triton's launcher specializes them; the report is of that variant
    divisible: tuple[str, ...] = ()
    # the matrix instruction the compiled code must contain: "target" (the target's own), another name from
    # `ops_for(target)`, or None where the kernel has none (a merge step)
    matrix_op: str | None = "target"


@dataclass(frozen=True)
class Report:
    name: str
    target: str
    registers: int  # per thread (VGPRs on AMD)
    stack: int  # NVIDIA stack bytes; AMD private segment (scratch) bytes
    local: int  # NVIDIA local bytes; AMD VGPRs spilled to scratch (SGPR spills go to VGPR lanes, not memory)
    shared: int
    smem_limit: int
    sass: dict[str, int]  # instruction counts (`ops_for(target)`); named for the SASS it was first read from
    matrix_op: str | None
    spill_free_required: bool
    allocated: bool = True  # registers allocated at compile time (False for Intel: IGC does it at load time)
    stack_cap: int | None = None  # `KernelConfig.max_stack`

    @property
    def spills(self) -> bool:
        """Registers spilled and reloaded: local memory, or any local load. (A stack frame written but never read
        back is not a spill: on sm_120 in-kernel descriptors are staged through 8 bytes of stack with STL only.)
        Unknown, and reported as none, where registers are allocated at load time."""
        if not self.allocated:
            return False
        if self.sass.get("LDL") is None:  # AMD: scratch or VGPRs spilled to it
            return bool(self.stack or self.local)
        return bool(self.local or self.sass["LDL"])

    @property
    def fits(self) -> bool:
        return self.shared <= self.smem_limit

    @property
    def within_stack_cap(self) -> bool:
        return self.stack_cap is None or self.stack <= self.stack_cap

    @property
    def ok(self) -> bool:
        return (not (self.spill_free_required and self.spills) and self.within_stack_cap and self.fits
                and (self.matrix_op is None or self.sass.get(self.matrix_op, 0) > 0))

    def verdict(self) -> str:
        if self.ok:
            if not self.allocated:
                return "ok (registers at load)"
            return "ok (spills tolerated)" if self.spills else "ok"
        if not self.fits:
            return "SHARED MEMORY"
        if not self.within_stack_cap:
            return f"STACK > {self.stack_cap}"
        return "SPILLS" if self.spills else f"no {self.matrix_op}"



def compile_config(cfg: KernelConfig, target: Target = TARGETS["sm_90"]):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if cfg.gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    sig = {name: "constexpr" if name in cfg.constexprs else cfg.arg_types.get(name, "i32")
           for name in cfg.fn.arg_names}
    attrs = {(cfg.fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in cfg.divisible}
    src = ASTSource(cfg.fn, sig, constexprs=cfg.constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget(*target.gpu_target),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def _matrix_op(cfg: KernelConfig, target: Target) -> str | None:
    return target.matrix_op if cfg.matrix_op == "target" else cfg.matrix_op


def _tool(name: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def analyse(cfg: KernelConfig, target: Target = TARGETS["sm_90"]) -> Report:
    if target.backend == "xpu":
        os.environ.setdefault("CC", "g++")  # the Intel backend compiles a SYCL (C++) helper with $CC on first use
    compiled = compile_config(cfg, target)
    if target.backend == "xpu":
        llir = compiled.asm["llir"]
        counts = {op: len(re.findall(rx, llir)) for op, rx in XPU_OPS.items()}
        return Report(cfg.name, target.name, 0, 0, 0, int(compiled.metadata.shared), target.smem, counts,
                      _matrix_op(cfg, target), cfg.spill_free, allocated=False, stack_cap=cfg.max_stack)
    if target.backend == "hip":
        asm = compiled.asm["amdgcn"]
        meta = dict(re.findall(r"^\s*\.(vgpr_count|vgpr_spill_count|private_segment_fixed_size):"
                               r"\s*(\d+)", asm, re.M))
        counts = {op: len(re.findall(rx, asm)) for op, rx in AMDGCN_OPS.items()}
        spills = int(meta.get("vgpr_spill_count", 0))
        return Report(cfg.name, target.name, int(meta.get("vgpr_count", 0)),
                      int(meta.get("private_segment_fixed_size", 0)), spills, int(compiled.metadata.shared),
                      target.smem, counts, _matrix_op(cfg, target), cfg.spill_free, stack_cap=cfg.max_stack)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    usage = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", res))
    counts = {op: len(re.findall(rx, sass)) for op, rx in ops_for(target).items()}
    return Report(cfg.name, target.name, int(usage.get("REG", 0)), int(usage.get("STACK", 0)),
                  int(usage.get("LOCAL", 0)), int(compiled.metadata.shared), target.smem, counts,
                  _matrix_op(cfg, target), cfg.spill_free, stack_cap=cfg.max_stack)
