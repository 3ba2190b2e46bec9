"""The op registry is the one place per-op facts live: every op group is defined once, every op has what each
stage needs (a type rule, a numpy kernel, a converter or a documented reason), and the frontend's trivial
functions and Tensor methods come from the registry."""
from __future__ import annotations

import ast
import dataclasses
import pathlib

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.ir.ops import GROUPS, Group, OpKind, all_ops, get_op, ops_in
from dyntvm.runtime.interpreter import Interpreter
from dyntvm.runtime.kernels import KERNELS

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("dyntvm", "ir", "frontend", "partition", "codegen", "runtime")


def _sources():
    for pkg in PACKAGES:
        yield from sorted((ROOT / pkg).rglob("*.py"))


def _string_collections(tree):
    """(line, set of strings) of every list/tuple/set literal and of the keys of every dict literal."""
    for node in ast.walk(tree):
        elts = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else \
            node.keys if isinstance(node, ast.Dict) else None
        if elts:
            yield node.lineno, {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def test_every_group_is_listed_once():
    """No source file outside ir/ops.py re-lists (3 or more of) a group's members: stages loop over `ops_in`."""
    seen = {}
    for group, members in GROUPS.items():
        assert members, group
        for m in members:
            assert m not in seen, f"{m} is in both {seen[m]} and {group}"
            seen[m] = group
    offenders = []
    for path in _sources():
        if path == ROOT / "ir" / "ops.py":
            continue
        for line, strings in _string_collections(ast.parse(path.read_text(), str(path))):
            for group, members in GROUPS.items():
                common = strings & set(members)
                if len(common) >= 3:
                    offenders.append(f"{path.relative_to(ROOT)}:{line} re-lists {group.name}: {sorted(common)}")
    assert not offenders, "op groups must be listed only in ir/ops.py GROUPS:\n" + "\n".join(offenders)


def test_every_op_has_a_type_rule_and_what_each_stage_needs():
    from dyntvm.codegen.converters import CONVERTERS
    for name, d in all_ops().items():
        assert d.name == name and callable(d.infer_type), name
        assert isinstance(d.kind, OpKind), name
        assert dataclasses.is_dataclass(d.attrs) and d.attrs.__dataclass_params__.frozen, name
        assert set(d.dim_attrs) <= {f.name for f in dataclasses.fields(d.attrs)}, name
        if d.group is not None:
            assert name in ops_in(d.group), name
        if d.kind in (OpKind.CONTROL_FLOW, OpKind.REGION):
            # documented reason: their semantics are the runner's; each interpreter has a handler
            assert callable(getattr(Interpreter, f"run_{name}", None)), name
            assert name not in KERNELS and name not in CONVERTERS, name
            continue
        assert name in KERNELS, f"{name} has no numpy kernel (runtime/kernels.py)"
        if d.kind is OpKind.STATIC:
            assert name in CONVERTERS, f"static op {name} has no Relax converter (codegen/converters)"
        else:
            # documented reason: a dynamic-shape op's output shape depends on values, so the executor runs
            # its numpy kernel between regions (DESIGN.md section 1); it is never compiled.
            assert d.kind is OpKind.DYNAMIC_SHAPE and name not in CONVERTERS, name
    assert set(KERNELS) <= set(all_ops()) and set(CONVERTERS) <= set(all_ops())
    for group in Group:     # every member is registered with its group
        assert all(get_op(m).group is group for m in ops_in(group)), group


def test_frontend_functions_and_methods_come_from_the_registry():
    from dyntvm.frontend.tracer import Tensor
    for name, d in all_ops().items():
        if d.api:
            f = getattr(F, d.api)
            assert f.__doc__ == d.doc and d.doc, name
        if d.method:
            assert callable(getattr(Tensor, d.api)), name
        if d.operator:
            assert callable(getattr(Tensor, f"__{d.operator}__")), name
            assert d.reflected == hasattr(Tensor, f"__r{d.operator}__"), name
    assert F.tan.__doc__ == get_op("tan").doc and "tan" in ops_in(Group.FLOAT_UNARY)


def test_generated_function_errors_name_the_api():
    x = dt.TensorSpec(("N", 4))
    with pytest.raises(dt.TraceError, match=r"clip: .*unexpected keyword argument 'lo'.*signature is clip\(x"):
        dt.trace(lambda a: F.clip(a, lo=0.0), x)
    with pytest.raises(dt.TraceError, match=r"clip: a_max must be a Python or numpy scalar or None"):
        dt.trace(lambda a: F.clip(a, 0.0, "1"), x)
    with pytest.raises(dt.TraceError, match=r"clip needs a_min or a_max"):
        dt.trace(lambda a: F.clip(a), x)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "bool"])
def test_clip_and_tan_eager_reference_compiled(dtype, tmp_path):
    """The two ops added to show what adding an op takes: eager == numpy == reference == compiled, at N in
    {0, 1, 7}, NaN kept, a_min > a_max giving a_max like numpy."""
    def fn(x):
        y = F.clip(x, 0, 1) if dtype == "bool" else F.clip(x, -0.5, 1.5)
        z = x.clip(2) if dtype != "bool" else F.clip(x, a_max=0)
        inv = F.clip(x, 1, 0)
        return y, z, inv, F.tan(x)

    model = dt.compile(fn, dt.TensorSpec(("N", 3), dtype), cache_dir=str(tmp_path))
    graph = dt.trace(fn, dt.TensorSpec(("N", 3), dtype))
    rng = np.random.default_rng(0)
    for n in (0, 1, 7):
        x = (rng.uniform(-3, 3, (n, 3)) if dtype != "bool" else rng.random((n, 3)) < 0.5).astype(dtype)
        if dtype.startswith("float") and n:
            x[0, 0] = np.nan
        with np.errstate(all="ignore"):
            t = x.dtype.type       # the bounds take x's dtype
            want = (np.clip(x, t(0), t(1)) if dtype == "bool" else np.clip(x, t(-0.5), t(1.5)),
                    np.clip(x, t(2), None) if dtype != "bool" else np.clip(x, None, t(0)),
                    np.clip(x, t(1), t(0)),
                    np.tan(x.astype("float32") if dtype in ("int32", "bool") else x))
        for got in (fn(x), dt.run_reference(graph, x), model(x)):
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6, equal_nan=True)


