"""The ONNX converters of sequences and optionals, registered into `onnx_ops.CONVERTERS` like the others.

A *sequence* is a Python list of the values of its elements (each a traced tensor or a numpy constant) while
everything about it is known at import (its length, the positions it is read at, the pieces of a split): the
fast path, where what reaches the graph are the element tensors. Where something is not known then (a position
or split computed from the inputs, a split along a symbolic axis, a sequence input of unknown length, a `Loop`
carrying one with a computed trip count) it becomes a run-time list (`onnx_seq_runtime.py`, `F.make_list`),
run by the executor. An *optional* is its value when it has one and `EMPTY` when not (import time only).
Graph inputs and outputs of sequence type are Python lists of arrays of the compiled model (a fixed length
with `from_onnx(input_shapes={name: [shape, ...]})`, any length without).

Control flow carrying them: an `If` whose condition is known at import inlines the taken branch (any
types); a data-dependent one needs both branches to yield the same structure (sequences of one length, no
empty optional). A `Loop` carrying a sequence or an optional is unrolled at import where its trip count (and
condition) are known then, at most `MAX_UNROLL` iterations; else it runs as a loop carrying a run-time list.
"""
from __future__ import annotations

import numpy as np

from . import F
from . import lists, onnx_seq_runtime as rt
from ..runtime.kernels_lists import split_sizes
from .list_values import TensorList
from .onnx_ops import OnnxImportError, _const, _is_const, _rank, _shape, converter

MAX_UNROLL = 1024           # iterations of a Loop unrolled at import (one copy of the body each)
KNOWN = "must be known when the model is imported"        # the phrase of the refusals of data-dependent operands


class _Empty:
    """The value of an empty optional (one instance, `EMPTY`)."""
    __slots__ = ()

    def __repr__(self):
        return "an empty optional"


EMPTY = _Empty()


def is_structured(v) -> bool:
    """A sequence (known at import, or a run-time list) or an empty optional: not a tensor."""
    return isinstance(v, (list, _Empty, TensorList))


def describe(v) -> str:
    return "an empty optional" if v is EMPTY else "a sequence" if isinstance(v, (list, TensorList)) else "a tensor"


_what = describe


def _seq(v, node, what="input 0"):
    if not isinstance(v, (list, TensorList)):
        raise OnnxImportError(f"{node.op_type}'s {what} must be a sequence, got {_what(v)}")
    return v


def _tensor(v, node, what):
    if v is None or is_structured(v):
        raise OnnxImportError(f"{node.op_type}'s {what} must be a tensor, got {_what(v) if v is not None else 'none'}")
    return v


def _same_dtype(seq: list, x, node):
    if seq and np.dtype(seq[0].dtype) != np.dtype(x.dtype):
        raise OnnxImportError(f"{node.op_type}: a {np.dtype(x.dtype).name} tensor cannot join a sequence of "
                              f"{np.dtype(seq[0].dtype).name} tensors (a sequence holds one dtype)")


def _position(p, n: int, node, insert: bool = False) -> int:
    """A position of a sequence of `n` elements, known at import; negative ones count from the end."""
    arr = _const(p, f"{node.op_type}'s position", node)
    if arr.size != 1 or arr.dtype.kind not in "iu":
        raise OnnxImportError(f"{node.op_type}'s position must be one integer, got {arr.dtype} {arr.shape}")
    pos, hi = int(arr.reshape(-1)[0]), n if insert else n - 1
    if not -n <= pos <= hi:
        raise OnnxImportError(f"{node.op_type}: position {pos} is out of range [{-n}, {hi}] for a sequence of "
                              f"{n} tensor{'s' if n != 1 else ''}")
    return pos + n if pos < 0 else pos


def value_type(vi) -> tuple:
    """``(kind, tensor type proto)`` of a graph input: kind "tensor" or "sequence" (of tensors of that type);
    an optional is typed as its element (it is imported present, or empty when fixed to None)."""
    tp, name = vi.type, vi.name
    if tp.HasField("optional_type"):
        tp = tp.optional_type.elem_type
    if tp.HasField("tensor_type"):
        return "tensor", tp.tensor_type
    if tp.HasField("sequence_type") and tp.sequence_type.elem_type.HasField("tensor_type"):
        return "sequence", tp.sequence_type.elem_type.tensor_type
    raise OnnxImportError(f"from_onnx: input {name!r} is a {tp.WhichOneof('value') or 'value of no type'} "
                          "(supported: tensors, sequences of tensors, optionals of those)")


def check_output(name: str, v):
    """A graph output's value: a tensor, or a list of them (a sequence); an empty optional has no value."""
    if v is EMPTY:
        raise OnnxImportError(f"from_onnx: graph output {name!r} is an empty optional: the compiled model "
                              "returns arrays (lists of arrays for sequences), it has nothing to return there")
    return v


