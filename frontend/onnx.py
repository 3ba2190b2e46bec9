"""ONNX importer: `from_onnx(path_or_model) -> Graph`.

The ONNX graph is *interpreted under the tracer*: each node's converter (one per ONNX op, in `CONVERTERS`)
calls `dyntvm.F` ops on the values of its inputs, so every ONNX op lands on the same op registry, type rules
and control-flow builders as a traced Python model (one op in one place). Values known at import time
(initializers, `Constant`, and whatever is computed from them only: the `Shape -> Gather -> Concat`
chains exporters emit for static shapes) stay numpy arrays and fold away; converters that need a static
operand (`Tile` repeats, `Unsqueeze` axes) read it from there, and take the dynamic variant where dyntvm has
one (`Reshape` with a computed shape, `Slice` with computed bounds).

Control flow: `If` becomes `F.cond` (a branch subgraph reads outer values by name; the tracer turns those
into explicit captures), `Loop` becomes `F.while_loop` (trip count as `max_iterations`, the loop-carried
values as loop vars, scan outputs stacked to the iterations run, zero included), `Scan` becomes
`F.foreach`; an `If` whose condition is known at import is inlined (the taken branch only). Sequences and
optionals exist at import time only (`onnx_seq.py`: a sequence is a list of element values; a `Loop`
carrying one is unrolled). Symbolic dims (`dim_param`) become symbols of the same name; unknown dims fresh
symbols. Unsupported ops are listed all at once, subgraphs included, before anything is converted.

Checks: the model is read by `onnx_load.py` (external data only from a named directory, subgraph nesting
bounded, text fields UTF-8); each node is checked against its op's schema at the model's opset, input types
included, and each (sub)graph output against its declared type, by `onnx_schema.py`.
"""
from __future__ import annotations

import re

import numpy as np


from dyntvm.errors import InputError, TraceError, UnsupportedOpError

from . import (onnx_control, onnx_data, onnx_image, onnx_index, onnx_nn, onnx_norm, onnx_resize,  # noqa: F401
               onnx_seq, onnx_vision)     # (register their converters: control flow, indexing, image ops, gather / scatter,
#                                 nn, norms / einsum, sequences / optionals, conv / pooling)
from .onnx_load import load, walk_nodes
from .onnx_ops import CONVERTERS, OnnxImportError, _np_dtype, _tensor
from .onnx_schema import _n, check_declared, check_node
from ..ir.dim_checks import undeclared_symbols
from ..ir.types import is_unknown, same_dim
from . import F
from .tracer import ListSpec, Tensor, TensorSpec, source_hint, trace

__all__ = ["from_onnx", "unsupported_ops", "unsupported_nodes", "CONVERTERS", "OnnxImportError"]

def _opsets(model) -> dict:
    return {(o.domain or "ai.onnx"): o.version for o in model.opset_import}


def unsupported_ops(model) -> list:
    """The ONNX op types of `model` (subgraphs included) without a converter, sorted."""
    return sorted({(n.domain + "." if n.domain not in ("", "ai.onnx") else "") + n.op_type
                   for n in walk_nodes(model.graph)
                   if n.domain not in ("", "ai.onnx") or n.op_type not in CONVERTERS})


def unsupported_nodes(model) -> list[dict]:
    """Every op of `model` (subgraphs included) without a converter, sorted by op: {"op", "domain", "opset" (the
    version the model imports for that domain, None if it imports none), "nodes" (the model's node names, in
    order; an unnamed node as "<unnamed OpType #k>", k counting all nodes from 0)}."""
    opsets = _opsets(model)
    found: dict = {}
    for k, n in enumerate(walk_nodes(model.graph)):
        domain = n.domain or "ai.onnx"
        if domain == "ai.onnx" and n.op_type in CONVERTERS:
            continue
        op = (n.domain + "." if domain != "ai.onnx" else "") + n.op_type
        entry = found.setdefault(op, {"op": n.op_type, "domain": domain, "opset": opsets.get(domain), "nodes": []})
        entry["nodes"].append(n.name or f"<unnamed {n.op_type} #{k}>")
    return [found[k] for k in sorted(found)]


