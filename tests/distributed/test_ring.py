"""Ring attention on W = 1, 2, 3 processes over gloo (the kernels through the interpreter on CPU, compiled on a GPU
machine's CPU tensors never: the worker keeps its tensors on the CPU): each rank's O and dQ, dK, dV against the
float64 full-sequence reference, sharded the same way; contiguous and zigzag, causal and not, GQA; and the same
checks failing on a broken ring (shards attended in the wrong layout, the causal mask dropped); a step under
torch.compile gets the eager gradients."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import xkernels
from xkernels.distributed import ring_attention, shard, unshard
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare_attention,
    compare_ring_grad,
    reference_attention,
    reference_attention_grads,
)

CASES = [  # (layout, causal, hq, hkv, dtype)
    ("contiguous", False, 2, 2, torch.float16),
    ("contiguous", True, 2, 1, torch.bfloat16),
    ("zigzag", True, 2, 2, torch.float16),
    ("zigzag", False, 2, 1, torch.bfloat16),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_case(layout, causal, hq, hkv, dtype, *, world, run_layout=None, run_causal=None) -> list[str]:
    """This rank's failures (empty: all checks pass) for one configuration. `run_layout` / `run_causal` run the ring
    with another layout or mask than the reference's (a broken ring)."""
    s = 4 * world * 3  # 12 rows a rank: zigzag chunks of 6
    q, k, v = attention_inputs(1, hq, s, s, 64, dtype, "cpu", hkv=hkv, seed=s + hq + hkv)
    g = torch.Generator().manual_seed(1)
    do = (torch.rand(q.shape, generator=g) - 0.5).to(dtype)
    recipe = ATTENTION_RECIPES["fp16" if dtype == torch.float16 else "bf16"]
    ref_o = reference_attention(q, k, v, is_causal=causal)
    ref_grads = reference_attention_grads(q, k, v, do, is_causal=causal)
    leaves = [shard(t, layout=layout).requires_grad_() for t in (q, k, v)]
    o = ring_attention(*leaves, is_causal=causal if run_causal is None else run_causal, enable_gqa=hq != hkv,
                       layout=run_layout or layout)
    o.backward(shard(do, layout=layout))
    fails = []
    checks = [("O", compare_attention(o.detach(), shard(ref_o, layout=layout), recipe))]
    checks += [(f"d{name}", compare_ring_grad(leaf.grad, shard(ref, layout=layout), recipe, world))
               for name, leaf, ref in zip("qkv", leaves, ref_grads, strict=True)]
    for name, c in checks:
        if not c.passed:
            fails.append(f"{name}: {c.reason}")
    full = unshard(o.detach(), layout=layout)  # every rank's O reassembled is the full sequence's
    if not compare_attention(full, ref_o, recipe).passed:
        fails.append("unshard(O)")
    return fails


def _check_compiled() -> list[str]:
    """A training step under torch.compile runs the ring eagerly (a graph break) and gets the eager gradients."""
    q, k, v = attention_inputs(1, 2, 24, 24, 64, torch.float16, "cpu", seed=5)
    leaves = [shard(t, layout="zigzag").requires_grad_() for t in (q, k, v)]

    def step(q, k, v):
        return ring_attention(q, k, v, is_causal=True, layout="zigzag").float().square().sum()

    step(*leaves).backward()
    eager = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    torch.compile(step)(*leaves).backward()
    return [f"d{n} differs" for n, t, g in zip("qkv", leaves, eager, strict=True) if not torch.equal(t.grad, g)]


