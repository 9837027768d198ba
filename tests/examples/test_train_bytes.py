"""The training example runs end to end (a few steps of the tiny model; under the interpreter on CPU): its xkernels
and SDPA runs start from the same weights and their losses stay together, dense and packed (documents through
`attention_varlen` against SDPA's block-diagonal mask). (The gradients themselves are checked
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
    # the same batch each step: the corpus is the repository's source, so fresh batches change with every commit,
    # and three steps over them need not lower the loss; on a batch it has seen, a model that learns must
    result = train.main(["--steps", "3", "--tiny", "--same-batch", "--device",
                         "cuda" if torch.cuda.is_available() else "cpu", "--out", str(tmp_path)])
    losses = result["losses"]
    assert set(losses) == {"xkernels", "sdpa", "sdpa-math"}
    assert all(math.isfinite(x) for ls in losses.values() for x in ls)
    assert losses["xkernels"][0] == losses["sdpa"][0] or abs(losses["xkernels"][0] - losses["sdpa"][0]) < 1e-3
    assert result["agreement"]["xkernels_vs_sdpa"] < 1e-2  # measured 3e-4

    assert losses["xkernels"][-1] < losses["xkernels"][0]
    assert (tmp_path / "train.json").exists()
    assert (tmp_path / "train.png").exists() == (importlib.util.find_spec("matplotlib") is not None)


def test_packed_attention_is_the_document_mask():
    """--packed: xkernels' varlen call over the cut rows computes SDPA's block-diagonal causal attention (and not the
    rows' plain causal attention, which the documents' boundaries change)."""
    train = _load()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = train.Config(packed=True, **train.TINY)
    docs = train.documents(cfg, torch.Generator().manual_seed(5), device)
    assert int(docs.cu_seqlens[-1]) == cfg.batch * cfg.seq and len(docs.cu_seqlens) > cfg.batch + 1
    g = torch.Generator().manual_seed(6)
    q, k, v = ((torch.rand(cfg.batch, h, cfg.seq, cfg.head_dim, generator=g) - 0.5).to(torch.bfloat16).to(device)
               for h in (cfg.heads, cfg.kv_heads, cfg.kv_heads))
    ours = train.attention_xkernels(q, k, v, docs).float()
    want = train.attention_sdpa_math(*(t.float() for t in (q, k, v)), docs)
    plain = train.attention_sdpa_math(*(t.float() for t in (q, k, v)))
    err = (ours - want).norm() / want.norm()
    assert err < 1e-2, err
    assert (ours - plain).norm() / plain.norm() > 10 * err


def test_tiny_packed_training_runs_and_agrees_with_sdpa(tmp_path):
    train = _load()
    result = train.main(["--steps", "3", "--tiny", "--packed", "--same-batch", "--device",
                         "cuda" if torch.cuda.is_available() else "cpu"])
    losses = result["losses"]
    assert all(math.isfinite(x) for ls in losses.values() for x in ls)
    assert result["agreement"]["xkernels_vs_sdpa"] < 1e-2  # measured 3e-4
    assert losses["xkernels"][-1] < losses["xkernels"][0]
