"""`CompiledModel`: a partitioned graph plus its compiled kernels, callable on numpy arrays.

Pipeline stage 4 of 4 (`dyntvm.pipeline`), and what `dt.load` (`runtime/load.py`) returns. Runtime-only
(imports the IR and the runtime, never the frontend, partitioner or codegen) so that `dt.load` stays light.
"""
from __future__ import annotations

import functools
import threading
import weakref

import numpy as np

from dyntvm.errors import CompileError, InputError

from ..ir.dim_checks import name_internal_dims
from ..ir.graph import Graph
from ..ir.list_type import ListType
from ..ir.ops import OpKind
from ..ir.tree import LEAF, flatten_like, tree_flatten, tree_str, tree_unflatten
from ..ir.types import expression_dim_errors, is_symbol
from .artifact import save as save_artifact
from .devices import device_type
from .dim_check_run import dim_range_error, in_range
from .executor import Executor
from .lists import check_list_value, host_list
from .placement import DevicePlacement
from .tensors import to_numpy
from .torch_inputs import is_torch_tensor, torch_to_numpy
from .vm_program import ProgramRunner, register_kernels, release_kernels
from .vm_program import status as program_status


def virtual_machine(lib, device: str = "cpu"):
    """A Relax VM over a kernel library (built, or loaded from a file) on a device type of `devices.DEVICES`.

    TVM's runtime VM (`tvm.runtime.vm`), not `tvm.relax`: importing relax needs TVM's compiler library,
    which a deployment (`dt.load`, `dyntvm run`) must not (see `tests/test_runtime_only.py`)."""
    from tvm.runtime.vm import VirtualMachine
    return VirtualMachine(lib, device_type(device).tvm_device())


def signature(graph: Graph) -> str:
    """The model's arguments, nested as traced, e.g. ``(x: float32[N,3], [h: float32[8], c: float32[8]])``."""
    labels = iter(f"{v.name}: {v.type.describe() if isinstance(v.type, ListType) else v.type}" for v in graph.inputs)

    def go(s):
        if s == LEAF:
            return next(labels)
        if s[0] == "dict":
            return "{" + ", ".join(f"{k!r}: {go(c)}" for k, c in zip(s[1], s[2])) + "}"
        inner = ", ".join(go(c) for c in s[1])
        return f"[{inner}]" if s[0] == "list" else f"({inner}{',' if len(s[1]) == 1 else ''})"
    return "(" + ", ".join(go(c) for c in graph.in_tree[1]) + ")" if graph.in_tree is not None else \
        "(" + ", ".join(labels) + ")"


def _convert_losslessly(x, a: np.ndarray, t, label: str) -> np.ndarray:
    """`a` (Python value `x` read by numpy) cast to `t`'s dtype; an InputError where that changes values
    (an integer out of range, a finite number that becomes inf). Float rounding is no loss."""
    with np.errstate(all="ignore"):
        b = a.astype(t.dtype)
    bad = None
    if b.dtype.kind in "iu" and a.dtype.kind in "iu" and a.size:
        info = np.iinfo(b.dtype)
        out = a[(a < info.min) | (a > info.max)]
        bad = out.flat[0].item() if out.size else None
    elif b.dtype.kind == "f":
        out = a[np.isfinite(a) & ~np.isfinite(b)]
        bad = out.flat[0].item() if out.size else None
    if bad is not None:
        raise InputError(f"{label}: the {type(x).__name__} holds {bad!r}, which does not fit {t.dtype} (converting "
                         f"to {t} would lose data); pass a numpy array of {t.dtype}")
    return b


def check_inputs(graph: Graph, args: tuple) -> list:
    """Flatten `args` like the traced signature and validate count, dtype, rank and dims."""
    try:
        return _check_inputs(graph, args)
    except InputError as e:     # types with unknown dims (TensorSpec None): named by their origin
        raise InputError(name_internal_dims(str(e), graph.dim_origins)) from None


