"""Builders shared by the workloads: numpy, PyTorch eager, torch.compile, ONNX Runtime and dyntvm."""
from __future__ import annotations

import itertools
import os
import time

import numpy as np

from . import NotApplicable, Prepared

ONNX_OPSET = 18
ONNX_IR_VERSION = 9           # what every onnxruntime since 1.15 reads


def as_tuple(out):
    if isinstance(out, (tuple, list)):
        return tuple(out)
    return (out,)


# ---------------------------------------------------------------- numpy

def numpy_builder(fn, inputs):
    def build(ctx):
        return Prepared(lambda *a: as_tuple(fn(*a)), tuple(inputs))
    return build


# ---------------------------------------------------------------- torch

def torch_args(inputs):
    import torch
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a for a in inputs)


def torch_to_numpy(out):
    return tuple(o.detach().cpu().numpy() if hasattr(o, "detach") else np.asarray(o) for o in as_tuple(out))


def torch_builder(factory, inputs):
    """`factory(inputs) -> (fn, args)`: a torch function and its arguments (torch tensors, ints).

    With `ctx.device == "cuda"` the factory runs with CUDA as torch's default device and `torch.from_numpy`
    moving to it (weights and inputs live on the GPU, as a CUDA user keeps them); each timed call ends with
    `torch.cuda.synchronize()` (dyntvm's numpy-out call includes its copy back, so this is torch's best case).
    """
    def build(ctx):
        import torch
        if getattr(ctx, "device", "cpu") == "cpu":
            fn, args = factory(inputs)

            def run(*a):
                with torch.inference_mode():
                    return fn(*a)
            return Prepared(run, tuple(args), torch_to_numpy)
        if not torch.cuda.is_available():
            raise NotApplicable("no CUDA GPU")
        dev = torch.device(ctx.device)
        # full fp32 like every other system (cuDNN's RNNs use TF32 by default: 1e-3 off the reference)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        plain = torch.from_numpy
        torch.from_numpy = lambda a: plain(a).to(dev)
        try:
            with dev:
                fn, args = factory(inputs)
        finally:
            torch.from_numpy = plain

        def run_gpu(*a):
            with torch.inference_mode(), dev:
                out = fn(*a)
            torch.cuda.synchronize()
            return out
        return Prepared(run_gpu, tuple(args), torch_to_numpy)
    return build


def _reason(text: str) -> str:
    """A dynamo graph-break / unsupported message in one line (its headline, plus a chained one)."""
    parts = str(text).split("*** While handling this graph break, another graph break occurred: ***")
    heads = []
    for p in parts:
        lines = [ln.strip() for ln in p.splitlines() if ln.strip()]
        if lines:
            heads.append(lines[0][:120])
    return " -> ".join(heads) or "?"


def _distinct(reasons) -> list[str]:
    """Sorted, without a reason that another one only extends ("X" next to "X -> graph break in loop")."""
    return sorted(r for r in reasons if not any(o != r and o.startswith(r) for o in reasons))


def torch_compile_builder(factory, inputs, warm_calls: int = 2):
    """`torch.compile(fn)` with default settings, as a user would; the first call compiles.

    The build time is the first call (compile + one run). Graph breaks, graphs compiled and recompiles
    are read from dynamo's counters over the first call and `warm_calls` more (recompiles show there).
    With `ctx.torch_cache_dir`, inductor's in-memory caches are cleared and its on-disk caches live in that
    folder while compiling (as `torch._inductor.utils.fresh_cache` does), so kernels compiled for an
    earlier workload are not reused: an empty folder is a cold compile.
    """
    def build(ctx):
        import torch
        import torch._dynamo
        from torch._dynamo.utils import counters
        fn, args = factory(inputs)
        torch._dynamo.reset()
        counters.clear()
        cfn = torch.compile(fn, backend=ctx.torch_backend)

        def run(*a):
            with torch.inference_mode():
                return cfn(*a)
        old_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if ctx.torch_cache_dir:
            try:
                from torch._inductor.utils import clear_caches
                clear_caches()
            except ImportError:                        # pragma: no cover (a torch without it)
                pass
            os.makedirs(ctx.torch_cache_dir, exist_ok=True)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = ctx.torch_cache_dir
        try:
            t0 = time.perf_counter()
            run(*args)
            first = time.perf_counter() - t0
            for _ in range(warm_calls):
                run(*args)
        finally:
            if ctx.torch_cache_dir:
                if old_dir is None:
                    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
                else:
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = old_dir
        breaks = counters.get("graph_break", {})
        unsupported = counters.get("unimplemented", {})
        stats = counters.get("stats", {})
        info = {"first_call_s": first,
                "graphs": int(stats.get("unique_graphs", 0)),
                "graph_breaks": int(sum(breaks.values())),
                "break_reasons": _distinct({_reason(r) for r in breaks} | {_reason(r) for r in unsupported}),
                "frames": int(counters.get("frames", {}).get("total", 0))}
        info["eager_fallback"] = info["graphs"] == 0
        return Prepared(run, tuple(args), torch_to_numpy, info=info, keep=cfn, compile_s=first)
    return build


