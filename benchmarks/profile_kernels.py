"""Per-kernel profile of a compiled model: every PrimFunc call inside the compiled regions, with its calls per
model call, total microseconds, share of the kernels' time, GFLOP/s (where TIR's FLOP estimate can count the
kernel at the call's sizes) and whether a CPU schedule rule handled it ("unscheduled": Relax's default loop nest).

    .venv/bin/python benchmarks/profile_kernels.py --example lstm [--sizes T=64,B=16]
    .venv/bin/python benchmarks/profile_kernels.py --onnx model.onnx --shape x=1,3,224,224
    .venv/bin/python benchmarks/profile_kernels.py --torchvision mobilenet_v3_small [--batch 8]
                                                  [--rounds 5] [--top 20] [--threads 1]

How: the model is compiled without the compile cache, with the CPU schedule pass observed (the fused PrimFuncs
before scheduling: their FLOPs, and which ones no rule scheduled). Then each call runs through the Relax VM's
instrument hook (`VirtualMachine.set_instrument`, before every Call instruction): a kernel is timed alone, by
calling it with the call's own arguments, and the VM then skips its own call (the result is the same). So the
figures exclude the VM's own work (allocation, shape checks) and the executor's; `--rounds` model calls are made
and each kernel's median time per call is reported. A compiled loop (`compiled_loops`) is one kernel here, its
body's kernels inside it, without a FLOP count. The TVM runtime's own profiler is not in this TVM build. With
`--threads 1` each kernel's time is the thread's CPU time (other processes on a busy machine do not count in it).
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    from thread_env import threads_from_argv     # the script's folder is on sys.path
    threads_from_argv(sys.argv, os.cpu_count() or 1)

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

SKIP_RUN = 1      # tvm.runtime.vm.VMInstrumentReturnKind.SKIP_RUN: the VM does not make the call itself
MODEL_CALL: list = []   # [median seconds of a plain model call], set by `profile_model`
#: The clock of each kernel's time: with one thread (`--threads 1`: TVM runs a parallel loop in the calling thread)
#: the thread's CPU time, which other processes' slices on a busy machine do not inflate; else the wall time.
CLOCK = [time.perf_counter]
SKIPPED: dict = {}   # kernel -> calls not made while profiling (`profile_model`)


@dataclass
class KernelStats:
    name: str
    calls: int = 0                              # over all rounds
    times: list = field(default_factory=list)   # seconds, one per call
    flops: float = 0.0                          # summed over the calls that could be counted
    counted: int = 0                            # calls whose FLOPs were counted
    unscheduled: bool = False
    shapes: tuple = ()                          # the argument shapes of its first call


class Observed:
    """The fused PrimFuncs as the CPU schedule pass saw them: name -> PrimFunc, and the names it left
    unscheduled. A context manager wrapping `cpu_schedule.schedule_module` / `_schedule_func`."""

    def __init__(self):
        self.funcs: dict = {}
        self.unscheduled: set = set()

    def __enter__(self):
        from dyntvm.codegen.backends.cpu import cpu_schedule
        self._mod, self._saved = cpu_schedule, (cpu_schedule.schedule_module, cpu_schedule._schedule_func)
        schedule_module, schedule_func = self._saved
        from tvm import tirx

        def observe_module(mod, target, tuned=None):
            for gvar, func in mod.functions_items():
                if isinstance(func, tirx.PrimFunc):
                    self.funcs[gvar.name_hint] = func
            return schedule_module(mod, target, tuned)

        def observe_func(func, target, name=""):
            new = schedule_func(func, target, name)
            if new is func:
                self.unscheduled.add(name)
            return new
        cpu_schedule.schedule_module, cpu_schedule._schedule_func = observe_module, observe_func
        return self

    def __exit__(self, *exc):
        self._mod.schedule_module, self._mod._schedule_func = self._saved


def call_flops(func, args) -> float | None:
    """The arithmetic of `func` (unscheduled) at the sizes of `args` (its symbolic dims bound from the
    arguments' shapes): per block, TIR's FLOP estimate of one iteration (`estimate_tir_flops`) times its
    iteration count. None where a block's count is not a number at these sizes (a data-dependent bound)."""
    import tvm
    import tvm_ffi
    from tvm import tirx
    from tvm.s_tir import SBlock
    from tvm.s_tir.analysis import estimate_tir_flops
    ana = tvm.sym.Analyzer()
    for param, arg in zip(func.params, args):
        if isinstance(arg, int):        # a symbolic dim passed as a scalar parameter
            ana.bind(param, arg)
            continue
        shape = getattr(arg, "shape", None)
        dims = getattr(param, "shape", None)
        if shape is None or dims is None or len(dims) != len(shape):
            continue
        for dim, size in zip(dims, shape):
            if isinstance(dim, tirx.Var):
                ana.bind(dim, int(size))
    blocks: list = []
    tvm_ffi.structural_walk(func.body, (SBlock, blocks.append))
    total = 0.0
    for block in blocks:
        count = 1
        for iv in block.iter_vars:
            ext = ana.simplify(iv.dom.extent)
            if not isinstance(ext, tirx.IntImm):
                return None
            count *= int(ext.value)
        if block.iter_vars:
            try:
                total += count * float(estimate_tir_flops(block.body))
            except Exception:  # pylint: disable=broad-except  # e.g. 'Do not have a default for prim.Let' (a Let in the block)
                return None
    return total


def is_kernel(func, symbol: str, observed: Observed) -> bool:
    """Whether a VM call is a kernel: a fused PrimFunc the schedule pass saw, or another compiled function
    (a compiled loop's kernel, `compiled_loops`: added after scheduling, so its FLOPs are not counted);
    not the VM's builtins, Relax functions (closures), shape functions or dyntvm's callbacks."""
    if symbol in observed.funcs:
        return True
    helpers = ("vm.", "dyntvm.", "shape_func", "compute_symbolic_expr")
    return type(func).__name__ != "Closure" and not symbol.startswith(helpers) and "." not in symbol


def profile_model(model, args: tuple, observed: Observed, rounds: int = 5) -> dict:
    """name -> KernelStats of the PrimFunc calls of `rounds` calls of `model(*args)` (one warm-up call first)."""
    model(*args)
    walls = []
    for _ in range(rounds):     # the plain call, for the time outside the kernels
        t0 = time.perf_counter()
        model(*args)
        walls.append(time.perf_counter() - t0)
    MODEL_CALL[:] = [statistics.median(walls)]
    ex = model._thread_executor()
    vm = ex.vm
    stats: dict = {}
    flop_cache: dict = {}
    skipped = SKIPPED

    def instrument(func, symbol, before, _ret, *call_args):
        symbol = str(symbol)
        if not before or not is_kernel(func, symbol, observed):
            return 0
        if any(a is None for a in call_args):
            # a scalar argument the hook receives as None (TVM's instrument loses some int registers), and the
            # VM's own call after the hook then fails too: skipped (a run-time size check), and counted
            skipped[symbol] = skipped.get(symbol, 0) + 1
            return SKIP_RUN
        clock = CLOCK[0]
        t0 = clock()
        func(*call_args)
        dt = clock() - t0
        st = stats.get(symbol)
        if st is None:
            st = stats[symbol] = KernelStats(symbol, unscheduled=symbol in observed.unscheduled, shapes=tuple(
                tuple(a.shape) if hasattr(a, "shape") else a for a in call_args))
        st.calls += 1
        st.times.append(dt)
        key = (symbol, tuple(tuple(a.shape) for a in call_args if hasattr(a, "shape")))
        if key not in flop_cache and symbol in observed.funcs:
            flop_cache[key] = call_flops(observed.funcs[symbol], call_args)
        if flop_cache.get(key) is not None:
            st.flops += flop_cache[key]
            st.counted += 1
        return SKIP_RUN
    vm.set_instrument(instrument)
    try:
        for _ in range(rounds):
            model(*args)
    finally:
        vm.set_instrument(None)
    for st in stats.values():
        st.calls //= rounds
    return stats


def report(stats: dict, rounds: int, top: int | None = None) -> list:
    """Rows (name, calls per model call, total us per model call, share, GFLOP/s or None, unscheduled, argument
    shapes of the first call), slowest first. A kernel's total: its median call time x its calls."""
    rows = []
    for st in stats.values():
        per_call = statistics.median(st.times)
        total = per_call * st.calls
        gflops = (st.flops / st.counted) / per_call / 1e9 if st.counted and per_call > 0 else None
        rows.append([st.name, st.calls, total * 1e6, 0.0, gflops, st.unscheduled, st.shapes])
    whole = sum(r[2] for r in rows) or 1.0
    for r in rows:
        r[3] = r[2] / whole
    rows.sort(key=lambda r: -r[2])
    return rows[:top] if top else rows


def print_report(rows: list, all_rows: list, shapes: bool = False) -> None:
    total = sum(r[2] for r in all_rows)
    print(f"{'kernel':60s} {'calls':>5s} {'total us':>9s} {'share':>6s} {'GFLOP/s':>8s}")
    for name, calls, us, share, gflops, unsched, args in rows:
        g = f"{gflops:8.2f}" if gflops is not None else f"{'-':>8s}"
        print(f"{name[:60]:60s} {calls:5d} {us:9.1f} {share:6.1%} {g}{'  unscheduled' if unsched else ''}")
        if shapes:
            print("    " + " ".join("x".join(map(str, a)) if isinstance(a, tuple) else str(a) for a in args))
    print(f"{len(all_rows)} kernels, {sum(r[1] for r in all_rows)} calls, {total:.1f} us per model call"
          + (f" (a plain model call: {MODEL_CALL[0] * 1e6:.1f} us)" if MODEL_CALL else ""))
    if SKIPPED:
        print("not run while profiling (a scalar argument the VM's hook loses): " +
              ", ".join(f"{k} x{v}" for k, v in SKIPPED.items()))


def _sizes(text: str) -> dict:
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))} if text else {}


