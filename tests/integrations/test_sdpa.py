"""`xkernels.integrations.sdpa.use_xkernels`: inside the block, F.scaled_dot_product_attention calls xkernels where it
computes what SDPA would (bitwise xkernels' own result, within the recipe of a float64 reference), gradients too;
every other call is torch's own, unchanged and counted with its reason (or refused with strict=True); outside the
block nothing changes; a transformers model with attn_implementation="sdpa" runs through it."""

import threading

import pytest
import torch
import torch.nn.functional as F

import xkernels
from xkernels.integrations.sdpa import use_xkernels
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import attention_inputs, compare_attention, reference_attention


@pytest.mark.parametrize("shape", ["4d", "3d", "5d"])
def test_served_calls_are_xkernels(device, shape):
    q, k, v = attention_inputs(2, 4, 9, 13, 64, torch.bfloat16, device, hkv=2, seed=1)
    want = xkernels.attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    c = compare_attention(want, reference_attention(q, k, v, is_causal=True, scale=0.3), ATTENTION_RECIPES["bf16"])
    assert c.passed, c.reason
    shaped = {"4d": (q, k, v), "3d": (q[1], k[1], v[1]), "5d": tuple(t[None] for t in (q, k, v))}[shape]
    with use_xkernels() as routed:
        got = F.scaled_dot_product_attention(*shaped, None, 0.0, True, scale=0.3, enable_gqa=True)
    assert routed.calls == 1 and not routed.fallbacks
    assert torch.equal(got, {"4d": want, "3d": want[1], "5d": want[None]}[shape])


def test_gradients_flow_through_served_calls(device):
    q, k, v = attention_inputs(1, 2, 11, 11, 64, torch.float16, device, seed=2)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with use_xkernels() as routed:
        out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    grads = torch.autograd.grad(out.float().square().sum(), leaves)
    mine = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(xkernels.attention(*mine, is_causal=True).float().square().sum(), mine)
    assert routed.calls == 1 and all(torch.equal(g, w) for g, w in zip(grads, want, strict=True))


def test_other_calls_are_torchs_own(device):
    """Each call xkernels cannot serve runs torch's SDPA unchanged, counted by reason; strict=True refuses it."""
    q, k, v = attention_inputs(1, 2, 8, 8, 64, torch.float16, device, seed=3)
    mask = torch.ones(8, 8, dtype=torch.bool, device=device).tril()
    cases = {"attn_mask is given": (q, k, v, mask), "dropout_p is 0.5": (q, k, v, None, 0.5),
             "dtypes": (q.float(), k.float(), v.float()), "head dims 32": (q[..., :32], k[..., :32], v[..., :32]),
             "shapes that broadcast": (q, k[:, :, None].squeeze(2)[0], v[0]),
             "different head counts without enable_gqa": (q, k[:, :1], v[:, :1])}
    for reason, args in cases.items():
        torch.manual_seed(0)
        try:
            want = F.scaled_dot_product_attention(*args)
        except RuntimeError:
            want = None  # torch refuses it too: the same error inside the block
        with use_xkernels() as routed:
            torch.manual_seed(0)
            if want is None:
                with pytest.raises(RuntimeError):
                    F.scaled_dot_product_attention(*args)
            else:
                assert torch.equal(F.scaled_dot_product_attention(*args), want), reason
        assert routed.calls == 0 and list(routed.fallbacks) and next(iter(routed.fallbacks)).startswith(reason)
        with use_xkernels(strict=True), pytest.raises(ValueError, match=f"cannot serve this call: {reason}"):
            F.scaled_dot_product_attention(*args)
    with pytest.raises(TypeError, match="strict: expected a bool"):
        use_xkernels(strict=1)


def test_nothing_changes_outside_the_block_or_in_other_threads(device):
    q, k, v = attention_inputs(1, 2, 8, 8, 64, torch.float16, device, seed=4)
    other = []
    with use_xkernels() as routed:
        F.scaled_dot_product_attention(q, k, v)
        thread = threading.Thread(target=lambda: other.append(F.scaled_dot_product_attention(q, k, v)))
        thread.start()
        thread.join()
    assert routed.calls == 1, "the other thread's call is torch's"
    assert torch.equal(F.scaled_dot_product_attention(q, k, v), other[0]) and routed.calls == 1


def test_sdpa_inside_a_torch_function_is_not_seen(device):
    """nn.MultiheadAttention's SDPA call happens inside F.multi_head_attention_forward, a torch function the mode
    handles whole (a mode is off inside its own handling): torch's SDPA serves it, unchanged, as documented."""
    torch.manual_seed(5)
    mha = torch.nn.MultiheadAttention(128, 2, batch_first=True, device=device, dtype=torch.float16)
    x = (torch.rand(2, 10, 128, device=device) - 0.5).half()
    want = mha(x, x, x, need_weights=False)[0]
    with use_xkernels() as routed:
        got = mha(x, x, x, need_weights=False)[0]
    assert routed.calls == 0 and not routed.fallbacks and torch.equal(got, want)


def test_transformers_sdpa_model(device):
    """A tiny Llama with attn_implementation="sdpa" inside the block: every layer's call is served and the logits
    match the model outside it within bf16 noise."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                      max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                          dtype=torch.bfloat16).to(device).eval()
    ids = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        want = model(ids).logits
        with use_xkernels() as routed:
            got = model(ids).logits
    assert routed.calls == 2 and not routed.fallbacks, (routed.calls, routed.fallbacks)
    rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert torch.isfinite(got).all() and rel < 2e-2, rel
