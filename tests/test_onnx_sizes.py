"""ONNX control-flow and dynamic-shape node tests re-run at other sizes and values, against onnxruntime.

The stored ONNX backend node tests (`onnx.backend.test.case`, as in tests/test_onnx_conformance.py) fix every
input shape, so they alone cannot show that one compiled model serves all sizes. Here each supported node test
of the families below is rewritten with symbolic input dims (`_symbolic`: a fixed dim becomes a `dim_param`,
equal sizes sharing one symbol so the constraints between inputs hold; size-1 dims, often broadcast, stay),
imported and compiled ONCE, then run on random inputs at other sizes (1, 0, larger, mixed) and with other values
(for Compress / NonZero / Unique / Where other numbers of selected elements), every output compared with
onnxruntime on the same rewritten model. A variant onnxruntime rejects (a Reshape target that no longer fits)
is dropped; one onnxruntime runs and dyntvm fails on is a failure. Inputs the importer needs as constants (a
Reshape target, Slice bounds, a TopK k: the smallest such set, found by retrying the import) keep their stored
values, and their dims stay fixed (none for the families of `RUNTIME_OPERANDS`, whose operands dyntvm takes
computed at run time); where the symbolic rewrite does not import, the dims stay fixed and only the values vary. Each family must compare a few variants at a size other than the stored one, so the test
cannot pass vacuously; the counts are printed (`pytest -s`) and recorded in docs/onnx.md.
"""
import itertools
import warnings
import zlib

import numpy as np
import pytest

import dyntvm as dt
from dyntvm.errors import DyntvmError
from dyntvm.frontend.onnx import unsupported_ops

ort = pytest.importorskip("onnxruntime")
ort.set_default_logger_severity(4)          # the variants it rejects are expected: no error logs for them

pytestmark = pytest.mark.slow

with warnings.catch_warnings():
    warnings.simplefilter("ignore")         # the case generators compute their expected outputs with numpy
    import onnx
    from onnx import numpy_helper
    from onnx.backend.test.case import node as _node_cases
    _ALL = sorted(_node_cases.collect_testcases(None), key=lambda c: c.name)

FAMILIES = ("loop", "if", "scan", "nonzero", "compress", "unique", "range", "top_k", "reshape", "expand",
            "constantofshape", "tile", "slice", "onehot", "where", "shape", "size", "split", "squeeze",
            "unsqueeze")
MIN_OTHER_SIZES = 3          # variants per family compared at a size other than the stored one, at least
TRIES = 6                    # random draws per planned variant until onnxruntime accepts one
# families whose supported node tests have nothing with a size: the values vary only (still compared)
NO_SIZES = {"if": "the If node tests (test_if, test_if_seq, test_if_opt) take a 0-d condition only; their branches "
                  "are constants"}
SELECT = ("nonzero", "compress", "unique", "where")     # data-dependent selection: vary how many are selected
# families whose shape / repeats / depth / bounds / axes operands dyntvm takes computed at run time: every input
# stays a graph input (none fixed as a constant), and they vary with the other inputs
RUNTIME_OPERANDS = ("range", "reshape", "expand", "constantofshape", "tile", "slice", "onehot")


def _family(name: str):
    n = name[len("test_"):]
    for f in FAMILIES:
        if n == f or n.startswith(f + "_") or (f in ("loop", "scan") and n[len(f):len(f) + 1].isdigit()
                                               and n.startswith(f)):
            return f
    return None


CASES = {f: [c for c in _ALL if _family(c.name) == f] for f in FAMILIES}
COUNTS: dict = {}            # family -> {"tests", "variants", "other_sizes", "dropped", "values_only"}


def _array(v):
    return numpy_helper.to_array(v) if hasattr(v, "raw_data") else np.asarray(v)


# ------------------------------------------------------------------------------------------ model rewrite
def _loosen(vi):
    """Keep the rank and element type of a value info, forget its dims (outputs, subgraph inputs / outputs:
    their stored shapes are the stored test's)."""
    tt = vi.type.tensor_type
    if vi.type.HasField("tensor_type") and tt.HasField("shape"):
        for d in tt.shape.dim:
            d.Clear()