# ----------------------------------------------------------------------------------------- sequences
@converter("SequenceConstruct")
def _construct(ins, a, ctx, env, node):
    return [[_tensor(x, node, f"input {k}") for k, x in enumerate(ins)]]    # one dtype: the schema's check


@converter("SequenceEmpty")
def _empty(ins, a, ctx, env, node):
    return [[]]


@converter("SequenceInsert")
def _insert(ins, a, ctx, env, node):
    seq, x = _seq(ins[0], node), _tensor(ins[1], node, "tensor")
    pos = None if len(ins) < 3 else ins[2]
    if rt.needs_runtime(seq, pos):
        lst = rt.to_runtime(seq, like=x)
        return [F.list_append(lst, x) if pos is None else F.list_insert(lst, x, rt.position(pos))]
    seq = list(seq)
    _same_dtype(seq, x, node)
    pos = len(seq) if len(ins) < 3 or ins[2] is None else _position(ins[2], len(seq), node, insert=True)
    seq.insert(pos, x)
    return [seq]


@converter("SequenceErase")
def _erase(ins, a, ctx, env, node):
    seq = _seq(ins[0], node)
    pos = None if len(ins) < 2 else ins[1]
    if rt.needs_runtime(seq, pos):
        return [F.list_erase(rt.to_runtime(seq), -1 if pos is None else rt.position(pos))]
    seq = list(seq)
    if not seq:
        raise OnnxImportError("SequenceErase of an empty sequence")
    pos = len(seq) - 1 if len(ins) < 2 or ins[1] is None else _position(ins[1], len(seq), node)
    del seq[pos]
    return [seq]


@converter("SequenceAt")
def _at(ins, a, ctx, env, node):
    seq = _seq(ins[0], node)
    if rt.needs_runtime(seq, ins[1]):
        return F.list_at(rt.to_runtime(seq), rt.position(ins[1]))
    return seq[_position(ins[1], len(seq), node)]


@converter("SequenceLength")
def _length(ins, a, ctx, env, node):
    seq = _seq(ins[0], node)
    return F.list_length(seq) if rt.is_runtime(seq) else np.asarray(len(seq), dtype=np.int64)


@converter("ConcatFromSequence")
def _concat_from_sequence(ins, a, ctx, env, node):
    seq = _seq(ins[0], node)
    if rt.is_runtime(seq):
        axis, new_axis = a["axis"], bool(a.get("new_axis", 0))
        return lists.join("list_stack" if new_axis else "list_concat", seq, axis, allow_empty=False)   # as ORT
    if not seq:
        raise OnnxImportError("ConcatFromSequence of an empty sequence (its result has no known dtype or shape)")
    axis, new_axis = a["axis"], bool(a.get("new_axis", 0))
    r = _rank(seq[0]) + new_axis
    if not -r <= axis < r:
        raise OnnxImportError(f"ConcatFromSequence: axis {axis} is out of range for rank-{_rank(seq[0])} tensors"
                              f"{' (new_axis)' if new_axis else ''}")
    return F.stack(list(seq), axis=axis % r) if new_axis else F.concat(list(seq), axis=axis % r)


@converter("SplitToSequence")
def _split_to_sequence(ins, a, ctx, env, node):
    x = _tensor(ins[0], node, "input")
    axis = a.get("axis", 0)
    if not -_rank(x) <= axis < _rank(x):
        raise OnnxImportError(f"SplitToSequence: axis {axis} is out of range for a rank-{_rank(x)} tensor")
    axis %= _rank(x)
    dim = _shape(x)[axis]
    split = None if len(ins) < 2 else ins[1]
    if not isinstance(dim, (int, np.integer)) or rt.needs_runtime(None, split):
        # the number or the sizes of the pieces are known when the model runs: a run-time list
        return [F.split_to_list(x, split, axis, bool(a.get("keepdims", 1)))]
    split = None if split is None else _const(split, "SplitToSequence's split", node)
    if split is not None and (split.dtype.kind not in "iu" or split.ndim > 1):
        raise OnnxImportError(f"SplitToSequence: split must be an integer scalar or 1-d tensor, got {split.dtype} "
                              f"{split.shape}")
    try:
        sizes = split_sizes(int(dim), split)
    except ValueError as e:
        raise OnnxImportError(f"SplitToSequence: {e}") from None
    pieces = [x] if len(sizes) == 1 else [] if not sizes else \
        F.split(x, [int(v) for v in np.cumsum(sizes)[:-1]], axis=axis)
    pieces = list(pieces)
    if split is None and not a.get("keepdims", 1):
        pieces = [F.squeeze(p, (axis,)) for p in pieces]
    return [pieces]


