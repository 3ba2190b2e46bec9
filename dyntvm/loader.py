"""Model and input loading shared by the `dyntvm` commands (compile, inspect, demo, and later tune).

A MODEL argument is one of:

* a saved graph, ``graph.json`` (the one-file form of `dyntvm.ir.serialize.save_graph`);
* ``path/to/file.py:name``, where ``name`` is a model function (traced with ``--input`` specs), a
  traced ``dt.Graph``, or a ``dyntvm.examples.Example``;
* a bundled example, given as ``--example NAME`` (or ``example:NAME``).

An artifact (what ``dyntvm compile`` writes) is a folder holding ``manifest.json`` or a ``.tar``.

Only the standard library is imported at module level, so ``dyntvm run`` (which needs just the
runtime) stays fast.
"""
from __future__ import annotations

import inspect
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import InputError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class LoadedModel:
    """A model ready to compile: its traced graph plus whatever else the source offered."""

    name: str
    graph: Any                        # the traced (not yet partitioned) dt.Graph
    source: str                       # how it was given, for messages ("example detection", "m.py:model")
    fn: Callable | None = None        # the eager function, when there is one
    example: Any = None               # the dyntvm.examples.Example, when there is one
    sizes: dict = field(default_factory=dict)   # default symbolic-dim sizes (examples)


def parse_input_spec(text: str):
    """``NAME:DIMS[:DTYPE]`` -> dt.TensorSpec; DIMS are comma separated ints, symbol names or ``?`` (a dim of
    its own, TensorSpec's None). ``NAME:[DIMS][:DTYPE]`` -> dt.ListSpec: a list input of any length whose
    elements are DIMS (a ``?`` may differ from element to element).

    Example:
        >>> parse_input_spec("xs:T,B,128:float32")
        TensorSpec(shape=('T', 'B', 128), dtype='float32', name='xs')
        >>> parse_input_spec("parts:[?,8]")
        ListSpec(elem=TensorSpec(shape=(None, 8), dtype='float32', name=None), length=None, name='parts')
    """
    from .frontend.tracer import ListSpec, TensorSpec
    from .ir.types import DTYPES, normalize_dtype
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise InputError(f"--input {text!r}: expected NAME:DIMS[:DTYPE], e.g. xs:T,B,128:float32")
    name, dims = parts[0].strip(), parts[1].strip()
    dtype = parts[2].strip() if len(parts) == 3 and parts[2].strip() else "float32"
    if not _NAME.match(name):
        raise InputError(f"--input {text!r}: {name!r} is not a valid input name")
    is_list = dims.startswith("[") and dims.endswith("]")
    dims = dims[1:-1].strip() if is_list else dims
    shape = []
    for d in (dims.split(",") if dims else []):
        d = d.strip()
        if re.fullmatch(r"\d+", d):
            shape.append(int(d))
        elif d == "?":
            shape.append(None)
        elif _NAME.match(d) and not d.startswith("_"):
            shape.append(d)
        else:
            raise InputError(f"--input {text!r}: dim {d!r} is neither a size, a symbol name (symbols start with a "
                             "letter) nor ? (a size of its own); a list input is NAME:[DIMS]:DTYPE")
    try:
        canonical = normalize_dtype(dtype)
    except ValueError as e:
        raise InputError(f"--input {text!r}: unknown dtype {dtype!r} ({e})") from e
    if canonical != dtype:           # numpy aliases: 'float' is float64 (torch's float is float32), 'f4', 'int'
        raise InputError(f"--input {text!r}: write the dtype by its name, {canonical!r} (numpy reads {dtype!r} "
                         f"as {canonical}); dtypes are {', '.join(DTYPES)}")
    if is_list:
        return ListSpec(TensorSpec(tuple(shape), dtype), name=name)
    return TensorSpec(tuple(shape), dtype, name=name)


def parse_sizes(items) -> dict:
    """``["T=16", "B=2"]`` -> ``{"T": 16, "B": 2}`` (for ``--dim``)."""
    sizes = {}
    for item in items or ():
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not re.fullmatch(r"\s*\d+\s*", value):
            raise InputError(f"--dim {item!r}: expected SYMBOL=SIZE, e.g. T=16")
        sizes[name.strip()] = int(value)
    return sizes


def is_artifact(path: str) -> bool:
    """Whether `path` looks like an artifact (a folder with manifest.json, or a tar file)."""
    if os.path.isdir(path):
        return os.path.exists(os.path.join(path, "manifest.json"))
    return os.path.isfile(path) and path.endswith(".tar")