@functools.lru_cache(maxsize=64)
def _np_dtype(name: str) -> np.dtype:
    """np.dtype(name), cached: `dtype.name` costs a few us per call (numpy builds it each time)."""
    return np.dtype(name)


def _check_inputs(graph: Graph, args: tuple) -> list:
    types = [v.type for v in graph.inputs]
    names = [v.name for v in graph.inputs]
    if graph.in_tree is not None:
        n_args = len(graph.in_tree[1])
        if len(args) != n_args:
            raise InputError(f"the model takes {n_args} arguments {signature(graph)}, got {len(args)}")
        leaves: list = []
        if not flatten_like(graph.in_tree, list(args), leaves):
            spec = tree_flatten(list(args), is_leaf=lambda x: isinstance(x, np.ndarray))[1]
            raise InputError(f"arguments are nested as {tree_str(spec)}, expected {tree_str(graph.in_tree)}: "
                             f"{signature(graph)}")
    else:
        leaves = list(args)
        if len(leaves) != len(types):
            raise InputError(f"the model takes {len(types)} inputs, got {len(leaves)}")
    env: dict = {}
    out = []
    for i, (x, t, name) in enumerate(zip(leaves, types, names)):
        label = f"input {i} ({name!r})" if name else f"input {i}"
        if isinstance(t, ListType):
            out.append(check_list_value(x, t, label, env, InputError))
            continue
        if type(x) is not np.ndarray and is_torch_tensor(x):      # numpy arrays: no lookup per call
            x = torch_to_numpy(x, label)
        want = _np_dtype(t.dtype)
        if isinstance(x, np.generic) and x.dtype == want:
            x = np.asarray(x)                 # a numpy scalar of the input's dtype: nothing to convert or check
        if not isinstance(x, np.ndarray):
            if isinstance(x, (int, float, bool, list, tuple, np.generic)):
                try:
                    a = np.asarray(x)
                except (TypeError, ValueError) as e:
                    raise InputError(f"{label}: cannot convert {type(x).__name__} to {t}: {e}") from e
                if not (np.can_cast(a.dtype, t.dtype, "same_kind") or a.dtype.kind + t.dtype[0] in ("iu", "ui")):
                    raise InputError(f"{label}: a Python {type(x).__name__} ({a.dtype.name}) does not convert "
                                     f"to {t} without losing data; pass a numpy array of {t.dtype}")
                x = _convert_losslessly(x, a, t, label)
            elif hasattr(x, "__dlpack__"):
                x = to_numpy(x)
            else:
                raise InputError(f"{label}: expected a numpy array of {t}, got {type(x).__name__}")
        if not x.dtype.isnative:              # e.g. '>f4': DLPack (and so TVM) takes native byte order only
            x = x.astype(x.dtype.newbyteorder("="))
        if x.dtype != want:
            raise InputError(f"{label}: dtype is {x.dtype.name}, expected {t} (use .astype({t.dtype!r}))")
        if x.ndim != t.ndim:
            raise InputError(f"{label}: rank is {x.ndim} (shape {list(x.shape)}), expected {t}")
        for ax, (d, s) in enumerate(zip(t.shape, x.shape)):
            if isinstance(d, int):
                if d != s:
                    raise InputError(f"{label}: axis {ax} has size {s}, expected {d} (spec {t})")
            elif is_symbol(d) and not d.startswith("_"):
                if env.setdefault(d, s) != s:
                    raise InputError(f"{label}: axis {ax} is {d}={s}, but {d}={env[d]} from an earlier input")
        if x.dtype == np.bool_ or x.dtype.kind in "iufb":
            pass
        else:
            raise InputError(f"{label}: unsupported dtype {x.dtype}")
        out.append(x)
    tensors = [k for k, t in enumerate(types) if not isinstance(t, ListType)]      # (a list's dims are its own)
    for k, ax, d, size in expression_dim_errors([types[i] for i in tensors], [out[i].shape for i in tensors], env):
        i = tensors[k]
        name = f"input {i} ({names[i]!r})" if names[i] else f"input {i}"
        raise InputError(f"{name}: axis {ax} has size {size}, which does not fit its dim {d} (spec {types[i]}; "
                         f"symbols: {env})")
    bad = dim_range_error(graph, env)
    if bad:
        raise InputError(bad)
    return out




