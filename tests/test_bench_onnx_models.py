"""benchmarks/bench_onnx_models.py: finds the zoo suites, measures a real case (it matched onnxruntime first), and
reports a case that cannot run, or fails, with its reason instead of stopping."""
import os
import sys
import types

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_onnx_models as bench  # noqa: E402
from model_exports import ModelCase  # noqa: E402

QUICK = types.SimpleNamespace(threads=1, size_index=-1, rounds=1, block_s=0.01, pause_s=0.0)


def _broken():
    raise RuntimeError("this model cannot be built")


def test_the_suites_are_found_by_name():
    zoos = bench.load_zoos(["small"])
    assert [c.name for c in zoos["small"]] == ["small_cnn", "small_bert", "gru_step", "greedy_loop"]
    with pytest.raises(SystemExit, match="no tests/zoo_<name>.py for nonesuch"):
        bench.load_zoos(["nonesuch"])


def test_a_case_is_checked_then_timed_and_failures_are_rows(tmp_path):
    gru = next(c for c in bench.load_zoos(["small"])["small"] if c.name == "gru_step")
    row = bench.bench_case(gru, "torchscript", QUICK, str(tmp_path))
    assert row["match"] == "yes" and row["builds"] == 1 and row["sizes"] == ["1", "3", "8"]
    assert row["onnx_nodes"] > 10 and row["regions"] >= 1 and row["timed_size"] == "8"
    assert row["ort_ms"] > 0 and row["dyntvm_ms"] > 0 and row["ratio"] == row["dyntvm_ms"] / row["ort_ms"]
    assert row["torch_ms"] > 0 and "torch" not in row           # torch eager timed too: the best peer's ratio
    assert row["ratio_best"] == row["dyntvm_ms"] / min(row["ort_ms"], row["torch_ms"])

    cannot = ModelCase("listed", _broken, None, [1], cannot={"dynamo": "the exporter refuses it"})
    assert bench.bench_case(cannot, "dynamo", QUICK, str(tmp_path)) == {
        "model": "listed", "exporter": "dynamo", "match": "cannot: the exporter refuses it"}
    failed = bench.bench_case(ModelCase("broken", _broken, None, [1]), "torchscript", QUICK, str(tmp_path))
    assert failed["match"] == "RuntimeError: this model cannot be built" and "ratio" not in failed

    report = {"machine": {"cpu": "cpu", "cores": 1, "loadavg": [0.5], "loadavg_end": [0.5]}, "versions": {},
              "threads": 1, "rounds": 1, "block_s": 0.01, "total_s": 1.0, "rows": [row, failed]}
    table = bench.markdown(report).splitlines()
    assert table[-2].startswith("| gru_step | torchscript | ") and f"| {row['ratio']:.2f} |" in table[-2]
    assert table[-1].startswith("| broken | torchscript |") and "RuntimeError: this model cannot be built" in table[-1]
