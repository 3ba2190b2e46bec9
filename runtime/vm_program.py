"""Running a model as its VM program (`ir.vm_program`): one call of the library's `PROGRAM` function per model
call, instead of the executor's Python step per node.

`CompiledModel` uses it for plain calls on the CPU when the library has the program; the executor still runs
calls with ``validate=True`` or ``profile=True``, models on a device, and every model without a program (the
nodes the program cannot run are listed by `print(model)`). When the program fails (a run-time check, a
kernel's error, an allocation), the call runs again in the executor, which raises the executor's error, naming
the node and iteration; should the executor succeed, its result is returned with a RuntimeWarning. So results
and errors are the executor's.

The dynamic-shape nodes a program does not run as kernels (`ir.vm_program.native`) call back into Python
(`KERNEL_CALLBACK`, registered here when this module is imported, before any VM is made: a VM looks its packed
functions up when it is created): the node's numpy kernel, from a table filled when a model with a program is
made (`register_kernels`); so do the regions whose sizes are checked before they run (`GUARD_CALLBACK`: the
executor's size guard), where the program's own evaluation of those sizes (`codegen/vm_guard.py`) finds a value
that may exceed 256 MiB.
"""
from __future__ import annotations

import os
import threading
import warnings

import numpy as np
import tvm_ffi
from tvm_ffi._ffi_api import ArrayGetItem

from ..ir.graph import Graph
from ..ir.vm_program import (ELEMENT_ALIGNED_FUNCTION, GUARD_CALLBACK, KERNEL_CALLBACK, NATIVE_GUARD_BYTES, PROGRAM,
                             describe, node_keys, python_callbacks, unsupported_nodes)
from . import region_sizes
from .kernels import KERNELS
from .region_sizes import size_guard
from .tensors import InputStaging, to_numpy, to_tvm

FALLBACK_CALLBACK = "dyntvm.vm_fallback"       # codegen/vm_program.py calls it under this name

_item = ArrayGetItem
_from_dlpack = np.from_dlpack                  # (the program's outputs are CPU tensors: `to_numpy`'s case)
_kernels: dict = {}                            # node key -> (numpy kernel, attrs)
_guards: dict = {}                             # node key -> a region's size check (`region_sizes.size_guard`)
_users: dict = {}                              # node key -> how many live models registered it
_lock = threading.RLock()                      # reentrant: `release_kernels` runs from a model's GC finalizer,
                                               # which a collection inside `register_kernels` can call


FALLBACK_MARK = "dyntvm: the VM program hands this call to the executor: "   # TVM re-raises it as a RuntimeError


def _run_kernel(key, *args):
    kern, attrs = _kernels[str(key)]
    res = kern(attrs, *[np.from_dlpack(a) for a in args])
    if len(res) == 1:
        return to_tvm(res[0])
    return [to_tvm(r) for r in res]


def _size_guard(key, *args):
    _guards[str(key)](args)
    return []


def _fallback(why):
    raise RuntimeError(FALLBACK_MARK + str(why))


tvm_ffi.register_global_func(KERNEL_CALLBACK, _run_kernel, override=True)
tvm_ffi.register_global_func(FALLBACK_CALLBACK, _fallback, override=True)
tvm_ffi.register_global_func(GUARD_CALLBACK, _size_guard, override=True)


def register_kernels(graph: Graph, prefix: str) -> list:
    """Fill the tables with `graph`'s dynamic-shape nodes and region size checks under the keys its program
    uses; returns the keys, for `release_kernels` when the model goes (a long-lived process loading model after
    model keeps only the live ones' entries). Models of the same graph and library share the keys."""
    keys = node_keys(graph, prefix)
    with _lock:
        for n, key in keys.items():
            if n.op == "region":
                _guards.setdefault(key, size_guard(n))
            else:
                _kernels.setdefault(key, (KERNELS[n.op], n.attrs))
            _users[key] = _users.get(key, 0) + 1
    return list(keys.values())


def release_kernels(keys: list) -> None:
    """Undo one `register_kernels`: the entries no live model uses any more leave the tables."""
    with _lock:
        for key in keys:
            _users[key] -= 1
            if not _users[key]:
                del _users[key]
                _guards.pop(key, None)
                _kernels.pop(key, None)


def registered() -> int:
    """How many callback entries the tables hold (tests: they do not grow with models that are gone)."""
    return len(_users)


NO_VM_PROGRAM = "DYNTVM_NO_VM_PROGRAM"        # "1": models run in the executor (read when a model is made)
#: "auto" (default): the program runs a model only where it calls no Python for a dynamic-shape op (such callbacks
#: made the detection example 1.7x slower than the executor, before its topk / slice / squeeze became kernels;
#: branchy, with two region size checks called back, was 0.54x: bench_ab in the closing note of the stop that
#: added the program);
#: "always": wherever it can; "never": the executor runs every model
VM_PROGRAM = "DYNTVM_VM_PROGRAM"


