"""The ops under torch.func's reverse-mode transforms: grad, vjp, jacrev, and vmap over them (per-sample gradients).

torch.func cannot differentiate a torch.library op through its registered autograd (torch raises that an
autograd.Function "must override the setup_context staticmethod"). Under an active functorch transform, a call an
input of which requires grad (`ops.call_with_grad`) goes through an autograd.Function instead, built from the op's
own setup_context and backward (`ops.AUTOGRAD`): the same kernels and formulas. Its vmap rule is generated (vmap runs
through its forward, setup_context and backward, whose ops take torch's per-sample fallback under vmap).
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
