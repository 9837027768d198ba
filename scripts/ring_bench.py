"""Ring attention on W GPUs of one host (NCCL) against one GPU running the whole sequence, B1 H32 D128 bf16: forward
and forward + backward, causal (zigzag) and full (contiguous), at S = 32K, 64K, 128K. Also the ring with its
transfers removed (each step attends the rank's own shard: the compute alone) and the transfers alone, to show how
much of the communication the attention hides; and each rank's O and gradients against the one-GPU run of the same
inputs (the recipe's contract; at 4K also against float64). A peer at the timed lengths: torch's own context
parallelism (F.scaled_dot_product_attention under torch.distributed.tensor.experimental.context_parallel, on its own
copies of the inputs: head-tail sharding, the zigzag, when causal, contiguous for full; K/V rotated by its default,
all-gather; its dK/dV by all-to-all) with its O and gradients against the one-GPU run; its failure (e.g. SDPA on CPU)
is recorded as torch_cp_error. Device time: CUDA events around each call after a barrier, median of the runs; one
JSON from rank 0.

    python scripts/ring_bench.py --gpus 2 --json ring.json [--lengths 32768 65536 131072]
    TRITON_INTERPRET=1 python scripts/ring_bench.py --cpu --gpus 2 --json ring.json --lengths 48  # a dry run
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.attention import SDPBackend

import xkernels
from xkernels.distributed import ring_attention, shard
from xkernels.distributed.ring import _Ring
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare_attention,
    compare_ring_grad,
    reference_attention,
    reference_attention_grads,
)

D = 128
RUNS = 3


def timed(fn, runs: int = RUNS) -> float:
    """Median milliseconds of fn() across ranks' lockstep runs (a barrier before each)."""
    fn()
    times = []
    for _ in range(runs):
        dist.barrier()
        if not torch.cuda.is_available():  # the CPU dry run
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def fwd_bwd(fn, leaves, do):
    def step():
        for t in leaves:
            t.grad = None
        fn().backward(do)

    return step


def torch_cp(
    world: int, causal: bool, inputs: list[torch.Tensor], do: torch.Tensor, want: list[torch.Tensor], layout: str
) -> dict:
    """torch's context parallelism on copies of the full `inputs` (q, k, v) and `do`: its timings and its O, dq, dk,
    dv against `want`, the one-GPU run's (full tensors). Any failure is recorded as torch_cp_error, after the context
    manager has exited cleanly (SDPA restored) and the load-balance option is put back: the later rows run as before."""
    recipe, row = ATTENTION_RECIPES["bf16"], {}
    try:
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import _cp_options  # or its shim
    except ImportError as e:
        return {"torch_cp_error": f"{type(e).__name__}: {e}"}
    balance = _cp_options.enable_load_balance
    try:
        row["torch_cp_backend"] = SDPBackend(torch._fused_sdp_choice(*inputs, is_causal=causal)).name
        row["torch_cp_rotate"] = _cp_options.rotate_method.name
        mesh = init_device_mesh(do.device.type, (world,))
        bufs = [t.detach().clone() for t in (*inputs, do)]  # sharded in place, not restored
        _cp_options.enable_load_balance = causal  # head-tail for causal; full attention refuses it
        failed = ""
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * 4, no_restore_buffers=set(bufs)):
            try:  # nothing raises through the yield: torch releases without its try/finally leave SDPA patched
                leaves = [b.requires_grad_() for b in bufs[:3]]  # after the sharding: resize_ refuses grad leaves
                cp = lambda: F.scaled_dot_product_attention(*leaves, is_causal=causal)  # the patched one, looked up
                o = cp()
                o.backward(bufs[3])
                ok = [compare_attention(o.detach(), shard(want[0], layout=layout), recipe).passed]
                ok += [
                    compare_ring_grad(a.grad, shard(b, layout=layout), recipe, world).passed
                    for a, b in zip(leaves, want[1:], strict=True)
                ]
                row["torch_cp_checks"] = dict(zip(("O", "dq", "dk", "dv"), ok, strict=True))
                del o
                row |= {"torch_cp_fwd_ms": timed(cp), "torch_cp_fwd_bwd_ms": timed(fwd_bwd(cp, leaves, bufs[3]))}
            except Exception as e:
                failed = f"{type(e).__name__}: {e}"
        if failed:
            row["torch_cp_error"] = failed
    except Exception as e:  # a peer's failure is a result
        row["torch_cp_error"] = f"{type(e).__name__}: {e}"
    finally:
        _cp_options.enable_load_balance = balance
    return row


