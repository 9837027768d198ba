"""The persistent Hopper forward (`hopper/attention_persistent.py`) on an H100/H200: against float64 and bitwise
against the dense kernel (the same per-tile arithmetic) over the recipes (bf16io: V converted by the producer, or by
one pass where `select.v_pass_pays`, both kernels alike), D64/D128/D256, causal and full, GQA and MQA, Sq != Skv, Sq
a multiple of 64 but not of the query block (warpgroups past the end store nothing), heads-outer and sequence-outer
layouts, and head chunks smaller than the batch (a partial last chunk), O through shared memory and TMA, from
registers, through the Q slots or the V ring (o_store); outputs poisoned, the LSE checked. Shapes it does not serve
take the dense kernel."""

import re

import pytest
import torch

import xkernels
from tests.helpers import poisoned_like
from xkernels.common.runtime import hopper_available
from xkernels.hopper import attention_persistent
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_attention, compare_lse, reference_attention, reference_lse

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available()
                                                       and hopper_available(torch.device("cuda"))),
                                                  reason="needs sm_90 with a tested triton")]


def _run(q, k, v, causal, recipe, backend="auto"):
    o, lse = xkernels.attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1], precision=recipe,
                                return_lse=True, out=poisoned_like(q), backend=backend)
    return o, lse, xkernels.last_backend()


def _check(q, k, v, causal, recipe, backend="auto", dense_backend="hopper:persistent=0"):
    rec = ATTENTION_RECIPES[recipe]
    o, lse, name = _run(q, k, v, causal, recipe, backend=backend)
    assert "persistent" in name, name
    c = compare_attention(o, reference_attention(q, k, v, is_causal=causal), rec)
    assert c.passed, c
    assert compare_lse(lse, reference_lse(q, k, is_causal=causal)).passed
    o_dense, lse_dense, dense = _run(q, k, v, causal, recipe, backend=dense_backend)
    assert "persistent" not in dense, dense
    assert torch.equal(o, o_dense) and torch.equal(lse, lse_dense), "persistent and dense tiles differ"
    return name


