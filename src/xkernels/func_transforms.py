"""The ops under torch.func's reverse-mode transforms: grad, vjp, jacrev, and vmap over them (per-sample gradients).

torch.func cannot differentiate a torch.library op through its registered autograd (torch raises that an
autograd.Function "must override the setup_context staticmethod"). Under an active functorch transform, a call an
input of which requires grad (`ops.call_with_grad`) goes through an autograd.Function instead, built from the op's
own setup_context and backward (`ops.AUTOGRAD`): the same kernels and formulas. Its vmap rule is generated: vmap
runs through its forward, setup_context and backward, whose ops have batching rules (below), so per-sample
gradients (vmap of grad) are one forward and one backward launch for the whole batch.
Forward-mode AD (jvp, jacfwd) has no formula and is refused by the public functions.
"""

from __future__ import annotations

import torch

from xkernels import ops

_FUNCTIONS: dict = {}


def _function(op) -> type[torch.autograd.Function]:
    setup, backward = ops.AUTOGRAD[op._schema.name.partition("::")[2]]

    class OpFunction(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(*args):
            return op(*args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            setup(ctx, inputs, output)

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    OpFunction.__name__ = OpFunction.__qualname__ = f"{op._schema.name.partition('::')[2]}_function"
    return OpFunction


def apply(op, *args):
    """`op(*args)`, differentiable under torch.func's transforms. Arguments left at their defaults are filled in
    first: the setup_context functions read every argument, as torch.library hands them over."""
    function = _FUNCTIONS.get(op)
    if function is None:
        function = _FUNCTIONS[op] = _function(op)
    schema = op._schema.arguments
    return function.apply(*args, *(a.default_value for a in schema[len(args):]))


# ---- vmap: batching rules ------------------------------------------------------------------------------------------
# torch.vmap over an op runs one call on the whole batch: the vmapped dim is folded into a dim the op already
# iterates over (the batch of the dense ops, the tokens of the packed ones, the heads where a per-head input, the
# sinks, is itself vmapped), and unfolded from the outputs. Without a rule, torch runs the op once per sample and
# warns. The ops that write an input (attention_out, matmul_out, attention_with_kvcache) have no rule: torch's
# fallback refuses them ("doesn't work on out= or view ops").

def _full_args(op, args: tuple, kwargs: dict, in_dims: tuple) -> tuple[list, list]:
    """Every schema argument of a call (defaults filled in) and its vmapped dim (None: not vmapped)."""
    schema = op._schema.arguments
    values = list(args) + [kwargs.get(a.name, a.default_value) for a in schema[len(args):]]
    return values, list(in_dims) + [None] * (len(schema) - len(in_dims))


def _fold(t: torch.Tensor | None, dim: int | None, size: int, axis: int) -> torch.Tensor | None:
    """`t` with its vmapped dim (size `size`; an unbatched `t` is expanded to it) folded into dim `axis`, outer: the
    sample index is the major part of the folded index."""
    if t is None:
        return None
    t = t.expand(size, *t.shape) if dim is None else t.movedim(dim, 0)
    return t.movedim(0, axis).flatten(axis, axis + 1)


def _unfold(t: torch.Tensor, size: int, axis: int) -> tuple[torch.Tensor, int | None]:
    """An output of the folded call split back into (sample, rest) at `axis`; an empty placeholder (an LSE not asked
    for) stays unbatched."""
    if t.numel() == 0 and t.dim() == 1:
        return t, None
    return t.unflatten(axis, (size, -1)), axis


def _folded_call(op, info, in_dims, args, kwargs, axes: dict[str, int], out_axes: tuple[int, ...], extra=None):
    """Call `op` once with the arguments named in `axes` folded into the given dims (`extra(values, dims)` may
    rewrite others), and unfold its outputs at `out_axes`."""
    values, dims = _full_args(op, args, kwargs, in_dims)
    names = [a.name for a in op._schema.arguments]
    for i, name in enumerate(names):
        if name in axes:
            values[i] = _fold(values[i], dims[i], info.batch_size, axes[name])
    if extra is not None:
        extra(values, dims, names, info.batch_size)
    out = op(*values)
    if isinstance(out, torch.Tensor):
        return _unfold(out, info.batch_size, out_axes[0])
    unfolded = [_unfold(t, info.batch_size, axis) for t, axis in zip(out, out_axes, strict=True)]
    return tuple(t for t, _ in unfolded), tuple(d for _, d in unfolded)


def _vmapped(names: tuple[str, ...], args: tuple, in_dims: tuple, schema) -> bool:
    """Whether any argument of these names is passed and vmapped."""
    by_name = {a.name: i for i, a in enumerate(schema.arguments)}
    return any(n in by_name and by_name[n] < len(in_dims) and in_dims[by_name[n]] is not None
               and args[by_name[n]] is not None for n in names)


def _dense_rule(op, n_out: int):
    """attention, attention_lse, attention_backward: (B, H, S, D) tensors and the LSE (B, H, S) fold the samples
    into B; vmapped sinks (one logit per query head) fold them into the heads instead (q, k, v and the outputs too:
    query head s*Hq + h still reads kv head s*Hkv + h // (Hq / Hkv), so GQA keeps its groups)."""
    tensors = ("grad_out", "q", "k", "v", "out", "lse", "grad_lse")

    def rule(info, in_dims, *args, **kwargs):
        if _vmapped(("sinks",), args, in_dims, op._schema):
            axes = dict.fromkeys(("q", "k", "v"), 1) | {"sinks": 0}
            return _folded_call(op, info, in_dims, args, kwargs, axes, (1,) * n_out)
        return _folded_call(op, info, in_dims, args, kwargs, dict.fromkeys(tensors, 0), (0,) * n_out)

    return rule


def _packed_offsets(values: list, dims: list, names: list, size: int) -> None:
    """The packed ops' samples laid end to end: sample s's sequences start s * total tokens later. Each sample's
    cu_seqlens must start at 0 and end at its total (what the op checks of one sample's): with `sync_checks` they
    are read and checked here; without (and under an outer vmap) a bad sample makes the folded cu_seqlens end at -1,
    which the op refuses, or answers with NaN everywhere, as it would the sample's own."""
    q = values[names.index("q")]
    sync_checks = ("sync_checks" in names and values[names.index("sync_checks")]
                   and not (q.is_cuda and torch.cuda.is_current_stream_capturing()))
    for cu_name, t_name in (("cu_seqlens_q", "q"), ("cu_seqlens_k", "k")):
        i = names.index(cu_name)
        cu = values[i]
        cu = cu.expand(size, *cu.shape) if dims[i] is None else cu.movedim(dims[i], 0)
        if cu.dim() != 2 or cu.shape[1] == 0:
            values[i] = cu.flatten()  # the op names what is wrong with it
            continue
        total = values[names.index(t_name)].shape[0] // size
        bad = ((cu[:, 0] != 0) | (cu[:, -1] != total)).any()
        if sync_checks and not torch._C._functorch.is_batchedtensor(bad) and bool(bad):
            raise ValueError(f"{cu_name}: must start at 0 and end at the packed tensor's {total} tokens in every "
                             f"vmapped sample, got starts {cu[:, 0].tolist()} and ends {cu[:, -1].tolist()}")
        starts = torch.arange(size, device=cu.device, dtype=cu.dtype)[:, None] * total
        end = torch.where(bad, -1, size * total).to(cu.dtype).reshape(1)
        values[i] = torch.cat([(cu[:, :-1] + starts).flatten(), end])


def _packed_rule(op, out_axes: tuple[int, ...]):
    """attention_varlen, attention_varlen_backward: the samples fold into the packed tokens ((total, H, D) dim 0,
    the LSE (H, total) dim 1), their cu_seqlens laid end to end; vmapped sinks with shared cu_seqlens fold into the
    heads instead."""
    def rule(info, in_dims, *args, **kwargs):
        schema = op._schema
        if _vmapped(("sinks",), args, in_dims, schema):
            if _vmapped(("cu_seqlens_q", "cu_seqlens_k"), args, in_dims, schema):
                return _per_sample(op, info, in_dims, args, kwargs)
            axes = dict.fromkeys(("q", "k", "v"), 1) | {"sinks": 0}
            return _folded_call(op, info, in_dims, args, kwargs, axes, (1, 0))
        axes = dict.fromkeys(("grad_out", "q", "k", "v", "out"), 0) | dict.fromkeys(("lse", "grad_lse"), 1)
        return _folded_call(op, info, in_dims, args, kwargs, axes, out_axes, _packed_offsets)

    return rule


def _per_sample(op, info, in_dims, args, kwargs):
    """One call per sample, stacked (what torch's fallback does, without its warning)."""
    values, dims = _full_args(op, args, kwargs, in_dims)
    outs = [op(*(v if d is None else v.select(d, s) for v, d in zip(values, dims, strict=True)))
            for s in range(info.batch_size)]
    return tuple(torch.stack(o) for o in zip(*outs, strict=True)), (0,) * len(outs[0])


def _matmul_rule(info, in_dims, a, b, *rest, **kwargs):
    """The samples become a leading batch dim of the product: each operand's batch dims padded with ones to the
    same count, after the sample dim (1 where an operand is not vmapped), so they broadcast as each sample's would.
    A 2-D weight shared by the samples stays 2-D (the one-problem path)."""
    da, db = in_dims[0], in_dims[1]
    if db is None and b.dim() == 2:
        return ops.matmul_op(a.movedim(da, 0), b, *rest, **kwargs), 0
    ranks = (a.dim() - (da is not None), b.dim() - (db is not None))
    batch_rank = max(ranks) - 2

    def leading(t, dim, rank):
        t = t.unsqueeze(0) if dim is None else t.movedim(dim, 0)
        return t.reshape(t.shape[0], *(1,) * (batch_rank - (rank - 2)), *t.shape[1:])

    return ops.matmul_op(leading(a, da, ranks[0]), leading(b, db, ranks[1]), *rest, **kwargs), 0


def _empty_batch(op, in_dims, args, kwargs):
    """A vmapped dim of size 0: the outputs' shapes from the op's fake kernel on one sample's meta tensors (no data
    read), with no samples."""
    values, dims = _full_args(op, args, kwargs, in_dims)
    device = next(v.device for v in values if isinstance(v, torch.Tensor))

    def one_sample(v, d):
        if not isinstance(v, torch.Tensor):
            return v
        shape = [n for i, n in enumerate(v.shape) if i != d]
        return torch.empty(shape, dtype=v.dtype, device="meta")

    out = op(*(one_sample(v, d) for v, d in zip(values, dims, strict=True)))
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    empty = tuple(torch.empty((0, *o.shape), dtype=o.dtype, device=device) for o in outs)
    return (empty[0], 0) if isinstance(out, torch.Tensor) else (empty, (0,) * len(empty))


def _sized(op, rule):
    """`rule`, but for a vmapped dim of size 0 (nothing to fold, and nothing to unfold by)."""
    def sized_rule(info, in_dims, *args, **kwargs):
        if info.batch_size == 0:
            return _empty_batch(op, in_dims, args, kwargs)
        return rule(info, in_dims, *args, **kwargs)

    return sized_rule


def register_batching_rules() -> None:
    for op, rule in ((ops.attention_op, _dense_rule(ops.attention_op, 1)),
                     (ops.attention_lse_op, _dense_rule(ops.attention_lse_op, 2)),
                     (ops.attention_backward_op, _dense_rule(ops.attention_backward_op, 3)),
                     (ops.attention_varlen_op, _packed_rule(ops.attention_varlen_op, (0, 1))),
                     (ops.attention_varlen_backward_op, _packed_rule(ops.attention_varlen_backward_op, (0, 0, 0))),
                     (ops.matmul_op, _matmul_rule)):
        torch.library.register_vmap(op, _sized(op, rule))