def case(world: int, s: int, causal: bool, layout: str, device: str, heads: int, check_len: int) -> dict:
    recipe = ATTENTION_RECIPES["bf16"]
    q, k, v = attention_inputs(1, heads, s, s, D, torch.bfloat16, device, seed=s)
    do = (torch.rand(q.shape, device=device, generator=torch.Generator(device).manual_seed(1)) - 0.5).bfloat16()
    shards = [shard(t, layout=layout).requires_grad_() for t in (q, k, v)]
    do_shard = shard(do, layout=layout)
    full = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    own = [t.detach() for t in shards]
    comm = _Ring(None)

    def ring():
        return ring_attention(*shards, is_causal=causal, layout=layout)

    def one():
        return xkernels.attention(*full, is_causal=causal)

    def compute_only():  # the ring's W steps of attention on the rank's own shard, no transfers
        for _ in range(world):
            xkernels.attention(*own, is_causal=causal)

    def comm_only():  # the ring's W - 1 K/V transfers, no attention
        kv = own[1:]
        for _ in range(world - 1):
            kv, reqs = comm.shift(kv)
            for r in reqs:
                r.wait()

    # correctness: the ring against the one-GPU run (and float64 at 4K)
    o = ring()
    o.backward(do_shard)
    o1 = one()
    o1.backward(do)
    checks = {"O": compare_attention(o.detach(), shard(o1.detach(), layout=layout), recipe).passed}
    for name, a, b in zip("qkv", shards, full, strict=True):
        checks[f"d{name}"] = compare_ring_grad(a.grad, shard(b.grad, layout=layout), recipe, world).passed
    row = {"S": s, "causal": causal, "layout": layout, "world": world, "checks": checks}
    if s <= check_len:
        ref = reference_attention(q, k, v, is_causal=causal)
        grads = reference_attention_grads(q, k, v, do, is_causal=causal)
        checks["O float64"] = compare_attention(o.detach(), shard(ref, layout=layout), recipe).passed
        for name, a, g in zip("qkv", shards, grads, strict=True):
            checks[f"d{name} float64"] = compare_ring_grad(a.grad, shard(g, layout=layout), recipe, world).passed
        return row
    row |= {
        "ring_fwd_ms": timed(ring),
        "ring_fwd_bwd_ms": timed(fwd_bwd(ring, shards, do_shard)),
        "compute_only_fwd_ms": timed(compute_only),
        "comm_only_fwd_ms": timed(comm_only),
        # one GPU, the whole sequence (every rank runs it on its own GPU, in lockstep)
        "one_gpu_fwd_ms": timed(one),
        "one_gpu_fwd_bwd_ms": timed(fwd_bwd(one, full, do)),
    }
    row["fwd_ratio"] = row["ring_fwd_ms"] / row["one_gpu_fwd_ms"]
    row["fwd_bwd_ratio"] = row["ring_fwd_bwd_ms"] / row["one_gpu_fwd_bwd_ms"]
    row |= torch_cp(world, causal, [q, k, v], do, [o1.detach(), *(t.grad for t in full)], layout)
    if "torch_cp_fwd_ms" in row:
        row["torch_cp_fwd_ratio"] = row["torch_cp_fwd_ms"] / row["one_gpu_fwd_ms"]
        row["torch_cp_fwd_bwd_ratio"] = row["torch_cp_fwd_bwd_ms"] / row["one_gpu_fwd_bwd_ms"]
    return row


def worker(rank: int, world: int, port: int, lengths: list[int], path: str, cpu: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if cpu:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        device, heads, check_len = "cpu", 2, 2 * world * 4
    else:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
        device, heads, check_len = "cuda", 32, 4096
    rows = []
    for s in [check_len, *lengths]:
        for causal, layout in ((True, "zigzag"), (False, "contiguous")):
            rows.append(case(world, s, causal, layout, device, heads, check_len))
            if not cpu:
                torch.cuda.empty_cache()
            if rank == 0:
                print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
                name = "cpu" if cpu else torch.cuda.get_device_name()
                json.dump({"device": name, "gpus": world, "rows": rows}, open(path, "w"), indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--json", required=True)
    ap.add_argument("--lengths", type=int, nargs="+", default=[32768, 65536, 131072])
    ap.add_argument("--cpu", action="store_true", help="a dry run on CPU processes over gloo (interpreter)")
    args = ap.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(worker, args=(args.gpus, port, args.lengths, args.json, args.cpu), nprocs=args.gpus)


if __name__ == "__main__":
    main()
