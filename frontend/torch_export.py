"""PyTorch importer: `from_torch(module_or_fn, example_args, dynamic_shapes=None) -> Graph`.

The program is exported with `torch.export.export` and decomposed to core ATen (`run_decompositions`); its FX
graph is then *interpreted under the tracer*, as the ONNX importer interprets ONNX nodes: each node's converter
(one per ATen op, `torch_ops.CONVERTERS`) calls `dyntvm.F` ops on its arguments' values, so a torch program
lands on the same op registry, type rules and control-flow builders as a traced Python model.

* Parameters, buffers and lifted constants become constants of the graph; the user's tensor inputs its inputs,
  named after the placeholders (the argument names of `forward`).
* Symbolic sizes: each input axis torch made symbolic gets a dyntvm symbol named after the user's `Dim` (torch's
  own name, ``s0``, where it cannot be told), so two axes torch proved equal share one symbol and are checked
  equal when the model runs. A SymInt computed in the graph (``sym_size``, ``operator.mul``) is a dyntvm dim
  expression; an unbacked one (the size of a `nonzero`, `masked_select`, boolean index or `unique` result) is
  dyntvm's data-dependent dim of that op's result.
* Higher-order ops: `cond` -> `F.cond` (branches of different shapes give an unknown dim, as dyntvm joins
  them; nested conds -> one `case`: `torch_cond.py`), `while_loop` -> `F.while_loop`, `scan` -> `F.foreach`,
  `map` -> `F.foreach` (`torch_control.py`).
* Every ATen op without a converter (subgraphs included) is listed in one `UnsupportedOpError`, each with the
  user's source line(s) torch recorded for it.
* Torch is an optional dependency (``pip install dyntvm[torch]``): imported here, inside `from_torch`, only.
"""
from __future__ import annotations

import warnings

import numpy as np

from dyntvm.errors import DyntvmError, InputError, TraceError, UnsupportedOpError

from .torch_ops import CONVERTERS, TorchImportError, np_dtype
from .tracer import Tensor, TensorSpec, source_hint, trace
from . import F
# (they register converters)
from . import torch_asserts, torch_cond, torch_control, torch_index, torch_ops_more  # noqa: F401
from .torch_control import user_line

__all__ = ["from_torch", "unsupported_ops", "TorchImportError"]


# --------------------------------------------------------------------------------------- node names
def target_name(node) -> str:
    """The converter key of a call_function node: "aten.add.Tensor", "higher_order.cond", "_operator.mul"."""
    t = node.target
    if hasattr(t, "_schema") and hasattr(t, "overloadpacket"):     # an OpOverload: "aten.add.Tensor"
        return str(t)
    if any(c.__name__ == "HigherOrderOperator" for c in type(t).__mro__):
        return "higher_order." + t._name
    if getattr(t, "__module__", None) in ("_operator", "operator"):
        return "_operator." + t.__name__
    mod = getattr(t, "__module__", "") or ""
    return f"{mod}.{getattr(t, '__name__', str(t))}"


def _where(node) -> str:
    line = user_line(node)
    return f"torch node {node.name!r} ({target_name(node)})" + (f" at {line}" if line else "")


def _subgraph_modules(gm, node) -> list:
    """The GraphModules a higher-order op's node calls (its get_attr arguments)."""
    out = []
    for a in node.args:
        for x in (a if isinstance(a, (list, tuple)) else [a]):
            if getattr(x, "op", None) == "get_attr":
                out.append(getattr(gm, x.target))
    return out


def _walk(gm):
    """Every call_function node of `gm` and of the subgraphs its higher-order ops call, with its module."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        yield gm, node
        for sub in _subgraph_modules(gm, node):
            yield from _walk(sub)


def unsupported_ops(gm) -> dict:
    """{op name: [user lines]} of the call_function targets of `gm` (subgraphs included) without a converter."""
    found: dict = {}
    for _, node in _walk(gm):
        name = target_name(node)
        if name not in CONVERTERS and name not in torch_control.CONVERTERS:
            lines = found.setdefault(name, [])
            line = user_line(node) or f"node {node.name!r} (no source line recorded)"
            if line not in lines:
                lines.append(line)
    return found


#: ops with an output dyntvm does not compute: {op: (output index, what it is)}
_OUTPUTS_NOT_COMPUTED = {f"aten.max_pool{k}d_with_indices.default": (1, "the indices of the maxima (return_indices="
                                                                        "True)") for k in (1, 2, 3)}


def refused_forms(gm) -> list:
    """What the program uses that dyntvm refuses although it converts the op: an output it does not compute (the
    indices of `max_pool2d_with_indices`), each with the user's line."""
    out = []
    for _, node in _walk(gm):
        name = target_name(node)
        if name not in _OUTPUTS_NOT_COMPUTED:
            continue
        k, what = _OUTPUTS_NOT_COMPUTED[name]
        if any(target_name(u) == "_operator.getitem" and u.args[1] == k and u.users for u in node.users):
            out.append(f"{name}: {what} are used at {user_line(node) or node.name}, and dyntvm's max_pool gives the "
                       "pooled values only; use the values, or compute the positions another way (e.g. an argmax "
                       "over unfolded windows)")
    return out


