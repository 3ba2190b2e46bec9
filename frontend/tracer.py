"""Tracing: `Tensor` proxies record ops into a `Builder`; `trace` turns a Python function into a Graph.

Builders nest (one per subgraph being traced). A value from an outer builder used inside an inner
one is *captured*: the inner builder gets a new input for it and remembers the outer value, so each
subgraph is closed (JAX style) and the owning control-flow node passes captures explicitly.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import numpy as np

from dyntvm.errors import TraceError
from ..ir.graph import Graph, Node, Value, assign_names, canonicalize_unknown_dims
from ..ir.attrs import ConstantAttrs
from ..ir.dim_checks import name_internal_dims, recording_checks
from ..ir.ops import attr_symbols, get_op
from ..ir.shapes import ShapeError
from ..ir.tree import LEAF, num_leaves, tree_flatten, tree_unflatten
from ..ir.list_type import ListType, all_dims, value_dims
from ..ir.types import TensorType, as_shape_dim, dim_origin, is_symbol, is_unknown, set_dim_origin, user_line
from ..runtime.torch_inputs import is_torch_tensor, torch_to_numpy
from . import shape_rewrites, shape_values
from .list_values import TensorList


class _Builders(threading.local):
    """The builders being traced into, innermost last: one stack per thread, so a thread tracing does not put
    another thread's eager calls into trace mode."""

    def __init__(self):
        self.stack: list[Builder] = []
        self.source_hint: str | None = None     # what `user_source` reports while a frontend converts a node


@contextlib.contextmanager
def source_hint(text: str):
    """Nodes traced inside record `text` as their source (the user's line): a frontend names the model's node
    they come from (an ONNX node), so run-time errors point at it rather than at the `from_onnx` call."""
    prev, _BUILDERS.source_hint = _BUILDERS.source_hint, text
    try:
        yield
    finally:
        _BUILDERS.source_hint = prev


_BUILDERS = _Builders()


def user_source() -> str:
    """'file.py:LINE: code' of the innermost frame outside dyntvm (the user's line), or the `source_hint` set."""
    if _BUILDERS.source_hint is not None:
        return _BUILDERS.source_hint
    return user_line()


def trace_error(msg: str, source: str | None = None) -> TraceError:
    source = user_source() if source is None else source
    return TraceError(name_internal_dims(f"{msg}\n    at {source}" if source else msg))


def infer_types(op: str, api: str | None, in_types: list, attrs, source: str | None = None) -> list:
    """`op`'s type rule on `in_types` (eager mode passes the arrays' types): a TraceError naming the API, the
    rule and the inputs where they do not fit, so eager and traced calls accept the same programs."""
    try:
        return get_op(op).infer_type(in_types, attrs)
    except ShapeError as e:
        raise trace_error(f"{api or op}: {e}; inputs are "
                          f"{', '.join(str(t) for t in in_types) or 'none'}", source) from None


def site(source: str) -> str:
    """"file.py:12" of a node's source ("file.py:12: code"), for a dim's origin."""
    return source.split(": ", 1)[0] if source else "an unknown line"


def name_new_dims(in_types: list, out_types: list, api: str, source: str) -> None:
    """Give each unknown dim an op's rule made (one no input has) its origin: what the rule said ("rows kept
    by boolean_mask"), else "axis 1 of the result of nonzero", and where ("at model.py:12")."""
    seen = {d for t in in_types for d in all_dims(t)}
    for k, t in enumerate(out_types):
        for ax, d in enumerate(all_dims(t)):
            if is_unknown(d) and d not in seen:
                seen.add(d)
                what = dim_origin(d) or (f"axis {ax} of the result of {api}" if len(out_types) == 1 else
                                         f"axis {ax} of result {k} of {api}")
                set_dim_origin(d, f"{what} at {site(source)}")


def tracing() -> bool:
    return bool(_BUILDERS.stack)


def current() -> "Builder":
    return _BUILDERS.stack[-1]


