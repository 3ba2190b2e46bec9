"""ONNX sequences known only when the model runs: the run-time lists of dyntvm (`F.make_list`, `TensorList`).

`onnx_seq.py` keeps a sequence a Python list of element values while everything about it is known at import
(its length, the positions it is read at): that is the fast path, and what reaches the graph are the element
tensors. Where something is not known then (a position or a split computed from the inputs, a split along a
symbolic axis, a sequence input of unknown length, a `Loop` carrying a sequence whose trip count or condition
is computed) the sequence becomes a run-time list here, and stays one from there on.
"""
from __future__ import annotations

import contextlib

import numpy as np

from . import F
from .list_values import TensorList
from .onnx_ops import OnnxImportError, _is_const
from .tracer import current, tracing


def is_runtime(v) -> bool:
    return isinstance(v, TensorList)


def declared_elem(tp):
    """(dtype, shape with None for a dim that is not a fixed int) of the elements of a declared sequence type (an
    ONNX TypeProto), or None where the model does not say (no elem type, no shape)."""
    from onnx import helper
    if tp.HasField("optional_type"):
        tp = tp.optional_type.elem_type
    if not tp.HasField("sequence_type") or not tp.sequence_type.elem_type.HasField("tensor_type"):
        return None
    tt = tp.sequence_type.elem_type.tensor_type
    if not tt.elem_type or not tt.HasField("shape"):
        return None
    return (np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name,
            tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim))


def to_runtime(seq, like=None, declared=None, what="the sequence") -> TensorList:
    """`seq` as a run-time list: an import-time sequence (a Python list of element values) becomes
    `F.make_list` of its elements; an empty one takes its element dtype and rank from `like` (a tensor it will
    hold) or `declared` (``(dtype, shape)``, `declared_elem`)."""
    if isinstance(seq, TensorList):
        return seq
    if seq:
        return F.make_list(*seq)
    if like is not None:
        return F.list_empty(np.dtype(like.dtype).name, (None,) * len(like.shape))
    if declared is not None:
        return F.list_empty(declared[0], declared[1])
    raise OnnxImportError(f"{what} is empty when the model is imported and its element type (dtype, rank) is not "
                          "declared in the model: declare it (a sequence type with an element shape)")


def position(p):
    """An ONNX position operand (an integer scalar or one-element tensor) as `F.list_*` takes it."""
    if _is_const(p):
        return np.asarray(p).reshape(-1)[0].astype(np.int64) if np.size(p) == 1 else np.asarray(p)
    return F.reshape(p, ())


def needs_runtime(seq, *operands) -> bool:
    """Whether an op on sequence `seq` runs on a run-time list: the sequence is one, or an operand is computed
    from the inputs."""
    return isinstance(seq, TensorList) or any(o is not None and not _is_const(o) for o in operands)


@contextlib.contextmanager
def rollback(always: bool = False):
    """Undo what a failed attempt recorded into the current trace (nodes, constants, captures), so another way
    of converting the same node starts from a clean builder: an unrolled `Loop` whose condition turns out to be
    computed from the inputs falls back to a run-time loop."""
    if not tracing():
        yield
        return
    b = current()
    saved = (len(b.nodes), len(b.inputs), len(b.captures), dict(b.consts), dict(b.capture_inputs), set(b.owned),
             dict(b.mask_dims), dict(b.sym_values))
    try:
        yield
    except (BaseException if always else OnnxImportError):
        n_nodes, n_inputs, n_caps, consts, caps, owned, masks, syms = saved
        del b.nodes[n_nodes:], b.inputs[n_inputs:], b.captures[n_caps:]
        b.consts, b.capture_inputs, b.owned, b.mask_dims, b.sym_values = consts, caps, owned, masks, syms
        raise


def runtime_carries(carried: list, body, probe) -> list:
    """The carried values of a `Loop` that runs at run time: its sequences as run-time lists. An empty one takes
    its element type from the body's declared input, else from what one iteration of the body adds to it
    (`probe()`: the body's outputs converted once at import, then rolled back)."""
    out, probed = [], None
    for k, v in enumerate(carried):
        if isinstance(v, list):
            vi = body.input[2 + k]
            declared = declared_elem(vi.type)
            if declared is None and not v:
                if probed is None:
                    probed = _probe(probe)
                new = probed[1 + k] if probed and 1 + k < len(probed) else None
                if isinstance(new, list) and new:
                    declared = (np.dtype(new[0].dtype).name, (None,) * len(new[0].shape))
                elif isinstance(new, TensorList):
                    declared = (new.type.dtype, (None,) * new.type.elem.ndim)
            v = to_runtime(v, declared=declared, what=f"Loop's carried sequence {vi.name!r}")
        out.append(v)
    return out


def _probe(probe) -> list:
    try:
        with rollback(True):
            raise _Probed(probe())
    except _Probed as p:
        return p.outs
    except Exception:   # noqa: BLE001 - the body cannot run at import: its element type stays unknown (refused)
        return []


class _Probed(Exception):
    def __init__(self, outs):
        self.outs = outs


def runtime_outputs(outs: list, graph) -> tuple:
    """The outputs of a branch of an `If` whose branches yield sequences of different lengths: each sequence a
    run-time list (an empty one typed as the branch declares it)."""
    return tuple(to_runtime(v, declared=declared_elem(vi.type), what=f"the branch output {vi.name!r}")
                 if isinstance(v, list) else v for v, vi in zip(outs, graph.output))


def carried_like(v, init):
    """A body output carried where the loop's value is `init`: a Python list (a sequence the body built at import)
    made a run-time list when `init` is one."""
    if isinstance(init, TensorList) and isinstance(v, list):
        return to_runtime(v, like=None, declared=(init.type.dtype, tuple(
            d if isinstance(d, int) else None for d in init.type.elem.shape)))
    return v
