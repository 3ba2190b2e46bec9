"""Device loops on a GPU (benchmarks/gpu_host.sh stage `loops`): for the loop workloads of bench_peers --gpu (LSTM
rows, greedy decode, the decoder example), compiled for CUDA: which loops run as a device loop, and per call
the region calls from Python, the host<->device copies and the median time, with the device loops and with
them switched off (the step-by-step loop, a region call per step). `python3 -P benchmarks/gpu_loops.py [N] [--cpu]`
(N calls per measurement, default 50; --cpu: the CPU's device path instead, to check this script without a
GPU: its times mean nothing)."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _loops(model) -> str:
    from dyntvm.ir.compiled_loop import compiled_loop_name, foreach_loop_plan, while_loop_plan
    found = []
    for n in model.graph.walk():
        if n.op in ("foreach", "while_loop"):
            plan = foreach_loop_plan(n) if n.op == "foreach" else while_loop_plan(n)
            if plan is None:
                found.append(f"{n.op}: not eligible")
                continue
            try:
                model.vm[compiled_loop_name(plan[0].attrs.name, device=True)]
                found.append(f"{n.op}: device loop")
            except Exception:  # noqa: BLE001 - declined by codegen
                found.append(f"{n.op}: declined")
    return ", ".join(found) or "no loop"


def _measure(model, args, calls: int) -> tuple:
    """(median ms, region calls per call, host->device and device->host copies per call)."""
    model(*args)
    c0, k0 = dict(model.device_copies), model.kernel_calls
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        model(*args)
        times.append(time.perf_counter() - t0)
    c1 = model.device_copies
    per = lambda key: (c1[key] - c0.get(key, 0)) / calls      # noqa: E731
    return (1e3 * float(np.median(times)), (model.kernel_calls - k0) / calls, per("host_to_device"),
            per("device_to_host"))


def main(argv) -> int:
    import dyntvm as dt
    from dyntvm.codegen import compiled_loops
    from dyntvm.runtime import loop_calls
    from peers import BuildContext, all_workloads
    cpu = "--cpu" in argv
    argv = [a for a in argv if a != "--cpu"]
    calls = int(argv[1]) if len(argv) > 1 else 50
    wanted = ("lstm_", "decode_", "ex_decoder_")
    system = "dyntvm" if cpu else "dyntvm_cuda"
    if cpu:
        import tvm

        from dyntvm.codegen.backends.cpu import DEVICE_LOOPS_ON_CPU
        os.environ[DEVICE_LOOPS_ON_CPU] = "1"
    rows = []
    for w in all_workloads(gpu=True):
        if not w.key.startswith(wanted) or system not in w.builders:
            continue
        try:
            prepared = w.builders[system](BuildContext())
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{w.label}: build failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        model = prepared.keep
        if cpu:
            model._use_device_path(tvm.cpu())
        want = w.reference()
        got = prepared.fn(*prepared.args)
        ok = all(np.allclose(np.asarray(g), np.asarray(r), rtol=1e-3, atol=1e-3) for g, r in zip(got, want))
        on = _measure(model, prepared.args, calls)
        real = loop_calls._loop_function
        loop_calls._loop_function = lambda ex, plan: None       # the step-by-step loop, for comparison
        try:
            model._threads.executor = None
            off = _measure(model, prepared.args, calls)
        finally:
            loop_calls._loop_function = real
            model._threads.executor = None
        rows.append((w.label, _loops(model), ok, on, off))
        print(f"{w.label}: {_loops(model)}; matches numpy: {ok}\n"
              f"  device loops: {on[0]:8.3f} ms, {on[1]:5.1f} region calls, copies in {on[2]:.1f} out {on[3]:.1f}\n"
              f"  step by step: {off[0]:8.3f} ms, {off[1]:5.1f} region calls, copies in {off[2]:.1f} out {off[3]:.1f}",
              flush=True)
    print("declined:", compiled_loops.stats.declined or "none in this process (CUDA builds in a child report "
          "nothing here)")
    print("\n| workload | loops | ms device loops | ms step by step | region calls | copies in / out |")
    print("|---|---|---:|---:|---:|---:|")
    for name, loops, ok, on, off in rows:
        print(f"| {name}{'' if ok else ' (MISMATCH)'} | {loops} | {on[0]:.3f} | {off[0]:.3f} | {on[1]:.0f} / "
              f"{off[1]:.0f} | {on[2]:.0f} / {on[3]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