def describe_unsupported(entries: list[dict], most: int = 5) -> str:
    """'Frobnicate (ai.onnx opset 13: nodes 'a', 'b'); ...' for `unsupported_nodes`' entries, at most `most` node
    names each."""
    def one(e):
        names = ", ".join(map(repr, e["nodes"][:most])) + (f" and {len(e['nodes']) - most} more"
                                                           if len(e["nodes"]) > most else "")
        opset = f"opset {e['opset']}" if e["opset"] is not None else "no opset imported"
        return f"{e['op']} ({e['domain']} {opset}: node{'s' if len(e['nodes']) > 1 else ''} {names})"
    return "; ".join(one(e) for e in entries)


def _symbol(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else "d_" + s


def _declared(vi, tt=None) -> str:
    """An input's declared type, for messages: float32[N, 4]."""
    tt = onnx_seq.value_type(vi)[1] if tt is None else tt
    dims = ", ".join(str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?" for d in tt.shape.dim)
    dtype = _np_dtype(tt.elem_type, f"input {vi.name!r}").name
    return dtype + (f"[{dims}]" if tt.HasField("shape") else " (rank unknown)")


_NOT_GIVEN = object()


def _shape_of(vi, tt, shape, what: str) -> tuple:
    """The dims of tensor input `what` (an input, or an element of a sequence input): `shape` given in
    input_shapes (checked against the declared rank), else the declared one."""
    if shape is not _NOT_GIVEN:
        if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)):
            raise InputError(f"from_onnx: input_shapes[{what}] must be a tuple of dims (ints or symbol "
                             f"names), got {shape!r}")
        if tt.HasField("shape") and len(shape) != len(tt.shape.dim):
            raise InputError(f"from_onnx: input_shapes[{what}] = {tuple(shape)} has rank {len(shape)}, but the "
                             f"model declares {vi.name!r} as {_declared(vi, tt)}, rank {len(tt.shape.dim)}")
        return tuple(shape)
    if not tt.HasField("shape"):
        raise OnnxImportError(f"from_onnx: input {vi.name!r} has no shape in the model (its rank is unknown); "
                              f"give it with input_shapes={{{vi.name!r}: (...)}}")
    return tuple(d.dim_value if d.HasField("dim_value") else
                 _symbol(d.dim_param) if d.HasField("dim_param") and d.dim_param else
                 f"{_symbol(vi.name)}_{ax}" for ax, d in enumerate(tt.shape.dim))


def _model_dims(g, skip: set, user_symbols: set) -> dict:
    """The symbols of the dims the model gives its inputs -> where they come from (the first axis that has
    each): its ``dim_param`` names and the symbols `_shape_of` names its unnamed dims. These are hints, not
    statements that dims are independent (onnxruntime checks only the values it runs with), so dims an op
    needs equal are unified and checked at run time, as for unknown dims. `skip`: inputs that are not the
    model's dims (initializers, constants, those given in input_shapes); `user_symbols`: symbols named in
    input_shapes, which stay the user's own."""
    out = {}
    for vi in g.input:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if vi.name in skip or tt is None or not tt.HasField("shape"):
            continue
        for ax, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                continue
            named = d.HasField("dim_param") and d.dim_param
            sym = _symbol(d.dim_param) if named else f"{_symbol(vi.name)}_{ax}"
            if sym not in user_symbols:
                out.setdefault(sym, f"axis {ax} of input {vi.name!r}" +
                               (f" (dim_param {d.dim_param!r})" if named else " (unnamed in the model)"))
    return out


def _strings(obj) -> list:
    """The strings in `obj`, nested lists and tuples included (the symbols of input_shapes' shapes)."""
    if isinstance(obj, str):
        return [obj]
    return [s for x in obj for s in _strings(x)] if isinstance(obj, (list, tuple)) else []


#: `ir.types.check_tensor_size`'s refusals: a size the model asks for (a constant operand) is an import error.
_TOO_LARGE = ("more than this machine's memory", "more than int64")


def _list_spec(vi, tt, name: str) -> ListSpec:
    """A sequence input of any length, a run-time list: its elements of the declared dtype and rank, each dim a
    declared int or free (a dim_param of an element is not shared between elements)."""
    if not tt.HasField("shape"):
        raise OnnxImportError(f"from_onnx: sequence input {vi.name!r} declares no element shape (its rank is "
                              f"unknown); give the element shapes with input_shapes={{{vi.name!r}: [shape, ...]}}")
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    return ListSpec(TensorSpec(dims, _np_dtype(tt.elem_type, f"input {vi.name!r}").name), name=name)