def _loosen_graph(g, top: bool, subgraphs: bool = True):
    """Forget the stored dims of `g`'s outputs (and, with `subgraphs`, of its subgraphs' inputs / outputs: a
    model that needs them, as a loop-carried value of one data-dependent dim pinned by its declared shape,
    keeps them)."""
    del g.value_info[:]
    for vi in (list(g.output) if top else list(g.input) + list(g.output)):
        _loosen(vi)
    for node in g.node if subgraphs else ():
        for a in node.attribute:
            if a.HasField("g"):
                _loosen_graph(a.g, False)
            for sub in a.graphs:
                _loosen_graph(sub, False)


def _symbolic(model, keep: set, subgraphs: bool = True):
    """A copy of `model` whose graph inputs (but those in `keep`) have symbolic dims: a dim of size n > 1
    becomes `n<n>`, so inputs of equal sizes share the symbol. Returns (model, {symbol: stored size})."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    init = {t.name for t in m.graph.initializer}
    symbols = {}
    for vi in m.graph.input:
        if vi.name in init or vi.name in keep or not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 1:
                symbols[f"n{d.dim_value}"] = d.dim_value
                d.dim_param = f"n{d.dim_value}"         # (clears dim_value: one of the two)
    _loosen_graph(m.graph, True, subgraphs)
    return m, symbols


def _fixed(model, subgraphs: bool = True):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _loosen_graph(m.graph, True, subgraphs)
    return m


# ------------------------------------------------------------------------------------------ import, compile
def _needs_constants(e: Exception) -> bool:
    return "must be known when the model is imported" in str(e)


def _import(model, feed: dict):
    """(graph, constant input names): the smallest set of integer / one-element inputs fixed to their stored
    values with which the model imports (the conformance runner fixes all of them at once)."""
    try:
        return dt.from_onnx(model), ()
    except DyntvmError as e:
        if not _needs_constants(e):
            raise
        first = e
    cands = [k for k, v in feed.items() if v.dtype.kind in "iu" or v.size == 1]
    last = None
    for n in range(1, len(cands) + 1):
        for keep in itertools.combinations(cands, n):
            try:
                return dt.from_onnx(model, constant_inputs={k: feed[k] for k in keep}), keep
            except DyntvmError as e:
                if not _needs_constants(e):
                    raise
                last = e
    raise last or first


def _session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


# ------------------------------------------------------------------------------------------ variants
def _values(rng, stored: np.ndarray, shape, family: str, k: int) -> np.ndarray:
    """Random values of `stored`'s dtype at `shape`, in a range like the stored ones."""
    dt_ = stored.dtype
    if dt_ == np.bool_:
        p = (0.5, 0.0, 1.0, 0.25, 0.8)[k % 5] if family in SELECT else 0.5
        return np.asarray(rng.random(shape) < p)
    if dt_.kind in "iu":
        lo = int(min(stored.min(), 0)) if stored.size else 0
        hi = int(max(stored.max(), lo + 1)) if stored.size else 3
        if family == "unique":              # repeats: a narrower range
            hi = lo + max(1, min(hi - lo, (2, 4, 8)[k % 3]))
        v = rng.integers(lo, hi + 1, size=shape).astype(dt_)
        if family not in SELECT and stored.shape == tuple(shape):     # shapes, repeats, counts: near the stored
            v = np.where(rng.random(shape) < 0.5, stored, v)
    else:
        s = stored.astype(np.float64)
        mean = float(s.mean()) if s.size else 0.0
        std = float(s.std()) if s.size > 1 and s.std() > 0 else 1.0
        v = rng.standard_normal(shape) * std + mean
        if family == "unique":              # repeats
            v = np.round(v)
        v = v.astype(dt_)
    if family in SELECT:                    # NonZero of data with some exact zeros
        v = np.where(rng.random(shape) < (0.5, 0.0, 1.0, 0.25, 0.8)[k % 5], np.zeros((), dt_), v)
    return np.asarray(v, dt_)               # a 0-d array, not a numpy scalar (onnxruntime takes arrays only)


def _size_plans(symbols: dict, rng) -> list:
    """Symbol -> size assignments: all 1, all 0, each larger, each random, and the stored sizes."""
    if not symbols:
        return [None] * 4
    plans = [{s: 1 for s in symbols}, {s: 0 for s in symbols}, {s: n + 2 for s, n in symbols.items()},
             {s: int(rng.integers(1, 2 * n + 2)) for s, n in symbols.items()}, None]
    return plans


