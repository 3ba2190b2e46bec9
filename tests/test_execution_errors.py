"""Run-time errors name the node: an ExecutionError names the op, the node, the failing condition and the
user's source line, raised from the cause — in the reference interpreter, a compiled model and a loaded
artifact alike; the innermost node of nested control flow, with the enclosing nodes as context."""
from __future__ import annotations

import linecache
import os
import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.partition.selector import OpListSelector
from dyntvm.runtime.executor import Executor

TABLE = np.arange(12, dtype="float32").reshape(3, 4)
IDX = dt.TensorSpec(("T", 2), "int64")
GOOD = np.array([[0, 1], [2, 2]], "int64")
BAD = np.array([[0, 1], [2, 5]], "int64")            # row 1 holds 5: out of range for 3 rows


def lookup(idx):
    def body(i, st):
        y = F.take(TABLE, i)  # the failing take
        return y, st
    return F.foreach(body, idx, [])[0]  # the enclosing foreach


def assert_names_the_take(err: dt.ExecutionError, iteration=1, cause=IndexError):
    msg = str(err)
    assert msg.startswith("take node '"), msg
    assert "failed: take: index out of range for axis 0 of size 3" in msg
    assert_line(msg, r"\n    at ([^:\n]+):(\d+): (.*)", "# the failing take")
    assert_line(msg, rf"\n    in foreach node '\w+', iteration {iteration}, at ([^:\n]+):(\d+): (.*)",
                "# the enclosing foreach")
    assert err.op == "take" and err.node and "F.take(TABLE, i)" in err.source
    assert isinstance(err.__cause__, cause)             # raised from the failure itself, not wrapped twice
    assert not isinstance(err.__cause__, dt.ExecutionError)