def _input_specs(model, input_shapes, constants=()) -> list:
    """One TensorSpec per tensor input, a list of them (one per element) per sequence input."""
    init = {t.name for t in model.graph.initializer} | set(constants)
    specs, used = [], set()
    if input_shapes is not None and not isinstance(input_shapes, dict):
        raise InputError(f"from_onnx: input_shapes must be a dict {{input name: shape}}, got "
                         f"{type(input_shapes).__name__}")
    shapes = dict(input_shapes or {})

    def spec(vi, tt, shape, what, name):
        shape = _shape_of(vi, tt, shape, what)
        while name in used:                                 # "x.1" and "x_1" both sanitize to x_1
            name += "_"
        used.add(name)
        return TensorSpec(shape, _np_dtype(tt.elem_type, f"input {vi.name!r}").name, name=name)

    for vi in (i for i in model.graph.input if i.name not in init):
        kind, tt = onnx_seq.value_type(vi)
        given = shapes.pop(vi.name, _NOT_GIVEN)
        if kind == "tensor":
            specs.append(spec(vi, tt, given, repr(vi.name), _symbol(vi.name)))
            continue
        if given is _NOT_GIVEN or isinstance(given, ListSpec):      # a run-time list: any length
            specs.append(given if isinstance(given, ListSpec) else _list_spec(vi, tt, _symbol(vi.name)))
            continue
        if not isinstance(given, list) or not all(isinstance(s, (tuple, list)) for s in given):
            raise InputError(f"from_onnx: input {vi.name!r} is a sequence: give its length and element shapes "
                             f"with input_shapes={{{vi.name!r}: [shape, ...]}} (a list of one tuple of dims per "
                             f"element{'' if given is _NOT_GIVEN else f', got {given!r}'}); it is passed to the "
                             "compiled model as a list of arrays")
        specs.append([spec(vi, tt, s, f"{vi.name!r}][{k}", f"{_symbol(vi.name)}_{k}") for k, s in enumerate(given)])
    if shapes:
        raise InputError(f"from_onnx: input_shapes names {', '.join(map(repr, shapes))}, which "
                         f"{'is not an input' if len(shapes) == 1 else 'are not inputs'} of the model")
    return specs


def _constant_input(vi, value):
    """`constant_inputs[vi.name]` checked against the input's declared type: an array of its dtype and
    shape (a list of ints is fine for an int64 input; a float array for one is not), a list of them for a
    sequence, None for an empty optional."""
    kind, tt = onnx_seq.value_type(vi)
    if value is None and vi.type.HasField("optional_type"):
        return onnx_seq.EMPTY
    if kind == "sequence":
        if not isinstance(value, (list, tuple)):
            raise OnnxImportError(f"from_onnx: constant_inputs[{vi.name!r}] must be a list of arrays (the input is "
                                  f"a sequence of {_declared(vi, tt)}), got {type(value).__name__}")
        return [_constant_tensor(vi, tt, v, f"{vi.name!r}][{k}") for k, v in enumerate(value)]
    return _constant_tensor(vi, tt, value, repr(vi.name))


def _constant_tensor(vi, tt, value, what: str) -> np.ndarray:
    want = _np_dtype(tt.elem_type, f"input {vi.name!r}")
    try:
        arr = np.asarray(value)
        if arr.dtype != want and arr.dtype.kind in "iub" and np.can_cast(arr, want) and want.kind in "iuf":
            arr = arr.astype(want)          # a Python int list for an int64 / float input
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.dtype != want:
        got = "not an array" if arr is None else f"{arr.dtype}"
        raise OnnxImportError(f"from_onnx: constant_inputs[{what}] is {got}, but the model declares "
                              f"{vi.name!r} as {_declared(vi, tt)}")
    if tt.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if len(dims) != arr.ndim or any(d is not None and d != n for d, n in zip(dims, arr.shape)):
            raise OnnxImportError(f"from_onnx: constant_inputs[{what}] has shape {arr.shape}, but the model "
                                  f"declares {vi.name!r} as {_declared(vi, tt)}")
    return arr