# ---------------------------------------------------------------------------------------- running
def _arg(env, a):
    """A node argument with each FX node replaced by its value (nested lists and tuples too)."""
    if hasattr(a, "op") and hasattr(a, "name") and hasattr(a, "meta"):
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_arg(env, x) for x in a)
    if isinstance(a, dict):
        return {k: _arg(env, v) for k, v in a.items()}
    return a


def _meta_dtype(val):
    dt = getattr(val, "dtype", None)
    return np_dtype(dt) if dt is not None and hasattr(val, "shape") else None


def _match_meta(out, val, where):
    """A converter's result cast to the dtype torch recorded (dyntvm's numpy rule may promote otherwise), and its
    rank checked (a converter that disagrees with torch on a shape is a bug: said so rather than run wrong)."""
    if isinstance(val, (list, tuple)) and isinstance(out, (list, tuple)):
        return type(out)(_match_meta(o, v, where) for o, v in zip(out, val))
    if not isinstance(out, (Tensor, np.ndarray)) or not hasattr(val, "shape"):
        return out
    want = _meta_dtype(val)
    if want is not None and np.dtype(out.dtype) != np.dtype(want):
        out = F.cast(out, want)
    if len(out.shape) != len(val.shape):
        raise TorchImportError(f"{where}: dyntvm's result has rank {len(out.shape)}, torch's {len(val.shape)} "
                               f"(a converter bug: please report it)")
    return out


class Interpreter:
    """Runs an exported FX graph (or a higher-order op's subgraph) under the tracer."""

    def __init__(self, constants: dict):
        self.constants = constants          # placeholder name of the top graph -> numpy array
        self.pending_asserts: list = []     # run-time checks of the (sub)graph being run (torch_asserts.py)
        self.dim_choices: dict = {}         # a cond's unknown dim -> the sizes its branches give it (torch_cond.py)

    def run(self, gm, inputs: list, top: bool = False) -> list:
        """The outputs of `gm` (flattened) with its placeholders bound to `inputs` in order (constants by name
        for the top graph)."""
        outer, self.pending_asserts = self.pending_asserts, []
        try:
            return self._run(gm, inputs, top)
        finally:
            self.pending_asserts = outer

    def _run(self, gm, inputs: list, top: bool) -> list:
        env, it = {}, iter(inputs)
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = self.constants[node.name] if top and node.name in self.constants else next(it)
            elif node.op == "get_attr":
                env[node] = _attr_value(gm, node)
            elif node.op == "call_function":
                torch_asserts.check_before(self, node, env)     # a pending assertion before what it guards
                env[node] = self.call(gm, node, env)
            elif node.op == "output":
                outs = node.args[0]
                outs = [_arg(env, o) for o in (outs if isinstance(outs, (list, tuple)) else [outs])]
                return torch_asserts.tie_in(outs, self.pending_asserts)
        raise TorchImportError("from_torch: the exported graph has no output node")

    def call(self, gm, node, env):
        name = target_name(node)
        where = _where(node)
        args, kwargs = _arg(env, node.args), _arg(env, node.kwargs)
        line = user_line(node)
        try:
            with source_hint(line or where):
                if name in torch_control.CONVERTERS:
                    out = torch_control.CONVERTERS[name](self, gm, node, args, kwargs)
                else:
                    out = CONVERTERS[name](*args, **kwargs)
                return _match_meta(out, node.meta.get("val"), where)
        except TorchImportError as e:
            raise TorchImportError(str(e) if str(e).startswith("torch node") else f"{where}: {e}") from None
        except (TraceError, InputError) as e:
            msg = str(e)
            raise type(e)(msg if msg.startswith("torch node") else f"{where}: {msg}") from None
        except DyntvmError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as e:
            raise TorchImportError(f"{where}: dyntvm cannot convert this form of the op "
                                   f"({type(e).__name__}: {e}); args {_describe(args)}") from None


