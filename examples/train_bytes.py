"""Train a small causal transformer on bytes with xkernels attention and with PyTorch SDPA, from the same seed.

The corpus is this repository's own Python source (shipped, nothing downloaded), read as bytes. Both runs start
from the same weights and see the same batches; only the attention differs. A third run, SDPA's math backend, gives
the noise floor: two correct attentions in bf16 differ by rounding, and that difference grows with training, so the
xkernels curve should sit as close to SDPA's as SDPA's own two backends sit to each other.

With `--packed`, every row of a batch is cut into documents of random lengths that attend only within themselves
(packed-sequence training): xkernels runs them through `attention_varlen` (one packed batch, no padding), SDPA and
its math backend through a block-diagonal causal mask over the rows.

  python examples/train_bytes.py --steps 300 --out train-out            (GPU: bf16 autocast; writes JSON and PNG)
  TRITON_INTERPRET=1 python examples/train_bytes.py --steps 3 --tiny    (CPU, through the Triton interpreter)
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import xkernels

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Config:
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2  # grouped-query attention: 4 query heads per kv head
    head_dim: int = 64
    seq: int = 512
    batch: int = 16
    lr: float = 1e-3
    steps: int = 300
    seed: int = 0
    packed: bool = False  # rows cut into documents of `min_doc`..`seq` bytes that attend only within themselves
    min_doc: int = 16
    same_batch: bool = False  # every step on the first batch (a smoke test: the loss must fall on data it has seen)

    @property
    def width(self) -> int:
        return self.heads * self.head_dim


TINY = dict(layers=2, heads=2, kv_heads=1, head_dim=64, seq=48, batch=2)


def corpus() -> torch.Tensor:
    """Every .py file under src/ and tests/, sorted, as one uint8 stream."""
    files = sorted(p for d in ("src", "tests") for p in (ROOT / d).rglob("*.py"))
    return torch.frombuffer(bytearray(b"".join(p.read_bytes() for p in files)), dtype=torch.uint8)


@dataclass(frozen=True)
class Documents:
    """Where a packed batch's documents start: cu_seqlens over the B * S tokens (int32, row-major), the longest
    document, and the same as a block-diagonal causal mask (B, 1, S, S) for SDPA."""

    cu_seqlens: torch.Tensor
    longest: int
    mask: torch.Tensor


def attention_sdpa(q, k, v, docs=None):
    if docs is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=docs.mask, enable_gqa=q.shape[1] != k.shape[1])


def attention_sdpa_math(q, k, v, docs=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        return attention_sdpa(q, k, v, docs)


def attention_xkernels(q, k, v, docs=None):
    if docs is None:
        return xkernels.attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    b, h, s, d = q.shape
    packed = [t.transpose(1, 2).reshape(b * s, t.shape[1], d) for t in (q, k, v)]  # (B * S, H, D), row-major
    o = xkernels.attention_varlen(*packed, docs.cu_seqlens, docs.cu_seqlens, docs.longest, docs.longest,
                                  is_causal=True)
    return o.view(b, s, h, d).transpose(1, 2)


ATTENTIONS = {"xkernels": attention_xkernels, "sdpa": attention_sdpa, "sdpa-math": attention_sdpa_math}


class Block(nn.Module):
    def __init__(self, cfg: Config, attention):
        super().__init__()
        self.cfg, self.attention = cfg, attention
        kv = cfg.kv_heads * cfg.head_dim
        self.norm1, self.norm2 = nn.RMSNorm(cfg.width), nn.RMSNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, cfg.width + 2 * kv, bias=False)
        self.proj = nn.Linear(cfg.width, cfg.width, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.width, 4 * cfg.width, bias=False), nn.GELU(),
                                 nn.Linear(4 * cfg.width, cfg.width, bias=False))

    def forward(self, x, rope, docs):
        cfg = self.cfg
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([cfg.width, cfg.kv_heads * cfg.head_dim,
                                                 cfg.kv_heads * cfg.head_dim], -1)
        q = rotate(q.view(b, s, cfg.heads, cfg.head_dim), rope).transpose(1, 2)
        k = rotate(k.view(b, s, cfg.kv_heads, cfg.head_dim), rope).transpose(1, 2)
        v = v.view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        dtype = torch.bfloat16  # the kernels take 16-bit inputs; on the CPU the rest of the model stays fp32
        o = self.attention(q.to(dtype), k.to(dtype), v.to(dtype), docs).to(x.dtype)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, cfg.width))
        return x + self.mlp(self.norm2(x))


def rope_table(seq: int, dim: int, device) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = torch.arange(seq, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.stack((angles.cos(), angles.sin()))


def rotate(x, rope):
    """Rotary position embedding on (B, S, H, D), half-split."""
    cos, sin = (t[None, :, None, :].to(x.dtype) for t in rope)
    a, b = x.chunk(2, -1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), -1)


class ByteLM(nn.Module):
    def __init__(self, cfg: Config, attention):
        super().__init__()
        self.embed = nn.Embedding(256, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.width)
        self.head = nn.Linear(cfg.width, 256, bias=False)
        self.cfg = cfg

    def forward(self, tokens, docs=None):
        rope = rope_table(tokens.shape[1], self.cfg.head_dim, tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, rope, docs)
        return self.head(self.norm(x))


def documents(cfg: Config, g: torch.Generator, device) -> Documents:
    """Each row cut into documents of cfg.min_doc..cfg.seq bytes (the last one what is left)."""
    lengths = []
    for _ in range(cfg.batch):
        left = cfg.seq
        while left:
            n = min(left, int(torch.randint(cfg.min_doc, cfg.seq + 1, (1,), generator=g)))
            lengths.append(n)
            left -= n
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).view(cfg.batch, cfg.seq)
    pos = torch.arange(cfg.seq)
    mask = (doc[:, :, None] == doc[:, None, :]) & (pos[None, None, :] <= pos[None, :, None])
    return Documents(cu.to(device), max(lengths), mask[:, None].to(device))


def batches(data: torch.Tensor, cfg: Config, device):
    g = torch.Generator().manual_seed(cfg.seed + 1)

    def draw():
        starts = torch.randint(0, len(data) - cfg.seq - 1, (cfg.batch,), generator=g)
        chunk = torch.stack([data[s:s + cfg.seq + 1] for s in starts.tolist()]).long().to(device)
        return chunk[:, :-1], chunk[:, 1:], documents(cfg, g, device) if cfg.packed else None

    first = draw()
    for step in range(cfg.steps):
        yield first if step == 0 or cfg.same_batch else draw()


def train(cfg: Config, attention: str, device: str, data: torch.Tensor) -> list[float]:
    torch.manual_seed(cfg.seed)
    model = ByteLM(cfg, ATTENTIONS[attention]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)
    warm = max(1, cfg.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(i, cfg.steps) / cfg.steps)))
    autocast = torch.autocast("cuda", torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    losses = []
    for x, y, docs in batches(data, cfg, device):
        with autocast:
            loss = F.cross_entropy(model(x, docs).float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def agreement(losses: dict[str, list[float]], window: int) -> dict[str, float]:
    """Mean |loss difference| over the last `window` steps: xkernels vs SDPA, and SDPA vs its math backend."""
    def gap(a, b):
        tail = list(zip(losses[a], losses[b], strict=True))[-window:]
        return sum(abs(x - y) for x, y in tail) / len(tail)

    return {"xkernels_vs_sdpa": gap("xkernels", "sdpa"), "sdpa_math_vs_sdpa": gap("sdpa-math", "sdpa")}


def plot(losses: dict[str, list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(3, 1))
    for name, ls in losses.items():
        ax.plot(ls, label=name, lw=1)
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    steps = range(len(losses["sdpa"]))
    ax2.plot(steps, [a - b for a, b in zip(losses["xkernels"], losses["sdpa"], strict=True)], lw=0.8,
             label="xkernels - sdpa")
    ax2.plot(steps, [a - b for a, b in zip(losses["sdpa-math"], losses["sdpa"], strict=True)], lw=0.8,
             label="sdpa-math - sdpa")
    ax2.axhline(0, color="k", lw=0.5)
    ax2.set_xlabel("step")
    ax2.set_ylabel("difference")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=Config.steps)
    p.add_argument("--tiny", action="store_true", help="a model small enough for the Triton interpreter")
    p.add_argument("--packed", action="store_true", help="rows cut into documents: xkernels through attention_varlen")
    p.add_argument("--same-batch", action="store_true",
                   help="every step on the first batch (the corpus is this repository's source: any batch of it "
                        "changes with the code, and a few steps on new batches need not lower the loss)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None, help="folder for train.json and train.png")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps: {args.steps}; at least 1 step (the loss curves compare trained steps)")
    cfg = Config(steps=args.steps, packed=args.packed, same_batch=args.same_batch, **(TINY if args.tiny else {}))
    data = corpus()
    losses, seconds = {}, {}
    for name in ATTENTIONS:
        t0 = time.perf_counter()
        losses[name] = train(cfg, name, args.device, data)
        seconds[name] = time.perf_counter() - t0
        print(f"{name:10s} loss {losses[name][0]:.3f} -> {losses[name][-1]:.3f} in {seconds[name]:.1f} s", flush=True)
    result = {"config": asdict(cfg), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "corpus_bytes": len(data), "losses": losses, "seconds": seconds,
              "agreement": agreement(losses, max(1, cfg.steps // 10))}
    print("mean |loss difference| over the last 10% of steps:", result["agreement"])
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "train.json").write_text(json.dumps(result, indent=1))
        try:
            plot(losses, out / "train.png", f"byte LM {cfg.layers}L {cfg.heads}/{cfg.kv_heads} heads "
                 f"D{cfg.head_dim} seq {cfg.seq} batch {cfg.batch}{' packed' * cfg.packed}, {result['device']}")
        except ImportError:
            print("no plot: matplotlib is not installed (pip install -e '.[bench]')")
    return result


if __name__ == "__main__":
    main()
