"""The CLI as a user runs it: a fresh process, no TRITON_INTERPRET set by anyone but the CLI itself."""

import json
import os
import subprocess
import sys

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU sweep runs in scripts/gpu_session.sh")
@pytest.mark.parametrize("command", ["check", "bench"])
def test_cli_runs_cpu_sweep_without_gpu(tmp_path, command):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    path = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "xkernels.cli.main", command, "--json", str(path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Triton interpreter" in proc.stdout
    if command == "bench":
        assert "no timings are made up" in proc.stdout
    rows = json.loads(path.read_text())["rows"]
    assert rows and all(r["passed"] for r in rows)