class Builder:
    """Collects nodes for one (sub)graph."""

    def __init__(self, parent: "Builder | None" = None):
        self.parent = parent
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.owned: set = set()
        self.captures: list[Value] = []         # values of the parent scope, in capture order
        self.capture_inputs: dict = {}          # parent-scope value -> this builder's input
        self.consts: dict = {}                  # id(array) -> (array, Value)
        self.mask_dims: dict = {}               # mask value -> unknown dim of the masked axis
        self.sym_values: dict = {}              # symbol -> a value of this builder with that dim
        self.known: dict = {}                   # value -> its known entries (frontend/shape_values.py)

    def own(self, v: Value) -> Value:
        self.owned.add(v)
        for d in value_dims(v.type):
            if is_symbol(d):
                self.sym_values.setdefault(d, v)
        return v

    def __enter__(self):
        _BUILDERS.stack.append(self)
        return self

    def __exit__(self, *exc):
        assert _BUILDERS.stack.pop() is self

    def new_input(self, t: TensorType | ListType, name: str = "") -> Value:
        v = Value(t, name)
        self.inputs.append(v)
        return self.own(v)

    def lift(self, v: Value) -> Value:
        """`v` as seen from this builder, capturing it from outer scopes when needed."""
        if v in self.owned:
            return v
        got = self.capture_inputs.get(v)
        if got is not None:
            return got
        if self.parent is None:
            raise trace_error("a traced tensor from another scope was used here (a finished trace, or a value "
                              "computed inside a control-flow body); return it from the body instead")
        outer = self.parent.lift(v)
        got = self.capture_inputs.get(outer)
        if got is None:
            got = self.own(Value(outer.type, ""))
            self.captures.append(outer)
            self.capture_inputs[outer] = got
            if outer in self.parent.known:      # the same tensor inside: the same entries
                self.known[got] = self.parent.known[outer]
        return got

    def define_symbol(self, sym: str) -> None:
        """Make symbol `sym` known in this graph (an attr uses it), capturing an outer value that has it."""
        b = self
        while b is not None and sym not in b.sym_values:
            b = b.parent
        if b is None:
            raise trace_error(f"the symbolic dim {sym!r} is not a dim of any traced tensor; use dims from x.shape")
        if b is not self:
            self.lift(b.sym_values[sym])

    def constant(self, array: np.ndarray) -> Value:
        hit = self.consts.get(id(array))
        if hit is not None and hit[0] is array:
            return hit[1]
        data = np.array(array, copy=True)
        data.flags.writeable = False
        (v,) = self.emit("constant", [], ConstantAttrs(data), api="constant")
        self.consts[id(array)] = (array, v)
        return v

    def emit(self, op: str, inputs: list, attrs, api: str | None = None, source: str | None = None) -> list:
        ins = [self.lift(v) for v in inputs]
        try:                # an operand whose entries are known while tracing: the static op, or known dims
            rewritten = shape_rewrites.rewrite(self, op, ins, attrs, api, source)
        except ShapeError as e:
            raise trace_error(f"{api or op}: {e}", source) from None
        if rewritten is not None:
            return rewritten
        for sym in sorted(attr_symbols(op, attrs)):
            self.define_symbol(sym)
        source = user_source() if source is None else source
        with recording_checks() as checks:     # undecided dims the rule unifies: checked at run time
            types = infer_types(op, api, [v.type for v in ins], attrs, source)
        node = Node(op, tuple(ins), attrs, source=source, checks=tuple(checks))
        name_new_dims([v.type for v in ins], types, api or op, source)
        node.outputs = tuple(self.own(Value(t, "", node, i)) for i, t in enumerate(types))
        self.nodes.append(node)
        shape_values.propagate(self.known, node)
        return list(node.outputs)

    def add_node(self, node: Node) -> list:
        """Append a node built elsewhere (control flow); its inputs must already be lifted."""
        for i, v in enumerate(node.outputs):
            v.producer, v.index = node, i
            self.own(v)
        self.nodes.append(node)
        return list(node.outputs)

    def graph(self, outputs: list, name: str = "main", extra_inputs=()) -> Graph:
        return Graph(list(self.inputs) + list(extra_inputs), list(self.nodes), list(outputs), name)


