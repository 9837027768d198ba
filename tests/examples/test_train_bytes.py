"""The training example runs end to end (a few steps of the tiny model; under the interpreter on CPU): its xkernels
and SDPA runs start from the same weights and their losses stay together. (The gradients themselves are checked
against float64 in tests/test_backward.py; three steps move the loss too little to tell a subtly wrong backward
from bf16 noise: halving dV moves it by 1e-3, against 3e-4 of noise.)"""

import importlib.util
import math
import sys
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_bytes.py"


def _load():
    spec = importlib.util.spec_from_file_location("train_bytes", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_bytes"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_tiny_training_runs_and_agrees_with_sdpa(tmp_path):
    train = _load()
    result = train.main(["--steps", "3", "--tiny", "--device", "cuda" if torch.cuda.is_available() else "cpu",
                         "--out", str(tmp_path)])
    losses = result["losses"]
    assert set(losses) == {"xkernels", "sdpa", "sdpa-math"}
    assert all(math.isfinite(x) for ls in losses.values() for x in ls)
    assert losses["xkernels"][0] == losses["sdpa"][0] or abs(losses["xkernels"][0] - losses["sdpa"][0]) < 1e-3
    assert result["agreement"]["xkernels_vs_sdpa"] < 1e-2  # measured 3e-4

    assert losses["xkernels"][-1] < losses["xkernels"][0]
    assert (tmp_path / "train.json").exists()
    assert (tmp_path / "train.png").exists() == (importlib.util.find_spec("matplotlib") is not None)
