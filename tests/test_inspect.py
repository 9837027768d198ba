"""`xkernels inspect` in CI: every shipped config compiles for every target with its matrix instruction, within the
target's shared memory and, where required, with zero spills."""

import json
import os
import subprocess
import sys

import triton

from xkernels.common.runtime import GLUON_COMPILES
from xkernels.common.targets import INTEL_TARGETS, TARGETS


def test_inspect_all_configs_spill_free(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # inspect compiles; it never interprets
    path = tmp_path / "inspect.json"
    proc = subprocess.run([sys.executable, "-m", "xkernels.cli.main", "inspect", "--target", "all", "--json",
                           str(path)], env=env, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = json.loads(path.read_text())
    expected = {"portable.attention", "portable.gemm", "portable.attention_bwd.dkdv", "portable.attention_bwd.dq",
                "portable.attention_varlen", "portable.decode", "portable.decode.combine"}
    if triton.__version__.startswith(GLUON_COMPILES):
        expected |= {"hopper.gemm", "hopper.attention", "hopper.attention_varlen", "hopper.attention_bwd.dkdv",
                     "hopper.attention_bwd.dq"}
    assert {r["name"].split()[0] for r in reports if r["target"] == "sm_90"} >= expected
    assert {r["target"] for r in reports} == set(TARGETS) - INTEL_TARGETS  # xe2: .ci/intel_xe2.sh
    for r in reports:
        where = f"{r['target']} {r['name']}"
        assert r["matrix_op"] is None or r["sass"][r["matrix_op"]] > 0, where  # None: a merge step, no matmul
        assert r["shared"] <= r["smem_limit"], where
        if r["spill_free_required"]:
            assert not r["spills"] and r["local"] == 0 and not r["sass"].get("LDL"), where
