"""`from_torch`'s converters of torch's value assertions, enforced when the model runs (not dropped).

torch.export records `torch._check(u >= 2)` on an unbacked size (a `nonzero` count, an `item()`), and the ranges
it derives for such sizes, as ``_assert_scalar`` / ``sym_constrain_range(_for_size)`` nodes; ``_assert_async``
asserts a tensor's value. Each is:

* decided while importing where the sizes are known: a condition that always holds is dropped, one that never
  can is refused by name (a `TorchImportError` with the assertion and the user's line);
* otherwise checked at run time: the conditions of a (sub)graph (0-d bool values), and-ed, feed one `nonzero`,
  whose count (1 where they hold, 0 where not) is stated equal to 1 by an `assert_dims_equal` carrying the assertion as its rule, so the
  run-time dim check raises an `ExecutionError` quoting torch's message and the user's line. The checked value is
  tied into the last tensor output of the (sub)graph (the
  top graph's first outputs may be buffer mutations, which are dropped) by a `where(ok, out, out)` (bit-exact), so the check is
  part of the data flow and no pass can drop it.

Input `Dim` ranges are not asserted in the graph: they are the graph's `dim_ranges`, checked with the inputs
(an `InputError`), see `torch_export._input_ranges`.
"""
from __future__ import annotations

import numpy as np

from ..ir.ops_checks import DimPairAttrs
from ..ir.types import is_static_dim
from . import F
from .ops import apply
from .torch_control import converter, user_line
from .torch_ops import TorchImportError, dim_tensor
from .tracer import Tensor

#: the prefix of the rule of a run-time check made here (runtime/dim_check_run.py words its failure from it)
RULE = "torch's run-time assertion"


def _holds_now(cond):
    """True / False where `cond` is decided while importing, None where it is a traced value."""
    if isinstance(cond, Tensor):
        return None
    return bool(np.asarray(cond))


def _enforce(interp, node, cond, what: str):
    decided = _holds_now(cond)
    line = user_line(node)
    if decided is True:
        return None
    if decided is False:
        raise TorchImportError(f"{what} can never hold for this program (torch.export recorded it; the sizes "
                               f"dyntvm traced decide it false){' at ' + line if line else ''}")
    interp.pending_asserts.append((F.cast(cond, "bool"), what + (f" at {line}" if line else "")))
    return None


def _checked(pending: list):
    """One run-time check of all `pending` (condition, what) of a (sub)graph: their conjunction feeds one
    `nonzero` (a host op per check would cost a round trip each)."""
    ok = pending[0][0]
    for cond, _ in pending[1:]:
        ok = F.logical_and(ok, cond)
    count = F.nonzero(F.reshape(ok, (1,)))                          # [1, 1] where all hold, [1, 0] where not
    whats = [w for _, w in pending]
    rule = f"{RULE} {whats[0]}" if len(whats) == 1 else f"{RULE}s (one of: {'; '.join(whats)})"
    return apply("assert_dims_equal", "assert_dims_equal", [np.zeros((1, 1), np.int64), count],
                 DimPairAttrs(1, 1, rule))[0]


@converter("aten._assert_scalar.default")
def _assert_scalar(interp, gm, node, args, kwargs):
    cond = args[0]
    msg = args[1] if len(args) > 1 else kwargs.get("assert_msg", "")
    return _enforce(interp, node, cond, repr(str(msg)))


@converter("aten._assert_async.msg")
@converter("aten._assert_async.default")
def _assert_async(interp, gm, node, args, kwargs):
    cond = args[0]
    msg = args[1] if len(args) > 1 else "torch._assert_async"
    if isinstance(cond, Tensor):
        cond = F.not_equal(F.reshape(cond, ()), 0) if cond.dtype != "bool" else F.reshape(cond, ())
    return _enforce(interp, node, cond, repr(str(msg)))


def _range_cond(size, lo, hi):
    """`lo <= size <= hi` (either bound None: open) as a Python bool or a 0-d bool value."""
    if is_static_dim(size):
        s = int(size)
        return (lo is None or s >= lo) and (hi is None or s <= hi)
    v = dim_tensor(size)
    parts = ([F.greater_equal(v, np.int64(lo))] if lo is not None else []) + \
            ([F.less_equal(v, np.int64(hi))] if hi is not None else [])
    out = True
    for p in parts:
        out = p if out is True else F.logical_and(out, p)
    return out


@converter("aten.sym_constrain_range.default")
@converter("aten.sym_constrain_range_for_size.default")
def _constrain_range(interp, gm, node, args, kwargs):
    size = args[0]
    lo, hi = kwargs.get("min", args[1] if len(args) > 1 else None), kwargs.get("max", args[2] if len(args) > 2 else None)
    if node.target.__name__.startswith("sym_constrain_range_for_size"):
        lo = 0 if lo is None else lo                 # torch._check_is_size: a size, >= 0
    hi = None if hi is None or hi >= 2 ** 62 else int(hi)
    what = f"{lo if lo is not None else '-inf'} <= {size} <= {hi if hi is not None else 'inf'}"
    return _enforce(interp, node, _range_cond(size, lo, hi), f"'{what}' (sym_constrain_range)")


def tie_in(outs: list, checks: list) -> list:
    """`outs` with the last tensor made to depend on the run-time check of `checks` (its values unchanged)."""
    if not checks:
        return outs
    k = next((i for i in reversed(range(len(outs))) if isinstance(outs[i], Tensor)), None)
    if k is None:
        raise TorchImportError("from_torch: the program asserts a condition at run time but returns no traced "
                               "tensor to attach the check to")
    ok = F.equal(F.reshape(_checked(checks), ()), np.int64(0))     # the nonzero index: 0 (true where it ran)
    outs = list(outs)
    outs[k] = F.where(ok, outs[k], outs[k])
    return outs
