"""The CPU matrix at real sizes, on a CUDA device (skipped without one). Real bf16 tensor-core numerics live here."""

import dataclasses

import pytest
import torch

import xkernels
from tests.helpers import poisoned_like
from xkernels.hopper.configs import ATTENTION_CONFIGS
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.select import DECODE_MAX_SQ
from xkernels.testing import (
    attention_inputs,
    compare_attention,
    compare_gemm,
    compare_lse,
    gemm_inputs,
    reference_attention,
    reference_lse,
    reference_matmul,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("sq,skv", [(1024, 1024), (1000, 3001), (2049, 513), (1, 4096)])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("recipe", list(ATTENTION_RECIPES))
@pytest.mark.parametrize("layer", ["portable", "hopper"])
def test_attention_real_sizes(layer, recipe, d, causal, hq, hkv, sq, skv):
    rec = ATTENTION_RECIPES[recipe]
    q, k, v = attention_inputs(2, hq, sq, skv, d, rec.io_dtype, "cuda", hkv=hkv, seed=sq + skv + d)
    o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv, precision=recipe,
                                return_lse=True, out=poisoned_like(q), backend=layer)
    kernel = "decode" if layer == "portable" and sq <= DECODE_MAX_SQ else "attention"  # few rows: split-KV
    assert xkernels.last_backend().startswith(f"{layer}.{kernel}[{recipe}")
    again = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv, precision=recipe, backend=layer)
    c = compare_attention(o, reference_attention(q, k, v, is_causal=causal), rec)
    assert c.passed, c
    assert compare_lse(lse, reference_lse(q, k, is_causal=causal)).passed
    assert torch.equal(o, again), "two runs on the same inputs differ"


@pytest.mark.parametrize("scale", [-0.3, 0.0, 2.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layer", ["portable", "hopper"])
def test_attention_any_scale(layer, causal, scale):
    """The Hopper softmax takes the row max before scaling only when scale > 0; other scales take the general path."""
    q, k, v = attention_inputs(1, 4, 300, 257, 128, torch.bfloat16, "cuda", seed=5)
    o, lse = xkernels.attention(q, k, v, is_causal=causal, scale=scale, out=poisoned_like(q), return_lse=True,
                                backend=layer)
    c = compare_attention(o, reference_attention(q, k, v, is_causal=causal, scale=scale), ATTENTION_RECIPES["bf16"])
    assert c.passed, c
    assert compare_lse(lse, reference_lse(q, k, is_causal=causal, scale=scale)).passed


# the Hopper kernel's switches, each off its shipped value, on both fp16 P.V recipes; convert_steps only on bf16io
_ABLATIONS = [(128, dict(overlap=0)), (128, dict(stages=3, block_n=64)), (64, dict(overlap=1)), (64, dict(consumers=2)),
              (64, dict(consumers=2, overlap=1)), (128, dict(stages=3))]
_CONVERT_STEPS = [(128, dict(convert_steps=2)), (256, dict(convert_steps=8)), (64, dict(convert_steps=8))]


@pytest.mark.parametrize("recipe,d,overrides", [(r, d, o) for r in ("fp16", "bf16io") for d, o in _ABLATIONS]
                         + [("bf16io", d, o) for d, o in _CONVERT_STEPS])
def test_hopper_attention_ablation_configs(recipe, d, overrides):
    rec = ATTENTION_RECIPES[recipe]
    cfg = dataclasses.replace(ATTENTION_CONFIGS[d], **overrides)
    backend = "hopper:" + ",".join(f"{k}={v}" for k, v in overrides.items())
    q, k, v = attention_inputs(2, 4, 1000, 1500, d, rec.io_dtype, "cuda", hkv=2, seed=8)
    for causal in (False, True):
        o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=True, precision=recipe,
                                    out=poisoned_like(q), return_lse=True, backend=backend)
        assert xkernels.last_backend() == f"hopper.attention[{recipe} {cfg}]"
        c = compare_attention(o, reference_attention(q, k, v, is_causal=causal), rec)
        assert c.passed, c
        assert compare_lse(lse, reference_lse(q, k, is_causal=causal)).passed


def test_hopper_attention_acc16_runs_off_contract():
    """The seeds' fp16 P.V accumulator is an ablation switch outside the fp16 contract (rel-RMS 3.4e-3 against 2e-3 at
    8K, run 14): every element written, finite, and within a looser 1e-2 of the reference at this size."""
    rec = ATTENTION_RECIPES["fp16"]
    q, k, v = attention_inputs(2, 4, 1000, 1500, 128, rec.io_dtype, "cuda", hkv=2, seed=11)
    o = xkernels.attention(q, k, v, enable_gqa=True, precision="fp16", out=poisoned_like(q), backend="hopper:acc16=1")
    assert "-acc16" in xkernels.last_backend()  # the config string goes on with -p1 (persistent)
    c = compare_attention(o, reference_attention(q, k, v), rec)
    assert c.nonfinite == 0 and c.rel_rms < 1e-2, c


def test_hopper_attention_rejects_config_it_cannot_run():
    q, k, v = attention_inputs(1, 2, 100, 100, 128, torch.float16, "cuda", seed=1)
    with pytest.raises(ValueError, match="consumers=3 needs"):
        xkernels.attention(q, k, v, backend="hopper:consumers=3")
    with pytest.raises(ValueError, match="convert_steps=3 must be"):
        xkernels.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), precision="bf16io",
                           backend="hopper:convert_steps=3")
    with pytest.raises(ValueError, match="acc16 needs fp16 P.V"):
        xkernels.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), precision="bf16", backend="hopper:acc16=1")