def _describe(args) -> str:
    return "(" + ", ".join(str(a.type) if isinstance(a, Tensor) else repr(a) for a in args) + ")"


def _attr_value(gm, node):
    v = gm
    for part in node.target.split("."):
        v = getattr(v, part)
    return _to_numpy(v, node.target) if _is_torch_tensor(v) else v


def _is_torch_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "numpy")


def _to_numpy(t, what: str) -> np.ndarray:
    import torch
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        raise TorchImportError(f"from_torch: {what} is bfloat16, which dyntvm has no dtype for; .float() it first")
    np_dtype(t.dtype)
    return t.contiguous().numpy().copy()


# ------------------------------------------------------------------------------------------ inputs
def _check_program(module_or_fn, example_args):
    import types

    import torch
    if isinstance(example_args, (torch.Tensor, np.ndarray)):
        example_args = (example_args,)
    if not isinstance(example_args, (tuple, list)):
        raise TorchImportError(f"from_torch: example_args must be a tuple of example inputs (torch tensors or numpy "
                               f"arrays), got {type(example_args).__name__}")
    if not isinstance(module_or_fn, torch.nn.Module):
        if not callable(module_or_fn):
            raise TorchImportError(f"from_torch: expected a torch.nn.Module or a function of torch tensors, got "
                                   f"{type(module_or_fn).__name__}")
        fn = module_or_fn

        class _Wrapped(torch.nn.Module):
            def forward(self, *args):
                return fn(*args)
        if isinstance(fn, types.FunctionType):
            # fn itself as forward, renamed so: torch records the source lines of `forward` frames only (and of
            # submodules'), and its parameters name the inputs and key dynamic_shapes
            code = fn.__code__.replace(co_name="forward")
            _Wrapped.forward = staticmethod(types.FunctionType(code, fn.__globals__, "forward", fn.__defaults__,
                                                               fn.__closure__))
        module_or_fn = _Wrapped()
    args = tuple(torch.from_numpy(np.array(a, copy=True)) if isinstance(a, np.ndarray) else a for a in example_args)
    return module_or_fn, args


def _dims_from_strings(dynamic_shapes):
    """dyntvm's short form of `dynamic_shapes`: a symbol name (a str) where torch wants a `Dim`, the same name the
    same Dim; torch's own forms pass through."""
    from torch.export import Dim
    made: dict = {}

    def conv(x):
        if isinstance(x, str):
            return made.setdefault(x, Dim(x))
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(conv(v) for v in x)
        return x
    return conv(dynamic_shapes)


def _input_specs(ep, dynamic_shapes):
    """One TensorSpec per user input placeholder, its symbolic axes named after the user's Dims."""
    from torch.export.graph_signature import InputKind
    gm = ep.graph_module
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    # torch's symbol (s0) -> the user's Dim name, by position: the Dim at an axis of an argument names its symbol
    rename = _torch_symbol_names(ep, dynamic_shapes, user)
    specs, constants_from_inputs = [], {}
    for k, name in enumerate(user):
        val = placeholders[name].meta.get("val")
        if not hasattr(val, "shape"):           # an int / float / None input: torch specialized it
            constants_from_inputs[name] = val
            continue
        dims = []
        for d in val.shape:
            if type(d).__name__ == "SymInt":
                dims.append(_dim_of(d.node.expr, rename, name))
            else:
                dims.append(int(d))
        specs.append(TensorSpec(tuple(dims), np_dtype(val.dtype), name=name))
    return user, specs, constants_from_inputs, _input_ranges(ep, specs, rename)


def _dim_of(expr, rename: dict, input_name: str):
    """The dyntvm dim of a torch size expression: a symbol (the user's Dim name) or, for a derived Dim
    (``2 * B``, ``B + 1``), that expression over the symbols, checked against the input when the model runs."""
    import re
    if getattr(expr, "is_Symbol", False):
        return rename.get(str(expr), str(expr))
    from ..ir.types import check_dim
    text = re.sub(r"[A-Za-z_]\w*", lambda m: rename.get(m.group(0), m.group(0)), str(expr))
    try:
        return check_dim(f"({text})" if not text.startswith("(") else text)
    except (TypeError, ValueError) as e:
        raise TorchImportError(f"from_torch: input {input_name!r} has an axis of the derived size {expr}, which "
                               f"dyntvm cannot take as a dim ({e}); give that axis a Dim of its own") from None