class Tensor:
    """A traced value. Supports numpy-style operators; see `dyntvm.F` for every op.

    Its operators and op methods (`+`, `x[i]`, `x.T`, `x.reshape`, ...) are installed by
    `tensor_methods.py` from the op registry: this module never imports the `F` functions."""

    __array_ufunc__ = None            # make `ndarray + Tensor` call Tensor.__radd__
    __slots__ = ("value", "builder")

    def __init__(self, value: Value, builder: Builder):
        self.value, self.builder = value, builder

    @property
    def type(self) -> TensorType:
        return self.value.type

    @property
    def shape(self) -> tuple:
        """Ints and symbolic dims; `x.shape[0] * 2` builds the dim expression "(N * 2)"."""
        return tuple(as_shape_dim(d) for d in self.value.type.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.value.type.dtype)

    @property
    def ndim(self) -> int:
        return self.value.type.ndim

    def __repr__(self):
        return f"Tensor({self.value.type})"

    def _no(self, what, hint):
        raise trace_error(f"{what} of a traced tensor {self.type} is not known while tracing; {hint}")

    def __bool__(self):
        self._no("bool()", "use F.cond / F.case for data-dependent branches or F.while_loop for loops (or "
                 "dt.compile(..., autograph=True), which converts Python `if` / `while` on tensors to them)")

    def __int__(self):
        self._no("int()", "keep it a tensor (F.cast) or use F.while_loop / F.cond on it")

    def __float__(self):
        self._no("float()", "keep it a tensor")

    def __index__(self):
        self._no("the integer value", "use F.take / F.slice with tensor indices")

    def __iter__(self):
        self._no("iteration", "use F.foreach to loop over axis 0 (or dt.compile(..., autograph=True), which converts "
                 "a Python `for` over a tensor to it)")

    def __len__(self):
        self._no("len()", "use x.shape[0] (may be symbolic) or F.shape_of(x), and F.foreach to loop over axis 0")

    def __array__(self, *a, **k):
        self._no("the numpy value", "use dyntvm.F functions instead of numpy functions on traced tensors")

    def __array_function__(self, func, types, args, kwargs):
        raise trace_error(f"np.{func.__name__} was called on a traced tensor; use F.{func.__name__} (dyntvm.F "
                          "functions work on numpy arrays and traced tensors alike)")

    def __hash__(self):
        return id(self)


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a traced input. A dim is an int, a symbol name ("T"), or None (fresh symbol).

    Example:
        >>> dt.TensorSpec(("T", "B", 128), "float32", name="xs")
    """

    shape: tuple
    dtype: str = "float32"
    name: str | None = None

    def __post_init__(self):
        from ..ir.types import check_dim, check_tensor_size, normalize_dtype
        shape = self.shape
        if isinstance(shape, (str, bytes)) or not isinstance(shape, (tuple, list)):
            raise TraceError(f"TensorSpec: shape must be a tuple of dims (ints, symbol names or None), got "
                             f"{shape!r}" + ("; for one symbolic axis write (\"N\",)" if isinstance(shape, str) else ""))
        try:
            dims = tuple(None if d is None else check_dim(d) for d in shape)
            dtype = normalize_dtype(self.dtype)
            check_tensor_size(dims, dtype)
        except (TypeError, ValueError) as e:
            raise TraceError(f"TensorSpec{(' ' + repr(self.name)) if self.name else ''}: {e}") from None
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "dtype", dtype)

    def to_type(self) -> TensorType:
        from ..ir.types import fresh_dim
        return TensorType(tuple(fresh_dim("_in") if d is None else d for d in self.shape), self.dtype)


@dataclass(frozen=True)
class ListSpec:
    """The spec of a list input: the spec of its elements (a `dt.TensorSpec`; a None dim may differ from element
    to element, a named one is shared with the other inputs) and its length (an int, a symbol name, or None: any).

    Example:
        >>> dt.trace(f, dt.ListSpec(dt.TensorSpec((None, 4))), dt.TensorSpec(("N",)))
    """

    elem: object
    length: object = None
    name: str | None = None

    def __post_init__(self):
        from ..ir.types import check_dim
        if not isinstance(self.elem, TensorSpec):
            raise TraceError(f"ListSpec: elem must be a dt.TensorSpec (the spec of every element), got "
                             f"{type(self.elem).__name__}")
        if self.length is not None:
            try:
                object.__setattr__(self, "length", check_dim(self.length))
            except (TypeError, ValueError) as e:
                raise TraceError(f"ListSpec: length: {e}") from None
        if self.name is None and self.elem.name:
            object.__setattr__(self, "name", self.elem.name)

    def to_type(self) -> ListType:
        from ..ir.types import TensorType, fresh_dim
        elem = TensorType(tuple(fresh_dim() if d is None else d for d in self.elem.shape), self.elem.dtype)
        return ListType(elem, fresh_dim("_in") if self.length is None else self.length)


def as_spec(x) -> TensorSpec:
    if isinstance(x, (TensorSpec, ListSpec)):
        return x
    if isinstance(x, ListType):
        return ListSpec(TensorSpec(x.elem.shape, x.elem.dtype), x.length)
    if isinstance(x, TensorType):
        return TensorSpec(x.shape, x.dtype)
    if isinstance(x, (np.ndarray, np.generic, bool, int, float)):
        a = np.asarray(x)
        return TensorSpec(a.shape, a.dtype.name)
    raise TraceError(f"expected a dt.TensorSpec (or an example numpy array), got {type(x).__name__}")


def wrap(v: Value, b: Builder):
    """The proxy of traced value `v`: a `Tensor`, or a `TensorList` for a list."""
    return TensorList(v, b) if isinstance(v.type, ListType) else Tensor(v, b)


def finish_outputs(b: Builder, out, api: str) -> tuple[list, object]:
    """Flatten a traced function's outputs to Values of builder `b` (constants for numpy leaves)."""
    leaves, spec = tree_flatten(out)
    values = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, (Tensor, TensorList)):
            values.append(b.lift(leaf.value))
        elif isinstance(leaf, (np.ndarray, np.generic, int, float, bool)):
            values.append(b.constant(as_array(leaf)))
        elif leaf is None:
            raise trace_error(f"{api}: output {i} is None; return tensors (or numpy arrays) only")
        else:
            raise trace_error(f"{api}: output {i} is a {type(leaf).__name__}; return tensors (or numpy arrays) only")
    return values, spec


