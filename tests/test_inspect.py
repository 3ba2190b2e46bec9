"""`dyntvm inspect model.onnx` and `dt.inspect_onnx`: which ONNX nodes (by the model's names) landed in which
compiled region, which run as dynamic-shape ops or control flow in the executor, and every op without a
converter listed at once with its domain, opset and node names. The CLI runs as a real subprocess."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import dyntvm as dt


def _vi(name, dtype, shape):
    return h.make_tensor_value_info(name, dtype, shape)


def dynamic_model():
    """x[N, 4]: a region (relu, square, compare), NonZero (a dynamic-shape op) and a Transpose after it, a Loop
    adding 1 `trips` times (its body's Add in a region of its own), a Tanh in a last region."""
    body = h.make_graph(
        [h.make_node("Add", ["acc_in", "one"], ["acc_out"], name="body_add"),
         h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in", TP.FLOAT, ["N", 4])],
        [_vi("cond_out", TP.BOOL, []), _vi("acc_out", TP.FLOAT, ["N", 4])],
        [h.make_tensor("one", TP.FLOAT, [], [1.0])])
    nodes = [h.make_node("Relu", ["x"], ["r"], name="stem_relu"),
             h.make_node("Mul", ["r", "r"], ["sq"], name="stem_square"),
             h.make_node("Greater", ["x", "zero"], ["pos"], name="mask_gt"),
             h.make_node("NonZero", ["pos"], ["nz"], name="find_positive"),
             h.make_node("Transpose", ["nz"], ["nzt"], name="nz_transpose"),
             h.make_node("Loop", ["trips", "", "sq"], ["acc"], name="repeat_loop", body=body),
             h.make_node("Tanh", ["acc"], ["y"], name="head_tanh")]
    g = h.make_graph(nodes, "dyn", [_vi("x", TP.FLOAT, ["N", 4]), _vi("trips", TP.INT64, [])],
                     [_vi("y", TP.FLOAT, ["N", 4]), _vi("nzt", TP.INT64, None)],
                     [h.make_tensor("zero", TP.FLOAT, [], [0.0])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def unsupported_model(opset=11):
    """One op without a converter (MaxUnpool) among supported ones, at `opset`."""
    nodes = [h.make_node("Relu", ["x"], ["a"], name="pre_relu"),
             h.make_node("MaxUnpool", ["a", "idx"], ["y"], name="decoder_unpool_3", kernel_shape=[2, 2])]
    g = h.make_graph(nodes, "unpool", [_vi("x", TP.FLOAT, [1, 1, 2, 2]), _vi("idx", TP.INT64, [1, 1, 2, 2])],
                     [_vi("y", TP.FLOAT, None)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def several_unsupported_model():
    """Three op types without a converter: two LpPool nodes, one unnamed MaxUnpool inside an If branch, and a
    custom-domain op; plus supported nodes around them."""
    branch = h.make_graph([h.make_node("MaxUnpool", ["a", "idx"], ["u"], kernel_shape=[2, 2])], "then", [],
                          [_vi("u", TP.FLOAT, None)])
    other = h.make_graph([h.make_node("Identity", ["a"], ["v"], name="else_id")], "else", [],
                         [_vi("v", TP.FLOAT, None)])
    nodes = [h.make_node("Relu", ["x"], ["a"], name="pre_relu"),
             h.make_node("LpPool", ["a"], ["p1"], name="pool_a", kernel_shape=[2, 2]),
             h.make_node("LpPool", ["p1"], ["p2"], name="pool_b", kernel_shape=[1, 1]),
             h.make_node("If", ["c"], ["b"], name="maybe_unpool", then_branch=branch, else_branch=other),
             h.make_node("Smash", ["b", "p2"], ["y"], name="acme_smash", domain="com.acme")]
    g = h.make_graph(nodes, "several", [_vi("x", TP.FLOAT, [1, 1, 4, 4]), _vi("idx", TP.INT64, [1, 1, 4, 4]),
                                        _vi("c", TP.BOOL, [])], [_vi("y", TP.FLOAT, None)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13), h.make_opsetid("com.acme", 3)])


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = dict(os.environ)
    e["DYNTVM_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    return e


def dyntvm(env, *args):
    return subprocess.run([sys.executable, "-m", "dyntvm", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


def by_name(report: dict) -> dict:
    return {n["name"]: n for n in report["nodes"]}


def kinds(node: dict) -> set:
    return {p["kind"] for p in node["places"]}


def regions_of(node: dict) -> set:
    return {p["where"] for p in node["places"] if p["kind"] == "region"}


def test_inspect_shows_regions_dynamic_ops_and_the_loop(env, tmp_path):
    path = tmp_path / "dyn.onnx"
    onnx.save(dynamic_model(), str(path))
    r = dyntvm(env, "inspect", path, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    nodes = by_name(report)
    assert report["ok"] and report["onnx_nodes"] == 9 and set(nodes) == {
        "stem_relu", "stem_square", "mask_gt", "find_positive", "nz_transpose", "repeat_loop", "head_tanh",
        "body_add", "body_cond"}
    stem = regions_of(nodes["stem_relu"])
    assert len(stem) == 1 and stem == regions_of(nodes["stem_square"]) == regions_of(nodes["mask_gt"])
    assert kinds(nodes["find_positive"]) == {"dynamic"} and nodes["find_positive"]["places"][0]["ops"] == ["nonzero"]
    assert "control_flow" in kinds(nodes["repeat_loop"])
    assert {p["ops"][0] for p in nodes["repeat_loop"]["places"] if p["kind"] == "control_flow"} == {"while_loop"}
    body = regions_of(nodes["body_add"])
    assert len(body) == 1 and not body & stem and not body & regions_of(nodes["head_tanh"])
    assert "region" not in kinds(nodes["nz_transpose"])
    assert kinds(nodes["body_cond"]) == {"import"}             # an Identity: no op of its own
    assert set(report["regions"]) == stem | body | regions_of(nodes["head_tanh"])
    assert report["counts"]["dynamic"] == 1 and report["counts"]["control_flow"] == 1

    r = dyntvm(env, "inspect", path)                           # the text form: summary and per-node table
    assert r.returncode == 0, r.stderr
    assert "dynamic-shape op (executor): find_positive (NonZero)" in r.stdout
    assert "control flow (executor): repeat_loop (Loop)" in r.stdout
    (region,) = stem
    assert f"  {region}: 3 ONNX nodes (Greater 1, Mul 1, Relu 1)" in r.stdout
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith(("stem_", "find_", "body_"))}
    assert f"region {region}" in rows["stem_relu"] and "dynamic nonzero" in rows["find_positive"]
    summary = "\n".join(dt.inspect_onnx(str(path)).summary_lines())    # what --summary prints: no table
    assert "find_positive (NonZero)" in summary and "ONNX node " not in summary


def test_the_inspected_model_runs_as_onnxruntime_does(tmp_path):
    """The model the placement test reads is a real one: compiled, it equals onnxruntime at N = 0, 1, 5."""
    ort = pytest.importorskip("onnxruntime")
    path = str(tmp_path / "dyn.onnx")
    onnx.save(dynamic_model(), path)
    compiled = dt.compile(dt.from_onnx(path), cache_dir=str(tmp_path / "cache"))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for n, trips in ((0, 2), (1, 0), (5, 3)):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        t = np.asarray(trips, np.int64)
        want = session.run(None, {"x": x, "trips": t})
        got = compiled(x, t)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)


def test_an_unsupported_op_is_named_with_its_opset_and_node(env, tmp_path):
    path = tmp_path / "unpool.onnx"
    onnx.save(unsupported_model(opset=11), str(path))
    r = dyntvm(env, "inspect", path)
    assert r.returncode == 1
    assert "unsupported MaxUnpool (ai.onnx opset 11): 1 node(s): decoder_unpool_3" in r.stdout
    assert "cannot be imported: 1 op type(s) without a converter" in r.stderr and "Traceback" not in r.stderr
    report = dt.inspect_onnx(str(path)).to_json()             # what --json prints
    assert not report["ok"] and report["unsupported"] == [
        {"op": "MaxUnpool", "domain": "ai.onnx", "opset": 11, "nodes": ["decoder_unpool_3"]}]
    with pytest.raises(dt.UnsupportedOpError, match=r"MaxUnpool \(ai.onnx opset 11: node 'decoder_unpool_3'\)"):
        dt.from_onnx(str(path))                                # the import error says the same


def test_every_unsupported_op_is_listed_at_once(env, tmp_path):
    path = tmp_path / "several.onnx"
    onnx.save(several_unsupported_model(), str(path))
    r = dyntvm(env, "inspect", path, "--json")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["unsupported"] == [
        {"op": "LpPool", "domain": "ai.onnx", "opset": 13, "nodes": ["pool_a", "pool_b"]},
        {"op": "MaxUnpool", "domain": "ai.onnx", "opset": 13, "nodes": ["<unnamed MaxUnpool #5>"]},
        {"op": "Smash", "domain": "com.acme", "opset": 3, "nodes": ["acme_smash"]}]
    text = "\n".join(dt.inspect_onnx(str(path)).summary_lines())    # what the text form prints
    for line in ("unsupported LpPool (ai.onnx opset 13): 2 node(s): pool_a, pool_b",
                 "unsupported Smash (com.acme opset 3): 1 node(s): acme_smash",
                 "not imported: 3 op type(s) without a converter (4 nodes)"):
        assert line in text, text


def test_the_python_api_names_unnamed_and_repeated_nodes_and_leaves_the_model_alone():
    m = dynamic_model()
    m.graph.node[0].name = ""                                  # stem_relu unnamed
    m.graph.node[2].name = "stem_square"                       # mask_gt named as stem_square
    info = dt.inspect_onnx(m)
    assert info.ok and info.path == "<ModelProto>"
    names = [r.name for r in info.nodes]
    assert names[:3] == ["<unnamed Relu #0>", "stem_square #1", "stem_square #2"] and len(set(names)) == len(names)
    assert [r.kinds for r in info.nodes[:3]] == [["region"]] * 3
    assert [n.name for n in m.graph.node[:3]] == ["", "stem_square", "stem_square"]
    assert info.graph is not None and sum(n.op == "region" for n in info.graph.walk()) == len(info.regions)


def test_a_converter_refusal_is_reported_with_the_node(env, tmp_path):
    """A form of a supported op dyntvm does not take (a batch-first LSTM) stops the import: reported, not raised."""
    nodes = [h.make_node("Relu", ["x"], ["a"], name="ok_relu"),
             h.make_node("LSTM", ["a", "W", "R"], ["y"], name="batch_first_lstm", hidden_size=2, layout=1)]
    g = h.make_graph(nodes, "e", [_vi("x", TP.FLOAT, [3, 2, 4])], [_vi("y", TP.FLOAT, None)],
                     [h.make_tensor("W", TP.FLOAT, [1, 8, 4], np.zeros(32)),
                      h.make_tensor("R", TP.FLOAT, [1, 8, 2], np.zeros(16))])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 14)])
    info = dt.inspect_onnx(m)
    assert not info.ok and not info.unsupported and not info.nodes
    assert "ONNX node 'batch_first_lstm' (LSTM)" in info.error and "layout=1" in info.error
    onnx.save(m, str(tmp_path / "lstm.onnx"))
    r = dyntvm(env, "inspect", tmp_path / "lstm.onnx")
    assert r.returncode == 1 and "batch_first_lstm" in r.stdout and "Traceback" not in r.stderr