def test_clip_bounds_outside_the_dtype_saturate(tmp_path):
    """Integer bounds beyond the dtype's range (or huge floats) must not wrap around: the values are numpy's
    clip of the values, in x's dtype (eager, reference and compiled alike)."""
    def fn(u, i):
        return F.clip(u, -1, 300), F.clip(i, 0, 1e30), F.clip(i, -2 ** 40, 2 ** 40), F.clip(i, -1.5, 2.5), \
            F.clip(i, 0, 2 ** 70)
    specs = dt.TensorSpec(("N",), "uint8"), dt.TensorSpec(("M",), "int32")
    u, i = np.array([0, 5, 255], "uint8"), np.array([1, 5, -3, 10, -2 ** 31], "int32")
    want = [u, np.array([1, 5, 0, 10, 0]), i, np.array([1, 2, -1, 2, -1]), np.array([1, 5, 0, 10, 0])]
    model = dt.compile(fn, *specs, cache_dir=str(tmp_path))
    for got in (fn(u, i), dt.run_reference(dt.trace(fn, *specs), u, i), model(u, i)):
        for g, w, x in zip(got, want, (u, i, i, i, i)):
            assert g.dtype == x.dtype and np.array_equal(g, w), (g, w)
    with pytest.raises(dt.TraceError, match="a_min must not be NaN"):
        dt.trace(lambda x: F.clip(x, float("nan")), specs[1])


def test_where_scalars_take_the_dtype_of_the_other_branch():
    """Regression: `where`'s bool condition must not decide a Python scalar's dtype (numpy: float32 here)."""
    b, x32 = np.array([True, False, True]), np.ones(3, "float32")
    assert F.where(b, x32, 0.5).dtype == np.float32 and F.where(b, 1, np.ones(3, "int8")).dtype == np.int8

    def f(xs, h):
        def step(x, st):
            h = F.where(x > 0, st[0] + x, 0.0)
            return h, [h]
        return F.foreach(step, xs, [h])
    g = dt.trace(f, dt.TensorSpec(("T", 4)), dt.TensorSpec((4,)))
    assert str(g.outputs[1].type) == "float32[4]"


def test_eager_and_traced_accept_the_same_programs():
    """Eager mode runs each op's type rule too: what tracing refuses, eager refuses with the same error."""
    x, spec = np.ones((2, 3), "float32"), dt.TensorSpec(("N", 3))
    for bad, msg in [(lambda a: F.clip(a), "clip needs a_min or a_max"),
                     (lambda a: F.where(a, 1.0, 2.0), "condition must be bool"),
                     (lambda a: F.sum(a, axis=(0, 0)), "duplicate axis"),
                     (lambda a: F.take(a, np.array([0]), axis=5), "axis 5 is out of range"),
                     (lambda a: F.less(F.cast(a, "int32"), 2 ** 40), "does not fit int32")]:
        for run in (lambda: bad(x), lambda: dt.trace(bad, spec)):
            with pytest.raises(dt.TraceError, match=msg):
                run()


def test_generated_functions_validate_their_arguments_like_numpy():
    """Attrs classes take what numpy takes for integer/bool parameters and refuse the rest, naming the API."""
    x = np.arange(6, dtype="float32").reshape(2, 3)
    assert F.sum(x, axis=np.array(1)).shape == (2,) and F.argmax(x, axis=np.int64(0)).shape == (3,)
    for bad, msg in [(lambda: F.argmax(x, axis=1.5), "argmax: axis must be an integer, got 1.5"),
                     (lambda: F.argmax(x, axis=True), "argmax: axis must be an integer"),
                     (lambda: F.sum(x, axis="1"), "sum: axis must be an integer"),
                     (lambda: F.sum(x, keepdims="no"), "sum: keepdims must be a bool"),
                     (lambda: F.transpose(x, (1.5, 0)), "transpose: axes must be an integer"),
                     (lambda: F.tile(x, True), "tile: reps must be an integer"),
                     (lambda: F.cast(x, "U3"), "cast: unsupported dtype 'U3'"),
                     (lambda: F.concat([x, x], axis=None), "concat: axis must be an integer")]:
        with pytest.raises(dt.TraceError, match=msg):
            bad()


def test_tensor_spec_is_validated():
    with pytest.raises(dt.TraceError, match=r"shape must be a tuple of dims.*write \(\"N\",\)"):
        dt.TensorSpec("NM")
    with pytest.raises(dt.TraceError, match="shape must be a tuple"):
        dt.TensorSpec(3)
    with pytest.raises(dt.TraceError, match="bad dim expression 'N/2'"):
        dt.TensorSpec(("N/2",))
    with pytest.raises(dt.TraceError, match="unsupported dtype"):
        dt.TensorSpec(("N",), "complex64")
    assert dt.TensorSpec(["N+1", 3, None]).shape == ("(N + 1)", 3, None)
    g = dt.trace(lambda a: F.reshape(a, (a.shape[0] % 2, -1)), dt.TensorSpec(("N", 4)))
    assert str(g.outputs[0].type) == "float32[(N % 2),((4 * N) // (N % 2))]"     # canonical: 4 * N