# 2K keys with GQA: the default's L2-chunk walk (`preferred_walk`); the other rows its head-major walk
@pytest.mark.parametrize("d,sq,skv", [(128, 128, 128), (128, 512, 1024), (128, 1024, 256), (128, 320, 384),
                                      (128, 1024, 2048), (64, 192, 128), (64, 768, 1536), (64, 512, 384),
                                      (64, 320, 256)])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2), (4, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("recipe", ["bf16", "fp16", "bf16io"])
def test_persistent_matches_float64_and_dense(recipe, causal, hq, hkv, d, sq, skv):
    q, k, v = attention_inputs(3, hq, sq, skv, d, ATTENTION_RECIPES[recipe].io_dtype, "cuda", hkv=hkv,
                               seed=sq + skv + d + hq)
    _check(q, k, v, causal, recipe)


@pytest.mark.parametrize("d,sq,skv", [(256, 128, 128), (256, 512, 1024), (256, 320, 384), (256, 1024, 256)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("recipe", ["bf16", "fp16", "bf16io"])
def test_persistent_d256_forced(recipe, causal, d, sq, skv):
    """D256's persistent config (one Q slot, 64-key tiles, O through the Q slot) forced, and the same with O from
    registers and through the V ring: float64, the LSE, and bitwise against the dense kernel (the same 64-key
    tiles)."""
    q, k, v = attention_inputs(3, 8, sq, skv, d, ATTENTION_RECIPES[recipe].io_dtype, "cuda", hkv=2, seed=sq + skv)
    # bf16io may convert V in a pass of its own first (-vp, the v_pass rule)
    assert re.search(r"BN64-S2-ov-cs4-p2-oq(-vp)? persistent", _check(q, k, v, causal, recipe,
                                                                      backend="hopper:persistent=2"))
    assert re.search(r"-p2-or(-vp)? persistent", _check(q, k, v, causal, recipe,
                                                        backend="hopper:persistent=2,o_store=1"))
    if recipe != "bf16io":  # the V ring path has no conversion (the config check refuses it)
        assert "-p2-ovs persistent" in _check(q, k, v, causal, recipe, backend="hopper:persistent=2,o_store=3")


@pytest.mark.parametrize("d,b,hq,hkv,sq,skv", [(128, 4, 16, 16, 1024, 1024), (128, 3, 8, 2, 320, 384),
                                               (128, 8, 8, 8, 192, 64), (64, 4, 16, 4, 1024, 512),
                                               (64, 5, 6, 3, 128, 64), (256, 6, 8, 4, 64, 128),
                                               (128, 128, 16, 16, 192, 64), (256, 16, 16, 4, 320, 64)])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_o_through_the_v_ring(causal, stages, d, b, hq, hkv, sq, skv):
    """O through the V ring (o_store=3, 64-key tiles): tiles of one key tile (a stage's last use then lies in an
    earlier tile) and warpgroups past the sequence end (they store nothing but still free their stage), both with
    many tiles per program (128 x 16 x 2 tiles of 192 rows: ~31 per program on 132 SMs, so every o_left and v.empty
    parity turns over many times), GQA, a ring deeper than the consumers; bitwise equal to the dense kernel on the
    same 64-key tiles."""
    if d == 256 and stages == 3:
        pytest.skip("D256: a third 64-key stage overflows shared memory")
    q, k, v = attention_inputs(b, hq, sq, skv, d, torch.bfloat16, "cuda", hkv=hkv, seed=sq + skv + d + b)
    assert "-p2-ovs persistent" in _check(q, k, v, causal, "bf16",
                                          backend=f"hopper:persistent=2,chained=0,o_store=3,block_n=64,stages={stages}",
                                          dense_backend=f"hopper:persistent=0,block_n=64,stages={stages}")


@pytest.mark.parametrize("recipe", ["bf16", "bf16io"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,b,hq,hkv,sq,skv,backend", [
    (256, 16, 16, 4, 320, 64, "auto"),  # D256's default (O through the one Q slot): ~6 tiles per program, single
    (256, 64, 8, 8, 128, 128, "auto"),  # key tiles, warpgroups past the end; 512 tiles of two key tiles
    (128, 8, 16, 16, 768, 768, "auto"),  # chained, ~6 tiles per program: both Q slots' parities turn over
    (128, 128, 16, 16, 192, 128, "hopper:persistent=2,o_store=2"),  # chained through the Q slots, ~31 per program
    (128, 128, 16, 16, 192, 128, "hopper:persistent=2,chained=0,o_store=2")])
def test_persistent_many_tiles_per_program(recipe, causal, d, b, hq, hkv, sq, skv, backend):
    """Programs that walk many tiles (each slot's q_free and ring barrier waited on at both parities, many times)
    with the shipped configs and the Q-slot O path, bf16 and bf16io: float64, the LSE, bitwise against the dense
    kernel."""
    q, k, v = attention_inputs(b, hq, sq, skv, d, torch.bfloat16, "cuda", hkv=hkv, seed=sq + skv + d + b)
    assert "persistent" in _check(q, k, v, causal, recipe, backend=backend)


@pytest.mark.parametrize("d,sq,skv", [(256, 512, 1024), (256, 320, 384)])
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_d256_32_key_tiles(causal, d, sq, skv):
    """The 32-key variants (O buffers, or chained tiles with O through the Q slots: two fit at 32 keys): float64
    and the LSE (not bitwise against the dense kernel's 64-key tiles, which fold the softmax in another grouping)."""
    q, k, v = attention_inputs(3, 8, sq, skv, d, torch.bfloat16, "cuda", hkv=2, seed=sq + skv)
    for backend in ("hopper:persistent=2,block_n=32,stages=3,o_store=0",
                    "hopper:persistent=2,block_n=32,stages=3,chained=1"):
        o, lse, name = _run(q, k, v, causal, "bf16", backend=backend)
        assert "persistent" in name and "BN32" in name, name
        assert compare_attention(o, reference_attention(q, k, v, is_causal=causal),
                                 ATTENTION_RECIPES["bf16"]).passed
        assert compare_lse(lse, reference_lse(q, k, is_causal=causal)).passed


@pytest.mark.parametrize("causal", [False, True])
def test_persistent_sequence_outer_layout(causal):
    """(B, S, H, D) tensors transposed to (B, H, S, D), as attention layers make them: heads side by side in a row."""
    b, s, h, d = 2, 512, 8, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = ((torch.randn(b, s, h, d, device="cuda", generator=g) * 0.5).bfloat16().transpose(1, 2)
               for _ in range(3))
    assert attention_persistent.descriptor_view(q)[2] == (s, 0, d)
    _check(q, k, v, causal, "bf16")


@pytest.mark.parametrize("causal", [False, True])
def test_persistent_head_chunks(causal):
    """Head chunks of 8 query heads (4 K/V heads of 640 KiB, groups of 2) over B*H = 12: a whole chunk, then a
    partial one."""
    q, k, v = attention_inputs(2, 6, 384, 1280, 128, torch.bfloat16, "cuda", hkv=3, seed=11)
    name = _check(q, k, v, causal, "bf16", backend="hopper:persistent=2,l2_budget_kib=2560")
    assert "-l2c2560" in name and "walk=0]" in name, name  # a chunk budget implies the L2-chunk walk


@pytest.mark.parametrize("sq,skv", [(1000, 1024), (1024, 1000), (256, 8192)])
def test_shapes_it_does_not_serve_take_the_dense_kernel(sq, skv):
    """Sq not a multiple of 64, Skv not a multiple of the key tile, or (by the measured rule) more than 4K keys."""
    q, k, v = attention_inputs(2, 4, sq, skv, 128, torch.bfloat16, "cuda", seed=2)
    o, _, name = _run(q, k, v, True, "bf16")
    assert name.startswith("hopper.attention[") and "persistent" not in name
    assert compare_attention(o, reference_attention(q, k, v, is_causal=True), ATTENTION_RECIPES["bf16"]).passed


def test_forced_persistent_beyond_the_rule():
    q, k, v = attention_inputs(1, 4, 256, 8192, 128, torch.bfloat16, "cuda", seed=4)
    o, lse, name = _run(q, k, v, True, "bf16", backend="hopper:persistent=2")
    assert "persistent" in name
    assert compare_attention(o, reference_attention(q, k, v, is_causal=True), ATTENTION_RECIPES["bf16"]).passed
    assert compare_lse(lse, reference_lse(q, k, is_causal=True)).passed


# the shipped configs chain tiles (D64: two consumers, window open); these are the other variants the kernel runs
VARIANTS = {"hopper:persistent=2,chained=0": "-p2 persistent", "hopper:persistent=2,consumers=3,overlap=0": "-p2-ch",
            "hopper:persistent=2,o_store=1": "-p2-ch-or persistent",
            "hopper:persistent=2,o_store=2": "-p2-ch-oq persistent",
            "hopper:persistent=2,chained=0,o_store=2": "-p2-oq persistent",
            "hopper:persistent=2,pingpong=1": "-p2-ch-pp persistent",
            "hopper:persistent=2,flat=1": "-p2-ch-fl persistent",
            "hopper:persistent=2,flat=0": "-p2-ch persistent",  # the chained consumer where the rule takes flat
            "hopper:persistent=2,flat=1,pingpong=1": "-p2-ch-pp-fl persistent"}


@pytest.mark.parametrize("walk", [0, 1])
@pytest.mark.parametrize("backend", list(VARIANTS))
@pytest.mark.parametrize("d,b,hq,hkv,sq,skv", [(128, 4, 16, 16, 1024, 1024), (128, 3, 8, 2, 320, 384),
                                               (64, 4, 16, 4, 1024, 512), (64, 2, 6, 3, 576, 640),
                                               (128, 1, 2, 1, 128, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_variants_match_float64_and_dense(causal, d, b, hq, hkv, sq, skv, backend, walk):
    """The shipped configs (chained tiles) and the other variants, on either tile walk, over several tiles per
    program (up to ~4 here, so both Q slots turn over), a program with one tile, Sq a multiple of 64 only, GQA; the
    same arithmetic per row as the dense kernel, so bitwise equal to it."""
    if d != 64 and "consumers=3" in backend:
        pytest.skip("three consumers need D64")
    q, k, v = attention_inputs(b, hq, sq, skv, d, torch.bfloat16, "cuda", hkv=hkv, seed=sq + d + b)
    # (flat=2, the default: shapes of the rule show -fl, `preferred_flat`)
    assert "-ch persistent" in _check(q, k, v, causal, "bf16").replace("-fl", "")
    want = VARIANTS[backend].replace(" persistent", ("-l2", "-hm")[walk] + " persistent")
    name = _check(q, k, v, causal, "bf16", backend=f"{backend},walk={walk}")
    assert want in (name if "flat" in backend else name.replace("-fl", "")) and f"walk={walk}]" in name, name


@pytest.mark.parametrize("backend", ["hopper:persistent=2,walk=1", "hopper:persistent=2,walk=1,chained=0",
                                     "hopper:persistent=2,walk=1,o_store=2", "hopper:persistent=2,walk=1,pingpong=1",
                                     "hopper:persistent=2,walk=1,flat=1", "hopper:persistent=2,walk=1,flat=1,o_store=2",
                                     "hopper:persistent=2,walk=1,flat=0",
                                     "hopper:persistent=2,walk=1,chained=0,o_store=3,block_n=64,stages=2"])
@pytest.mark.parametrize("d,b,hq,hkv,sq,skv", [
    (128, 4, 16, 16, 1024, 1024),  # 8 blocks a head, 64 heads: causal 256 pairs (two rounds), full 512 single tiles
    (128, 12, 16, 4, 640, 640),  # 5 blocks, 192 heads, GQA: causal 384 pairs, then 192 middle blocks
    (128, 3, 8, 2, 320, 384),  # 3 blocks (the last half past Sq), 72 tiles, one round: single tiles, GQA
    (64, 4, 16, 4, 1024, 512),  # Sq > Skv: pairs of unequal cost
    (256, 16, 16, 4, 384, 384),  # 3 blocks, 256 heads: pairs, then middle blocks, many per program
    (128, 1, 2, 1, 128, 128),  # one block a head: two single tiles (a grid of 2)
    (128, 64, 16, 16, 256, 128)])  # 2 blocks a head, 1024 pairs: ~8 a program, both Q slots many times
@pytest.mark.parametrize("causal", [False, True])
def test_head_major_walk_matches_float64_and_dense(causal, d, b, hq, hkv, sq, skv, backend):
    """The head-major walk (`walk=1`: causal blocks paired past one round of tiles, else single tiles) with the
    shipped configs (D64 and D128 chained, D256 through the Q slot) and the other O paths: every tile once, the same
    arithmetic per row as the dense kernel, so bitwise equal to it."""
    if d == 256 and ("pingpong" in backend or "flat=1" in backend):
        pytest.skip("D256's persistent config is not chained: no turns, no flat loop")
    q, k, v = attention_inputs(b, hq, sq, skv, d, torch.bfloat16, "cuda", hkv=hkv, seed=sq + d + b + 1)
    dense = "hopper:persistent=0" + (",block_n=64,stages=2" if "block_n=64" in backend else "")
    name = _check(q, k, v, causal, "bf16", backend=backend, dense_backend=dense)
    assert "-hm persistent" in name and "walk=1]" in name, name


@pytest.mark.parametrize("causal", [False, True])
def test_head_major_walk_bf16io(causal):
    """bf16io (the producer converts V) on the head-major walk: float64, the LSE, bitwise against the dense kernel."""
    q, k, v = attention_inputs(8, 8, 512, 512, 128, torch.bfloat16, "cuda", hkv=4, seed=5)
    assert "walk=1]" in _check(q, k, v, causal, "bf16io", backend="hopper:persistent=2,walk=1,v_pass=0")