@pytest.mark.parametrize("m,n,k", [(4096, 4096, 4096), (4095, 4097, 1000), (8192, 1024, 512), (1, 4096, 4096)])
@pytest.mark.parametrize("walk", ["row", "grouped", "zorder"])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layer", ["portable", "hopper"])
def test_gemm_real_sizes(layer, dtype, b_layout, walk, m, n, k):
    a, b = gemm_inputs(m, n, k, dtype, "cuda", b_layout, seed=m + n + k)
    c = xkernels.matmul(a, b, b_layout=b_layout, walk=walk, out=poisoned_like(a, shape=(m, n)), backend=layer)
    assert xkernels.last_backend().startswith(f"{layer}.gemm")
    r = compare_gemm(c, reference_matmul(a, b, b_layout), k)
    assert r.passed, r


@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (16, 6144, 4096), (32, 4096, 14336), (7, 28672, 4096)])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_few_row_gemm_real_sizes(b_layout, m, n, k):
    """Decode-time linear layers: the few-row kernel, its K slices summed in a fixed order."""
    a, b = gemm_inputs(m, n, k, torch.bfloat16, "cuda", b_layout, seed=m + n)
    c = xkernels.matmul(a, b, b_layout=b_layout, out=poisoned_like(a, shape=(m, n)))
    assert "skinny" in xkernels.last_backend()
    r = compare_gemm(c, reference_matmul(a, b, b_layout), k)
    assert r.passed, r
    assert torch.equal(c, xkernels.matmul(a, b, b_layout=b_layout))


def test_few_row_gemm_kept_workspace_per_stream_and_under_capture():
    """The split-K workspace kept across calls (`common.scratch`): one set per stream, so two streams running the same
    plan at once stay correct; a CUDA graph captures a per-call workspace from its own pool (no set for the capture
    stream), and its replays interleaved with eager calls stay correct. (A weight of 2048 columns: its 64-column
    blocks fill half the SMs, so K is split; 32-column blocks of wider weights fill them unsplit.)"""
    from xkernels.common import scratch

    a, b = gemm_inputs(16, 2048, 8192, torch.bfloat16, "cuda", "nk", seed=5)
    want = reference_matmul(a, b, "nk")
    xkernels.matmul(a, b, b_layout="nk")
    assert "skinny" in xkernels.last_backend() and "slices=1]" not in xkernels.last_backend()
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = [[poisoned_like(a, shape=(16, 2048)) for _ in range(20)] for _ in streams]
    for _ in range(2):
        for i in range(20):
            for s, o in zip(streams, outs, strict=True):
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    xkernels.matmul(a, b, b_layout="nk", out=o[i])
    torch.cuda.synchronize()
    assert all(compare_gemm(c, want, 8192).passed for o in outs for c in o)
    assert {key for key in scratch._SETS} >= {(0, s.stream_id) for s in streams}
    g, static = torch.cuda.CUDAGraph(), poisoned_like(a, shape=(16, 2048))
    xkernels.matmul(a, b, b_layout="nk", out=static)  # warm (compiled) outside the capture
    before = set(scratch._SETS)
    with torch.cuda.graph(g):
        xkernels.matmul(a, b, b_layout="nk", out=static)
    assert set(scratch._SETS) == before, "no set is made for (or used by) a capture"
    for _ in range(5):
        static.fill_(float("nan"))
        g.replay()
        eager = xkernels.matmul(a, b, b_layout="nk")
        torch.cuda.synchronize()
        assert compare_gemm(static, want, 8192).passed and torch.equal(eager, static)