def partition_summary(graph: Graph) -> list[str]:
    """One line per compiled region, dynamic-shape node and control-flow node (depth first)."""
    lines = []
    for n in graph.walk():
        if n.op == "region":
            ops = [m.op for m in n.subgraphs[0].nodes if m.op != "constant"]
            kinds = sorted(set(ops))
            lines.append(f"region {n.attrs.name}: {len(ops)} ops ({', '.join(kinds[:8])}"
                         f"{', ...' if len(kinds) > 8 else ''}), {len(n.inputs)} in / {len(n.outputs)} out")
        elif n.opdef.kind in (OpKind.DYNAMIC_SHAPE, OpKind.CONTROL_FLOW):
            lines.append(f"{n.opdef.kind.value.replace('_', '-')} node {n.name} ({n.op})")
    return lines


class InputChecker:
    """The common case (flat arguments that already fit) checked with precomputed tuples; anything
    else goes through `check_inputs`, which also writes the error messages."""

    def __init__(self, graph: Graph):
        self.graph = graph
        tree = graph.in_tree
        self.flat = tree is None or (tree[0] in ("list", "tuple") and all(c == "*" for c in tree[1]))
        self.fast = None
        if any(isinstance(v.type, ListType) for v in graph.inputs):
            self.flat, self.sig = False, []     # lists: checked element by element by `check_inputs`
            return
        if any(isinstance(d, str) and not is_symbol(d) for v in graph.inputs for d in v.type.shape):
            self.flat = False           # expression dims (``(T + 1)``): checked by `check_inputs`
        self.n = len(graph.inputs)
        self.sig = []
        for v in graph.inputs:
            t = v.type
            static = tuple((ax, d) for ax, d in enumerate(t.shape) if isinstance(d, int))
            syms = tuple((ax, d) for ax, d in enumerate(t.shape) if is_symbol(d) and not d.startswith("_"))
            self.sig.append((np.dtype(t.dtype), t.ndim, static, syms))
        self.ranges = tuple((sym, lo, hi) for sym, (lo, hi) in graph.dim_ranges.items())
        if self.flat:
            self.fast = _fast_check(self.sig, self.ranges)

    def __call__(self, args: tuple) -> list:
        fast = self.fast
        if fast is not None:
            out = fast(args)
            if out is not None:
                return out
        if self.flat and len(args) == self.n:
            env: dict = {}
            out = list(args)
            k = 0
            for dtype, nd, static, syms in self.sig:    # (plain loops: a generator per input cost ~0.3 us)
                x = args[k]
                if type(x) is not np.ndarray:
                    if nd or not isinstance(x, np.generic) or x.dtype != dtype:
                        break
                    x = out[k] = np.asarray(x)      # a numpy scalar of the input's dtype (np.int64(5))
                k += 1
                xd = x.dtype
                if (xd is not dtype and xd != dtype) or x.ndim != nd:
                    break
                shape = x.shape
                bad = False
                for ax, d in static:
                    if shape[ax] != d:
                        bad = True
                for ax, sym in syms:
                    if env.setdefault(sym, shape[ax]) != shape[ax]:
                        bad = True
                if bad:
                    break
            else:
                if not self.ranges or all(in_range(env.get(s, lo), lo, hi) for s, lo, hi in self.ranges):
                    return out
        return check_inputs(self.graph, args)