def _shape_of(vi, stored: np.ndarray, plan) -> tuple:
    if plan is None:
        return stored.shape
    dims = vi.type.tensor_type.shape.dim
    return tuple(plan[d.dim_param] if d.dim_param in plan else n for d, n in zip(dims, stored.shape))


def _forms(case, feed: dict, keep: tuple):
    """Candidate rewrites, most symbolic first: every input's dims symbolic (but the constant ones'); one more
    input's dims fixed (OneHot's `values` pair shares a size with the indices); integer inputs' fixed."""
    free = [n for n in feed if n not in keep]
    ints = {n for n in free if feed[n].dtype.kind in "iu"}
    yield set(keep)
    for n in free:
        yield set(keep) | {n}
    yield set(keep) | ints


def _accepts_other_sizes(model, symbols, feed, keep, family) -> bool:
    """Does onnxruntime run the rewritten model at some size other than the stored one?"""
    sess, rng = _session(model), np.random.default_rng(0)
    ins = {vi.name: vi for vi in model.graph.input}
    for k, plan in enumerate(_size_plans(symbols, rng)[:-1]):
        for _ in range(TRIES):
            try:
                sess.run(None, {n: v if n in keep else _values(rng, v, _shape_of(ins[n], v, plan), family, k)
                                for n, v in feed.items()})
                return True
            except Exception:  # noqa: BLE001 - rejected: another draw, size or form
                pass
    return False


def _choose_form(case, feed, family):
    """(model, symbols, graph, constant inputs): the first form of `_forms` that onnxruntime runs at another
    size and dyntvm imports; else the stored fixed dims (values vary only)."""
    _, keep = _import(case.model, feed)
    for fixed, subgraphs in itertools.product(_forms(case, feed, keep), (True, False)):
        model, symbols = _symbolic(case.model, fixed, subgraphs)
        if not symbols or not _accepts_other_sizes(model, symbols, feed, keep, family):
            continue
        try:
            graph, keep2 = _import(model, feed)
        except DyntvmError:         # dyntvm does not take this symbolic form
            continue
        if family in RUNTIME_OPERANDS and keep2:    # (an operand of a symbolic length: its dims stay fixed)
            continue
        return model, symbols, graph, keep2
    for subgraphs in (True, False):
        model = _fixed(case.model, subgraphs)
        try:
            graph, keep = _import(model, feed)
        except DyntvmError:
            if subgraphs:
                continue
            raise
        return model, {}, graph, keep


# ------------------------------------------------------------------------------------------ one node test
def _shapes(v):
    """An output's shape; a sequence output's, the list of its elements'."""
    return [np.shape(_array(e)) for e in v] if isinstance(v, list) else np.shape(_array(v))


def _outputs(got, n: int) -> list:
    """The compiled model's result as a list of its `n` outputs (one output may itself be a list: a sequence)."""
    return list(got) if n > 1 else [got]


def _compare(got, want, where):
    got = list(got)
    assert len(got) == len(want), f"{where}: {len(got)} outputs, onnxruntime {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        if isinstance(b, list):             # a sequence output: a list of arrays on both sides
            assert isinstance(a, list), f"{where}: output {i} is {type(a).__name__}, onnxruntime a sequence"
            _compare(a, b, f"{where}: output {i}")
            continue
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, f"{where}: output {i} dtype {a.dtype}, onnxruntime {b.dtype}"
        assert a.shape == b.shape, f"{where}: output {i} shape {a.shape}, onnxruntime {b.shape}"
        if a.dtype.kind in "fc":
            tol = 1e-3 if a.dtype == np.float16 else 1e-5        # float16: one ulp (Range's arithmetic)
            np.testing.assert_allclose(a, b, rtol=10 * tol, atol=tol, equal_nan=True, err_msg=f"{where}: output {i}")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"{where}: output {i}")