@pytest.mark.parametrize("m,n,k,split", [(128, 4096, 4096, 2), (100, 4000, 14336, 2), (64, 4096, 4096, 4),
                                         (128, 4096, 4160, 3), (1000, 3000, 2000, 2)])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_hopper_gemm_split_k(b_layout, m, n, k, split):
    """Split-K on the Hopper kernel (tails in M, N and K; a split count that does not divide the k-steps): the last
    arriver of each tile sums every split's partial in split order, so a second call (on counters the first put back
    to zero) is bitwise equal; the unsplit kernel agrees within the GEMM bounds."""
    a, b = gemm_inputs(m, n, k, torch.bfloat16, "cuda", b_layout, seed=m + k)
    backend = f"hopper:split_k={split}"
    c = xkernels.matmul(a, b, b_layout=b_layout, out=poisoned_like(a, shape=(m, n)), backend=backend)
    assert f"SK{split}]" in xkernels.last_backend(), xkernels.last_backend()
    want = reference_matmul(a, b, b_layout)
    r = compare_gemm(c, want, k)
    assert r.passed, r
    for _ in range(3):
        assert torch.equal(c, xkernels.matmul(a, b, b_layout=b_layout, backend=backend))
    whole = xkernels.matmul(a, b, b_layout=b_layout, backend="hopper:split_k=1")
    assert "SK" not in xkernels.last_backend() and compare_gemm(whole, want, k).passed


def test_hopper_gemm_split_k_picked_and_captured():
    """A few hundred rows against a long-K weight: the default splits K; a CUDA graph captures a per-call workspace,
    and its replays interleaved with eager calls on the kept one stay correct."""
    a, b = gemm_inputs(128, 4096, 14336, torch.bfloat16, "cuda", "nk", seed=3)
    want = reference_matmul(a, b, "nk")
    eager = xkernels.matmul(a, b, b_layout="nk")
    assert "SK2]" in xkernels.last_backend(), xkernels.last_backend()
    assert compare_gemm(eager, want, 14336).passed
    g, static = torch.cuda.CUDAGraph(), poisoned_like(a, shape=(128, 4096))
    xkernels.matmul(a, b, b_layout="nk", out=static)
    with torch.cuda.graph(g):
        xkernels.matmul(a, b, b_layout="nk", out=static)
    for _ in range(4):
        static.fill_(float("nan"))
        g.replay()
        again = xkernels.matmul(a, b, b_layout="nk")
        torch.cuda.synchronize()
        assert torch.equal(static, eager) and torch.equal(again, eager)


@pytest.mark.parametrize("m,n,k", [(100, 4000, 4096), (1000, 6000, 4000), (250, 4096, 3000), (2000, 2048, 1000),
                                   (64, 4000, 14328), (64, 4096, 4096)])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_hopper_gemm_tile_picked(b_layout, m, n, k):
    """The shape rule's tiles (`hopper.configs.gemm_config`; on 132 SMs these shapes, with tails in M, N and K, take
    64 x 64, 128 x 128, 64 x 128, 128 x 256 and twice 64 x 32), each picked by the default and right."""
    from xkernels.common.runtime import sm_count
    from xkernels.hopper.configs import gemm_config

    tile = str(gemm_config(m, n, k, sm_count(0)))
    a, b = gemm_inputs(m, n, k, torch.bfloat16, "cuda", b_layout, seed=m + n)
    c = xkernels.matmul(a, b, b_layout=b_layout, out=poisoned_like(a, shape=(m, n)))
    assert f"{tile}]" in xkernels.last_backend(), xkernels.last_backend()
    r = compare_gemm(c, reference_matmul(a, b, b_layout), k)
    assert r.passed, r


@pytest.mark.parametrize("m,n,k,tile,split", [(1536, 1536, 1536, "block_n=128", 1), (1000, 3000, 2000, "block_n=64", 1),
                                              (1536, 1536, 1536, "block_n=128", 2), (100, 4000, 14336, "block_n=64", 3),
                                              (4095, 4097, 1000, "block_n=128", 1), (64, 4096, 4096, "block_n=64", 4),
                                              (1536, 1536, 128, "block_n=128", 1), (1000, 3000, 100, "block_n=64", 1)])
@pytest.mark.parametrize("walk", ["grouped", "zorder"])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_hopper_gemm_pingpong(b_layout, walk, m, n, k, tile, split):
    """Two consumer partitions taking a CTA's work units in turn (2-3 units per CTA at 1536^3 unsplit, 4-5 split;
    units of 2 k-steps, shorter than the 8-stage ring, so the loader fills stages of several units ahead; a Z-order
    walk with tiles outside the grid; split-K whose last arriver is either partition): each output tile's wgmmas are
    the one-consumer kernel's, so the result is bitwise equal to it, and right."""
    a, b = gemm_inputs(m, n, k, torch.bfloat16, "cuda", b_layout, seed=m + n + k)
    # every field named: nothing inherited from the shape's default pick (192-row tiles at 1536^3)
    base = f"hopper:block_m=64,{tile},block_k=64,num_warps=4,stages=8,split_k={split},row_wgs=1"
    c = xkernels.matmul(a, b, b_layout=b_layout, walk=walk, out=poisoned_like(a, shape=(m, n)),
                        backend=base + ",consumers=2")
    assert "-PP]" in xkernels.last_backend(), xkernels.last_backend()
    r = compare_gemm(c, reference_matmul(a, b, b_layout), k)
    assert r.passed, r
    one = xkernels.matmul(a, b, b_layout=b_layout, walk=walk, backend=base + ",consumers=1")
    assert "-PP" not in xkernels.last_backend() and torch.equal(c, one)
    for _ in range(2):
        assert torch.equal(c, xkernels.matmul(a, b, b_layout=b_layout, walk=walk, backend=base + ",consumers=2"))


