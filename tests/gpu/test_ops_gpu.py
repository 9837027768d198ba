"""The ops on a CUDA device: CUDA-graph capture and replay, torch.compile with inductor and with CUDA graphs, the
direct launch path against Triton's generic one, and memory that plans and descriptor encodings never pin."""

import gc

import pytest
import torch

import xkernels
from xkernels import plans
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import (
    attention_inputs,
    compare_attention,
    compare_gemm,
    gemm_inputs,
    reference_attention,
    reference_matmul,
)

pytestmark = pytest.mark.gpu


def _step(q, k, v, w):
    o = xkernels.attention(q, k, v, is_causal=True, enable_gqa=True)
    return xkernels.matmul(o.transpose(1, 2).flatten(2), w, b_layout="nk")


def _inputs(seed):
    q, k, v = attention_inputs(2, 8, 1000, 1000, 128, torch.bfloat16, "cuda", hkv=2, seed=seed)
    w = gemm_inputs(1, 1024, 1024, torch.bfloat16, "cuda", "nk", seed=seed)[1]
    return q, k, v, w


def test_cuda_graph_replay_is_bitwise_equal_to_eager():
    static = _inputs(1)
    eager = _step(*static)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _step(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _step(*static)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    fresh = _inputs(2)
    for dst, src in zip(static, fresh, strict=True):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, _step(*fresh)), "replay on new data differs from eager"


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compile_fullgraph_on_gpu(mode):
    args = _inputs(3)
    torch._dynamo.reset()
    compiled = torch.compile(_step, fullgraph=True, mode=mode)
    for _ in range(3):  # reduce-overhead records a CUDA graph on a later call
        got = compiled(*args)
    assert torch.equal(got, _step(*args))


def test_direct_and_generic_launches_agree():
    """A misaligned base address sends a call down the general path (a copy, Triton's launcher); the aligned call of
    the same key takes the direct launch. Both are right, and the same."""
    q, k, v = attention_inputs(1, 4, 300, 300, 128, torch.float16, "cuda", seed=4)
    fast = xkernels.attention(q, k, v)
    assert "copied" not in xkernels.last_backend()
    buf = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")
    q_odd = buf[1:].view(q.shape)
    q_odd.copy_(q)
    slow = xkernels.attention(q_odd, k, v)
    assert "copied:q" in xkernels.last_backend()
    assert torch.equal(fast, slow)
    c = compare_attention(fast, reference_attention(q, k, v), ATTENTION_RECIPES["fp16"])
    assert c.passed, c


def test_bshd_views_take_the_direct_path():
    """q/k/v from a (B, S, H, D) projection, viewed as (B, H, S, D): descriptor-ready strides, no copy."""
    b, s, h, d = 2, 513, 8, 64
    qkv = (torch.rand(b, s, 3, h, d, device="cuda") - 0.5).half()
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    o = xkernels.attention(q, k, v, is_causal=True)
    assert "copied" not in xkernels.last_backend()
    c = compare_attention(o, reference_attention(q, k, v, is_causal=True), ATTENTION_RECIPES["fp16"])
    assert c.passed, c


def test_a_repeated_call_reuses_its_plan():
    a, b = gemm_inputs(512, 512, 512, torch.bfloat16, "cuda", seed=5)
    xkernels.matmul(a, b)
    n = len(plans._PLANS)
    for _ in range(3):
        xkernels.matmul(a, b)
        xkernels.matmul(a.clone(), b.clone())  # new tensors, same key
    assert len(plans._PLANS) == n


def test_calls_pin_no_device_memory():
    """Descriptor encodings and plans keep addresses as numbers: freeing the tensors frees the memory. (The split-K
    scratch, kept per stream by design (`common/scratch.py`), is grown by a first round of the same calls.)"""

    def calls():
        for n in (1024, 2048, 1536):
            a, b = gemm_inputs(n, n, n, torch.bfloat16, "cuda", "nk", seed=n)
            c = xkernels.matmul(a, b, b_layout="nk")
            assert compare_gemm(c, reference_matmul(a, b, "nk"), n).passed
            q, k, v = attention_inputs(1, 4, n, n, 64, torch.bfloat16, "cuda", seed=n)
            o = xkernels.attention(q, k, v)
            del a, b, c, q, k, v, o

    calls()
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    calls()
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


def test_a_tensor_on_another_device_launches_there():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    q, k, v = attention_inputs(1, 2, 200, 200, 64, torch.float16, "cuda:1", seed=6)
    o = xkernels.attention(q, k, v)
    assert o.device == q.device
    assert compare_attention(o, reference_attention(q, k, v), ATTENTION_RECIPES["fp16"]).passed


def test_a_captured_decode_loop_appends_and_attends_like_eager():
    """A serving loop's decode step under CUDA-graph capture: the cache checks (a read to the host) are skipped, the
    append and the split-KV kernel replay, and each replayed step equals the eager step on the same cache."""
    batch, s_max, hq, hkv, d = 4, 1024, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(5)

    def rnd(*shape):
        return (torch.rand(shape, generator=g, device="cuda") - 0.5).to(torch.bfloat16)

    k_cache, v_cache = rnd(batch, s_max, hkv, d), rnd(batch, s_max, hkv, d)
    lengths = torch.tensor([100, 7, 900, 512], dtype=torch.int32, device="cuda")
    q, k, v = rnd(batch, 1, hq, d), rnd(batch, 1, hkv, d), rnd(batch, 1, hkv, d)
    eager_k, eager_v, eager_len = k_cache.clone(), v_cache.clone(), lengths.clone()

    def step(kc, vc, n):
        o = xkernels.attention_with_kvcache(q, kc, vc, cache_seqlens=n, k=k, v=v)
        n += 1
        return o

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (plans, compiles) on scratch copies
        step(k_cache.clone(), v_cache.clone(), lengths.clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(k_cache, v_cache, lengths)
    for _ in range(3):
        graph.replay()
        want = step(eager_k, eager_v, eager_len)
        torch.cuda.synchronize()
        assert torch.equal(captured, want)
        assert torch.equal(k_cache, eager_k) and torch.equal(lengths, eager_len)


def test_new_addresses_encode_on_a_thread_without_a_context():
    """A plan made on this thread meets new addresses on a thread that has made no CUDA runtime call (as autograd's
    device thread before its first kernel): encoding their tensor maps binds the device's context first, and the
    results are the main thread's bits."""
    import threading

    a, b = gemm_inputs(64, 256, 128, torch.bfloat16, "cuda", "nk", seed=3)
    xkernels.matmul(a, b, b_layout="nk")  # the plan and its descriptors for these addresses
    if not xkernels.last_backend().startswith("hopper."):
        pytest.skip("host tensor maps: the Hopper GEMM's plan (sm_90)")
    a2, b2 = a.clone(), b.clone()  # new addresses: encoded on the other thread
    got, errors = [], []

    def work():
        try:
            got.append(xkernels.matmul(a2, b2, b_layout="nk"))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (reported by the assertion below)
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    assert torch.equal(got[0], xkernels.matmul(a, b, b_layout="nk"))
