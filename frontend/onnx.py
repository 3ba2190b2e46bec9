"""ONNX importer: `from_onnx(path_or_model) -> Graph`.

The ONNX graph is *interpreted under the tracer*: each node's converter (one per ONNX op, in `CONVERTERS`)
calls `dyntvm.F` ops on the values of its inputs, so every ONNX op lands on the same op registry, type rules
and control-flow builders as a traced Python model (one op in one place). Values known at import time
(initializers, `Constant`, and whatever is computed from them only: the `Shape -> Gather -> Concat`
chains exporters emit for static shapes) stay numpy arrays and fold away; converters that need a static
operand (a `Reshape` target, `Slice` bounds, `Unsqueeze` axes) read it from there, and take the dynamic
variant where dyntvm has one (`Reshape` with a computed shape).

Control flow: `If` becomes `F.cond` (a branch subgraph reads outer values by name; the tracer turns those
into explicit captures), `Loop` becomes `F.while_loop` (trip count as `max_iterations`, the loop-carried
values as loop vars, scan outputs stacked to the iterations run, zero included), `Scan` becomes
`F.foreach`. Symbolic dims (`dim_param`) become symbols of the same name; unknown dims fresh symbols.
Unsupported ops are listed all at once, subgraphs included, before anything is converted.
"""
from __future__ import annotations

import os
import re

import numpy as np


from dyntvm.errors import InputError, TraceError, UnsupportedOpError

from . import onnx_control, onnx_nn, onnx_vision  # noqa: F401  (register If, Loop, Scan, LSTM, GRU; activations,
#                                                    BatchNorm; Conv, pooling)
from .onnx_ops import CONVERTERS, OnnxImportError, _np_dtype, _tensor
from .tracer import TensorSpec, trace

__all__ = ["from_onnx", "unsupported_ops", "CONVERTERS", "OnnxImportError"]

# ------------------------------------------------------------------------------------------ loading
def _load(model):
    try:
        import onnx
    except ImportError:
        raise InputError("from_onnx: the `onnx` package is needed to read ONNX models (pip install onnx)") from None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if os.path.isdir(path):
            raise InputError(f"from_onnx: {path!r} is a directory, not an ONNX model file")
        if not os.path.isfile(path):
            raise InputError(f"from_onnx: no such file {path!r}")
        try:
            model = onnx.load(path)
        except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError and friends
            raise InputError(f"from_onnx: {path!r} is not a readable ONNX model ({type(e).__name__}: {e})") from None
    if not isinstance(model, onnx.ModelProto):
        raise InputError(f"from_onnx: expected a path or an onnx.ModelProto, got {type(model).__name__}")
    if not model.HasField("graph"):         # an empty file, or another protobuf, parses as an empty ModelProto
        where = f"{path!r}" if "path" in locals() else "the model"
        raise InputError(f"from_onnx: {where} is not an ONNX model (it has no graph)")
    return model


def _opsets(model) -> dict:
    return {(o.domain or "ai.onnx"): o.version for o in model.opset_import}


def _walk_nodes(graph):
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.g is not None and a.HasField("g"):
                yield from _walk_nodes(a.g)
            for g in a.graphs:
                yield from _walk_nodes(g)


def unsupported_ops(model) -> list:
    """The ONNX op types of `model` (subgraphs included) without a converter, sorted."""
    return sorted({(n.domain + "." if n.domain not in ("", "ai.onnx") else "") + n.op_type
                   for n in _walk_nodes(model.graph)
                   if n.domain not in ("", "ai.onnx") or n.op_type not in CONVERTERS})


