"""`xkernels inspect` in CI: every shipped config compiles for sm_90 with HGMMA and, where required, zero spills."""

import json
import os
import subprocess
import sys

import triton

from xkernels.common.runtime import GLUON_COMPILES


def test_inspect_all_configs_spill_free(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # inspect compiles; it never interprets
    path = tmp_path / "inspect.json"
    proc = subprocess.run([sys.executable, "-m", "xkernels.cli.main", "inspect", "--json", str(path)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reports = json.loads(path.read_text())
    expected = {"portable.attention", "portable.gemm"}
    if triton.__version__.startswith(GLUON_COMPILES):
        expected |= {"hopper.gemm", "hopper.attention"}
    assert {r["name"].split()[0] for r in reports} >= expected
    for r in reports:
        assert r["sass"]["HGMMA"] > 0, r["name"]
        if r["spill_free_required"]:
            assert r["stack"] == 0 and r["local"] == 0 and r["sass"]["LDL"] == 0 == r["sass"]["STL"], r["name"]