def _fast_check(sig: list, ranges: tuple):
    """A function of the arguments giving them as a list where they are numpy arrays of the inputs' dtypes and
    shapes (symbols equal where repeated, within their ranges), else None (`InputChecker` then checks them the
    general way): written out for the model's signature, a third of the time of a loop over it."""
    names: dict = {}                               # symbol -> the local holding its size
    lines = ["def check(args):", f"    if len(args) != {len(sig)}:", "        return None"]
    glob = {"ndarray": np.ndarray}
    for k, (dtype, nd, static, syms) in enumerate(sig):
        glob[f"t{k}"] = dtype
        lines += [f"    a{k} = args[{k}]",
                  f"    if type(a{k}) is not ndarray:", "        return None",
                  f"    d = a{k}.dtype",
                  f"    if d is not t{k} and d != t{k}:", "        return None",
                  f"    s{k} = a{k}.shape",
                  f"    if len(s{k}) != {int(nd)}:", "        return None"]
        conds = [f"s{k}[{int(ax)}] != {int(d)}" for ax, d in static]
        for ax, sym in syms:
            if sym in names:
                conds.append(f"s{k}[{int(ax)}] != {names[sym]}")
            else:
                names[sym] = f"v{len(names)}"
                lines.append(f"    {names[sym]} = s{k}[{int(ax)}]")
        if conds:
            lines += [f"    if {' or '.join(conds)}:", "        return None"]
    for j, (sym, lo, hi) in enumerate(ranges):
        if sym not in names:                       # a range of a symbol no input binds: the general check
            return None
        glob[f"lo{j}"], glob[f"hi{j}"] = lo, hi
        v = names[sym]
        lines += [f"    if {v} < lo{j}" + ("" if hi is None else f" or {v} > hi{j}") + ":", "        return None"]
    lines.append(f"    return [{', '.join(f'a{k}' for k in range(len(sig)))}]")
    exec("\n".join(lines), glob)     # noqa: S102 - our own text: indices, ints and local names only
    return glob["check"]


def _owned(to_host):
    """`to_host`, copying an array the caller may not write to (a view of a device tensor's remembered host copy,
    `DevicePlacement.read`, made by a dynamic-shape op whose result is an output)."""
    def host(o):
        a = to_host(o)
        return a if a.flags.writeable else np.array(a)
    return host


