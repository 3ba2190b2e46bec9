"""The `dyntvm` command line: compile, tune, run, inspect, demo, bundle.

    dyntvm compile my_model.py:model --input xs:T,B,128:float32 -o m.dtvm
    dyntvm tune my_model.py:model --input xs:T,B,128:float32 --hint T=16,64 --hint B=1,16 --trials 64
    dyntvm run m.dtvm --input xs=xs.npy --repeat 20 --output out/
    dyntvm inspect m.dtvm --svg m.svg
    dyntvm demo --example decoder

Errors print one line, ``dyntvm <command>: error: ...``, and exit with status 1 (2 for bad usage);
``-v`` shows the traceback instead. Heavy imports happen inside the commands, so ``dyntvm run`` loads
only the runtime.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

EXAMPLES = "lstm | decoder | detection | branchy | transformer"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (`dyntvm run: error: ... (see dyntvm run --help)`), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _target(text: str) -> str:
    """A target string of `codegen.backends`: cpu, cuda or cuda:sm_XX (the CUDA arch to build device code for).
    Not checked in a runtime-only install (no compiler: `_check_full_install` then refuses the command)."""
    import importlib.util
    if importlib.util.find_spec("dyntvm.codegen") is None:
        return text
    from .codegen.backends import resolve, target_forms
    from .errors import CompileError
    try:
        resolve(text)
    except CompileError:
        raise argparse.ArgumentTypeError(f"expected {target_forms()} (e.g. cuda:sm_80), got {text!r}") from None
    return text


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 0.01 else f"{seconds * 1e3:.1f} ms"


def _leaves(tree) -> list:
    import numpy as np

    from dyntvm.ir.tree import tree_flatten
    return [np.asarray(x) for x in tree_flatten(tree)[0]]


def _type_str(a) -> str:
    return f"{a.dtype}[{','.join(str(s) for s in a.shape)}]"


def _signature_type(entry: dict) -> str:
    """A type of an artifact's signature (`runtime.artifact.signature`): float32[T,B,8], or a list's
    list[float32[?,8] x length]."""
    def tensor(t):
        return f"{t.get('dtype')}[{','.join(map(str, t.get('shape', [])))}]"
    if "list" in entry:
        return f"list[{tensor(entry['list'])} x {entry.get('length')}]"
    return tensor(entry)


def _value_str(a) -> str:
    """An array's type, or a list value's length and element types."""
    import numpy as np
    if isinstance(a, list):
        return f"list of {len(a)}" + "".join(f"{', ' if k else ': '}{_type_str(np.asarray(e))}" for k, e in enumerate(a))
    return _type_str(np.asarray(a))


def _compare(got: list, want: list, rtol: float = 1e-4, atol: float = 1e-4) -> tuple[bool, str]:
    """(match, detail): same count, dtypes and shapes, values within tolerance."""
    import numpy as np
    if len(got) != len(want):
        return False, f"{len(got)} outputs, expected {len(want)}"
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, want)):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False, f"output {i} is {_type_str(a)}, expected {_type_str(b)}"
        if a.size and not np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            return False, f"output {i} differs by up to {err:.3g}"
        if a.size and a.dtype.kind == "f":
            worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
    return True, f"max abs difference {worst:.3g}"


# ------------------------------------------------------------------------------------------ compile
def _compile(args) -> int:
    import dyntvm as dt
    from dyntvm.errors import InputError
    from dyntvm.loader import load_model
    from dyntvm.runtime.artifact import check_destination
    check_destination(args.output)      # before compiling: never overwrite what is not an artifact
    t0 = time.perf_counter()
    if getattr(args, "torch", False):
        if args.example or args.input or args.autograph:
            raise InputError("--torch takes MODEL as file.py:make only (no --example, --input or --autograph: "
                             "torch.export takes the program's control flow as torch.cond / while_loop)")
        from dyntvm.loader import load_torch
        loaded = load_torch(args.model)
    else:
        loaded = load_model(args.model, args.example, args.input, args.autograph)
    t_trace = time.perf_counter() - t0
    kwargs = {"target": args.target, "cache_dir": args.cache_dir}
    if args.tuning_log is not None:
        if not os.path.isdir(args.tuning_log):
            raise InputError(f"--tuning-log {args.tuning_log}: no such folder")
        kwargs["tuning_log"] = args.tuning_log
    print(f"compiling {loaded.source} for {args.target} ...", flush=True)
    t0 = time.perf_counter()
    import warnings

    from dyntvm.codegen.tuning import TuningWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TuningWarning)
        model = dt.compile(loaded.graph, **kwargs)
    for w in caught:
        if issubclass(w.category, TuningWarning):
            print(f"dyntvm compile: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    t_compile = time.perf_counter() - t0
    print(model.summary())
    t0 = time.perf_counter()
    model.save(args.output)
    t_save = time.perf_counter() - t0
    print(f"trace {t_trace:.2f} s, compile {t_compile:.2f} s, save {t_save:.2f} s; "
          f"wrote {args.output} ({_size(args.output) / 1e6:.2f} MB)")
    return 0


# --------------------------------------------------------------------------------------------- tune
def _hints(items) -> dict:
    from dyntvm.errors import InputError
    hints = {}
    for item in items or []:
        name, _, sizes = (x.strip() for x in item.partition("="))
        try:
            values = [int(v) for v in sizes.split(",")]
        except ValueError:
            values = None
        if not name or not values:
            raise InputError(f"--hint {item!r}: expected SYMBOL=SIZE[,SIZE...], e.g. T=16,64")
        if name in hints:
            raise InputError(f"--hint {name} is given twice: give all its sizes once, e.g. {name}=16,64")
        hints[name] = values
    return hints


def _tune(args) -> int:
    import json

    import dyntvm as dt
    from dyntvm.loader import load_model
    loaded = load_model(args.model, args.example, args.input, args.autograph)
    print(f"tuning {loaded.source} for {args.target} ({args.trials} trials per kernel) ...", flush=True)
    t0 = time.perf_counter()
    log = dt.tune(loaded.graph, target=args.target, trials=args.trials, shape_hints=_hints(args.hint) or None,
                  log_dir=args.output, rpc=args.rpc, rpc_key=args.key, busy_load=args.busy_load,
                  refuse_busy=args.refuse_busy)
    with open(os.path.join(log, "manifest.json")) as f:
        manifest = json.load(f)
    print(f"{'kernel':<40} {'default us':>11} {'tuned us':>10}  used")
    for k in manifest["kernels"]:
        why = k.get("reason") or k.get("rejected") or k.get("verdict", {}).get("reason")
        print(f"{k.get('name', '?'):<40} {k.get('default_us', '-'):>11} {k.get('tuned_us', '-'):>10}  "
              f"{k.get('use', '-')}" + (f" ({why})" if why else ""))
    won = sum(k.get("use") == "tuned" for k in manifest["kernels"])
    print(f"{won} of {len(manifest['kernels'])} kernels use the tuned schedule; {time.perf_counter() - t0:.1f} s; "
          f"log: {log} (dyntvm compile ... --tuning-log {log})")
    return 0


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# ------------------------------------------------------------------------------------------- bundle
def _bundle(args) -> int:
    from dyntvm.bundle import bundle
    info = bundle(args.output, cpp=args.cpp)
    print(f"wrote {info['path']}: {info['files']} files, {info['bytes'] / 1e6:.1f} MB"
          + (f" ({_size(info['path']) / 1e6:.1f} MB compressed)" if os.path.isfile(info["path"]) else "")
          + "; on the target machine: PYTHONPATH=<it> python3 -m dyntvm run ART ...")
    return 0


# ---------------------------------------------------------------------------------------------- run
def _npz_list(item: str, path: str, archive, is_list: bool) -> list:
    """The arrays of an .npz archive given for a list input, in order: `np.savez(path, *arrays)` names them
    arr_0, arr_1, ... (what `--output` writes for a list output)."""
    from dyntvm.errors import InputError
    with archive:
        keys = list(archive.files)
        if not is_list:
            raise InputError(f"--input {item!r}: {path} is an .npz archive; give one array as a .npy file (an "
                             ".npz is for a list input)")
        order = {f"arr_{k}": k for k in range(len(keys))}
        if set(keys) != set(order):
            raise InputError(f"--input {item!r}: {path} holds {', '.join(map(repr, keys[:5]))}; a list input takes "
                             "an .npz of its elements named arr_0, arr_1, ... (np.savez(path, *arrays))")
        return [archive[k] for k in sorted(keys, key=order.__getitem__)]


def _run(args) -> int:
    import numpy as np

    import dyntvm as dt
    from dyntvm.errors import InputError
    from dyntvm.ir.list_type import ListType
    from dyntvm.ir.tree import flatten_like, tree_unflatten
    from dyntvm.loader import parse_sizes, random_inputs
    sizes = parse_sizes(args.dim)
    t0 = time.perf_counter()
    if args.artifact.endswith(".onnx") and os.path.isfile(args.artifact):   # an ONNX model: import and compile
        model = dt.compile(dt.from_onnx(args.artifact), target=args.device or "cpu")
    else:
        model = dt.load(args.artifact, device=args.device)
    t_load = time.perf_counter() - t0
    graph = model.graph
    names = [v.name for v in graph.inputs]
    list_inputs = {v.name for v in graph.inputs if isinstance(v.type, ListType)}
    given = {}
    for item in args.input or ():
        name, eq, path = item.partition("=")
        if not eq:
            raise InputError(f"--input {item!r}: expected NAME=FILE.npy; inputs are {', '.join(names)}")
        if name not in names:
            raise InputError(f"--input {item!r}: the model has no input {name!r}; inputs are {', '.join(names)}")
        if name in given:
            raise InputError(f"--input {item!r}: input {name!r} is given twice")
        try:
            given[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"--input {item!r}: cannot read {path} as a .npy array: {e}") from e
        if not isinstance(given[name], np.ndarray):          # an .npz archive: a list input's elements
            given[name] = _npz_list(item, path, given[name], name in list_inputs)
    missing = [n for n in names if n not in given]
    if missing and not args.random:
        raise InputError(f"no --input for {', '.join(missing)} (give NAME=FILE.npy, or --random)")
    leaves = random_inputs(graph, np.random.default_rng(args.seed), sizes, given)
    call_args = tree_unflatten(graph.in_tree, leaves) if graph.in_tree is not None else leaves
    print(f"loaded {args.artifact} (target {model.target}, {len(model.regions)} compiled region(s)) "
          f"in {_ms(t_load)}")
    for v, a in zip(graph.inputs, leaves):
        print(f"input {v.name}: {_value_str(a)} ({'file' if v.name in given else 'random'})")
    t0 = time.perf_counter()
    result = model(*call_args)
    t_first = time.perf_counter() - t0
    outs: list = []                  # one entry per graph output: an array, or a Python list for a list output
    if graph.out_tree is None or not flatten_like(graph.out_tree, result, outs):
        outs = [result]
    for i, a in enumerate(outs):
        print(f"output {i}: {_value_str(a)}")
    t_med = _median_time(lambda: model(*call_args), args.repeat)
    print(f"first call {_ms(t_first)}; median of {args.repeat} runs {_ms(t_med)}")
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        for i, a in enumerate(outs):
            if isinstance(a, list):          # a list output: its elements in order (arr_0, arr_1, ...)
                np.savez(os.path.join(args.output, f"output_{i}.npz"), *[np.ascontiguousarray(e) for e in a])
            else:
                np.save(os.path.join(args.output, f"output_{i}.npy"), np.ascontiguousarray(a))
        print(f"saved {len(outs)} output(s) to {os.path.join(args.output, 'output_<i>.npy')}"
              + (" (a list output: output_<i>.npz)" if any(isinstance(a, list) for a in outs) else ""))
    return 0


# ------------------------------------------------------------------------------------------ inspect
def _inspect(args) -> int:
    from dyntvm.loader import is_artifact, load_model
    from dyntvm.runtime.model import partition_summary
    if args.svg:                                       # a .png path: say so before printing the whole graph
        from dyntvm.partition.draw import check_svg_path
        check_svg_path(args.svg, "--svg")
    if args.model and is_artifact(args.model):
        from dyntvm.runtime.artifact import read
        manifest, pg = read(args.model)               # no native code runs while inspecting
        sig = manifest.get("signature", {})
        print(f"artifact {args.model}: target {manifest.get('target')}, format {manifest.get('format_version')}, "
              f"dyntvm {manifest.get('dyntvm')}, tvm {manifest.get('tvm')}")
        for i in sig.get("inputs", []):
            print(f"  input {i.get('name')}: {_signature_type(i)}")
        for k, o in enumerate(sig.get("outputs", [])):
            print(f"  output {k}: {_signature_type(o)}")
        for k, v in (manifest.get("info") or {}).items():
            print(f"  {k}: {v}")
        for fn, digest in manifest.get("files", {}).items():
            print(f"  file {fn}: sha256 {str(digest)[:16]}...")
    elif args.model and args.model.endswith(".onnx") and not args.input and not args.example:
        return _inspect_onnx(args)
    else:
        from dyntvm.pipeline import partition_graph
        loaded = load_model(args.model, args.example, args.input, args.autograph)
        pg = partition_graph(loaded.graph)            # partitioned and folded, as `compile` builds it
        print(f"model {loaded.source} (partitioned, not compiled)")
    regions = [n for n in pg.walk() if n.op == "region"]
    print(f"{len(regions)} compiled region(s):")
    for line in partition_summary(pg):
        print(f"  {line}")
    from dyntvm.ir.vm_program import describe, unsupported_nodes
    bad = describe(unsupported_nodes(pg))
    print("VM program (CPU): " + ("the whole model, one VM call per call" if not bad else
                                  "no, the executor runs the model: " + "; ".join(bad)))
    print(pg)
    _draw(pg, args.svg)
    return 0


def _draw(pg, svg) -> None:
    if svg:
        from dyntvm.partition.draw import draw_partition
        draw_partition(pg, svg)
        print(f"wrote {svg}")


def _inspect_onnx(args) -> int:
    """Where each ONNX node landed (`dyntvm.onnx_inspect`); a model that cannot be imported is described, every
    unsupported op listed, and the command fails after printing it."""
    import json

    import dyntvm as dt
    from dyntvm.errors import DyntvmError
    info = dt.inspect_onnx(args.model)
    if args.json:
        print(json.dumps(info.to_json(), indent=1))
    else:
        print("\n".join(info.summary_lines()))
        if info.ok and not args.summary:
            print("\n".join(info.table_lines()))
        if info.ok and args.graph:
            print(info.graph)
    if not info.ok:
        raise DyntvmError(f"{args.model} cannot be imported: " + (
            f"{len(info.unsupported)} op type(s) without a converter (listed above)" if info.unsupported
            else "see above"))
    _draw(info.graph, args.svg)
    return 0


# --------------------------------------------------------------------------------------------- demo
def _demo(args) -> int:
    import numpy as np

    import dyntvm as dt
    from dyntvm import examples
    from dyntvm.examples import plain_numpy
    ex = examples.get(args.example)
    t0 = time.perf_counter()
    graph = dt.trace(ex.fn, *ex.specs)
    t_trace = time.perf_counter() - t0
    print(f"# example {ex.name}: {ex.description}")
    print(graph)
    inputs = ex.make_inputs(np.random.default_rng(0), **ex.sizes)
    eager = _leaves(ex.fn(*inputs))
    ref = _leaves(dt.run_reference(graph, *inputs))
    ref_ok, ref_detail = _compare(ref, eager, rtol=1e-5, atol=1e-6)
    print(f"traced in {t_trace * 1e3:.1f} ms; sizes {ex.sizes}")
    print(f"reference interpreter matches eager: {ref_ok} ({ref_detail})")

    t0 = time.perf_counter()
    model = dt.compile(graph, target=args.target)
    t_compile = time.perf_counter() - t0
    print(model.summary())
    print(f"compiled in {t_compile:.2f} s")
    compiled = _leaves(model(*inputs))
    ok, detail = _compare(compiled, eager)
    for i, (a, b) in enumerate(zip(compiled, eager)):
        print(f"output {i}: {_type_str(a)} (eager {_type_str(b)})")
    # the baseline: the example written in plain numpy, as a numpy user would (dyntvm's eager mode runs the
    # same numpy kernels but adds its own dispatch per op, so it is shown apart, not as "numpy")
    numpy_fn = plain_numpy.BY_EXAMPLE[ex.name]
    numpy_ok, numpy_detail = _compare(compiled, _leaves(numpy_fn(*inputs)), rtol=1e-3)
    # compiled first: OpenBLAS threads keep spinning for a while after numpy matmuls and would slow
    # TVM's parallel kernels, which measures the contention rather than either side
    t_comp = _median_time(lambda: model(*inputs), args.repeat)
    t_numpy = _median_time(lambda: numpy_fn(*inputs), args.repeat)
    t_eager = _median_time(lambda: ex.fn(*inputs), args.repeat)
    print(f"compiled matches eager: {ok} ({detail})")
    print(f"compiled matches plain numpy: {numpy_ok} ({numpy_detail})")
    ratio = t_numpy / t_comp
    verdict = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    print(f"latency (median of {args.repeat}): plain numpy {_ms(t_numpy)}, dyntvm eager mode {_ms(t_eager)}, "
          f"compiled {_ms(t_comp)}; compiled is {verdict} than plain numpy")
    return 0 if ok and ref_ok and numpy_ok else 1


# --------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    from .runtime.devices import DEVICES
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks on errors")
    p = _Parser(prog="dyntvm", description="Compile dynamic neural networks with Apache TVM.",
                epilog="MODEL is path/to/file.py:function with --input specs, a saved graph (graph.json), an "
                       "ONNX model (model.onnx), or --example NAME. Run `dyntvm COMMAND --help` for each command.")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def model_args(q):
        q.add_argument("model", nargs="?", metavar="MODEL", help="path/to/file.py:function, graph.json or model.onnx")
        q.add_argument("--example", metavar="NAME", help=f"a bundled example instead of MODEL: {EXAMPLES}")
        q.add_argument("--input", action="append", metavar="NAME:DIMS:DTYPE",
                       help="input spec of a model function, e.g. xs:T,B,128:float32 (dims: ints or "
                            "symbols; dtype defaults to float32); once per argument")
        q.add_argument("--autograph", action="store_true", help="convert the model function's Python if / for / "
                       "while on tensors to dyntvm control flow first (as dt.compile(..., autograph=True))")

    c = sub.add_parser("compile", parents=[common], help="compile a model to a deployable artifact",
                       description="Trace, partition and compile MODEL; write an artifact folder (or .tar).")
    model_args(c)
    c.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="artifact to write: a folder (e.g. m.dtvm) or a file ending in .tar; an existing "
                        "OUT is replaced only if it is an empty folder or a dyntvm artifact")
    c.add_argument("--target", type=_target, default="cpu", metavar="cpu|cuda[:sm_XX]",
                   help="where the kernels run (default cpu). cuda builds device code for sm_XX (default: the "
                        "local GPU's, else sm_90) and needs nvcc, not a GPU")
    c.add_argument("--tuning-log", metavar="DIR", help="a log of `dyntvm tune`: also build the hinted sizes with "
                   "its tuned kernels and dispatch on the sizes at run time (a log of another model or target "
                   "warns and is not applied)")
    c.add_argument("--cache-dir", metavar="DIR", help="compile cache (default $DYNTVM_CACHE_DIR or the user "
                   "cache folder)")
    c.add_argument("--torch", action="store_true", help="MODEL is file.py:make, make() returning (module, "
                   "example_args[, dynamic_shapes]): imported with dt.from_torch (torch.export)")
    c.set_defaults(func=_compile)

    t = sub.add_parser("tune", parents=[common], help="autotune a model's kernels (MetaSchedule + XGBoost)",
                       description="Tune MODEL's kernels at hinted sizes of its symbolic dims; write a log "
                                   "folder for `dyntvm compile --tuning-log`. Running again resumes; Ctrl-C keeps "
                                   "what was tuned.")
    model_args(t)
    t.add_argument("--target", type=_target, default="cpu", metavar="cpu|cuda",
                   help="default cpu; cuda tunes on the local GPU (needed: candidates are timed on it)")
    t.add_argument("--trials", type=_positive_int, default=64, metavar="N",
                   help="candidates measured per kernel (default 64)")
    t.add_argument("--hint", action="append", metavar="SYM=SIZES",
                   help="sizes to tune a symbolic dim for, e.g. T=16,64; once per symbol (default 16 each)")
    t.add_argument("-o", "--output", metavar="DIR", help="log folder (default tuning_logs/<model>/<target key>)")
    t.add_argument("--rpc", metavar="HOST:PORT", help="a TVM RPC tracker: its servers (registered with --key) "
                   "measure the candidates (CPU)")
    t.add_argument("--key", metavar="KEY", help="the key the RPC servers registered under at the tracker (--rpc)")
    t.add_argument("--busy-load", type=float, metavar="X", help="load average per core above which the machine "
                   "counts as busy (default $DYNTVM_TUNE_BUSY_LOAD, else 0.5): warns, or refuses with --refuse-busy")
    t.add_argument("--refuse-busy", action="store_true", help="refuse to tune on a busy machine instead of warning")
    t.set_defaults(func=_tune)

    r = sub.add_parser("run", parents=[common], help="run an artifact (or an ONNX model) on .npy or random inputs",
                       description="Load an artifact (or import and compile an ONNX model), run it, print output "
                                   "shapes and latency.")
    r.add_argument("artifact", metavar="ART", help="artifact folder or .tar written by `dyntvm compile`, or a "
                   "model.onnx (compiled first, for --device or the CPU)")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input array; once per input "
                   "(a list input: an .npz of its elements, np.savez(FILE, *arrays))")
    r.add_argument("--random", action="store_true", help="random data for inputs not given with --input")
    r.add_argument("--dim", action="append", metavar="SYM=SIZE", help="size of a symbolic dim for --random, "
                   "e.g. T=16")
    r.add_argument("--seed", type=int, default=0, help="random seed for --random (default 0)")
    r.add_argument("--repeat", type=_positive_int, default=10, metavar="N", help="timed runs after the first (default 10)")
    r.add_argument("--output", metavar="DIR", help="save outputs as DIR/output_<i>.npy (a list output: "
                   "DIR/output_<i>.npz, its elements arr_0, arr_1, ...)")
    r.add_argument("--device", choices=sorted(DEVICES), help="default: the artifact's target")
    r.set_defaults(func=_run)

    i = sub.add_parser("inspect", parents=[common], help="print (and draw) a model's or artifact's partition",
                       description="Print the partitioned graph and its regions; --svg draws it. For model.onnx: where each "
                                   "ONNX node landed (regions, dynamic ops, control flow), or every op without a "
                                   "converter with its opset and node names.")
    model_args(i)
    i.add_argument("--svg", metavar="FILE", help="draw the partition to FILE (SVG)")
    i.add_argument("--json", action="store_true", help="model.onnx: print where each ONNX node landed as JSON")
    i.add_argument("--summary", action="store_true", help="model.onnx: the summary only, not the per-node table")
    i.add_argument("--graph", action="store_true", help="model.onnx: also print the partitioned graph")
    i.set_defaults(func=_inspect)

    b = sub.add_parser("bundle", parents=[common], help="write the runtime-only install a deployment needs",
                       description="Copy dyntvm's runtime and TVM without its compiler library into OUT (a "
                                   "folder, or a .tar.gz) to put on PYTHONPATH where artifacts are run.")
    b.add_argument("-o", "--output", required=True, metavar="OUT", help="a new folder, or a file ending in .tar.gz")
    b.add_argument("--cpp", action="store_true", help="also the C++ runner's sources (deploy/cpp/) and the headers "
                   "it builds with: `sh OUT/cpp/build.sh run_model` on the target")
    b.set_defaults(func=_bundle)

    d = sub.add_parser("demo", parents=[common], help="trace, compile and run a bundled example",
                       description="Trace a bundled example, compile it, and compare its results and latency with the "
                                   "same model written in plain numpy (and with dyntvm's eager mode).")
    d.add_argument("--example", default="lstm", metavar="NAME", help=f"{EXAMPLES} (default lstm)")
    d.add_argument("--target", type=_target, default="cpu", metavar="cpu|cuda[:sm_XX]", help="default cpu")
    d.add_argument("--repeat", type=_positive_int, default=20, metavar="N", help="timed runs per side (default 20)")
    d.set_defaults(func=_demo)
    return p


def _check_full_install(cmd: str, args=None) -> None:
    """A runtime-only install (`dyntvm bundle`) runs and inspects artifacts; the rest needs the compiler."""
    import importlib.util

    from dyntvm.errors import DyntvmError
    if importlib.util.find_spec("dyntvm.frontend") is not None or cmd == "run":
        return
    if cmd == "inspect" and args is not None and args.model and not args.svg and not args.example:
        from dyntvm.loader import is_artifact
        if is_artifact(args.model):           # reading an artifact needs only the runtime
            return
    raise DyntvmError(f"this is a runtime-only dyntvm (made by `dyntvm bundle`): it runs and inspects artifacts "
                      f"(`dyntvm run`, `dyntvm inspect ART`); `dyntvm {cmd}` here needs the full install "
                      "(pip install dyntvm)")


def main(argv=None) -> int:
    from dyntvm.errors import DyntvmError
    args = build_parser().parse_args(argv)
    try:
        _check_full_install(args.cmd, args)
        return args.func(args)
    except BrokenPipeError:                            # `dyntvm inspect ... | head`: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"dyntvm {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure becomes one line unless -v asks for the traceback
        if args.verbose:
            raise
        if isinstance(e, KeyError) and e.args:
            msg = str(e.args[0])
        elif isinstance(e, (DyntvmError, OSError)):
            msg = str(e)
        else:
            msg = f"{type(e).__name__}: {e} (run with -v for the traceback)"
        print(f"dyntvm {args.cmd}: error: {' '.join(msg.split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