def run_case(case, family: str) -> dict:
    """Compare dyntvm with onnxruntime on `case` rewritten with symbolic dims, at other sizes and values.
    Returns counts, or {"skip": reason}."""
    missing = unsupported_ops(case.model)
    if missing:
        return {"skip": f"unsupported op(s): {', '.join(missing)}"}
    init = {t.name for t in case.model.graph.initializer}
    ins = [vi for vi in case.model.graph.input if vi.name not in init]
    stored_in, stored_out = case.data_sets[0]
    feed = {vi.name: _array(v) for vi, v in zip(ins, stored_in)}
    if any(v.dtype.kind not in "biuf" for v in feed.values()):
        return {"skip": "an input dtype dyntvm has no numpy form of"}
    try:
        _import(case.model, feed)
    except DyntvmError as e:
        return {"skip": f"unsupported: {str(e).splitlines()[0][:160]}"}
    try:
        _session(case.model)
    except Exception as e:  # noqa: BLE001 - onnxruntime lacks a kernel (TopK of uint64)
        return {"skip": f"onnxruntime cannot run it: {str(e).splitlines()[0][-120:]}"}
    stored_shapes = [_shapes(v) for v in stored_out]
    symbols, values_only = {}, False
    model, symbols, graph, keep = _choose_form(case, feed, family)
    if family in RUNTIME_OPERANDS:
        assert not keep, f"{case.name}: needs its inputs {list(keep)} fixed as constants"
    compiled, sess = dt.compile(graph), _session(model)
    values_only = not symbols
    want = sess.run(None, feed)
    _compare(_outputs(compiled(*[v for k, v in feed.items() if k not in keep]), len(want)), want,
             f"{case.name} at the stored inputs")
    model_ins = {vi.name: vi for vi in model.graph.input}
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    counts = {"variants": 0, "other_sizes": 0, "dropped": 0, "values_only": int(values_only)}
    plans = _size_plans(symbols, rng) + [None] * (2 if family in SELECT or values_only else 0)
    for k, plan in enumerate(plans):
        for _ in range(TRIES):              # random shape operands (Expand's, Tile's) often do not fit: redraw
            variant = {n: v if n in keep else _values(rng, v, _shape_of(model_ins[n], v, plan), family, k)
                       for n, v in feed.items()}
            try:
                want = sess.run(None, variant)
            except Exception:  # noqa: BLE001 - onnxruntime rejects this variant (a target that no longer fits)
                want = None
            if want is not None and not any(w is None for w in want):   # (a Scan over no step: no output)
                break
            want = None
        if want is None:
            counts["dropped"] += 1
            continue
        where = f"{case.name} variant {k} inputs " + ", ".join(f"{n}{list(v.shape)}" for n, v in variant.items())
        try:
            got = _outputs(compiled(*[v for n, v in variant.items() if n not in keep]), len(want))
        except Exception as e:  # noqa: BLE001 - reported with the variant
            raise AssertionError(f"{where}: onnxruntime runs it, dyntvm raised {type(e).__name__}: {e}") from e
        _compare(got, want, where)
        counts["variants"] += 1
        sizes_in = [v.shape for n, v in variant.items()] != [v.shape for v in feed.values()]
        sizes_out = [_shapes(w) for w in want] != stored_shapes
        counts["other_sizes"] += int(sizes_in or sizes_out)
    return counts


@pytest.mark.parametrize("family", FAMILIES)
def test_family_at_other_sizes(family):
    total = {"tests": 0, "variants": 0, "other_sizes": 0, "dropped": 0, "values_only": 0}
    skipped, failures = [], []
    for case in CASES[family]:
        try:
            res = run_case(case, family)
        except AssertionError as e:
            failures.append(f"{case.name}: {e}")
            continue
        if "skip" in res:
            skipped.append(f"{case.name} ({res['skip']})")
            continue
        total["tests"] += 1
        for k, v in res.items():
            total[k] += v
    COUNTS[family] = total
    print(f"\n{family}: {total}; skipped {len(skipped)}: {'; '.join(skipped)}")
    assert not failures, "\n".join(failures)
    if not total["tests"]:
        pytest.skip(f"no {family} node test is supported: {'; '.join(skipped)}")
    if family in NO_SIZES:
        assert total["variants"] >= MIN_OTHER_SIZES, (family, NO_SIZES[family], total)
    else:
        assert total["other_sizes"] >= MIN_OTHER_SIZES, (family, total, skipped)
