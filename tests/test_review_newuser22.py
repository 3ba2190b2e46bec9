"""Found by a new user of issue 22's lists (a shrinking beam search, a run-time ONNX sequence, the command line).

* `F.list_concat` of an empty list of rank-1 rows (`F.list_empty("float32", 1)`: the finished hypotheses of a
  beam search where none finished) was an ExecutionError although the result, float32[0], is fully determined:
  the joined axis is 0 long whatever the elements' lengths. Now an empty tensor wherever every dim but the
  axis is known (eager, reference interpreter, compiled).
* `dyntvm run` flattened a list output into output_<i>.npy files, one per element, so the files of the outputs
  after it were numbered by the list's run-time length; and a list input could not be given at all. A list
  output is now DIR/output_<i>.npz (elements arr_0, arr_1, ...), and an .npz is taken for a list input.
* `dyntvm inspect ART` printed a list input or output as "None[]".
* `dyntvm compile` could not declare a list input (nor a dim of its own, TensorSpec's None): now
  `--input 'parts:[?,8]'` (a list of float32[?,8]) and `?` for a dim.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.errors import ExecutionError, InputError
from dyntvm.loader import parse_input_spec


def finished_scores(scores, n_done):
    """The first n_done scores as rows of a list, concatenated (a list of rows of any length)."""
    def body(i, done):
        return i + 1, F.list_append(done, F.slice(scores, F.reshape(i, (1,)), F.reshape(i + 1, (1,))))
    _, done = F.while_loop(lambda i, done: i < n_done, body, [np.int64(0), F.list_empty("float32", 1)])
    rows = F.list_empty("float32", (None, 3))          # the joined axis unknown, the other one known
    return F.list_concat(done, 0), F.list_concat(rows, 0), F.list_length(done)


def numpy_finished(scores, n_done):
    return scores[:n_done], np.zeros((0, 3), np.float32), np.int64(n_done)


@pytest.fixture(scope="module")
def compiled():
    return dt.compile(finished_scores, dt.TensorSpec(("K",)), dt.TensorSpec((), "int64"))


@pytest.mark.parametrize("k,n_done", [(0, 0), (1, 0), (1, 1), (5, 0), (5, 3)])
def test_list_concat_of_an_empty_list_is_empty_where_only_the_axis_is_unknown(compiled, k, n_done):
    scores = np.arange(k, dtype=np.float32) * 0.5 - 1
    want = numpy_finished(scores, n_done)
    graph = dt.trace(finished_scores, dt.TensorSpec(("K",)), dt.TensorSpec((), "int64"))
    for got in (finished_scores(scores, np.int64(n_done)), dt.run_reference(graph, scores, np.int64(n_done)),
                compiled(scores, np.int64(n_done))):
        for g, w in zip(got, want):
            assert np.shape(g) == np.shape(w) and np.asarray(g).dtype == w.dtype
            np.testing.assert_array_equal(g, w)


def test_list_concat_of_an_empty_list_still_refuses_an_unknown_other_dim():
    def f(x):
        return F.list_concat(F.list_empty("float32", (None, None)), 0) + F.sum(x)
    with pytest.raises(ExecutionError, match="list_concat of an empty list"):
        dt.run_reference(dt.trace(f, dt.TensorSpec(("N",))), np.ones(2, np.float32))


def test_list_concat_keeps_the_graph_of_a_fully_known_element():
    """An element type with every dim known records it as before (the graph hash of such models is kept)."""
    g = dt.trace(lambda x: F.list_concat(F.list_append(F.list_empty("float32", (2, 3)), x), 0),
                 dt.TensorSpec((2, 3)))
    node = next(n for n in g.nodes if n.op == "list_concat")
    assert node.attrs.empty_shape == (2, 3)


def test_input_spec_takes_a_list_and_a_dim_of_its_own():
    spec = parse_input_spec("parts:[?,8]")
    assert spec == dt.ListSpec(dt.TensorSpec((None, 8)), name="parts")
    assert parse_input_spec("x:?,N:int64") == dt.TensorSpec((None, "N"), "int64", name="x")
    with pytest.raises(InputError, match=r"a list input is NAME:\[DIMS\]:DTYPE"):
        parse_input_spec("x:[?,8")


MODEL_FILE = """
from dyntvm import F