def _input_ranges(ep, specs, rename: dict) -> dict:
    """{input symbol: (lowest, highest or None)} torch.export derived for the symbols of the inputs' axes (the
    users' `Dim(min=, max=)` and what the program's own checks added), where narrower than any size (0 to inf)."""
    from ..ir.dims import parse_dim
    names = {x for s in specs for d in s.shape if isinstance(d, str) for x in parse_dim(d).symbols}
    out = {}
    for expr, vr in ep.range_constraints.items():
        if not getattr(expr, "is_Symbol", False):
            continue                    # a derived Dim's range follows from its root's
        sym = rename.get(str(expr), str(expr))
        if sym not in names:
            continue
        lo, hi = _finite(vr.lower) or 0, _finite(vr.upper)
        if lo > 0 or hi is not None:
            out[sym] = (max(lo, 0), hi)
    return out


def _finite(bound):
    """A sympy range bound as an int, None where it is infinite (torch's int_oo, or its 2**63 - 2 stand-in)."""
    try:
        v = int(bound)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None
    return v if abs(v) < 2 ** 62 else None


def _torch_symbol_names(ep, dynamic_shapes, user) -> dict:
    """{torch symbol (str): the user's Dim name}: read off the placeholders of the tensor arguments where the user
    gave a Dim at an axis (a Dim object, or a str in the short form). `dynamic_shapes` keyed by argument name or
    one entry per argument; an argument holding several tensors keeps torch's names (s0, s1)."""
    if dynamic_shapes is None:
        return {}
    placeholders = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    if isinstance(dynamic_shapes, dict):
        per_arg = [(k, v) for k, v in dynamic_shapes.items() if k in placeholders]
    else:
        per_arg = list(zip(user, dynamic_shapes))
    out = {}
    for name, axes in per_arg:
        val = placeholders[name].meta.get("val")
        if not hasattr(val, "shape") or not isinstance(axes, (dict, list, tuple)):
            continue
        for ax, dim in (axes.items() if isinstance(axes, dict) else enumerate(axes)):
            dim_name = dim if isinstance(dim, str) else getattr(dim, "__name__", None)
            d = val.shape[ax] if isinstance(ax, int) and ax < len(val.shape) else None
            if type(d).__name__ != "SymInt":
                continue
            expr = d.node.expr
            root = getattr(dim, "root", None)           # a derived Dim (2 * B): its expression's one symbol is B
            if root is not None and len(expr.free_symbols) == 1:
                out.setdefault(str(next(iter(expr.free_symbols))), _symbol(root.__name__))
            elif isinstance(dim_name, str) and getattr(expr, "is_Symbol", False):
                out.setdefault(str(expr), _symbol(dim_name))
    return out


def _symbol(name: str) -> str:
    import re
    s = re.sub(r"\W", "_", name)
    return s if s and not s[0].isdigit() else "d_" + s


def export(module_or_fn, example_args, dynamic_shapes=None):
    """`torch.export.export(...).run_decompositions()` with torch's refusals as a `TorchImportError`."""
    import torch
    module, args = _check_program(module_or_fn, example_args)
    try:
        ep = torch.export.export(module, args, dynamic_shapes=_dims_from_strings(dynamic_shapes), strict=False)
        with warnings.catch_warnings():     # torch 2.13's own code uses its deprecated LeafSpec check: not the user's
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            return ep.run_decompositions(), module
    except DyntvmError:
        raise
    except Exception as e:      # torch's many refusals (UserError, constraint violations, guards on data)
        lines = [ln.rstrip() for ln in str(e).strip().splitlines() if ln.strip()]
        first = "\n    ".join(lines[:8]) + ("\n    ..." if len(lines) > 8 else "")
        hint = ("\n    (torch's while_loop needs loop values of fixed shape; dyntvm's F.while_loop takes values that "
                "change shape: write that loop with it, or with a fixed-size buffer, see docs/torch.md)"
                if "while_loop" in str(e) and "same metadata" in str(e) else "")
        raise TorchImportError(f"from_torch: torch.export refused the program ({type(e).__name__}): {first}{hint}"
                               ) from e


