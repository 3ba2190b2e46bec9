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
* before what they guard: the tensors an assertion's condition is computed from (the `nonzero` result whose size
  it bounds) are gated the same way, `where(ok, t, t)`, before the first index into them (`check_before`,
  `GUARDED_OPS`), so `torch._check(v.shape[0] >= 2); v[1]` raises torch's message, not the index's error.
  The asserts pending at that point are checked together (one `nonzero`, as at the end).

Input `Dim` ranges are not asserted in the graph: they are the graph's `dim_ranges`, checked with the inputs
(an `InputError`), see `torch_export._input_ranges`.
"""
from __future__ import annotations

import numpy as np

from ..ir.list_type import value_dims
from ..ir.ops_checks import DimPairAttrs
from ..ir.types import is_static_dim, is_symbol
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
    interp.pending_asserts.append((F.cast(cond, "bool"), what + (f" at {line}" if line else ""), _guarded(node)))
    return None


def _is_tensor_meta(val) -> bool:
    if isinstance(val, (list, tuple)):
        return any(_is_tensor_meta(v) for v in val)
    return hasattr(val, "shape") and hasattr(val, "dtype")


def _guarded(node) -> set:
    """The FX nodes of the tensors the assertion `node` talks about: the nearest tensor-valued nodes its
    condition is computed from (through SymInt nodes: `sym_size(v, 0) >= 2` -> v)."""
    found, todo, seen = set(), list(node.all_input_nodes), set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if _is_tensor_meta(n.meta.get("val")):
            found.add(n)
        else:
            todo.extend(n.all_input_nodes)
    return found


#: the ops that fail on an index the assertion rules out (`torch._check(v.shape[0] > 1); v[1]`): they run after
#: the check. (Never out of bounds: dyntvm checks their indices; only the error would be theirs, not torch's.)
#: Other ops keep the check at the end: a gate is a copy of the tensor, on the branchy example's path.
GUARDED_OPS = {"aten.select.int", "aten.index.Tensor", "aten.gather.default", "aten.index_select.default",
               "aten.embedding.default"}


def check_before(interp, node, env: dict) -> None:
    """Where `node` indexes into a tensor a pending assertion talks about (`GUARDED_OPS`), or by a size (a
    SymInt node): the pending asserts checked now, and those tensors in `env` (and the builder's values of their
    sizes) gated by the check, so that `node` and all after it run only where the assertions hold."""
    pending = [p for p in interp.pending_asserts if p[1] is not None]
    if not pending or str(node.target) not in GUARDED_OPS:      # an OpOverload prints "aten.select.int"
        return
    guarded = set().union(*(g for _, _, g in pending))
    if not any(n in guarded or not _is_tensor_meta(n.meta.get("val")) for n in node.all_input_nodes):
        return
    ok = F.equal(F.reshape(_checked(pending), ()), np.int64(0))
    for n in guarded:
        if isinstance(env.get(n), Tensor):
            old = env[n]
            env[n] = F.where(ok, old, old)
            for d in value_dims(old.type):      # a size of it read later (`zeros(n - 2)`) reads the gated value
                if is_symbol(d) and d in old.builder.sym_values:
                    old.builder.sym_values[d] = env[n].value
    interp.pending_asserts[:] = [p for p in interp.pending_asserts if p[1] is None] + [(ok, None, set())]


def _checked(pending: list):
    """One run-time check of all `pending` (condition, what) of a (sub)graph: their conjunction feeds one
    `nonzero` (a host op per check would cost a round trip each)."""
    ok = pending[0][0]
    for cond, *_ in pending[1:]:
        ok = F.logical_and(ok, cond)
    count = F.nonzero(F.reshape(ok, (1,)))                          # [1, 1] where all hold, [1, 0] where not
    whats = [w for _, w, *_ in pending]
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
    """`outs` with the last tensor made to depend on the run-time check of `checks` (its values unchanged):
    those still pending (condition, what, guarded) checked now; those `check_before` made (ok, None, ...) too,
    as their gated tensors may feed no output."""
    if not checks:
        return outs
    k = next((i for i in reversed(range(len(outs))) if isinstance(outs[i], Tensor)), None)
    if k is None:
        raise TorchImportError("from_torch: the program asserts a condition at run time but returns no traced "
                               "tensor to attach the check to")
    pending = [c for c in checks if c[1] is not None]
    oks = [c[0] for c in checks if c[1] is None]
    if pending:
        oks.append(F.equal(F.reshape(_checked(pending), ()), np.int64(0)))   # the nonzero index: 0 where it ran
    ok = oks[0]
    for more in oks[1:]:
        ok = F.logical_and(ok, more)
    outs = list(outs)
    outs[k] = F.where(ok, outs[k], outs[k])
    return outs