class CompiledModel:
    """A compiled model: call it on numpy arrays; outputs come back nested like the traced function's.

    Safe to call from several threads at once: each thread runs its own Relax VM and executor (made on
    its first call, in about 0.1 ms), sharing the kernel library and the constants.

    Attributes:
        graph: the partitioned graph (region nodes own their subgraphs).
        regions: names of the compiled region functions.
        target: the device type its kernels run on (`devices.DEVICES`: "cpu", "cuda").
        last_profile: node -> (calls, seconds) of the latest call made with ``profile=True`` (any thread).
        last_copies: host<->device copies (counts and bytes) of that call, for kernels on a device (a GPU).
    """

    def __init__(self, graph: Graph, vm=None, target: str = "cpu", lib=None, info: dict | None = None):
        self.graph, self.vm, self.target, self.lib = graph, vm, target, lib
        self.info = dict(info or {})
        self.lib_path = None           # the kernel library on disk (compile cache), if any
        self.lib_bytes = None          # or its bytes (a model loaded from an artifact), for save()
        self.regions = [n.attrs.name for n in graph.walk() if n.op == "region"]
        self._lock = threading.Lock()  # guards the call counters below, never a model call
        self._calls: dict = {}         # id -> region-call counter of each live per-thread executor
        self._calls_retired = [0, 0]   # region calls (all, specialized) of executors whose thread has ended
        self._threads = threading.local()
        self._constants: dict = {}     # filled by the first executor, then shared read-only by all
        self.not_runnable = None       # why this model cannot run here (CUDA kernels built without a GPU)
        self.last_copies: dict = {}    # host<->device copies of the latest profile=True call (device targets)
        self._device = None            # the TVM device values live on, for kernels that run on a device
        device = device_type(target)
        if not device.host and vm is not None:      # values live on the device, host crossings are copies
            self._device = device.tvm_device()
        # the VM program (`vm_program`): whether plain calls run as one VM call, else why not (print(model))
        self.vm_program, self.vm_program_fallback = program_status(graph, vm, self.specialized) if device.host else \
            (False, [f"the VM program is built for the CPU only (target {target})"])
        if self.vm_program:             # its callbacks' keys begin with the binding compiled into the library
            from .artifact import library_binding
            weakref.finalize(self, release_kernels, register_kernels(graph, library_binding(vm)))
        if vm is None and self.regions and not device.host:
            self.not_runnable = (f"this model was compiled for {device.label} on a machine without a GPU: it cannot "
                                 "run here; save it (model.save) and run it on a GPU host with dt.load / dyntvm run")
            self._executor = None
        else:
            self._executor = self._new_executor(vm)      # this thread's; other threads make theirs
        self._check = InputChecker(graph)
        tree = graph.out_tree
        self._out_kind = ("leaf" if tree == "*" else "tuple" if tree and tree[0] == "tuple" and
                          all(c == "*" for c in tree[1]) else "tree")

    def _new_executor(self, vm) -> Executor:
        """This thread's executor: a Relax VM keeps per-call frames, so threads must not share one."""
        ex = Executor(self.graph, vm, constants=self._constants, placement=self._placement(),
                      specialized=self.specialized)
        key = id(ex)
        with self._lock:
            self._calls[key] = ex.calls
        weakref.finalize(ex, _retire, self._lock, self._calls, key, self._calls_retired)
        self._threads.executor = ex
        # the program needs the VM of this thread; none on a device path (tests run it on the CPU)
        ex.program = ProgramRunner(vm, self.graph) if self.vm_program and ex.pl is None else None
        return ex

    def _placement(self):
        return None if self._device is None else DevicePlacement(self._device)

    def _use_device_path(self, device) -> None:
        """Run as if the kernels were on a device: values in TVM tensors on `device`, every host crossing an
        explicit, counted copy (tests run the GPU path on `tvm.cpu()` this way)."""
        self._device = device
        self._threads = threading.local()
        self._constants.clear()
        self._executor = self._new_executor(self.vm)

    def _thread_executor(self) -> Executor:
        if self.not_runnable:
            raise CompileError(self.not_runnable)
        ex = getattr(self._threads, "executor", None)
        if ex is None:
            ex = self._new_executor(virtual_machine(self.lib, self.target) if self.vm is not None else None)
        return ex

    def __call__(self, *args, validate: bool = False, profile: bool = False, **kwargs):
        if kwargs:
            raise InputError(f"the model takes its inputs by position: model{signature(self.graph)}; got keyword "
                             f"argument{'s' if len(kwargs) > 1 else ''} {', '.join(map(repr, kwargs))}")
        arrays = self._check(args)
        ex = self._thread_executor()
        if validate or profile:
            ex = Executor(self.graph, ex.vm, validate=validate, profile=profile, constants=self._constants,
                          placement=self._placement(), specialized=self.specialized)
        elif ex.program is not None:          # one VM call; the executor runs a call the program cannot finish
            return self._nest(ex.program(arrays, lambda a: self._run_executor(ex, a, False)))
        return self._nest(self._run_executor(ex, arrays, profile))

    @property
    def vm_program_calls(self) -> int:
        """Calls this thread made through the VM program (tests: one per plain call where it runs)."""
        ex = getattr(self._threads, "executor", None)
        return ex.program.calls if ex is not None and ex.program is not None else 0

    def _run_executor(self, ex: Executor, arrays: list, profile: bool) -> list:
        """The outputs of one call run by the executor `ex`, as host arrays."""
        if ex.pl is not None:                 # values on a device: the outputs are copied to the host
            host = _owned(ex.pl.to_host)
            try:
                outs = [host_list(o, host) if isinstance(o, list) else host(o) for o in ex.run(arrays)]
            finally:
                ex.pl.new_call()              # the copies remembered for this call (`DevicePlacement.read`)
        else:
            consts = ex.constant_ids
            outs = [np.array(to_numpy(o)) if id(o) in consts else host_list(o, _host_copy(consts)) if
                    isinstance(o, list) else to_numpy(o) for o in ex.run(arrays)]
        if profile:
            self.last_profile = {k: tuple(v) for k, v in ex.profile.items()}
            pl = ex.pl
            self.last_copies = {"host_to_device": pl.h2d, "device_to_host": pl.d2h, "host_to_device_bytes":
                                pl.h2d_bytes, "device_to_host_bytes": pl.d2h_bytes} if pl is not None else {}
        return outs

    def _nest(self, outs: list):
        """The flat outputs nested like the traced function's."""
        kind = self._out_kind
        if kind == "leaf":
            return outs[0]
        if kind == "tuple":
            return tuple(outs)
        return tree_unflatten(self.graph.out_tree, outs) if self.graph.out_tree is not None else outs

    @property
    def device_copies(self) -> dict:
        """Host<->device copies (counts and bytes) made so far by this thread's plain calls, for kernels on a
        device (a GPU); {} on the CPU. Tests compare it before and after a call (`last_copies` needs
        ``profile=True``, which runs loops step by step)."""
        ex = getattr(self._threads, "executor", None)
        pl = ex.pl if ex is not None else None
        return {} if pl is None else {"host_to_device": pl.h2d, "device_to_host": pl.d2h,
                                      "host_to_device_bytes": pl.h2d_bytes, "device_to_host_bytes": pl.d2h_bytes}

    @property
    def device_allocations(self) -> int:
        """Device buffers this thread's plain calls allocated for values the executor fills itself (inputs
        copied from the host, loop rows and stacked outputs), for kernels on a device; 0 on the CPU. They are
        pooled (`placement.BufferPool`): a repeated call with the same sizes allocates none."""
        ex = getattr(self._threads, "executor", None)
        return ex.pl.pool.allocs if ex is not None and ex.pl is not None else 0

    @property
    def kernel_calls(self) -> int:
        """Region calls made so far by plain calls of this model, from all threads."""
        with self._lock:
            return self._calls_retired[0] + sum(c[0] for c in self._calls.values())

    @property
    def specialized_calls(self) -> int:
        """Of `kernel_calls`, those that went to a region's specialization for its sizes (a tuning log's)."""
        with self._lock:
            return self._calls_retired[1] + sum(c[1] for c in self._calls.values())

    @property
    def specialized(self) -> dict:
        """``{region: [(sizes of its symbols, function name)]}``: the specializations a tuning log added."""
        table = (self.info.get("tuning") or {}).get("specialized") or {}
        return {r: [(dict(combo), name) for combo, name in specs] for r, specs in table.items()}

    def summary(self) -> str:
        lines = [f"CompiledModel {self.graph.name!r} target={self.target}: {len(self.regions)} region(s)"]
        lines += ["  " + line for line in partition_summary(self.graph)]
        lines.append("  vm program: " + ("every plain call runs as one VM call" if self.vm_program else
                                         "no, the executor runs the model: " + "; ".join(self.vm_program_fallback)))
        for k, v in self.info.items():
            lines.append(f"  {k}: {v}")
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self):
        return f"<CompiledModel {self.graph.name!r} target={self.target} regions={len(self.regions)}>"

    def save(self, path: str) -> None:
        """Write a deployable artifact (see `dt.load`)."""
        save_artifact(self, path)


def _host_copy(consts):
    """A list output's element as numpy: a copy where it is one of the model's constants (shared by calls)."""
    return lambda e: np.array(to_numpy(e)) if id(e) in consts else to_numpy(e)


def _retire(lock, calls: dict, key: int, retired: list) -> None:
    """A per-thread executor died (its thread ended): keep its count of region calls."""
    with lock:
        c = calls.pop(key)
        retired[0] += c[0]
        retired[1] += c[1]