def rows_model(parts, x):
    rows = F.split_to_list(F.list_concat(parts, 0), None, 0, keepdims=False)
    return rows, F.sum(x) + F.cast(F.list_length(rows), "float32")
"""


@pytest.mark.slow           # three subprocesses (compile, inspect, run): 30-70 s on a busy 2-core machine
def test_run_command_saves_a_list_output_as_one_npz_and_takes_a_list_input(tmp_path):
    """Compiled from the command line (`--input 'parts:[?,2]'`), run from the command line."""
    (tmp_path / "rows.py").write_text(MODEL_FILE)
    art = tmp_path / "rows.dtvm"
    r = subprocess.run([sys.executable, "-m", "dyntvm.cli", "compile", f"{tmp_path / 'rows.py'}:rows_model",
                        "--input", "parts:[?,2]", "--input", "x:N", "-o", str(art)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "dyntvm.cli", "inspect", str(art)], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ))        # printed a list as "None[]"
    assert r.returncode == 0 and "None[]" not in r.stdout, r.stdout + r.stderr
    assert re.search(r"input parts: list\[float32\[\w+,2\] x \w+\]", r.stdout), r.stdout
    assert re.search(r"output 0: list\[float32\[2\] x \w+\]", r.stdout), r.stdout
    parts = [np.arange(6, dtype=np.float32).reshape(3, 2), np.ones((1, 2), np.float32)]
    np.savez(tmp_path / "parts.npz", *parts)
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "dyntvm.cli", "run", str(art), "--input", f"parts={tmp_path / 'parts.npz'}",
                        "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out), "--repeat", "1"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert "output 0: list of 4: float32[2], float32[2], float32[2], float32[2]" in r.stdout, r.stdout
    assert sorted(os.listdir(out)) == ["output_0.npz", "output_1.npy"]
    with np.load(out / "output_0.npz") as z:
        got = [z[f"arr_{k}"] for k in range(len(z.files))]
    want = list(np.concatenate(parts))
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    np.testing.assert_array_equal(np.load(out / "output_1.npy"), np.float32(4 + 4))


def test_run_command_refuses_an_npz_not_written_by_savez_of_a_list(tmp_path):
    from dyntvm.cli import _npz_list
    np.savez(tmp_path / "bad.npz", first=np.ones(2))
    with pytest.raises(InputError, match="named arr_0, arr_1"):
        _npz_list("parts=bad.npz", "bad.npz", np.load(tmp_path / "bad.npz"), True)
    np.savez(tmp_path / "two.npz", np.ones(2), np.zeros(3))
    with pytest.raises(InputError, match=r"is an .npz archive; give one array as a .npy file \(an .npz is for a list"):
        _npz_list("x=two.npz", "two.npz", np.load(tmp_path / "two.npz"), False)
    got = _npz_list("parts=two.npz", "two.npz", np.load(tmp_path / "two.npz"), True)
    assert [a.shape for a in got] == [(2,), (3,)]
    np.savez(tmp_path / "none.npz")
    assert _npz_list("parts=none.npz", "none.npz", np.load(tmp_path / "none.npz"), True) == []


def test_a_negative_one_hot_depth_at_run_time_names_one_hot():
    """The run-time check of a depth tensor is a fill of `depth` zeros: its error read 'broadcast_to_dyn ...
    the shape [-1] has a negative entry' at the user's line, with no word of one_hot."""
    def one_hot_of(x, depth):
        return F.one_hot(x, depth)
    graph = dt.trace(one_hot_of, dt.TensorSpec(("N",), "int64"), dt.TensorSpec((), "int64"))
    np.testing.assert_array_equal(dt.run_reference(graph, np.array([0, 2, 1]), np.int64(3)), np.eye(3)[[0, 2, 1]])
    with pytest.raises(ExecutionError, match=r"(?s)negative entry \(-1\).*the depth of one_hot is >= 0"):
        dt.run_reference(graph, np.array([0, 2, 1]), np.int64(-1))