def assert_line(msg, pattern, snippet):
    """`pattern` in `msg` names this test file and the line holding `snippet`."""
    m = re.search(pattern, msg)
    assert m, (pattern, msg)
    assert m.group(1) == os.path.basename(__file__)
    line = linecache.getline(__file__, int(m.group(2)))
    assert snippet in line and m.group(3) in line, (line, m.group(3))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The lookup model compiled twice (one TVM build each): with `take` left to the executor's numpy
    kernel, and with the default selector (`take` inside a compiled region, which checks its indices)."""
    cache = str(tmp_path_factory.mktemp("cache"))
    numpy_take = dt.compile(lookup, IDX, cache_dir=cache, selector=OpListSelector(exclude={"take"}))
    in_region = dt.compile(lookup, IDX, cache_dir=cache)
    return numpy_take, in_region


# -------------------------------------------------------------------------------- one per stage
def test_reference_interpreter_names_the_node():
    g = dt.trace(lookup, IDX)
    assert dt.run_reference(g, GOOD).shape == (2, 2, 4)
    with pytest.raises(dt.ExecutionError) as info:
        dt.run_reference(g, BAD)
    assert_names_the_take(info.value)


def test_compiled_model_names_the_node(models):
    model, _ = models
    assert any(n.op == "take" for n in model.graph.walk())       # run by the executor, not in a region
    np.testing.assert_array_equal(model(GOOD), lookup(GOOD))
    with pytest.raises(dt.ExecutionError) as info:
        model(BAD)
    assert_names_the_take(info.value)


def test_loaded_artifact_names_the_node(models, tmp_path):
    models[0].save(str(tmp_path / "lookup.dtvm"))
    loaded = dt.load(str(tmp_path / "lookup.dtvm"))
    with pytest.raises(dt.ExecutionError) as info:
        loaded(BAD)
    assert_names_the_take(info.value)


def test_compiled_region_names_the_op_inside_it(models):
    _, model = models
    assert not any(n.op == "take" for n in model.graph.nodes)
    np.testing.assert_array_equal(model(GOOD), lookup(GOOD))
    for validate in (False, True):
        with pytest.raises(dt.ExecutionError) as info:
            model(BAD, validate=validate)  # the compiled take checks its indices and raises
        assert_names_the_take(info.value, cause=RuntimeError)
        assert re.search(r"\n    in region node '\w+', whose compiled code raised: take: index out of range\n"
                         r"    in foreach node", str(info.value)), str(info.value)


class _FailingVM:
    """Stands in for the TVM VM: every region function raises, as TVM does on a failed run-time check."""

    def __getitem__(self, name):
        def fail(*args):
            raise RuntimeError(f"Check failed: something in {name}")
        return fail


def test_a_failing_region_is_traced_to_the_op_inside_it(models):
    _, model = models
    ex = Executor(model.graph, _FailingVM())
    with pytest.raises(dt.ExecutionError) as info:
        ex.run([BAD[::-1].copy()])         # the numpy reference of the region fails at the take: named
    assert_names_the_take(info.value, iteration=0, cause=RuntimeError)     # the compiled code's error
    assert re.search(r"in region node '\w+', whose compiled code raised: Check failed: something in", str(info.value))
    with pytest.raises(dt.ExecutionError) as info:
        ex.run([GOOD])                     # the reference runs fine: the region, its ops and lines are named
    msg = str(info.value)
    assert re.match(r"region node '\w+' failed: Check failed: something in \w+\n    \(the region computes take; "
                    r"from test_execution_errors.py:\d+: y = F.take\(TABLE, i\)  # the failing take\)", msg), msg
    assert isinstance(info.value.__cause__, RuntimeError)


# ------------------------------------------------------------------------------------ details
def test_nested_control_flow_names_the_innermost_node_once():
    def f(x, idx):
        def body(i, st):
            return F.cond(F.sum(i) >= 0, lambda: F.take(x, i), lambda: F.take(x, i * 0)), st  # cond

        def loop_body(k, acc):
            return F.foreach(body, idx, [])[0], [k + 1, acc]  # foreach
        return F.while_loop(lambda k, acc: k < 2, loop_body, [np.int64(0), x])  # while
    g = dt.trace(f, dt.TensorSpec((3, 4)), IDX)
    with pytest.raises(dt.ExecutionError) as info:
        dt.run_reference(g, TABLE, BAD)
    msg = str(info.value)
    lines = msg.split("\n    ")
    assert lines[0].startswith("take node") and "# cond" in lines[1]
    assert re.fullmatch(r"in cond node '\w+', at test_execution_errors.py:\d+: .*# cond", lines[2])
    assert re.fullmatch(r"in foreach node '\w+', iteration 1, at .*# foreach", lines[3])
    assert re.fullmatch(r"in while_loop node '\w+', iteration 0, at .*# while", lines[4])
    assert len(lines) == 5 and msg.count("take node") == 1
    assert isinstance(info.value.__cause__, IndexError)


def test_runner_rules_read_the_same_in_every_mode(models):
    """A rule of the shared runner: TraceError at the user's line eagerly, ExecutionError naming the node
    in the interpreter and the executor; one text."""
    def f(x):
        return F.foreach(lambda r, s: (F.boolean_mask(r, r > 0), s), x, [])[0]
    x = np.array([[1, 2, -1], [-1, -1, 3]], "float32")
    rule = re.escape("foreach: step output 0 changed shape between iterations (float32[2] then float32[1]); "
                     "per-step outputs are stacked and must keep one shape")
    with pytest.raises(dt.TraceError, match=rule):
        f(x)
    with pytest.raises(dt.ExecutionError, match=r"foreach node '\w+' failed: " + rule) as info:
        dt.run_reference(dt.trace(f, dt.TensorSpec(("T", 3))), x)
    assert type(info.value.__cause__).__name__ == "RuleError"


def test_while_loop_step_outputs_must_keep_their_shape():
    def f(x):
        return F.while_loop(lambda v: F.sum(v > 0) > 0, lambda v: (F.boolean_mask(v, v > 0), [v - 1.0]), [x])
    x = np.array([1.0, 2.0], "float32")
    rule = re.escape("while_loop: step output 0 changed shape between iterations (float32[2] then float32[1])")
    with pytest.raises(dt.TraceError, match=rule):
        f(x)
    with pytest.raises(dt.ExecutionError, match=rule):
        dt.run_reference(dt.trace(f, dt.TensorSpec(("N",))), x)


def test_execution_error_is_exported():
    assert issubclass(dt.ExecutionError, dt.DyntvmError)
    assert "ExecutionError" in dir(dt)


def test_eager_mode_raises_the_same_error():
    """Eager mode has no graph nodes, but a failing kernel still gives an ExecutionError naming the op and
    the user's line, from the cause: the same error a compiled model gives."""
    with pytest.raises(dt.ExecutionError) as info:
        F.take(TABLE, np.array([5]))  # eager take out of range
    msg = str(info.value)
    assert msg.startswith("take failed: take: index out of range for axis 0 of size 3"), msg
    assert_line(msg, r"\n    at ([^:\n]+):(\d+): (.*)", "# eager take out of range")
    assert info.value.op == "take" and isinstance(info.value.__cause__, IndexError)
