"""Types of loop-carried values and per-step outputs while a loop body is traced (`control_flow.py`'s loops):
the fixpoint that turns dims changing between iterations into unknown dims (named by where they change), and
the checks that carried values keep their dtype and rank."""
from __future__ import annotations

from ..ir.list_type import ListType, all_dims, join_carried, same_kind
from ..ir.types import TensorType, dim_symbols, fresh_dim, set_dim_origin
from .tracer import site, trace_error, user_source

_LIST_STEP = ("a per-step output is a list: per-step outputs are stacked into one tensor; carry the list as a "
              "loop variable instead (F.list_append in the body)")


def _state_types_fixpoint(api, body_trace, in_types, rule, slot):
    """Trace the body until loop-carried types are stable: dims that change become unknown dims.

    Returns the final trace, the carried types and the set of unknown dims made here (they vary
    between iterations)."""
    types, made = list(in_types), set()
    for _ in range(4):
        sub, new_types = body_trace(types)
        _check_carried(api, rule, slot, types, new_types)
        joined = [join_carried(a, b, made) for a, b in zip(types, new_types)]
        if joined == types:
            return sub, types, made
        new = {d for t in joined for d in all_dims(t)} - {d for t in types for d in all_dims(t)}
        _name_varying_dims(api, slot, joined, new)
        made |= new
        types = joined
    raise trace_error(f"{api}: {slot} types did not settle after 4 traces")  # pragma: no cover


def _name_varying_dims(api, slot, types, new) -> None:
    where = site(user_source())
    for i, t in enumerate(types):
        if isinstance(t, ListType):
            named = [(t.length, "the length"), *((d, f"axis {ax} of an element") for ax, d in enumerate(t.elem.shape))]
        else:
            named = [(d, f"axis {ax}") for ax, d in enumerate(t.shape)]
        for d, what in named:
            if d in new:
                set_dim_origin(d, f"{what} of {slot}[{i}] of {api} at {where} (it changes between iterations)")


def _check_carried(api, rule, slot, old_types, new_types):
    """Loop-carried values keep dtype and rank (traced types, or the types of eager values)."""
    for i, (a, b) in enumerate(zip(old_types, new_types)):
        if not same_kind(a, b):
            raise trace_error(f"{api}: {rule}; {slot}[{i}] is {a} in and {b} out")


def _stacked_type(lead, t: TensorType, varying: set) -> TensorType:
    """Type of per-step outputs of type `t` stacked on a new axis of size `lead`; a dim that refers to
    a loop-carried dim which varies between iterations is unknown outside the loop."""
    if isinstance(t, ListType):
        raise trace_error(_LIST_STEP)
    dims = tuple(fresh_dim(origin=f"axis {ax + 1} of a stacked per-step output (it changes between iterations)")
                 if isinstance(d, str) and dim_symbols(d) & varying else d for ax, d in enumerate(t.shape))
    return TensorType((lead,) + dims, t.dtype)