# ------------------------------------------------------------------------------------- interpretation
class _Ctx:
    """What converters see: the opset and how to run a subgraph (control flow)."""

    def __init__(self, opset: int, model_name: str, check_dims: bool):
        self.opset = opset
        self.model_name = model_name
        self.check_dims = check_dims    # declared static dims of outputs hold (input_shapes may change them)
        self.node = None            # the node being converted (innermost)

    def run_graph(self, graph, env: dict, inputs: list) -> list:
        """Run subgraph `graph` (an attribute of the node being converted) with its formal inputs bound to
        `inputs` (as many as it declares); names it does not define are read from `env` (the enclosing scope)."""
        op = self.node.op_type if self.node is not None else "node"
        part = next((a.name for a in (self.node.attribute if self.node is not None else ())
                     if a.HasField("g") and a.g is graph), "subgraph")
        if len(graph.input) != len(inputs):
            raise OnnxImportError(f"{op}'s {part} has {_n(len(graph.input), 'input')}, the {op} gives it "
                                  f"{len(inputs)}")
        local = _Scope(env)
        for vi, x in zip(graph.input, inputs):
            local[vi.name] = x
        for t in graph.initializer:
            local[t.name] = _tensor(t)
        _run_nodes(graph, local, self)
        outs = [_pin_declared(_output(local, o.name, f"{op}'s {part}"), o, self.node) for o in graph.output]
        for o, v in zip(graph.output, outs):
            check_declared(o, v, self.check_dims, f"{op}'s {part}")
        return outs


def _output(env, name: str, where: str):
    try:
        return env[name]
    except KeyError:
        raise OnnxImportError(f"{where} output {name!r} is not computed by any node (nor an input or initializer)"
                              ) from None


def _pin_declared(v, vi, node=None):
    """A subgraph output with one data-dependent dim (a Slice with computed bounds) where the model declares that
    dim static: reshaped to the declared shape, which checks the size when it runs (exact: its other dims are
    the declared ones, none 0), so a loop-carried value keeps its static shape from one iteration to the next."""
    tt = vi.type.tensor_type
    if not isinstance(v, Tensor) or not tt.HasField("shape") or len(tt.shape.dim) != len(v.shape):
        return v
    want = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if None in want or 0 in want:
        return v
    unknown = [d for d in v.shape if is_unknown(d)]
    if len(unknown) != 1 or any(not same_dim(d, w) for d, w in zip(v.shape, want) if not is_unknown(d)):
        return v
    where = f"{node_where(node)}: " if node is not None else ""
    with source_hint(f"{where}subgraph output {vi.name!r}, declared {tuple(want)} (a reshape checks its size)"):
        return F.reshape(v, tuple(want))


class _Scope(dict):
    """Names of a (sub)graph, falling back to the enclosing scope's."""

    def __init__(self, parent=None):
        super().__init__()
        self.parent = parent

    def __missing__(self, key):
        if self.parent is None:
            raise KeyError(key)
        return self.parent[key]


# the ops that take sequences / optionals (the others take tensors only)
def _takes_structured(op: str) -> bool:
    return op in ("Identity", "Loop") or CONVERTERS[op].__module__ == onnx_seq.__name__


def _attrs(node) -> dict:
    from onnx import helper
    return {a.name: (a if a.type in (a.GRAPH, a.GRAPHS) else helper.get_attribute_value(a)) for a in node.attribute}


def node_where(node) -> str:
    """How messages name an ONNX node, and the `source` its IR ops record (`dyntvm.onnx_inspect` maps it back)."""
    return f"ONNX node {node.name or node.op_type!r} ({node.op_type})"


def _run_nodes(graph, env: dict, ctx: _Ctx) -> None:
    for node in graph.node:
        conv = CONVERTERS[node.op_type]
        where = node_where(node)
        try:
            ins = [env[n] if n else None for n in node.input]
        except KeyError as e:
            raise OnnxImportError(f"{where}: input {e.args[0]!r} is not defined before it (not a graph input, "
                                  "initializer or earlier node output)") from None
        prev, ctx.node = ctx.node, node
        try:
            if not _takes_structured(node.op_type):
                for k, v in enumerate(ins):
                    if onnx_seq.is_structured(v):
                        raise OnnxImportError(f"{node.op_type}'s input {k} is {onnx_seq.describe(v)}; it takes tensors")
            check_node(node, ctx.opset, ins)
            with source_hint(where):        # its nodes' run-time errors name it
                outs = conv(ins, _attrs(node), ctx, env, node)
        except (TraceError, InputError) as e:
            msg = str(e).replace(f"\n    at {where}", "")
            too_large = isinstance(e, TraceError) and any(s in msg for s in _TOO_LARGE)    # the model's own sizes
            raise (OnnxImportError if too_large else type(e))(f"{where}: {msg}") from None
        except MemoryError:         # folding a constant under the machine's size but over what this process may take
            raise OnnxImportError(f"{where}: folding it at import needs more memory than this process can allocate "
                                  "(its constant operands ask for a very large tensor)") from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError) as e:   # malformed
            raise OnnxImportError(f"{where}: malformed node, not as the ONNX spec defines it for opset "
                                  f"{ctx.opset} ({type(e).__name__}: {e})") from None
        finally:
            ctx.node = prev
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        if any(node.output[len(outs):]):
            raise OnnxImportError(f"{where}: the node names {len(node.output)} outputs, it yields {len(outs)}")
        for name, v in zip(node.output, outs):
            if name:
                if name in env:         # this graph's own names only (a subgraph may read, not redefine, outer ones)
                    raise OnnxImportError(f"{where}: output {name!r} is already defined (an input, initializer or "
                                          "earlier node output): ONNX names are assigned once")
                env[name] = v


