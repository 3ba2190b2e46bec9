"""Regressions found by a hostile review of the issue-21 hardening (each failed before its fix)."""
import numpy as np
import pytest

import dyntvm as dt

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T, helper as h, numpy_helper as nh  # noqa: E402

from dyntvm.frontend.onnx_ops import OnnxImportError  # noqa: E402


def _model(nodes, inits, out, outtype=T.FLOAT, opset=17):
    g = h.make_graph(nodes, "g", [], [h.make_tensor_value_info(out, outtype, None)], initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def _x():
    return nh.from_array(np.ones((4,), np.float32), "x")


# ------------------------------------------------------------------------------ ONNX folding sizes
def test_onnx_reflect_pad_of_huge_size_is_an_import_error():
    # its index vector was made with np.pad before any size check: a raw numpy MemoryError (64 GiB)
    m = _model([h.make_node("Pad", ["x", "p"], ["y"], mode="reflect")],
               [_x(), nh.from_array(np.array([0, 2 ** 33], np.int64), "p")], "y")
    with pytest.raises(OnnxImportError, match="Pad mode 'reflect'.*more than this machine's memory"):
        dt.from_onnx(m)


def test_onnx_one_hot_of_huge_depth_is_an_import_error():
    # np.arange(depth) was made before any size check: a raw numpy MemoryError (512 GiB)
    m = _model([h.make_node("OneHot", ["i", "d", "v"], ["y"])],
               [nh.from_array(np.array([1], np.int64), "i"), nh.from_array(np.array([2 ** 36], np.int64), "d"),
                nh.from_array(np.array([0, 1], np.float32), "v")], "y")
    with pytest.raises(OnnxImportError, match="OneHot's depth.*more than this machine's memory"):
        dt.from_onnx(m)


def test_onnx_folding_out_of_process_memory_is_an_import_error(monkeypatch):
    # a fold under the machine's memory but over what the process may allocate (ulimit -v, a cgroup) gave a
    # raw MemoryError: in a converter, and when the folded output is copied into the graph
    from dyntvm.frontend import onnx_ops, tracer

    def oom(*_a, **_k):
        raise MemoryError("Unable to allocate 4.00 GiB")
    m = _model([h.make_node("Tile", ["x", "r"], ["y"])], [_x(), nh.from_array(np.array([2], np.int64), "r")], "y")
    monkeypatch.setitem(onnx_ops.CONVERTERS, "Tile", oom)
    with pytest.raises(OnnxImportError, match="more memory than this process can allocate"):
        dt.from_onnx(m)
    monkeypatch.undo()
    monkeypatch.setattr(tracer.Builder, "constant", oom)
    with pytest.raises(OnnxImportError, match="more memory than this process can allocate"):
        dt.from_onnx(m)


# ------------------------------------------------------------------------------ torch inputs
def test_torch_nested_tensor_error_does_not_blame_the_dtype():
    # a nested float32 tensor was refused with "dyntvm has no tensors of this dtype" (float32 is one)
    torch = pytest.importorskip("torch")
    from dyntvm.errors import InputError
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # torch: nested tensors are a prototype
        x = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(InputError, match="cannot be read as an array") as e:
        dt.F.add(x, 1.0)
    assert "no tensors of this dtype" not in str(e.value)


# ------------------------------------------------------------------------------ // and % compiled vs numpy
def _edge_values(dtype):
    d = np.dtype(dtype)
    if d.kind in "iu":
        ii = np.iinfo(d)
        v = [ii.min, ii.min + 1, -3, -1, 0, 1, 2, 3, 7, ii.max - 1, ii.max]
        return np.array([x for x in v if ii.min <= x <= ii.max], d)
    return np.array([0.0, -0.0, 1.0, -1.0, 0.1, 3.0, -3.0, 7.5, np.inf, -np.inf, np.nan, 1e-30,
                     np.finfo(d).max, np.finfo(d).tiny], d)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint64", "float16", "float32", "float64"])
def test_floor_divide_and_mod_compiled_match_numpy_bitwise(dtype):
    # int32 / int64 x // -1 compiled to 0 for every x (silent wrong answer); 0.0 // -1.0 gave +0.0 (numpy: -0.0)
    import itertools
    v = _edge_values(dtype)
    a, b = (np.array(p, dtype) for p in zip(*itertools.product(v, v)))
    spec = dt.TensorSpec(("n",), dtype)
    q, r = dt.compile(lambda x, y: (x // y, x % y), spec, spec)(a, b)
    with np.errstate(all="ignore"):
        eq, er = np.floor_divide(a, b), np.mod(a, b)
    for got, exp in ((q, eq), (r, er)):
        got = np.asarray(got)
        assert got.dtype == exp.dtype
        if exp.dtype.kind == "f":        # bit for bit: signed zeros count; any NaN matches any NaN
            same = (got.view(f"u{exp.itemsize}") == exp.view(f"u{exp.itemsize}")) | (np.isnan(got) & np.isnan(exp))
        else:
            same = got == exp
        bad = np.flatnonzero(~same)
        assert bad.size == 0, [(a[i], b[i], got[i], exp[i]) for i in bad[:5]]


# ------------------------------------------------------------------------------ staging cleanup
@pytest.mark.parametrize("tag", ["dyntvm-new", "dyntvm-old"])
def test_stale_cleanup_leaves_other_users_folders(tmp_path, monkeypatch, tag):
    # a dead writer's staging folder was removed (or, "old" with no artifact, renamed into place as the
    # artifact) whoever owned it: in a shared folder another user's could be deleted or planted
    import os
    from dyntvm.runtime import staging
    folder = tmp_path / f".model.{tag}-999999999-ab12"
    folder.mkdir()
    (folder / "manifest.json").write_text("{}")
    monkeypatch.setattr(os, "getuid", lambda: os.stat(folder).st_uid + 1)     # as seen by another user
    staging.remove_stale(str(tmp_path / "model"))
    assert folder.is_dir() and not (tmp_path / "model").exists()
    monkeypatch.undo()
    staging.remove_stale(str(tmp_path / "model"))                              # this user's: cleaned up
    assert not folder.exists()


# ------------------------------------------------------------------------------ tuning logs
@pytest.mark.parametrize("secs", [[-1e300], [-1.0], [0.0], [1e300]])
def test_tuning_record_with_impossible_run_time_is_skipped(tmp_path, secs):
    # run_secs -1e300 passed the "finite mean" check; TVM then refused the whole database with a raw
    # RuntimeError (float32 overflow), and a negative time ranked a record above every measured one
    import json
    import shutil
    from pathlib import Path
    from dyntvm.codegen.tuning_trust import RECORDS, load_checked_database
    src = Path(__file__).resolve().parent.parent / "tuning_logs" / "lstm" / "llvm-znver4-2c"
    log = tmp_path / "log"
    shutil.copytree(src, log)
    lines = [json.loads(x) for x in (log / RECORDS).read_text().splitlines() if x.strip()]
    first = lines[0][0]
    kept = [r for r in lines if r[0] == first]
    lines.append([first, [kept[0][1][0], secs, kept[0][1][2], kept[0][1][3]]])
    (log / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in lines))
    db, rejected = load_checked_database(str(log))
    records = db.get_all_tuning_records()
    assert records and all(0 < float(s) < 1e10 for r in records for s in r.run_secs)