def load_model(args, tmp: str):
    """(graph, inputs) of the command line's model."""
    import dyntvm as dt
    rng = np.random.default_rng(0)
    if args.example:
        from dyntvm import examples
        ex = examples.get(args.example)
        sizes = {**ex.sizes, **_sizes(args.sizes)}
        return dt.trace(ex.fn, *ex.specs), tuple(ex.make_inputs(rng, **sizes))
    path = args.onnx
    if args.torchvision:
        from bench_conv_models import export
        path, _ = export(args.torchvision, tmp)      # (the ONNX path, the torch model)
        shapes = {"x": (args.batch, 3, 224, 224)}
    else:
        shapes = {k: tuple(int(d) for d in v.split(",")) for k, v in (s.split("=") for s in args.shape)}
    graph = dt.from_onnx(path)
    inputs = tuple(rng.standard_normal(shapes[v.name]).astype(v.type.dtype) for v in graph.inputs)
    return graph, inputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--example", help="a bundled example (dyntvm.examples.NAMES)")
    what.add_argument("--onnx", help="an ONNX file (with --shape per input)")
    what.add_argument("--torchvision", help="a torchvision model exported to ONNX (symbolic B, H, W), 224x224")
    parser.add_argument("--sizes", default="", help="the example's sizes, e.g. T=64,B=16")
    parser.add_argument("--shape", action="append", default=[], help="NAME=D0,D1,... per ONNX input")
    parser.add_argument("--batch", type=int, default=1, help="--torchvision's batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--shapes", action="store_true", help="also each kernel's argument shapes (first call)")
    args = parser.parse_args(argv)
    CLOCK[:] = [time.thread_time if args.threads == 1 else time.perf_counter]
    import dyntvm as dt
    with tempfile.TemporaryDirectory() as tmp:
        graph, inputs = load_model(args, tmp)
        with Observed() as observed:
            model = dt.compile(graph, use_cache=False)
        rows = report(profile_model(model, inputs, observed, args.rounds), args.rounds)
    print_report(rows[:args.top], rows, args.shapes)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    sys.exit(main())