def from_onnx(model, input_shapes: dict | None = None, constant_inputs: dict | None = None, base_dir=None):
    """Import an ONNX model (a file path or an `onnx.ModelProto`) as a dyntvm Graph.

    Args:
        model: path to a ``.onnx`` file, or a loaded ``onnx.ModelProto``.
        input_shapes: ``{input name: shape}`` overriding the model's (ints for fixed sizes, strings for
            symbols); by default each ``dim_param`` is a symbol of that name, each unknown dim a fresh one.
            A sequence input needs one: ``[shape, ...]``, one per element (its length is fixed at import).
        constant_inputs: ``{input name: array}``: inputs fixed at import time (they are no longer inputs of
            the graph), for operands dyntvm needs constant (a `Reshape` target fed as an input, say); a list
            of arrays for a sequence input, None for an optional input that is empty.
        base_dir: the directory holding the model's external data files (tensors stored outside the model).
            A model read from a path reads them from its own directory; a ``ModelProto`` with external data
            needs ``base_dir`` (it is never read relative to the current directory). Either way onnx refuses
            locations outside that directory (absolute paths, ``..``, symlinks).

    Returns:
        A `dt.Graph` whose inputs are the model's graph inputs (initializers excluded), named after them; a
        sequence input is a list of arrays (elements ``name_0``, ``name_1``, ...), a sequence output a list.

    Raises:
        UnsupportedOpError: listing every op of the model (subgraphs included) without a converter.
        OnnxImportError: a model that is malformed (a node against its op's schema at the model's opset:
            counts, attributes, input types; an output against its declared type; corrupt data or names;
            subgraphs nested deeper than `onnx_load.MAX_SUBGRAPH_DEPTH`), external data without a directory
            to read it from, a constant too large to fold (over the machine's or the process's memory), or a
            form of an op dyntvm does not support.

    Example:
        >>> graph = dt.from_onnx("model.onnx")
        >>> model = dt.compile(graph)
    """
    model = load(model, base_dir)
    missing = unsupported_ops(model)
    if missing:
        raise UnsupportedOpError(f"from_onnx: no converter for ONNX op(s) {', '.join(missing)} "
                                 f"(supported: {len(CONVERTERS)} ops, dt.frontend.onnx.CONVERTERS); where: "
                                 f"{describe_unsupported(unsupported_nodes(model))}")
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
    ctx = _Ctx(opset, name, check_dims=input_shapes is None)

    def run(*xs):
        env = _Scope()
        env.update(inits)
        env.update(zip(names, xs))
        _run_nodes(g, env, ctx)
        outs = [onnx_seq.check_output(o.name, _output(env, o.name, "from_onnx: graph")) for o in g.output]
        for o, v in zip(g.output, outs):
            check_declared(o, v, ctx.check_dims, "from_onnx: graph")
        return outs[0] if len(outs) == 1 else tuple(outs)
    run.__name__ = name
    given = input_shapes or {}
    user_symbols = set(_strings(list(given.values())))
    model_dims = _model_dims(g, set(inits) | set(given), user_symbols)
    try:
        with undeclared_symbols(model_dims):    # the model's dim names are hints: unified and checked when needed
            graph = trace(run, *specs, name=name)
        graph.dim_origins.update(model_dims)
        return graph
    except MemoryError:         # a folded output copied into the graph (each node's own folding is caught above)
        raise OnnxImportError("from_onnx: the model's constant outputs need more memory than this process can "
                              "allocate") from None