def status(graph: Graph, vm, specialized: dict) -> tuple[bool, list]:
    """``(runs in the VM, lines)``: whether the library behind `vm` has the program, else why not."""
    mode = os.environ.get(VM_PROGRAM, "auto")
    if mode not in ("auto", "always", "never"):
        warnings.warn(f"${VM_PROGRAM} is {mode!r}: expected auto, always or never; using auto", stacklevel=2)
        mode = "auto"
    if os.environ.get(NO_VM_PROGRAM) == "1" or mode == "never":
        return False, [f"${NO_VM_PROGRAM} is 1" if mode != "never" else f"${VM_PROGRAM} is never"]
    if specialized:
        return False, ["a tuning log's specializations (the executor picks them by size)"]
    bad = unsupported_nodes(graph)
    if bad:
        return False, describe(bad)
    if vm is None:
        return False, ["no kernel library"]
    if not has_program(vm):
        return False, ["the library has no VM program (built without one, or the build declined it)"]
    callbacks = [n for n in python_callbacks(graph) if n.op != "region"]     # size checks are cheap (branchy: 2)
    if callbacks and mode == "auto":
        ops = sorted({n.op for n in callbacks})
        return False, [f"the program would call back into Python for {len(callbacks)} dynamic-shape ops "
                       f"({', '.join(ops)}), slower than the executor today (${VM_PROGRAM}=always runs it anyway)"]
    return True, []


def has_program(vm) -> bool:
    return has_function(vm, PROGRAM)


def has_function(vm, name: str) -> bool:
    try:
        vm[name]
        return True
    except Exception:  # noqa: BLE001 - AttributeError from the VM: not in this library
        return False


def copied_outputs(graph: Graph) -> list:
    """Per graph output, whether the program may return a tensor the model holds (a constant: directly, through
    a branch, or as a loop's final state after no step): those are copied, as the executor copies its
    constants. An input given back is not (the executor gives it back too)."""
    out = []
    for v in graph.outputs:
        p = v.producer
        if p is None:
            out.append(False)
        elif p.op == "region":
            inner = p.subgraphs[0].outputs[p.outputs.index(v)].producer
            out.append(inner is None or inner.op == "constant")
        elif p.op in ("foreach", "while_loop"):       # a final state after no step: the initial value
            out.append(p.outputs.index(v) >= p.attrs.num_outputs)
        else:
            out.append(p.op in ("constant", "cond", "case"))
    return out


_limit_fn = None                               # the `region_sizes.memory_limit` last asked
_native_guard_ok = True


def native_guard_ok() -> bool:
    """Whether the program's own size checks (`NATIVE_GUARD_BYTES`) are within this machine's memory limit, as the
    runtime's check reads it (`region_sizes.memory_limit`; asked again only when that function is replaced, as
    tests lowering the limit do: one identity test per call)."""
    global _limit_fn, _native_guard_ok
    fn = region_sizes.memory_limit
    if fn is not _limit_fn:
        _limit_fn, _native_guard_ok = fn, fn() >= NATIVE_GUARD_BYTES
    return _native_guard_ok


class ProgramRunner:
    """Calls the program of one thread's VM on checked input arrays; the executor `fallback` (a callable on the
    same arrays) runs a call the program cannot finish."""

    __slots__ = ("fn", "copy", "plain", "positions", "calls", "staging")

    def __init__(self, vm, graph: Graph):
        self.fn = vm[PROGRAM]
        self.copy = copied_outputs(graph)
        self.plain, self.positions = not any(self.copy), range(len(self.copy))
        self.calls = 0                       # program calls (tests: one per model call)
        # (one per thread, as its VM)
        self.staging = InputStaging(len(graph.inputs), has_function(vm, ELEMENT_ALIGNED_FUNCTION))

    def __call__(self, arrays: list, fallback) -> list:
        if not native_guard_ok():            # a machine with less memory than the program's checks assume
            return fallback(arrays)
        try:
            res = self.fn(*self.staging.tensors(arrays))
        except Exception as e:  # noqa: BLE001 - TVM raises many kinds: the executor names the node
            self.staging.clear()             # (the traceback may hold the input tensors)
            if FALLBACK_MARK in str(e):      # a case the program leaves to the executor (`FALLBACK_CALLBACK`)
                return fallback(arrays)
            outs = fallback(arrays)          # raises the executor's error where the call fails there too
            warnings.warn(f"dyntvm: the VM program failed ({type(e).__name__}: {str(e).strip()[:200]}) where the "
                          "executor runs the call; the result comes from the executor", RuntimeWarning, stacklevel=3)
            return outs
        self.calls += 1
        if self.plain:                       # (no output to copy: the common case, without a call per output)
            outs = [_from_dlpack(_item(res, k)) for k in self.positions]
        else:
            outs = [np.array(to_numpy(_item(res, k))) if c else to_numpy(_item(res, k))
                    for k, c in enumerate(self.copy)]
        del res                              # (the input tensors went with the call's arguments)
        self.staging.release()
        return outs