def _worker(rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = {}
        for case in CASES:
            out[str(case)] = _check_case(*case, world=world)
        if world > 1:  # broken rings: each must fail somewhere
            out["broken: zigzag shards attended as contiguous"] = _check_case("zigzag", True, 2, 2, torch.float16,
                                                                              world=world, run_layout="contiguous")
            out["broken: causal mask dropped"] = _check_case("contiguous", True, 2, 2, torch.float16, world=world,
                                                             run_causal=False)
        if world == 2:
            out["torch.compile"] = _check_compiled()
        results.put((rank, out))
    finally:
        dist.destroy_process_group()


def _run(world: int, worker=None) -> dict[int, dict[str, list[str]]]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(worker or _worker, args=(world, _free_port(), results), nprocs=world, start_method="spawn")
    return dict(results.get(timeout=60) for _ in range(world))


def _raised(fn, match: str) -> str:
    """'' when fn() raises a ValueError containing `match`, else what happened instead."""
    try:
        fn()
    except ValueError as e:
        return "" if match in str(e) else f"ValueError without {match!r}: {e}"
    return f"no error (wanted {match!r})"


def _disagreeing_worker(rank: int, world: int, port: int, results) -> None:
    """Ranks whose shards or arguments disagree each raise, naming what differs, before any K/V moves (the receive
    buffers take the local shard's shape: a longer shard elsewhere would corrupt this rank's steps); a rank outside
    the group is told so (torch's -1 rank and size would run no ring step and return uninitialized memory)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        q, k, v = attention_inputs(1, 2, 8, 8, 64, torch.float16, "cpu", seed=rank)
        rows = 8 if rank == 0 else 6
        out = {"length": _raised(lambda: ring_attention(q[:, :, :rows], k[:, :, :rows], v[:, :, :rows]),
                                 "disagree on q shape, k shape, v shape"),
               "causal": _raised(lambda: ring_attention(q, k, v, is_causal=rank == 0), "disagree on is_causal"),
               "heads": _raised(lambda: ring_attention(q, k[:, :1 + rank], v[:, :1 + rank], enable_gqa=True),
                                "disagree on k shape, v shape")}
        first = dist.new_group([0])  # every rank creates it; rank 1 is not in it
        if rank == 1:
            out["outside"] = _raised(lambda: ring_attention(q, k, v, group=first), "not a member")
        results.put((rank, out))
    finally:
        dist.destroy_process_group()


def test_ranks_that_disagree_raise_on_every_rank():
    if torch.cuda.is_available():
        pytest.skip("CPU tensors through the interpreter")
    for rank, out in _run(2, _disagreeing_worker).items():
        for case, failure in out.items():
            assert not failure, f"rank {rank}, {case}: {failure}"


@pytest.mark.parametrize("world", [2, 3])
def test_ring_attention_matches_float64(world):
    if torch.cuda.is_available():
        pytest.skip("the gloo run keeps CPU tensors, which the GPU machine's compiled kernels do not take")
    by_rank = _run(world)
    for rank, out in by_rank.items():
        for case, fails in out.items():
            if case.startswith("broken"):
                continue
            assert not fails, f"rank {rank}, {case}: {fails}"
    for broken in ("broken: zigzag shards attended as contiguous", "broken: causal mask dropped"):
        assert any(out[broken] for out in by_rank.values()), broken


def test_one_rank_is_plain_attention_and_bad_input_is_named():
    if torch.cuda.is_available():
        pytest.skip("CPU tensors through the interpreter")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        q, k, v = attention_inputs(1, 2, 10, 10, 64, torch.float16, "cpu", seed=3)
        assert torch.equal(ring_attention(q, k, v, is_causal=True), xkernels.attention(q, k, v, is_causal=True))
        with pytest.raises(ValueError, match="layout"):
            ring_attention(q, k, v, layout="striped")
        with pytest.raises(ValueError, match="odd"):
            ring_attention(q[:, :, :9], k[:, :, :9], v[:, :, :9], layout="zigzag")
        with pytest.raises(ValueError, match="same positions"):
            ring_attention(q, k[:, :, :8], v[:, :, :8])
        with pytest.raises(TypeError, match="is_causal"):
            ring_attention(q, k, v, is_causal=1)
        fwad = torch.autograd.forward_ad
        with fwad.dual_level(), pytest.raises(NotImplementedError, match="k: carries a forward-mode AD tangent"):
            ring_attention(q, fwad.make_dual(k, torch.ones_like(k)), v)
        with pytest.raises(ValueError, match="multiple of 2"):
            shard(q[:, :, :9], layout="zigzag")
    finally:
        dist.destroy_process_group()


def test_uninitialized_group_is_named():
    if dist.is_initialized():
        pytest.skip("a process group is up")
    q = torch.zeros(1, 1, 4, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="not initialized"):
        ring_attention(q, q, q)