def _symbol(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else "d_" + s


def _declared(vi) -> str:
    """An input's declared type, for messages: float32[N, 4]."""
    tt = vi.type.tensor_type
    dims = ", ".join(str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?" for d in tt.shape.dim)
    return f"{_np_dtype(tt.elem_type).name}" + (f"[{dims}]" if tt.HasField("shape") else " (rank unknown)")


def _input_specs(model, input_shapes, constants=()) -> list:
    init = {t.name for t in model.graph.initializer} | set(constants)
    specs, used = [], set()
    if input_shapes is not None and not isinstance(input_shapes, dict):
        raise InputError(f"from_onnx: input_shapes must be a dict {{input name: shape}}, got "
                         f"{type(input_shapes).__name__}")
    shapes = dict(input_shapes or {})
    for k, vi in enumerate(i for i in model.graph.input if i.name not in init):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise OnnxImportError(f"from_onnx: input {vi.name!r} is not a tensor (sequences and maps are not "
                                  "supported as model inputs)")
        if vi.name in shapes:
            shape = shapes.pop(vi.name)
            if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)):
                raise InputError(f"from_onnx: input_shapes[{vi.name!r}] must be a tuple of dims (ints or symbol "
                                 f"names), got {shape!r}")
            if tt.HasField("shape") and len(shape) != len(tt.shape.dim):
                raise InputError(f"from_onnx: input_shapes[{vi.name!r}] = {tuple(shape)} has rank {len(shape)}, but "
                                 f"the model declares {vi.name!r} as {_declared(vi)}, rank {len(tt.shape.dim)}")
            shape = tuple(shape)
        elif not tt.HasField("shape"):
            raise OnnxImportError(f"from_onnx: input {vi.name!r} has no shape in the model (its rank is unknown); "
                                  f"give it with input_shapes={{{vi.name!r}: (...)}}")
        else:
            shape = tuple(d.dim_value if d.HasField("dim_value") else
                          _symbol(d.dim_param) if d.HasField("dim_param") and d.dim_param else
                          f"{_symbol(vi.name)}_{ax}" for ax, d in enumerate(tt.shape.dim))
        name = _symbol(vi.name)
        while name in used:                                 # "x.1" and "x_1" both sanitize to x_1
            name += "_"
        used.add(name)
        specs.append(TensorSpec(shape, _np_dtype(tt.elem_type).name, name=name))
    if shapes:
        raise InputError(f"from_onnx: input_shapes names {', '.join(map(repr, shapes))}, which "
                         f"{'is not an input' if len(shapes) == 1 else 'are not inputs'} of the model")
    return specs


def _constant_input(vi, value) -> np.ndarray:
    """`constant_inputs[vi.name]` as an array of the input's declared dtype and shape (a list of ints is fine for
    an int64 input; a float array for one is not)."""
    tt = vi.type.tensor_type
    want = _np_dtype(tt.elem_type)
    try:
        arr = np.asarray(value)
        if arr.dtype != want and arr.dtype.kind in "iub" and np.can_cast(arr, want) and want.kind in "iuf":
            arr = arr.astype(want)          # a Python int list for an int64 / float input
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.dtype != want:
        got = "not an array" if arr is None else f"{arr.dtype}"
        raise OnnxImportError(f"from_onnx: constant_inputs[{vi.name!r}] is {got}, but the model declares "
                              f"{vi.name!r} as {_declared(vi)}")
    if tt.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if len(dims) != arr.ndim or any(d is not None and d != n for d, n in zip(dims, arr.shape)):
            raise OnnxImportError(f"from_onnx: constant_inputs[{vi.name!r}] has shape {arr.shape}, but the model "
                                  f"declares {vi.name!r} as {_declared(vi)}")
    return arr


# ------------------------------------------------------------------------------------- interpretation
class _Ctx:
    """What converters see: the opset and how to run a subgraph (control flow)."""

    def __init__(self, opset: int, model_name: str):
        self.opset = opset
        self.model_name = model_name
        self.dims: dict = {}        # id(tensor) -> (tensor, dims, scalar): shape vectors with symbolic entries

    def run_graph(self, graph, env: dict, inputs: list) -> list:
        """Run subgraph `graph` with its formal inputs bound to `inputs`; names it does not define are read
        from `env` (the enclosing scope)."""
        local = _Scope(env)
        for vi, x in zip(graph.input, inputs):
            local[vi.name] = x
        for t in graph.initializer:
            local[t.name] = _tensor(t)
        _run_nodes(graph, local, self)
        return [local[o.name] for o in graph.output]


class _Scope(dict):
    """Names of a (sub)graph, falling back to the enclosing scope's."""

    def __init__(self, parent=None):
        super().__init__()
        self.parent = parent

    def __missing__(self, key):
        if self.parent is None:
            raise KeyError(key)
        return self.parent[key]


