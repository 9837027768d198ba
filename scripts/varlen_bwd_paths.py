"""The packed backward's plan paths on the bench's packed training batch: gradients of the direct path
(`VarlenBackwardPlan`'s prepared launches) against the general path's (`_varlen_general`, through `launch.run`),
bitwise, then each against float64 per sequence with the bench's check, and the worst dQ row's sequence and offset;
then the dQ rows that are zero in exact arithmetic (a causal sequence's first query sees one key: dS = P (dP - delta)
= 0) against the check's floor, on the Hopper kernels and on the portable ones.

    python3 scripts/varlen_bwd_paths.py [--causal]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from xkernels import backward, plans
from xkernels.recipes import ATTENTION_RECIPES
from xkernels.testing import compare_grad
from xkernels.testing.cases import VarlenGradCase


def grads(case, inputs, direct: bool):
    for plan in plans._PLANS.values():
        if isinstance(plan, backward.VarlenBackwardPlan):
            plan.direct = direct
    o, leaves = case.forward(inputs)
    out = torch.autograd.grad(o, leaves, inputs[-1])
    return out, plans.last_backend()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()
    case = VarlenGradCase(32, 256, 4096, 32, 32, 128, args.causal, step="fwd+bwd")
    inputs = case.inputs("cuda")
    grads(case, inputs, True)  # the plan exists from here
    direct, name_d = grads(case, inputs, True)
    general, name_g = grads(case, inputs, False)
    print(f"direct: {name_d}; general: {name_g}")
    for n, a, b in zip(("dq", "dk", "dv"), direct, general, strict=True):
        print(f"{n}: bitwise equal {torch.equal(a, b)}, max |diff| {(a.float() - b.float()).abs().max().item():.3g}")
    refs = case.references(inputs)
    recipe = ATTENTION_RECIPES["bf16"]
    cu = inputs[3].tolist()
    for path, got in (("direct", direct), ("general", general)):
        for n, g, r in zip(("dq", "dk", "dv"), got, refs, strict=True):
            c = compare_grad(g, r, recipe)
            err = ((g.double() - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-30))  # (total, H)
            row = int(err.max(dim=1).values.argmax())
            seq = max(i for i, start in enumerate(cu[:-1]) if start <= row)
            print(f"{path} {n}: {'PASS' if c.passed else 'FAIL'} {c.reason or ''} rel-RMS {c.rel_rms:.2e}; worst "
                  f"row {row} (sequence {seq}, offset {row - cu[seq]} of {cu[seq + 1] - cu[seq]}) rel err "
                  f"{err.max().item():.3g}")
    if args.causal:
        first_rows(case, inputs, refs)
    worst_rows(case, inputs, refs)


def first_rows(case, inputs, refs) -> None:
    """Per sequence: the computed norm of its first query row's dQ (0 in exact arithmetic when causal), the largest
    over heads, against the check's floor (a tenth of the RMS row norm for bf16) and the typical row."""
    cu = inputs[3].tolist()
    ref_rows = refs[0].norm(dim=-1)  # (total, H)
    rms_row = ref_rows.square().mean().sqrt().item()
    floor = ATTENTION_RECIPES["bf16"].grad_row_floor * rms_row
    print(f"dQ RMS row norm {rms_row:.3g}, check floor {floor:.3g}")
    for backend in ("auto", "portable"):
        case_b = dataclasses.replace(case, backend=None if backend == "auto" else backend)
        o, leaves = case_b.forward(inputs)
        dq = torch.autograd.grad(o, leaves, inputs[-1])[0]
        name = plans.last_backend()
        norms = dq.float().norm(dim=-1)  # (total, H)
        firsts = torch.tensor(cu[:-1], device=dq.device)
        worst = norms[firsts].max(dim=1).values
        print(f"{name}: first rows' dQ norm / floor: max {worst.max().item() / floor:.3g}, median "
              f"{worst.median().item() / floor:.3g}; second rows' (exact: nonzero) ref / floor median "
              f"{ref_rows[firsts + 1].max(dim=1).values.median().item() / floor:.3g}")
        for i in worst.argsort(descending=True)[:4].tolist():
            row = cu[i]
            h = int(norms[row].argmax())
            print(f"  sequence {i} (length {cu[i + 1] - cu[i]}): head {h} |dQ| {norms[row, h].item():.3g}; "
                  f"|q| {leaves[0][row, h].float().norm().item():.3g} |k0| {leaves[1][row, h].float().norm():.3g} "
                  f"|dO| {inputs[-1][row, h].float().norm():.3g}")


def worst_rows(case, inputs, refs, count: int = 6) -> None:
    """The dQ rows the check measures worst (error over max(own norm, floor)), each recomputed in float64 twice: the
    exact gradient (delta = rowsum(dO * O) with O exact, as autograd gives) and the backward op's given its inputs
    (delta from the forward's bf16 O, which every kernel reads): what the worst rows' error is made of."""
    q, k, v, cu, _, do = inputs
    o, leaves = case.forward(inputs)
    dq = torch.autograd.grad(o, leaves, do)[0].double()
    ref = refs[0]
    ref_rows = ref.norm(dim=-1)
    floor = ATTENTION_RECIPES["bf16"].grad_row_floor * ref_rows.square().mean().sqrt().item()
    metric = (dq - ref).norm(dim=-1) / ref_rows.clamp_min(floor)
    starts = cu.tolist()
    scale = q.shape[-1] ** -0.5
    for flat in metric.flatten().argsort(descending=True)[:count].tolist():
        row, h = divmod(flat, metric.shape[1])
        seq = max(i for i, start in enumerate(starts[:-1]) if start <= row)
        first, offset = starts[seq], row - starts[seq]
        last = first + offset + 1 if case.causal else starts[seq + 1]
        kk, vv = k[first:last, h].double(), v[first:last, h].double()
        p_row = torch.softmax(scale * kk @ q[row, h].double(), 0)
        dp = vv @ do[row, h].double()
        exact = scale * (p_row * (dp - (p_row * dp).sum())) @ kk
        given_o = scale * (p_row * (dp - do[row, h].double() @ o[row, h].double())) @ kk
        print(f"dQ row {row} head {h} (sequence {seq}, offset {offset}, {last - first} keys, max P "
              f"{p_row.max().item():.3f}): check metric {metric[row, h].item():.3g}; |ref| / floor "
              f"{ref_rows[row, h].item() / floor:.3g}; error against the exact gradient "
              f"{(dq[row, h] - exact).norm().item() / max(exact.norm().item(), floor):.3g}, against the op's given "
              f"its bf16 O {(dq[row, h] - given_o).norm().item() / max(given_o.norm().item(), floor):.3g}")


if __name__ == "__main__":
    main()
