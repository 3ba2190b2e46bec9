"""The checks of `frontend/onnx.py` against the ONNX spec: each node against its op's schema at the model's opset
(input / output counts, required inputs and attributes, attribute types, the types of its inputs under the
schema's type constraints), and each (sub)graph output against its declared type."""
from __future__ import annotations

import numpy as np

from .onnx_ops import OnnxImportError, _np_dtype
from .list_values import TensorList
from .onnx_seq import EMPTY


def _n(k: int, what: str) -> str:
    return f"{k} {what}{'' if k == 1 else 's'}"


def check_node(node, opset: int, ins: list) -> None:
    """`node` against its op's ONNX schema at `opset`: input / output counts, no empty name for a required
    input ('' marks an omitted optional one), required attributes present, attributes of the declared types,
    input values of the types its type constraints allow (those sharing a type parameter of one type)."""
    from onnx import AttributeProto, defs
    try:
        s = defs.get_schema(node.op_type, opset, "")
    except Exception:  # noqa: BLE001 - no schema at this opset: the converter judges
        return

    def count(lo, hi, what):
        return _n(lo, what) if lo == hi else f"at least {_n(lo, what)}" if hi > 1 << 20 else f"{lo} to {hi} {what}s"
    op = node.op_type
    if not s.min_input <= len(node.input) <= s.max_input:
        raise OnnxImportError(f"{op} takes {count(s.min_input, s.max_input, 'input')}, the node has {len(node.input)}")
    if not s.min_output <= len(node.output) <= s.max_output:
        raise OnnxImportError(f"{op} has {count(s.min_output, s.max_output, 'output')}, the node names "
                              f"{len(node.output)}")
    single = defs.OpSchema.FormalParameterOption.Single
    for k, name in enumerate(node.input):
        formal = s.inputs[min(k, len(s.inputs) - 1)]
        if not name and formal.option == single:
            raise OnnxImportError(f"{op}'s input {k} ({formal.name!r}) is required, but its name is empty ('' marks "
                                  "an omitted optional input)")
    for a in node.attribute:
        want = s.attributes.get(a.name)
        if want is not None and a.type and int(a.type) != int(want.type):
            raise OnnxImportError(f"{op}'s attribute {a.name!r} must be an {want.type.name}, got a "
                                  f"{AttributeProto.AttributeType.Name(a.type)}")
    given = {a.name for a in node.attribute}
    for name, at in s.attributes.items():
        if at.required and name not in given:
            raise OnnxImportError(f"{op}'s required attribute {name!r} is missing")
    _check_input_types(node, s, ins)


def type_str(v) -> str | None:
    """The ONNX type string of an imported value (``tensor(float)``, ``seq(tensor(int64))``); None where it
    says nothing (an empty sequence or optional, a dtype ONNX has no name for)."""
    from onnx import TensorProto, helper
    if isinstance(v, list):
        inner = type_str(v[0]) if v else None
        return None if inner is None else f"seq({inner})"
    if isinstance(v, TensorList):         # a sequence known when the model runs
        return f"seq({type_str(np.empty(0, v.type.dtype))})"
    if getattr(v, "dtype", None) is None:
        return None
    try:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype))
    except (KeyError, TypeError, ValueError):
        return None
    return f"tensor({TensorProto.DataType.Name(elem).lower()})"


def _check_input_types(node, schema, ins: list) -> None:
    """Each input of a type its formal parameter allows; inputs bound to one type parameter (Add's A and B, T)
    of one type (ONNX does not promote: a float32 + int64 Add is malformed)."""
    from onnx import defs
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    variadic = defs.OpSchema.FormalParameterOption.Variadic
    bound: dict = {}            # type parameter -> (type string, the input that bound it)
    for k, v in enumerate(ins):
        formal = schema.inputs[min(k, len(schema.inputs) - 1)]
        ts, param = type_str(v), formal.type_str
        types = allowed.get(param, {param})
        if ts is None or any(t.startswith(("optional(", "map(", "sparse_tensor(")) for t in types):
            continue            # optionals are imported as their element (or EMPTY): judged by their converters
        what = f"{node.op_type}'s input {k} ({formal.name!r})"
        if ts not in types:
            raise OnnxImportError(f"{what} is {ts}; the spec allows {', '.join(sorted(types))}")
        if param not in allowed or (formal.option == variadic and not formal.is_homogeneous):
            continue
        first = bound.setdefault(param, (ts, k))
        if first[0] != ts:
            raise OnnxImportError(f"{what} is {ts}, but input {first[1]} is {first[0]}: both are of type {param}, "
                                  "which must be one type (ONNX does not promote; insert a Cast)")


def check_declared(vi, v, check_dims: bool, where: str) -> None:
    """Output `v` of a graph (`where`: "from_onnx: graph", "Loop's body") against its declared type `vi`: a
    tensor of the declared dtype and rank, its static dims the declared ones (when `check_dims`: not where
    input_shapes changed the inputs' sizes); an optional likewise; a sequence of elements of the declared
    dtype."""
    tp = vi.type
    if tp.HasField("optional_type"):
        if v is EMPTY:
            return
        tp = tp.optional_type.elem_type
    if tp.HasField("sequence_type"):
        if isinstance(v, TensorList):
            _check_tensor(f"{where} output {vi.name!r}'s elements", tp.sequence_type.elem_type.tensor_type,
                          np.empty((0,) * v.type.elem.ndim, v.type.dtype), None)
            return
        if not isinstance(v, list):
            raise OnnxImportError(f"{where} output {vi.name!r} is declared a sequence, it is a tensor")
        for k, e in enumerate(v):       # the dtype only: the elements' shapes may differ, a declared one is loose
            _check_tensor(f"{where} output {vi.name!r}[{k}]", tp.sequence_type.elem_type.tensor_type, e, None)
    elif tp.HasField("tensor_type"):
        if isinstance(v, (list, TensorList)) or v is EMPTY:
            raise OnnxImportError(f"{where} output {vi.name!r} is declared a tensor, it is "
                                  f"{'an empty optional' if v is EMPTY else 'a sequence'}")
        _check_tensor(f"{where} output {vi.name!r}", tp.tensor_type, v, check_dims)


def _check_tensor(what: str, tt, v, check_dims: bool | None) -> None:
    """A tensor against its declared type: the dtype; the rank unless check_dims is None, its static dims too
    when check_dims is true."""
    if getattr(v, "dtype", None) is None:
        raise OnnxImportError(f"{what} has no value (an output the node that names it does not yield)")
    if tt.elem_type:
        want = _np_dtype(tt.elem_type, what)
        if np.dtype(v.dtype) != want:
            raise OnnxImportError(f"{what} is declared {want.name}, it is {np.dtype(v.dtype).name}")
    if check_dims is None or not tt.HasField("shape"):
        return
    shape, dims = tuple(v.shape), tt.shape.dim
    if len(dims) != len(shape):
        raise OnnxImportError(f"{what} is declared of rank {len(dims)}, it has rank {len(shape)} (shape {shape})")
    for ax, (d, got) in enumerate(zip(dims, shape)):
        if check_dims and d.HasField("dim_value") and isinstance(got, (int, np.integer)) and d.dim_value != got:
            raise OnnxImportError(f"{what} is declared with dim {d.dim_value} at axis {ax}, it has {got} (shape "
                                  f"{shape})")
