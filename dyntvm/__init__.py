"""dyntvm: compile dynamic neural networks (control flow, data-dependent shapes) with Apache TVM.

Example:
    >>> import numpy as np, dyntvm as dt
    >>> from dyntvm import F
    >>> g = dt.trace(lambda x: F.boolean_mask(x, x > 0) * 2, dt.TensorSpec(("N",)))

Attributes load lazily, so `import dyntvm.runtime` (what `dt.load` needs) pulls in neither the
frontend nor codegen.
"""
from .errors import (ArtifactError, CompileError, DyntvmError, ExecutionError, GraphError, InputError,  # noqa: F401
                     TraceError, UnsupportedOpError)

__version__ = "0.1.0"

_LAZY = {
    "F": ("dyntvm.frontend.F", None),
    "trace": ("dyntvm.frontend.tracer", "trace"),
    "TensorSpec": ("dyntvm.frontend.tracer", "TensorSpec"),
    "Graph": ("dyntvm.ir.graph", "Graph"),
    "TensorType": ("dyntvm.ir.types", "TensorType"),
    "Interpreter": ("dyntvm.runtime.interpreter", "Interpreter"),
    "run_reference": ("dyntvm.runtime.interpreter", "run_reference"),
    "graph_from_json": ("dyntvm.ir.serialize", "graph_from_json"),
    "graph_to_json": ("dyntvm.ir.serialize", "graph_to_json"),
    "compile": ("dyntvm.codegen.api", "compile"),
    "hybridize": ("dyntvm.codegen.api", "hybridize"),
    "load": ("dyntvm.runtime.artifact", "load"),
}


def __getattr__(name):
    import importlib
    try:
        mod, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'dyntvm' has no attribute {name!r}") from None
    m = importlib.import_module(mod)
    val = m if attr is None else getattr(m, attr)
    globals()[name] = val
    return val


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