@converter("SequenceMap")
def _sequence_map(ins, a, ctx, env, node):
    body = a["body"].g
    for k, v in enumerate(ins):
        if rt.is_runtime(v):
            raise OnnxImportError(f"SequenceMap over a sequence whose length is known only when the model runs "
                                  f"(input {k}): its length {KNOWN}")
    n = len(_seq(ins[0], node))
    for k, v in enumerate(ins[1:], 1):
        if isinstance(v, list) and len(v) != n:
            raise OnnxImportError(f"SequenceMap: input sequence {k} has {len(v)} elements, input 0 has {n}")
    outs = [ctx.run_graph(body, env, [v[i] if isinstance(v, list) else v for v in ins]) for i in range(n)]
    return [[o[k] for o in outs] for k in range(len(body.output))]


# ----------------------------------------------------------------------------------------- optionals
@converter("Optional")
def _optional(ins, a, ctx, env, node):
    return [ins[0] if ins and ins[0] is not None else EMPTY]


@converter("OptionalHasElement")
def _has_element(ins, a, ctx, env, node):
    return np.asarray(bool(ins) and ins[0] is not None and ins[0] is not EMPTY)


@converter("OptionalGetElement")
def _get_element(ins, a, ctx, env, node):
    if not ins or ins[0] is None or ins[0] is EMPTY:
        raise OnnxImportError("OptionalGetElement of an empty optional (the model fails there for every input)")
    return [ins[0]]


# ------------------------------------------------------------------------------------- control flow
def cond_branch(outs: list, seen: list) -> tuple:
    """The outputs of one branch of an `If` whose condition is computed from the inputs: both branches must
    yield the same structure (a sequence the same length in both, no empty optional), else the condition
    must be known at import (the branch is then inlined)."""
    for k, v in enumerate(outs):
        if v is EMPTY:
            raise OnnxImportError(f"output {k} of a branch is an empty optional; with a condition computed from "
                                  f"the inputs both branches must yield values: the condition {KNOWN}")
    lengths = [len(v) if isinstance(v, list) else "?" if isinstance(v, TensorList) else None for v in outs]
    if seen and seen[0] != lengths:
        raise OnnxImportError(f"the branches yield sequences of different lengths ({seen[0]} and {lengths}); "
                              f"with a condition computed from the inputs they must match: the condition {KNOWN}")
    seen.append(lengths)
    return tuple(outs)


def can_unroll(e: Exception, ins) -> bool:
    """Whether a `Loop` whose body was refused as a loop (`e`: an operand that must be known at import, such
    as `Slice` bounds computed from the iteration number) is unrolled instead: its trip count and condition
    known at import, at most `MAX_UNROLL` iterations."""
    trip, cond = ins[0], ins[1]
    return (KNOWN in str(e) and trip is not None and _is_const(trip) and (cond is None or _is_const(cond))
            and int(np.asarray(trip).reshape(-1)[0]) <= MAX_UNROLL)


def unroll_loop(ins, a, ctx, env, node) -> list:
    """A `Loop` unrolled at import (one carrying a sequence or an optional, or one `can_unroll`): the body
    converted once per iteration into the enclosing graph, with the iteration number a constant (so
    `SequenceAt(seq, i)` or a `Slice` at `i` resolves)."""
    body = a["body"].g
    trip, cond, carried = ins[0], ins[1], list(ins[2:])
    why = ("a Loop carrying a sequence or an optional is unrolled when the model is imported, so its"
           if any(is_structured(v) for v in carried) else "this Loop is unrolled when the model is imported (its "
           "body needs its iteration number then), so its")
    if trip is not None and not _is_const(trip):
        raise OnnxImportError(f"{why} trip count {KNOWN} (it is computed from the inputs)")
    if cond is not None and not _is_const(cond):
        raise OnnxImportError(f"{why} condition {KNOWN} (it is computed from the inputs)")
    n = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
    if cond is None and (n is None or n > MAX_UNROLL):
        raise OnnxImportError(f"{why} trip count must be at most {MAX_UNROLL} (it is "
                              f"{'absent' if n is None else n})")
    go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    n_carried = len(carried)
    scans, i = [], 0
    while go and (n is None or i < n):
        if i == MAX_UNROLL:
            raise OnnxImportError(f"{why} iterations are limited to {MAX_UNROLL}; this one runs on")
        outs = ctx.run_graph(body, env, [np.asarray(i, np.int64), np.asarray(go), *carried])
        if cond is not None:            # without a condition input the body's condition output is ignored
            if not _is_const(outs[0]):
                raise OnnxImportError(f"{why} condition {KNOWN}; the body computes it from the inputs")
            go = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried, scans, i = outs[1:1 + n_carried], scans + [outs[1 + n_carried:]], i + 1
    n_scan = len(body.output) - 1 - n_carried
    if n_scan and not scans:
        raise OnnxImportError(f"{why} scan outputs need one iteration at least (this one runs none: their "
                              "element shape is unknown)")
    return list(carried) + [F.stack([s[k] for s in scans], axis=0) for k in range(n_scan)]