def as_array(x) -> np.ndarray:
    """Python scalars follow dyntvm's defaults: float -> float32, int -> int64."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, np.generic):
        return np.asarray(x)
    if isinstance(x, bool):
        return np.asarray(x)
    if isinstance(x, int):
        if not -2 ** 63 <= x < 2 ** 63:
            raise trace_error(f"the Python int {x} does not fit int64 (the dtype of Python ints); pass a numpy "
                              "array (e.g. uint64 or float64)")
        return np.asarray(x, np.int64)
    if isinstance(x, float):
        return np.asarray(x, np.float32)
    if is_torch_tensor(x):
        return torch_to_numpy(x, "argument")
    a = np.asarray(x)
    return a.astype(np.float32) if a.dtype == np.float64 and not isinstance(x, np.generic) else a


def _input_names(fn, in_spec, n: int) -> list:
    """Default input names: the function's parameter names (``h_0``, ``h_1`` for the leaves of a nested
    argument ``h``), else ``in0``, ``in1``, ... (`dyntvm run --input NAME=...` uses them)."""
    import inspect
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    args = in_spec[1] if in_spec != LEAF else ()
    if len(params) < len(args):
        return [f"in{i}" for i in range(n)]
    names = []
    for p, a in zip(params, args):
        names += [p] if a == LEAF else [f"{p}_{j}" for j in range(num_leaves(a))]
    return names if len(names) == n and len(set(names)) == n else [f"in{i}" for i in range(n)]


def trace(fn, *specs, name: str | None = None) -> Graph:
    """Trace `fn` into a Graph.

    Args:
        fn: a Python function of tensors built from `dyntvm.F` ops (and numpy constants).
        *specs: one `TensorSpec` (or nested list/tuple of them) per argument of `fn`.

    Example:
        >>> g = dt.trace(lambda x: F.tanh(x) * 2, dt.TensorSpec(("N", 4)))
    """
    leaves, in_spec = tree_flatten(list(specs), is_leaf=lambda s: isinstance(s, (TensorSpec, TensorType, ListSpec,
                                                                                   ListType)))
    named = [s.name for s in leaves if isinstance(s, (TensorSpec, ListSpec)) and s.name]
    if len(set(named)) != len(named):
        dup = sorted({n for n in named if named.count(n) > 1})
        raise trace_error(f"trace: input name(s) {', '.join(map(repr, dup))} given to more than one TensorSpec; "
                          "input names must be unique")
    with Builder() as b:
        tensors = []
        for i, s in enumerate(leaves):
            s = as_spec(s)
            tensors.append(wrap(b.new_input(s.to_type(), s.name or ""), b))
        args = tree_unflatten(in_spec, tensors)
        out = fn(*args)
        values, out_spec = finish_outputs(b, out, "trace")
    g = b.graph(values, name=name or getattr(fn, "__name__", "main").strip("<>"))
    g.in_tree, g.out_tree = in_spec, out_spec
    for v, default in zip(g.inputs, _input_names(fn, in_spec, len(g.inputs))):
        if not v.name:
            v.name = default
        t = v.type
        named = [(t.length, "the length"), *((d, f"axis {ax} of an element") for ax, d in enumerate(t.elem.shape))] \
            if isinstance(t, ListType) else [(d, f"axis {ax}") for ax, d in enumerate(t.shape)]
        for d, what in named:
            if is_unknown(d):           # a TensorSpec None dim
                set_dim_origin(d, f"{what} of input {v.name!r}")
    canonicalize_unknown_dims(g)
    assign_names(g)
    return g.lint()