# ---------------------------------------------------------------- ONNX / ONNX Runtime

class OnnxGraph:
    """A small onnx.helper wrapper: `g.op("MatMul", a, b)` appends a node and returns its output name(s).

    Names are unique across a model (subgraphs share the counter), so a loop body may use any value of
    an enclosing graph by name, as ONNX allows.
    """

    _ids = itertools.count()

    def __init__(self):
        self.nodes, self.inits = [], []

    def name(self, hint="v"):
        return f"{hint}_{next(self._ids)}"

    def const(self, value, dtype=None, hint="c"):
        from onnx import numpy_helper
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type, *inputs, n_out=1, outputs=None, **attrs):
        from onnx import helper
        outs = list(outputs) if outputs else [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, [i if i is not None else "" for i in inputs], outs, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def graph(self, name, inputs, outputs):
        """inputs / outputs: (name, elem_type, shape) with shape a list of ints / strings / None, or None."""
        from onnx import helper
        vi = lambda n, t, s: helper.make_tensor_value_info(n, t, s)
        return helper.make_graph(self.nodes, name, [vi(*i) for i in inputs], [vi(*o) for o in outputs],
                                 initializer=self.inits)


def onnx_model(graph):
    from onnx import checker, helper
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              producer_name="dyntvm-bench-peers")
    model.ir_version = ONNX_IR_VERSION
    checker.check_model(model)
    return model


def ort_session(model, threads: int):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_builder(make_model, inputs, input_names=None):
    """`make_model() -> onnx.ModelProto`; the build time is graph construction + session creation."""
    def build(ctx):
        model = make_model()
        sess = ort_session(model, ctx.threads)
        names = input_names or [i.name for i in sess.get_inputs()]
        feed = {n: np.ascontiguousarray(a) for n, a in zip(names, inputs)}
        return Prepared(lambda f: tuple(sess.run(None, f)), (feed,), keep=sess)
    return build


# ---------------------------------------------------------------- dyntvm

def dyntvm_builder(fn, specs, inputs):
    def build(ctx):
        import dyntvm as dt
        if ctx.device != "cpu":
            from dyntvm.codegen.backends.cuda.gpu import gpu_present
            if not gpu_present():
                raise NotApplicable("no CUDA GPU")
        model = dt.compile(fn, *specs, cache_dir=ctx.cache_dir, target=ctx.device)
        return Prepared(lambda *a: as_tuple(model(*a)), tuple(inputs), keep=model)
    return build


def dyntvm_onnx_builder(make_model, inputs):
    """The ONNX model ONNX Runtime runs (`make_model() -> onnx.ModelProto`), imported with `dt.from_onnx` and
    compiled: the build time is graph construction + import + compile."""
    def build(ctx):
        import dyntvm as dt
        if ctx.device != "cpu":
            raise NotApplicable("CPU only")
        cache = os.path.join(ctx.cache_dir, "onnx") if ctx.cache_dir else None     # cold apart from "dyntvm"'s
        model = dt.compile(dt.from_onnx(make_model()), cache_dir=cache)
        return Prepared(lambda *a: as_tuple(model(*a)), tuple(inputs), keep=model)
    return build


def standard_builders(inputs, numpy_fn, torch_factory, onnx_factory, dyntvm_fn, specs) -> dict:
    """The builders every workload has: numpy, PyTorch eager and torch.compile (the same torch function),
    ONNX Runtime, dyntvm."""
    return {
        "numpy": numpy_builder(numpy_fn, inputs),
        "torch": torch_builder(torch_factory, inputs),
        "torch_compile": torch_compile_builder(torch_factory, inputs),
        "ort": ort_builder(onnx_factory, inputs),
        "dyntvm": dyntvm_builder(dyntvm_fn, specs, inputs),
        "dyntvm_onnx": dyntvm_onnx_builder(onnx_factory, inputs),
    }
