"""dyntvm: compile dynamic neural networks (control flow, data-dependent shapes) with Apache TVM.

Example:
    >>> import numpy as np, dyntvm as dt
    >>> from dyntvm import F
    >>> g = dt.trace(lambda x: F.boolean_mask(x, x > 0) * 2, dt.TensorSpec(("N",)))

The pipeline, one folder per stage: `frontend/` (trace) -> `partition/` (regions) -> `codegen/` (TVM
build) -> `runtime/` (CompiledModel, executor). `dt.compile` and `dt.hybridize` (`dyntvm/pipeline.py`)
call them in that order; `dt.load` (`runtime/load.py`) needs the runtime alone.

Attributes load lazily through a table of module names, so `import dyntvm` imports no stage and
`dt.load` pulls in neither the frontend, the partitioner nor codegen.
"""
from .errors import (ArtifactError, CompileError, DyntvmError, ExecutionError, GraphError, InputError,  # noqa: F401
                     TraceError, UnsupportedOpError)

__version__ = "0.1.0"

_LAZY = {
    "F": ("dyntvm.frontend.F", None),
    "trace": ("dyntvm.frontend.tracer", "trace"),
    "TensorSpec": ("dyntvm.frontend.tracer", "TensorSpec"),
    "ListSpec": ("dyntvm.frontend.tracer", "ListSpec"),
    "Graph": ("dyntvm.ir.graph", "Graph"),
    "TensorType": ("dyntvm.ir.types", "TensorType"),
    "Interpreter": ("dyntvm.runtime.interpreter", "Interpreter"),
    "run_reference": ("dyntvm.runtime.interpreter", "run_reference"),
    "graph_from_json": ("dyntvm.ir.serialize", "graph_from_json"),
    "graph_to_json": ("dyntvm.ir.serialize", "graph_to_json"),
    "compile": ("dyntvm.pipeline", "compile"),
    "hybridize": ("dyntvm.pipeline", "hybridize"),
    "autograph": ("dyntvm.frontend.autograph", "convert"),
    "show_converted": ("dyntvm.frontend.autograph", "show_converted"),
    "tune": ("dyntvm.pipeline", "tune"),
    "from_onnx": ("dyntvm.frontend.onnx", "from_onnx"),
    "from_torch": ("dyntvm.frontend.torch_export", "from_torch"),
    "inspect_onnx": ("dyntvm.onnx_inspect", "inspect_onnx"),
    "load": ("dyntvm.runtime.load", "load"),
    "grad": ("dyntvm.frontend.grad", "grad"),
    "value_and_grad": ("dyntvm.frontend.grad", "value_and_grad"),
    "vjp": ("dyntvm.frontend.grad", "vjp"),
    "jvp": ("dyntvm.frontend.grad_forward", "jvp"),
}


def __getattr__(name):
    import importlib
    import importlib.util
    try:
        mod, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'dyntvm' has no attribute {name!r}") from None
    try:
        m = importlib.import_module(mod)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("dyntvm.") and importlib.util.find_spec("dyntvm.frontend") is None:
            raise ImportError(f"dyntvm.{name} is not in this runtime-only dyntvm (made by `dyntvm bundle`): it "
                              "loads and runs artifacts (dt.load); tracing and compiling need the full install "
                              "(pip install dyntvm)") from None
        raise
    except AttributeError as e:     # an AttributeError here would read as "no attribute F": show the real one
        raise ImportError(f"importing {mod} for dyntvm.{name} failed: {e!r}") from e
    val = m if attr is None else getattr(m, attr)
    globals()[name] = val
    return val


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