@pytest.mark.parametrize("fields,match", [
    ("consumers=2,num_warps=8", "consumers=2 must be 1, or 2 with num_warps=4"),
    ("block_m=64,block_n=128,num_warps=4,stages=9,consumers=2", "bytes of shared memory"),
    ("block_m=128,num_warps=4,row_wgs=3", "row_wgs=3 must be 1, or 2 or 3 with num_warps=4"),
    ("block_m=192,block_n=128,num_warps=4,row_wgs=3,split_k=2", "row_wgs=3 must be 1")])
def test_hopper_gemm_config_errors(fields, match):
    a, b = gemm_inputs(256, 256, 256, torch.bfloat16, "cuda", "nk", seed=1)
    with pytest.raises(ValueError, match=match):
        xkernels.matmul(a, b, b_layout="nk", backend="hopper:" + fields)


@pytest.mark.parametrize("m,n,k,rows,tile", [(1536, 1536, 1536, 3, "block_n=128,stages=4"),
                                             (1000, 3000, 2000, 3, "block_n=128,stages=3"),
                                             (3072, 3072, 3072, 3, "block_n=128,stages=4"),
                                             (100, 4000, 100, 3, "block_n=64,stages=6"),
                                             (4095, 4097, 1000, 2, "block_n=128,stages=6"),
                                             (40, 1000, 4160, 3, "block_n=128,stages=4")])
@pytest.mark.parametrize("walk", ["grouped", "zorder"])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_hopper_gemm_row_split(b_layout, walk, m, n, k, rows, tile):
    """Tiles of 64 * rows rows over `rows` one-warpgroup partitions sharing each stage's B box (tails in M, N and K;
    row warpgroups whose rows lie wholly past M; a Z-order walk with tiles outside the grid): each warpgroup issues
    the 64-row wgmmas an 8-warp 128-row tile's warpgroup issues, in the same k order, so the result is bitwise equal
    to the one-partition kernel's, and right."""
    a, b = gemm_inputs(m, n, k, torch.bfloat16, "cuda", b_layout, seed=m + n + k)
    c = xkernels.matmul(a, b, b_layout=b_layout, walk=walk, out=poisoned_like(a, shape=(m, n)),
                        backend=f"hopper:block_m={64 * rows},{tile},block_k=64,num_warps=4,row_wgs={rows}")
    assert f"-R{rows}]" in xkernels.last_backend(), xkernels.last_backend()
    r = compare_gemm(c, reference_matmul(a, b, b_layout), k)
    assert r.passed, r
    block_n = tile.split(",")[0]
    one = xkernels.matmul(a, b, b_layout=b_layout, walk=walk,
                          backend=f"hopper:block_m=128,{block_n},block_k=64,num_warps=8,stages=4,row_wgs=1")
    assert "-R" not in xkernels.last_backend() and torch.equal(c, one)


@pytest.mark.parametrize("overrides", [dict(stages=2), dict(block_k=32, stages=6), dict(block_k=32, stages=4)])
def test_hopper_gemm_ablation_configs(overrides):
    a, b = gemm_inputs(1000, 3000, 2000, torch.bfloat16, "cuda", "nk", seed=9)
    c = xkernels.matmul(a, b, b_layout="nk", backend="hopper:" + ",".join(f"{k}={v}" for k, v in overrides.items()))
    assert compare_gemm(c, reference_matmul(a, b, "nk"), 2000).passed


def test_hopper_gemm_deterministic_and_auto_dispatch():
    a, b = gemm_inputs(2048, 2048, 4096, torch.float16, "cuda", seed=10)
    c1 = xkernels.matmul(a, b)
    assert xkernels.last_backend().startswith("hopper.gemm")
    assert torch.equal(c1, xkernels.matmul(a, b))
    xkernels.matmul(a.expand(2, -1, -1), b.expand(2, -1, -1))
    assert xkernels.last_backend().startswith("portable.gemm")  # batched: the portable kernel, visibly

