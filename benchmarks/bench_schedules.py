"""Benchmark: unscheduled Relax CPU pipeline vs codegen.cpu_schedule vs numpy.

Run from the repository root:

    .venv/bin/python benchmarks/bench_schedules.py [--quick]
    .venv/bin/python benchmarks/bench_schedules.py --small [--rounds 7]   # the small kernels only
    .venv/bin/python benchmarks/bench_schedules.py --conv [--rounds 5]    # the convolution layers only

Prints latency (and GFLOP/s where the FLOP count is meaningful) per case: the median of 5
time_evaluator repeats, best of --rounds rounds. The machine is shared, so every round first waits
for an idle CPU (--no-wait skips that) and warms up (an idle core runs ~2x slower for ~0.2 s).
TVM cases are all timed before numpy: OpenBLAS worker threads keep spinning after a numpy
matmul and slow the next TVM parallel kernels ~50x for a few hundred ms.

A second table ("small kernels", issue 10 item 4) times dyntvm's own lowering of small kernels
(regions built from traced models) with and without each change of that item, and numpy, interleaved
in rounds (before, after, numpy; a pause after numpy), and prints medians over rounds with their
spread: the batch-1 LSTM step (before: FuseOps' four kernels, `cpu_schedule.FUSE_CONTRACTIONS`),
argmax / argmin / max / sum of a float32[N] (before: the generic reduction computes,
`converters.reduce.LANE_REDUCE`), softmax over a leading axis (before: no axis-reduction rule). "region"
is a VM call of the region (what a compiled region costs without the executor); "kernel" is the one
scheduled PrimFunc called directly. Also prints the launch cost of a trivial parallel loop. Every result
is checked against numpy first (argmax: the same index).

A third table ("convolutions", issue 24; `--conv` alone) times single conv layers of resnet18 and
mobilenet_v3_small at 224 x 224, batch 1, compiled through dyntvm's converter before (Relax's conv2d under the
generic schedule) and after (`te_conv` + `cpu_schedule_conv`), against numpy im2col + BLAS and onnxruntime
(one Conv node), medians over interleaved rounds, with GFLOP/s next to numpy's large-GEMM peak and compile times.
"""

from __future__ import annotations

import argparse
import os
import time

from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu, cpu_target  # first: sets TVM_NUM_THREADS

import numpy as np  # noqa: E402  (after the import above, on purpose)
import tvm  # noqa: E402
from tvm import relax, tirx  # noqa: E402
from tvm.relax import op as R  # noqa: E402

RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _func(bb, name, params, body_fn):
    with bb.function(name, params):
        with bb.dataflow():
            out = bb.emit_output(body_fn(*params))
        bb.emit_func_output(out)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def make_cases(quick: bool):
    """Returns [(label, module, fname, [numpy args], numpy_fn, flops)]."""
    cases = []

    for m, k, n in [(64, 256, 256), (16, 256, 1024), (256, 512, 512)]:
        bb = relax.BlockBuilder()
        a = relax.Var("a", relax.TensorType((m, k), "float32"))
        b = relax.Var("b", relax.TensorType((k, n), "float32"))
        _func(bb, "main", [a, b], R.matmul)
        args = [_rand(m, k), _rand(k, n)]
        cases.append((f"matmul {m}x{k}x{n}", bb.get(), "main", args, np.matmul, 2 * m * k * n))

    # GEMV with a symbolic M (the RNN batch) and a constant weight: one kernel for every M.
    w = _rand(256, 1024)
    bb = relax.BlockBuilder()
    mv = tirx.Var("M", "int64")
    x = relax.Var("x", relax.TensorType((mv, 256), "float32"))
    _func(bb, "main", [x], lambda x: R.matmul(x, relax.const(w, "float32")))
    gemv = bb.get()
    for m in (1, 16):
        cases.append((f"gemv Mx256x1024 M={m}", gemv, "main", [_rand(m, 256)],
                      lambda x: x @ w, 2 * m * 256 * 1024))

    # LSTM-cell-like fused region, hidden 256 (4 gates -> 1024 columns), symbolic batch.
    wx, wh, bias = _rand(256, 1024) * 0.05, _rand(256, 1024) * 0.05, _rand(1024)
    bb = relax.BlockBuilder()
    bv = tirx.Var("B", "int64")
    xx = relax.Var("x", relax.TensorType((bv, 256), "float32"))
    hh = relax.Var("h", relax.TensorType((bv, 256), "float32"))
    _func(bb, "cell", [xx, hh], lambda x, h: R.tanh(R.add(R.add(
        R.matmul(x, relax.const(wx, "float32")), R.matmul(h, relax.const(wh, "float32"))),
        relax.const(bias, "float32"))))
    cell = bb.get()
    for b in (1, 16):
        cases.append((f"lstm-cell tanh(xW+hU+b) B={b}", cell, "cell",
                      [_rand(b, 256), _rand(b, 256)],
                      lambda x, h: np.tanh(x @ wx + h @ wh + bias), 2 * b * 256 * 1024 * 2))

    # Row reductions over (n, 512), n symbolic.
    gamma, beta = _rand(512), _rand(512)
    bb = relax.BlockBuilder()
    nv = tirx.Var("n", "int64")
    y = relax.Var("y", relax.TensorType((nv, 512), "float32"))
    _func(bb, "softmax", [y], lambda y: R.nn.softmax(y, axis=-1))
    y2 = relax.Var("y", relax.TensorType((tirx.Var("n", "int64"), 512), "float32"))
    _func(bb, "layer_norm", [y2], lambda y: R.nn.layer_norm(
        y, relax.const(gamma, "float32"), relax.const(beta, "float32"), axes=[-1]))
    red = bb.get()

    def np_softmax(v):
        e = np.exp(v - v.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def np_layer_norm(v):
        mu = v.mean(-1, keepdims=True)
        return (v - mu) / np.sqrt(v.var(-1, keepdims=True) + 1e-5) * gamma + beta

    for n in ((1, 256) if quick else (1, 64, 1024)):
        cases.append((f"softmax ({n},512)", red, "softmax", [_rand(n, 512)], np_softmax, None))
        cases.append((f"layer_norm ({n},512)", red, "layer_norm", [_rand(n, 512)], np_layer_norm,
                      None))

    # A big elementwise chain with broadcasting (fused into one kernel).
    bb = relax.BlockBuilder()
    ev = relax.Var("e", relax.TensorType((tirx.Var("n", "int64"), 1024), "float32"))
    _func(bb, "main", [ev], lambda e: R.multiply(R.add(R.multiply(e, relax.const(bias, "float32")),
                                                       relax.const(1.0, "float32")),
                                                 R.maximum(e, relax.const(0.0, "float32"))))
    ew = bb.get()
    for n in (1, 1024):
        cases.append((f"elementwise (x*b+1)*relu(x) ({n},1024)", ew, "main", [_rand(n, 1024)],
                      lambda e: (e * bias + 1.0) * np.maximum(e, 0.0), None))
    return cases


def _cpu_idle_fraction(interval=0.5):
    def read():
        with open("/proc/stat", encoding="ascii") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        return vals[3] + vals[4], sum(vals)  # idle + iowait, total
    idle0, total0 = read()
    time.sleep(interval)
    idle1, total1 = read()
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_idle(max_wait=600.0, need=0.9):
    """Blocks until the machine is ~idle (other processes skew every number on 2 cores)."""
    t0 = time.time()
    while time.time() - t0 < max_wait:
        if _cpu_idle_fraction() >= need:
            return True
        time.sleep(2.0)
    print(f"warning: machine still busy after {max_wait:.0f} s; timings are unreliable")
    return False


def time_vm(vm, fname, args, budget=0.25):
    """Median seconds per call via the VM's C++ time_evaluator, after a 0.3 s warm-up."""
    f = vm[fname]
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.3 or calls < 2:
        f(*args)
        calls += 1
    number = max(1, int(budget / 5 / ((time.perf_counter() - t0) / calls)))
    res = vm.time_evaluator(fname, tvm.cpu(), number=number, repeat=5)(*args)
    return float(np.median(res.results))


def time_np(fn, args, budget=0.25):
    t0, calls = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.1 or calls < 2:
        fn(*args)
        calls += 1
    number = max(1, int(budget / 5 / ((time.perf_counter() - t0) / calls)))
    res = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(number):
            fn(*args)
        res.append((time.perf_counter() - t0) / number)
    return float(np.median(res))


# ------------------------------------------------------------------------------------- small kernels
def _region(fn, *specs):
    """(Relax module, region function name) of dyntvm's lowering of a one-region model."""
    import dyntvm as dt
    from dyntvm.codegen.build import collect_regions
    from dyntvm.codegen.relax_builder import build_module
    from dyntvm.pipeline import partition_graph
    regions = collect_regions(partition_graph(dt.trace(fn, *specs)))
    assert len(regions) == 1, [r[0] for r in regions]
    return build_module(regions), regions[0][0]


def _kernel_of(mod, target, prefix, shapes):
    """The scheduled PrimFunc named `prefix`* of `mod`'s CPU build, compiled alone, and its arguments
    (`shapes`: one per parameter, random data)."""
    from dyntvm.codegen.backends.cpu.cpu_schedule import legalize_and_fuse, schedule_module
    sched = schedule_module(legalize_and_fuse(target)(mod), target)
    (func,) = [f for gv, f in sched.functions_items() if gv.name_hint.startswith(prefix)]
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    args = [tvm.runtime.tensor(np.zeros(sh, str(p.dtype)) if "int" in str(p.dtype) else _rand(*sh))
            for p, sh in zip(func.params, shapes)]
    return lib.mod, args


def small_cases(quick: bool):
    """[(label, make(before: bool) -> (mod, fname), numpy args, numpy fn, kernel prefix, kernel shapes,
    switch)] for the small-kernel table. `switch(before)` sets the module flags of the "before" build."""
    from dyntvm import F
    from dyntvm import TensorSpec as S
    from dyntvm.codegen.backends.cpu import cpu_schedule as cs
    from dyntvm.codegen.converters import reduce as red
    from dyntvm.examples.lstm import EXAMPLE, U, W, b
    cases = []

    def lstm_np(x, h, c):
        z = x @ W + h @ U + b
        i, f, g, o = np.split(z, 4, axis=-1)
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        c = sig(f) * c + sig(i) * np.tanh(g)
        return c, sig(o) * np.tanh(c)

    def fuse(before):
        cs.FUSE_CONTRACTIONS = not before
    for bsz in ((1, 16) if quick else (1, 2, 16)):
        args = [_rand(bsz, 128), _rand(bsz, 256), _rand(bsz, 256)]
        cases.append((f"lstm step B={bsz} (x@W + h@U + b, gates)", lambda: _region(EXAMPLE.fn, *EXAMPLE.specs),
                      args, lstm_np, "fused_contraction",
                      [(bsz, 256), (256, 1024), (bsz, 128), (128, 1024), (1024,), (bsz, 256), (bsz, 256),
                       (bsz, 256)], fuse))

    def lanes(before):
        red.LANE_REDUCE = not before
    reductions = (("argmax", F.argmax), ("argmin", F.argmin), ("max", F.max), ("sum", F.sum))
    for n in ((1000, 1 << 20) if quick else (1000, 65536, 1 << 20)):
        for name, fn in reductions:     # numpy: the method (a.argmax()), its fastest call
            cases.append((f"{name} float32[{n}]", lambda fn=fn: _region(fn, S(("N",))), [_rand(n)],
                          lambda a, name=name: getattr(a, name)(), f"dt_lanes_{name}", [(n,), ()], lanes))

    saved = cs._reduced_axis

    def axis_rule(before):
        cs._reduced_axis = (lambda sch: None) if before else saved
    for shape, axis in (((1024, 64), 0), ((8, 512, 64), 1)):
        spec = S(("N",) + shape[1:]) if axis == 0 else S((shape[0], "N", shape[2]))

        def np_softmax(v, axis=axis):
            e = np.exp(v - v.max(axis, keepdims=True))
            return e / e.sum(axis, keepdims=True)
        cases.append((f"softmax {shape} axis={axis}", lambda spec=spec, axis=axis: _region(
            lambda x: F.softmax(x, axis=axis), spec), [_rand(*shape)], np_softmax, None, None, axis_rule))
    return cases


def _same(out, ref) -> bool:
    outs = out if isinstance(ref, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    return all(np.asarray(o).shape == np.shape(r) and (np.array_equal(o, r) if np.asarray(r).dtype.kind in "iu"
               else np.allclose(o, r, rtol=1e-4, atol=1e-3)) for o, r in zip(outs, refs))


def launch_cost(target, rounds: int) -> tuple[float, float]:
    """Median us per call of a kernel adding 1 to a (2, 16) array: serial, and with its 2-row loop parallel."""
    from tvm import te
    from tvm.s_tir import Schedule
    a = te.placeholder((2, 16), "float32", name="a")
    out = te.compute((2, 16), lambda i, j: a[i, j] + 1.0, name="out")
    func = te.create_prim_func([a, out]).with_attr("global_symbol", "main")
    times = []
    for parallel in (False, True):
        sch = Schedule(func)
        i, j = sch.get_loops(sch.get_sblock("out"))
        if parallel:
            sch.parallel(i)
        sch.vectorize(j)
        lib = tvm.compile(sch.mod, target=target).mod
        args = [tvm.runtime.tensor(np.zeros((2, 16), "float32")) for _ in range(2)]
        fe = lib.time_evaluator("main", tvm.cpu(), number=5000, repeat=rounds)
        times.append(float(np.median(fe(*args).results)) * 1e6)
    return times[0], times[1]


def run_small(opts, target):
    """The small-kernel table (module doc)."""
    dev = tvm.cpu()
    print("\nsmall kernels (issue 10 item 4): medians over rounds [min-max]; before = without the change")
    ser, par = launch_cost(target, max(3, opts.rounds))
    print(f"launch cost of a trivial loop: serial {ser:.2f} us, parallel (2 threads) {par:.2f} us")
    rows = []
    for label, make, args, np_fn, prefix, kshapes, switch in small_cases(opts.quick):
        built = {}
        for before in (True, False):
            switch(before)
            mod, fname = make()
            vm = relax.VirtualMachine(build_cpu(mod, target), dev)
            kernel = _kernel_of(mod, target, prefix, kshapes) if prefix and not before else None
            built[before] = (vm, fname, kernel)
        switch(False)
        targs = [tvm.runtime.tensor(a) for a in args]
        ref = np_fn(*args)
        ok = True
        for vm, fname, _ in built.values():
            out = vm[fname](*targs)
            got = tuple(o.numpy() for o in out)
            ok = ok and _same(got if len(got) > 1 else got[0], ref)
        times = {"before": [], "after": [], "kernel": [], "numpy": []}
        for r in range(opts.rounds):
            if not opts.no_wait:
                wait_idle()
            order = (True, False) if r % 2 == 0 else (False, True)
            for before in order:
                vm, fname, _ = built[before]
                times["before" if before else "after"].append(time_vm(vm, fname, targs, 0.1))
            kernel = built[False][2]
            if kernel is not None:
                lib, kargs = kernel
                fe = lib.time_evaluator("main", dev, number=max(10, int(2e5 // max(1, args[0].size))), repeat=5)
                times["kernel"].append(float(np.median(fe(*kargs).results)))
            times["numpy"].append(time_np(np_fn, args, 0.1))
            time.sleep(0.5)     # OpenBLAS threads spin after numpy's matmul
        rows.append((label, times, ok))

    def fmt(v):
        if not v:
            return f"{'-':>22s}"
        v = np.array(v) * 1e6
        return f"{np.median(v):9.2f} [{v.min():.2f}-{v.max():.2f}]".rjust(22)
    print(f"{'case':42s} {'before region us':>22s} {'after region us':>22s} {'after kernel us':>22s} "
          f"{'numpy us':>22s} {'before/after':>12s} {'numpy/after':>11s} {'np/kernel':>9s}  ok")
    for label, t, ok in rows:
        b, a, n = (float(np.median(t[k])) for k in ("before", "after", "numpy"))
        k = float(np.median(t["kernel"])) if t["kernel"] else None
        print(f"{label:42s} {fmt(t['before'])} {fmt(t['after'])} {fmt(t['kernel'])} {fmt(t['numpy'])} "
              f"{b / a:12.2f} {n / a:11.2f} {(n / k if k else float('nan')):9.2f}  {'ok' if ok else 'MISMATCH'}")


# ----------------------------------------------------------------------------------------- convolutions
# (label, C, O, kernel, stride, pad, groups, H = W of the input): single layers of resnet18 and mobilenet_v3_small
# at 224 x 224, batch 1
CONV_LAYERS = [
    ("resnet18 stem 7x7/2 3->64", 3, 64, 7, 2, 3, 1, 224),
    ("resnet18 3x3 64->64 @56", 64, 64, 3, 1, 1, 1, 56),
    ("resnet18 3x3/2 64->128 @56", 64, 128, 3, 2, 1, 1, 56),
    ("resnet18 1x1/2 64->128 @56", 64, 128, 1, 2, 0, 1, 56),
    ("resnet18 3x3 128->128 @28", 128, 128, 3, 1, 1, 1, 28),
    ("resnet18 3x3 256->256 @14", 256, 256, 3, 1, 1, 1, 14),
    ("resnet18 3x3 512->512 @7", 512, 512, 3, 1, 1, 1, 7),
    ("mobilenet stem 3x3/2 3->16", 3, 16, 3, 2, 1, 1, 224),
    ("mobilenet dw 3x3/2 16 @112", 16, 16, 3, 2, 1, 16, 112),
    ("mobilenet 1x1 24->88 @28", 24, 88, 1, 1, 0, 1, 28),
    ("mobilenet dw 5x5 240 @14", 240, 240, 5, 1, 2, 240, 14),
    ("mobilenet 1x1 96->576 @7", 96, 576, 1, 1, 0, 1, 7),
]


def _im2col_conv(w, stride, pad):
    """numpy's convolution as a numpy user writes it: im2col (a strided window view) + one BLAS GEMM (groups: a
    loop of them)."""
    o, cg, k, _ = w.shape

    def conv(x):
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        cols = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
        n, c, ho, wo = cols.shape[:4]
        groups = c // cg
        og = o // groups
        outs = [np.tensordot(w[g * og:(g + 1) * og], cols[:, g * cg:(g + 1) * cg], axes=([1, 2, 3], [1, 4, 5]))
                for g in range(groups)]
        return np.concatenate(outs, 0).transpose(1, 0, 2, 3)
    return conv


def _ort_conv(w, stride, pad, groups, shape):
    """An onnxruntime session of one Conv node (None without onnxruntime)."""
    try:
        import onnx
        import onnxruntime as ort
    except ImportError:
        return None
    from onnx import TensorProto, helper, numpy_helper
    o = w.shape[0]
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride] * 2, pads=[pad] * 4, group=groups)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = tvm.runtime.num_threads()
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    del onnx
    return lambda x: sess.run(None, {"x": x})[0]


def run_conv(opts, target):
    """Single conv layers (CONV_LAYERS): dyntvm's conv kernel before (Relax's conv2d under the generic schedule,
    `converters.window.TE_CONV = False`) and after, numpy im2col + BLAS, onnxruntime; medians over rounds,
    interleaved; GFLOP/s against numpy's large-GEMM peak."""
    import dyntvm as dt
    from dyntvm import F
    from dyntvm.codegen.converters import window
    dev = tvm.cpu()
    big = _rand(2048, 2048)
    peak = min(time_np(np.matmul, [big, big], 1.0) for _ in range(3))
    print(f"\nconvolutions, batch 1 (numpy GEMM 2048^3 peak: {2 * 2048 ** 3 / peak / 1e9:.0f} GFLOP/s)")
    layers = CONV_LAYERS[:4] if opts.quick else CONV_LAYERS
    print(f"{'layer':30s} {'compile s b/a':>13s} {'before ms':>10s} {'after ms':>9s} {'GF/s':>6s} {'%peak':>6s} "
          f"{'numpy ms':>9s} {'ort ms':>8s} {'b/a':>6s} {'np/a':>6s} {'ort/a':>6s}  ok")
    for label, c, o, k, stride, pad, groups, hw in layers:
        w = (_rand(o, c // groups, k, k) / np.sqrt(c // groups * k * k)).astype("float32")
        x = _rand(1, c, hw, hw)
        built, compile_s = {}, {}
        for before in (True, False):
            window.TE_CONV = not before
            mod, fname = _region(lambda v: F.conv(v, w, stride=stride, padding=pad, groups=groups), dt.TensorSpec(x.shape))
            t0 = time.perf_counter()
            built[before] = (relax.VirtualMachine(build_cpu(mod, target), dev), fname)
            compile_s[before] = time.perf_counter() - t0
        window.TE_CONV = True
        numpy_fn, ort_fn = _im2col_conv(w, stride, pad), _ort_conv(w, stride, pad, groups, list(x.shape))
        ref = numpy_fn(x)
        targs = [tvm.runtime.tensor(x)]
        outs = [vm[fn](*targs) for vm, fn in built.values()]
        ok = all(np.allclose((out if hasattr(out, "numpy") else out[0]).numpy(), ref, rtol=1e-3, atol=1e-3)
                 for out in outs)
        times: dict = {"before": [], "after": [], "numpy": [], "ort": []}
        for _ in range(opts.rounds):
            if not opts.no_wait:
                wait_idle()
            for before in (True, False):
                vm, fn = built[before]
                times["before" if before else "after"].append(time_vm(vm, fn, targs, 0.1))
            times["numpy"].append(time_np(numpy_fn, [x], 0.1))
            if ort_fn is not None:
                times["ort"].append(time_np(ort_fn, [x], 0.1))
            time.sleep(0.3)
        med = {key: float(np.median(v)) if v else float("nan") for key, v in times.items()}
        flops = 2 * o * (c // groups) * k * k * ((hw + 2 * pad - k) // stride + 1) ** 2
        gf = flops / med["after"] / 1e9
        print(f"{label:30s} {compile_s[True]:6.2f}/{compile_s[False]:<6.2f} {med['before'] * 1e3:10.3f} "
              f"{med['after'] * 1e3:9.3f} {gf:6.1f} {100 * gf / (2 * 2048 ** 3 / peak / 1e9):5.0f}% "
              f"{med['numpy'] * 1e3:9.3f} {med['ort'] * 1e3:8.3f} {med['before'] / med['after']:6.2f} "
              f"{med['numpy'] / med['after']:6.2f} {med['ort'] / med['after']:6.2f}  {'ok' if ok else 'MISMATCH'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter timing")
    parser.add_argument("--no-wait", action="store_true",
                        help="do not wait for an idle machine before each measurement")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many rounds")
    parser.add_argument("--small", action="store_true", help="only the small-kernel table")
    parser.add_argument("--conv", action="store_true", help="only the convolution table")
    opts = parser.parse_args()
    if opts.conv:
        target = cpu_target()
        print(f"target: {target}\nTVM threads: {tvm.runtime.num_threads()}  numpy: {np.__version__}  "
              f"load average: {os.getloadavg()[0]:.2f}")
        return run_conv(opts, target)
    if opts.small:
        target = cpu_target()
        print(f"target: {target}\nTVM threads: {tvm.runtime.num_threads()}  numpy: {np.__version__}  "
              f"load average: {os.getloadavg()[0]:.2f}")
        return run_small(opts, target)
    budget = 0.1 if opts.quick else 0.25
    target = cpu_target()
    dev = tvm.cpu()
    print(f"target: {target}")
    print(f"TVM threads: {tvm.runtime.num_threads()}  numpy: {np.__version__}  "
          f"load average: {os.getloadavg()[0]:.2f} (numbers are only meaningful near 0)")

    cases = make_cases(opts.quick)
    refs = [np_fn(*args) for _, _, _, args, np_fn, _ in cases]  # numpy first: see module doc
    time.sleep(1.0)
    built: dict[int, tuple] = {}
    results = []
    for (label, mod, fname, args, _, flops), ref in zip(cases, refs):
        if id(mod) not in built:
            t0 = time.perf_counter()
            base_ex = tvm.compile(mod, target=target,
                                  relax_pipeline=relax.get_default_pipeline(target))
            t1 = time.perf_counter()
            ours_ex = build_cpu(mod, target)
            t2 = time.perf_counter()
            built[id(mod)] = (relax.VirtualMachine(base_ex, dev),
                              relax.VirtualMachine(ours_ex, dev), t1 - t0, t2 - t1)
        base_vm, ours_vm, _, _ = built[id(mod)]
        targs = [tvm.runtime.tensor(a, dev) for a in args]
        out = ours_vm[fname](*targs).numpy()
        ok = np.allclose(out, ref, rtol=1e-4, atol=1e-4)
        t_base = t_ours = float("inf")
        for _ in range(opts.rounds):
            if not opts.no_wait:
                wait_idle()
            t_base = min(t_base, time_vm(base_vm, fname, targs, budget))
            t_ours = min(t_ours, time_vm(ours_vm, fname, targs, budget))
        results.append([label, flops, t_base, t_ours, None, ok])
    time.sleep(1.0)  # let TVM's spinning workers go idle before OpenBLAS runs
    for row, (_, _, _, args, np_fn, _) in zip(results, cases):
        row[4] = float("inf")
        for _ in range(opts.rounds):
            if not opts.no_wait:
                wait_idle()
            row[4] = min(row[4], time_np(np_fn, args, budget))

    def fmt(t, flops):
        s = f"{t * 1e6:10.1f}"
        return s + (f" {flops / t / 1e9:7.1f}" if flops else " " * 8)

    print()
    print(f"{'case':40s} {'default us':>10s} {'GF/s':>7s} {'ours us':>10s} {'GF/s':>7s} "
          f"{'numpy us':>10s} {'GF/s':>7s} {'ours/np':>8s}  ok")
    for label, flops, t_base, t_ours, t_np, ok in results:
        print(f"{label:40s} {fmt(t_base, flops)} {fmt(t_ours, flops)} {fmt(t_np, flops)} "
              f"{t_np / t_ours:8.2f}  {'ok' if ok else 'MISMATCH'}")
    print()
    print("build seconds (default / ours):",
          ", ".join(f"{b:.2f}/{o:.2f}" for _, _, b, o in built.values()))
    run_small(opts, target)
    run_conv(opts, target)


if __name__ == "__main__":
    main()