def _attrs(node) -> dict:
    from onnx import helper
    return {a.name: (a if a.type in (a.GRAPH, a.GRAPHS) else helper.get_attribute_value(a)) for a in node.attribute}


def _run_nodes(graph, env: dict, ctx: _Ctx) -> None:
    for node in graph.node:
        conv = CONVERTERS[node.op_type]
        where = f"ONNX node {node.name or node.op_type!r} ({node.op_type})"
        try:
            ins = [env[n] if n else None for n in node.input]
        except KeyError as e:
            raise OnnxImportError(f"{where}: input {e.args[0]!r} is not defined before it (not a graph input, "
                                  "initializer or earlier node output)") from None
        try:
            outs = conv(ins, _attrs(node), ctx, env, node)
        except (TraceError, InputError) as e:
            raise type(e)(f"{where}: {e}") from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:   # a malformed node
            raise OnnxImportError(f"{where}: malformed node, not as the ONNX spec defines it for opset "
                                  f"{ctx.opset} ({type(e).__name__}: {e})") from None
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        for name, v in zip(node.output, outs):
            if name:
                if name in env:         # this graph's own names only (a subgraph may read, not redefine, outer ones)
                    raise OnnxImportError(f"{where}: output {name!r} is already defined (an input, initializer or "
                                          "earlier node output): ONNX names are assigned once")
                env[name] = v


def from_onnx(model, input_shapes: dict | None = None, constant_inputs: dict | None = None):
    """Import an ONNX model (a file path or an `onnx.ModelProto`) as a dyntvm Graph.

    Args:
        model: path to a ``.onnx`` file, or a loaded ``onnx.ModelProto``.
        input_shapes: ``{input name: shape}`` overriding the model's (ints for fixed sizes, strings for
            symbols); by default each ``dim_param`` is a symbol of that name, each unknown dim a fresh one.
        constant_inputs: ``{input name: array}``: inputs fixed at import time (they are no longer inputs of
            the graph), for operands dyntvm needs constant (a `Reshape` target fed as an input, say).

    Returns:
        A `dt.Graph` whose inputs are the model's graph inputs (initializers excluded), named after them.

    Raises:
        UnsupportedOpError: listing every op of the model (subgraphs included) without a converter.

    Example:
        >>> graph = dt.from_onnx("model.onnx")
        >>> model = dt.compile(graph)
    """
    model = _load(model)
    missing = unsupported_ops(model)
    if missing:
        raise UnsupportedOpError(f"from_onnx: no converter for ONNX op(s) {', '.join(missing)} "
                                 f"(supported: {len(CONVERTERS)} ops, dt.frontend.onnx.CONVERTERS)")
    opset = _opsets(model).get("ai.onnx", 1)
    from onnx.defs import onnx_opset_version
    if opset > onnx_opset_version():
        raise OnnxImportError(f"from_onnx: the model uses opset {opset}, newer than the installed onnx package "
                              f"knows ({onnx_opset_version()}): its ops' semantics cannot be checked")
    g = model.graph
    constants = dict(constant_inputs or {})
    unknown = sorted(set(constants) - {vi.name for vi in g.input})
    if unknown:
        raise InputError(f"from_onnx: constant_inputs names {', '.join(map(repr, unknown))}, not an input of the model")
    specs = _input_specs(model, input_shapes, constants)
    inits = {t.name: _tensor(t) for t in g.initializer}
    inits.update({vi.name: _constant_input(vi, constants[vi.name]) for vi in g.input if vi.name in constants})
    names = [vi.name for vi in g.input if vi.name not in inits]
    name = _symbol(g.name or "onnx_model")
    ctx = _Ctx(opset, name)

    def run(*xs):
        env = _Scope()
        env.update(inits)
        env.update(zip(names, xs))
        _run_nodes(g, env, ctx)
        try:
            outs = [env[o.name] for o in g.output]
        except KeyError as e:
            raise OnnxImportError(f"from_onnx: graph output {e.args[0]!r} is not computed by any node") from None
        return outs[0] if len(outs) == 1 else tuple(outs)
    run.__name__ = name
    return trace(run, *specs, name=name)