def from_torch(module_or_fn, example_args, dynamic_shapes=None):
    """Import a PyTorch program (an `nn.Module` or a function of tensors) as a dyntvm Graph, through torch.export.

    Args:
        module_or_fn: a `torch.nn.Module` (its `forward`) or a function of torch tensors.
        example_args: a tuple of example inputs (torch tensors or numpy arrays), one per argument.
        dynamic_shapes: as `torch.export.export` takes it (``{"x": {0: Dim("N")}}``, or one entry per argument);
            a str may stand for a Dim: ``{"x": {0: "N"}}`` (the same name, the same Dim). Each such axis is a
            dyntvm symbol of the Dim's name; axes without a Dim are static (the example's size).

    Returns:
        A `dt.Graph`, as `dt.from_onnx` returns: compile it with `dt.compile`. Its inputs are the tensor arguments
        (named after the program's parameters), its outputs the program's outputs, flattened.

    Raises:
        UnsupportedOpError: listing every ATen op (after decomposition to core ATen) without a converter, each
            with the user's source lines.
        TorchImportError: torch.export refused the program, an input that is not a torch program, or a form of
            an op dyntvm does not support.

    Example:
        >>> graph = dt.from_torch(model, (torch.randn(2, 8),), dynamic_shapes={"x": {0: "B"}})
        >>> compiled = dt.compile(graph)
    """
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ImportError("dt.from_torch needs PyTorch: pip install 'dyntvm[torch]'") from None
    ep, module = export(module_or_fn, example_args, dynamic_shapes)
    gm = ep.graph_module
    missing = unsupported_ops(gm)
    if missing:
        where = "; ".join(f"{op} (at {', '.join(lines[:3])}{' and more' if len(lines) > 3 else ''})"
                          for op, lines in sorted(missing.items()))
        raise UnsupportedOpError(f"from_torch: no converter for {len(missing)} op(s) of the exported program: "
                                 f"{', '.join(sorted(missing))} (supported: {len(CONVERTERS)} ATen ops, "
                                 f"dyntvm.frontend.torch_ops.CONVERTERS); where: {where}")
    refused = refused_forms(gm)
    if refused:
        raise TorchImportError("from_torch: " + "; ".join(refused))
    constants = _constants(ep)
    user, specs, specialized, ranges = _input_specs(ep, dynamic_shapes)
    constants.update(specialized)
    interp = Interpreter(constants)
    tensor_inputs = [n for n in user if n not in specialized]
    name = _symbol(type(module).__name__ if type(module).__name__ != "_Wrapped" else
                   getattr(module_or_fn, "__name__", "torch_model"))

    def run(*xs):
        by_name = dict(zip(tensor_inputs, xs))
        placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        env_inputs = [by_name[p] for p in placeholders if p not in constants]
        outs = interp.run(gm, env_inputs, top=True)
        outs = [o for o in outs[_n_mutations(ep):]]
        if any(o is None for o in outs):
            raise TorchImportError("from_torch: the program returns None among its outputs; return tensors only")
        return outs[0] if len(outs) == 1 else tuple(outs)
    run.__name__ = name
    mutated = _mutated(ep)
    if mutated:
        import warnings
        warnings.warn(f"from_torch: the program updates {', '.join(mutated)} in place; dyntvm keeps buffers as "
                      "constants and inputs unchanged, so every call sees the values of the export (pass state "
                      "as inputs and return it as outputs instead)", stacklevel=2)
    graph = torch_cond.merge_nested_conds(trace(run, *specs, name=name))
    graph.dim_ranges.update(ranges)
    return graph


def _mutated(ep) -> list:
    """Names of the buffers and inputs the program mutates (their updates are dropped)."""
    from torch.export.graph_signature import OutputKind
    return [f"buffer {s.target}" if s.kind == OutputKind.BUFFER_MUTATION else f"input {s.target}"
            for s in ep.graph_signature.output_specs
            if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)]


def _n_mutations(ep) -> int:
    """How many leading graph outputs are buffer / input mutations (not the user's outputs)."""
    from torch.export.graph_signature import OutputKind
    return sum(1 for s in ep.graph_signature.output_specs if s.kind != OutputKind.USER_OUTPUT)


def _constants(ep) -> dict:
    """{placeholder name: numpy array} of the parameters, buffers and lifted constants."""
    from torch.export.graph_signature import InputKind
    out = {}
    state = dict(ep.state_dict)
    state.update(ep.constants)
    for s in ep.graph_signature.input_specs:
        if s.kind == InputKind.USER_INPUT:
            continue
        if s.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            out[s.arg.name] = _to_numpy(state[s.target], f"{s.kind.name.lower()} {s.target!r}")
        else:
            raise TorchImportError(f"from_torch: the program takes a {s.kind.name} input ({s.arg.name!r}); dyntvm "
                                   "takes tensors, parameters, buffers and constants")
    return out