def load_model(model: str | None = None, example: str | None = None, inputs=(), autograph: bool = False
               ) -> LoadedModel:
    """Trace (or read) the model a command names; see the module docstring for the MODEL forms.

    Args:
        model: the MODEL argument (None when `example` is given).
        example: a bundled example name (``--example``).
        inputs: ``--input NAME:DIMS:DTYPE`` strings, needed for a model function.
        autograph: convert the model function's Python control flow on tensors first (``--autograph``; a model
            function only).

    Raises:
        dt.InputError: a bad MODEL or --input; dt.TraceError / dt.GraphError from tracing or reading.
    """
    inputs = list(inputs or ())
    if autograph and not (model and model.rpartition(":")[0].endswith(".py")):
        raise InputError("--autograph converts a Python model function: give MODEL as file.py:function (an "
                         "example, a saved graph or an ONNX model has its control flow already)")
    if model and model.startswith("example:"):
        model, example = None, model[len("example:"):]
    if (model is None) == (example is None):
        raise InputError("give either MODEL or --example NAME" if model is None else
                         "give MODEL or --example NAME, not both")
    if example is not None:
        if inputs:
            raise InputError("--input is not used with --example (the example has its own signature)")
        return _from_example(_get_example(example), f"example {example}")
    if model.endswith(".onnx"):
        if inputs:
            raise InputError("--input is only for a model function (file.py:function); an ONNX model has its "
                             "own inputs (names, dtypes and dim_param symbols)")
        from .frontend.onnx import from_onnx
        graph = from_onnx(model)
        return LoadedModel(graph.name, graph, model)
    path, colon, attr = model.rpartition(":")
    if colon and path.endswith(".py"):
        return _from_python(path, attr, inputs, model, autograph)
    if model.endswith(".py"):
        raise InputError(f"{model}: name the model function too, as {model}:function")
    if is_artifact(model):
        raise InputError(f"{model} is a compiled artifact, not a model; run it with `dyntvm run {model}`")
    if not os.path.exists(model):
        raise InputError(f"{model}: no such file (MODEL is graph.json, file.py:function or --example NAME)")
    if inputs:
        raise InputError("--input is only for a model function (file.py:function); a saved graph has its "
                         "own signature")
    return _from_graph_file(model)


def _get_example(name: str):
    from . import examples
    if name not in examples.NAMES:
        raise InputError(f"unknown example {name!r}; choose one of {', '.join(examples.NAMES)}")
    return examples.get(name)


def _from_example(ex, source: str) -> LoadedModel:
    import dyntvm as dt
    graph = dt.trace(ex.fn, *ex.specs, name=ex.name)
    return LoadedModel(ex.name, graph, source, ex.fn, ex, dict(ex.sizes))


def _from_graph_file(path: str) -> LoadedModel:
    from .ir.serialize import load_graph
    graph = load_graph(path)
    if any(n.op == "region" for n in graph.walk()):
        raise InputError(f"{path}: this graph is already partitioned (an artifact's graph.json?); "
                         "give the traced graph written by dyntvm.ir.serialize.save_graph")
    graph.lint()
    return LoadedModel(graph.name, graph, path)


def import_file(path: str):
    """Import a Python file as a fresh module (its folder is on sys.path while it runs)."""
    import importlib.util
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    folder = os.path.dirname(os.path.abspath(path))
    mod_name = "_dyntvm_user_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)
    try:
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def _from_python(path: str, attr: str, inputs, source: str, autograph: bool = False) -> LoadedModel:
    from .examples import Example
    from .ir.graph import Graph
    module = import_file(path)
    if not hasattr(module, attr):
        public = [k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                  and getattr(v, "__module__", None) == module.__name__]
        raise InputError(f"{path} has no {attr!r}; it defines: {', '.join(public) or 'nothing callable'}")
    obj = getattr(module, attr)
    if autograph and (isinstance(obj, (Example, Graph)) or not callable(obj)):
        raise InputError(f"{source}: --autograph converts a model function, not a {type(obj).__name__}")
    if isinstance(obj, Example):
        if inputs:
            raise InputError(f"{source} is an Example with its own signature; drop --input")
        return _from_example(obj, source)
    if isinstance(obj, Graph):
        if inputs:
            raise InputError(f"{source} is a traced graph with its own signature; drop --input")
        return LoadedModel(obj.name, obj.lint(), source)
    if not callable(obj):
        raise InputError(f"{source} is a {type(obj).__name__}, not a model function, dt.Graph or Example")
    specs = _order_specs(obj, [parse_input_spec(s) for s in inputs], source)
    import dyntvm as dt
    fn = dt.autograph(obj) if autograph else obj
    return LoadedModel(attr, dt.trace(fn, *specs, name=attr), source, obj)


