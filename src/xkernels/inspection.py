"""Compile every shipped kernel config for Hopper without a GPU and read what the compiler made of it.

The seeds' "check for spills before benchmarking" step: registers, stack and local memory (spills), shared memory,
and counts of the instructions that matter on sm_90 (HGMMA tensor-core ops, UTMALDG/UTMASTG TMA copies, BAR
barriers, LDL/STL local-memory traffic) from the cubin through the cuobjdump and nvdisasm that ship in triton's wheel.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

from xkernels.common.dtypes import POINTER_TYPE, SHORT_NAME

TARGET = ("cuda", 90, 32)
SASS_OPS = ("HGMMA", "UTMALDG", "UTMASTG", "BAR", "LDL", "STL")


def _attention_types(io: torch.dtype, v: torch.dtype | None = None) -> dict[str, str]:
    """Argument types of the attention kernels' shared runtime arguments (`plans.attention_args`)."""
    p = POINTER_TYPE[io]
    return {"Q": p, "K": p, "V": POINTER_TYPE[v or io], "O": p, "LSE": "*fp32", "qk_scale": "fp32"}


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


@dataclass(frozen=True)
class Report:
    name: str
    registers: int
    stack: int
    local: int
    shared: int
    sass: dict[str, int]
    spill_free_required: bool

    @property
    def spills(self) -> bool:
        return bool(self.stack or self.local or self.sass.get("LDL") or self.sass.get("STL"))

    @property
    def ok(self) -> bool:
        return not (self.spill_free_required and self.spills) and self.sass.get("HGMMA", 0) > 0


def portable_configs() -> Iterator[KernelConfig]:
    from xkernels.portable import attention_fwd as attn
    from xkernels.portable import gemm
    from xkernels.portable.configs import ATTENTION_CONFIGS, GEMM_CONFIGS, attention_config
    from xkernels.recipes import ATTENTION_RECIPES

    for d in sorted(ATTENTION_CONFIGS):
        for recipe in ATTENTION_RECIPES.values():
            cfg = attention_config(d, recipe)
            for causal in (False, True):
                yield KernelConfig(
                    f"portable.attention {recipe.name} D{d}{' causal' if causal else ''} {cfg}",
                    attn.attention_fwd_kernel, _attention_types(recipe.io_dtype),
                    cfg.constexprs(d, recipe, causal=causal, write_lse=True, interpret=False),
                    cfg.num_warps, cfg.num_stages)
    for dtype, out in ((torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                       (torch.float16, torch.float32), (torch.bfloat16, torch.float32)):
        g = GEMM_CONFIGS[out.itemsize]
        dt = SHORT_NAME[dtype]
        for lay in ("kn", "nk"):
            for walk in ("row", "grouped", "zorder"):
                yield KernelConfig(
                    f"portable.gemm {dt}->{SHORT_NAME[out]} {lay} {walk} {g}", gemm.gemm_kernel,
                    {"A": POINTER_TYPE[dtype], "B": POINTER_TYPE[dtype], "C": POINTER_TYPE[out]},
                    g.constexprs(lay, walk, interpret=False), g.num_warps, g.num_stages)


def hopper_configs() -> Iterator[KernelConfig]:
    from triton.experimental.gluon import language as gl

    from xkernels.hopper import attention_fwd as attn
    from xkernels.hopper import gemm
    from xkernels.hopper.configs import ATTENTION_CONFIGS, GEMM_CONFIG
    from xkernels.recipes import ATTENTION_RECIPES

    for d, ac in sorted(ATTENTION_CONFIGS.items()):
        for recipe in ATTENTION_RECIPES.values():
            for causal in (False, True):
                yield KernelConfig(
                    f"hopper.attention {recipe.name} D{d}{' causal' if causal else ''} {ac}",
                    attn.attention_fwd_kernel,
                    _attention_types(recipe.io_dtype, torch.float16 if recipe.converts_v else None),
                    ac.constexprs(d, recipe, causal=causal, positive_scale=True, write_lse=True), 4, gluon=True)

    c = GEMM_CONFIG
    for dt, gdt in (("fp16", gl.float16), ("bf16", gl.bfloat16)):
        for lay in ("kn", "nk"):
            for walk in ("row", "grouped", "zorder"):
                descs = {name: f"tensordesc<{dt}[{shape[0]}, {shape[1]}],"
                               f"{gl.NVMMASharedLayout.get_default_for(shape, gdt)}>"
                         for name, shape in zip(("a_desc", "b_desc", "c_desc"), c.blocks(lay), strict=True)}
                yield KernelConfig(f"hopper.gemm {dt} {lay} {walk} {c}", gemm.persistent_gemm_kernel, descs,
                                   c.constexprs(lay, walk), c.num_warps, gluon=True)


def all_configs() -> Iterator[KernelConfig]:
    """Every shipped config; the Gluon ones on the triton releases in `runtime.GLUON_COMPILES`."""
    from xkernels.common.runtime import GLUON_COMPILED

    yield from portable_configs()
    if GLUON_COMPILED:
        yield from hopper_configs()


def compile_config(cfg: KernelConfig):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {name: "constexpr" if name in cfg.constexprs else cfg.arg_types.get(name, "i32")
           for name in cfg.fn.arg_names}
    src = (GluonASTSource if cfg.gluon else ASTSource)(cfg.fn, sig, constexprs=cfg.constexprs)
    return triton.compile(src, target=GPUTarget(*TARGET),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def _tool(name: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def analyse(cfg: KernelConfig) -> Report:
    compiled = compile_config(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    usage = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", res))
    counts = {op: len(re.findall(rf"\b{op}(?:\.|\b)", sass)) for op in SASS_OPS}
    return Report(cfg.name, int(usage.get("REG", 0)), int(usage.get("STACK", 0)), int(usage.get("LOCAL", 0)),
                  int(compiled.metadata.shared), counts, cfg.spill_free)