def load_torch(model: str | None) -> LoadedModel:
    """``file.py:make`` for ``--torch``: ``make()`` returns ``(module_or_fn, example_args)`` or ``(module_or_fn,
    example_args, dynamic_shapes)``, imported with `dt.from_torch`."""
    path, colon, attr = (model or "").rpartition(":")
    if not (colon and path.endswith(".py") and _NAME.match(attr)):
        raise InputError(f"--torch takes MODEL as file.py:make, where make() returns (module, example_args[, "
                         f"dynamic_shapes]); got {model!r}")
    module = import_file(path)
    make = getattr(module, attr, None)
    if not callable(make):
        raise InputError(f"{path} has no function {attr!r} (make() returns (module, example_args[, dynamic_shapes]))")
    got = make()
    if not (isinstance(got, (tuple, list)) and len(got) in (2, 3)):
        raise InputError(f"{model}: {attr}() must return (module, example_args) or (module, example_args, "
                         f"dynamic_shapes), got {type(got).__name__}")
    from .frontend.torch_export import from_torch
    graph = from_torch(*got)
    return LoadedModel(graph.name, graph, model)


def _order_specs(fn, specs: list, source: str) -> list:
    """Put the --input specs in the function's parameter order (matched by name when they all match)."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        varargs = any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return specs
    names = [p.name for p in params]
    required = [p.name for p in params if p.default is p.empty]
    usage = f"{source}({', '.join(names)})"
    if not specs:
        raise InputError(f"{usage} needs one --input NAME:DIMS:DTYPE per argument: "
                         f"{' '.join('--input ' + n + ':DIMS:DTYPE' for n in required or ['x'])} "
                         "(e.g. xs:T,B,128:float32)")
    given = [s.name for s in specs]
    if len(set(given)) != len(given):
        raise InputError(f"--input names must be unique, got {', '.join(given)}")
    if set(given) <= set(names):
        ordered = [s for n in names for s in specs if s.name == n]
        missing = [n for n in required if n not in given]
        if missing:
            raise InputError(f"{usage}: no --input for {', '.join(missing)}")
        return ordered
    if varargs or len(specs) == len(names):
        return specs                   # positional: names are labels only
    raise InputError(f"{usage}: --input names {', '.join(given)} do not match its parameters")


def random_inputs(graph, rng, sizes: dict | None = None, given: dict | None = None) -> list:
    """One array per graph input: `given[name]` where present, random data of the declared type otherwise.

    Symbolic dims take their size from `sizes` or from a given array with the same symbol.
    Floats are standard normal, integers in [0, 10), bools fair coin flips.
    """
    import numpy as np

    from .ir.types import eval_dim, is_symbol
    given = dict(given or {})
    env = dict(sizes or {})
    from .ir.list_type import ListType
    for v in graph.inputs:
        if isinstance(v.type, ListType) and v.name not in given:
            raise InputError(f"input {v.name!r} is {v.type.describe()}: random data is made for tensor inputs only; "
                             "give this one (a list of arrays: --input NAME=FILE.npz, written by "
                             "np.savez(FILE, *arrays))")
    for v in graph.inputs:                       # bind symbols from the given arrays first
        if v.name in given and not isinstance(v.type, ListType):
            for d, s in zip(v.type.shape, np.shape(given[v.name])):
                if is_symbol(d):
                    env.setdefault(d, int(s))
    out = []
    for v in graph.inputs:
        if v.name in given:
            out.append(given[v.name])
            continue
        shape = []
        for d in v.type.shape:
            try:
                shape.append(eval_dim(d, env))
            except KeyError:
                raise InputError(f"input {v.name!r} is {v.type}: dim {d} needs a size, e.g. --dim {d}=16")
        dt = np.dtype(v.type.dtype)
        if dt.kind == "f":
            a = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            a = rng.integers(0, 10, size=shape).astype(dt)
        elif dt.kind == "b":
            a = rng.random(shape) < 0.5
        else:
            raise InputError(f"input {v.name!r}: cannot make random data of dtype {dt}")
        out.append(a)
    return out
