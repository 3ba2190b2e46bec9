"""ONNX models whose tensors keep their data in external files: read from the model file's directory, or from
`base_dir=` for a ModelProto, with onnx's checks on the location (no absolute path, no `..`, no symlink out);
never from the current directory."""
import os

import numpy as np
import pytest

import dyntvm as dt
from dyntvm.frontend.onnx import OnnxImportError

import onnx  # noqa: E402
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper as h  # noqa: E402

SECRET = b"top secret bytes"        # 16 bytes: four float32s


def external_tensor(name: str, location: str, n: int = 4):
    """A float32[n] tensor whose data is in the file `location` (as onnx writes it)."""
    t = TP(name=name, data_type=TP.FLOAT, dims=[n], data_location=TP.EXTERNAL)
    for k, v in (("location", location), ("offset", "0"), ("length", str(4 * n))):
        t.external_data.add(key=k, value=v)
    return t


def external_model(location: str, n: int = 4):
    """y = x + w, w a float32[n] initializer whose data is in the file `location`."""
    w = external_tensor("w", location, n)
    g = h.make_graph([h.make_node("Add", ["x", "w"], ["y"])], "m", [h.make_tensor_value_info("x", TP.FLOAT, [n])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [n])], initializer=[w])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def add_of(graph, n=4):
    """What the imported graph adds to x (the initializer's values as the graph holds them)."""
    return np.asarray(dt.run_reference(graph, np.zeros(n, np.float32)))


@pytest.fixture
def secret_in_cwd(tmp_path, monkeypatch):
    """A secret file in the current directory (the importer must not read it)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "secret.txt").write_bytes(SECRET)
    monkeypatch.chdir(cwd)
    return cwd


def test_a_model_proto_with_external_data_and_no_base_dir_is_refused(secret_in_cwd):
    """Was read relative to the current directory: the graph held secret.txt's bytes."""
    m = external_model("secret.txt")
    with pytest.raises(OnnxImportError, match=r"'w'.*external files.*base_dir="):
        dt.from_onnx(m)


def test_a_constant_with_external_data_is_refused_too(secret_in_cwd):
    t = external_tensor("c", "secret.txt")
    g = h.make_graph([h.make_node("Constant", [], ["c"], value=t), h.make_node("Add", ["x", "c"], ["y"])], "m",
                     [h.make_tensor_value_info("x", TP.FLOAT, [4])], [h.make_tensor_value_info("y", TP.FLOAT, [4])])
    with pytest.raises(OnnxImportError, match="external files"):
        dt.from_onnx(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))


def test_base_dir_reads_external_data_from_there(secret_in_cwd, tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    w = np.array([1, 2, 3, 4], np.float32)
    (weights / "w.bin").write_bytes(w.tobytes())
    m = external_model("w.bin")
    np.testing.assert_array_equal(add_of(dt.from_onnx(m, base_dir=weights)), w)
    assert m.graph.initializer[0].data_location == TP.EXTERNAL      # the caller's proto is left as it was
    with pytest.raises(OnnxImportError, match="cannot be read"):    # the secret is not in base_dir
        dt.from_onnx(external_model("secret.txt"), base_dir=weights)


@pytest.mark.parametrize("location, why", [("../cwd/secret.txt", "points outside the directory"),
                                           ("ABSOLUTE", "should be a relative path"),
                                           ("link.txt", "symbolic link")])
def test_base_dir_keeps_onnx_checks_on_the_location(secret_in_cwd, tmp_path, location, why):
    weights = tmp_path / "weights"
    weights.mkdir()
    if location == "ABSOLUTE":
        location = str(secret_in_cwd / "secret.txt")
    if location == "link.txt":
        os.symlink(secret_in_cwd / "secret.txt", weights / "link.txt")
    with pytest.raises(OnnxImportError, match=f"cannot be read.*{why}"):
        dt.from_onnx(external_model(location), base_dir=weights)


def test_a_model_file_reads_external_data_from_its_own_directory(secret_in_cwd, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    w = np.array([5, 6, 7, 8], np.float32)
    (model_dir / "w.bin").write_bytes(w.tobytes())
    onnx.save(external_model("w.bin"), model_dir / "m.onnx")
    np.testing.assert_array_equal(add_of(dt.from_onnx(str(model_dir / "m.onnx"))), w)
    onnx.save(external_model("secret.txt"), model_dir / "leak.onnx")    # names a file of the cwd, not its dir
    with pytest.raises(OnnxImportError, match="cannot be read"):
        dt.from_onnx(model_dir / "leak.onnx")
    onnx.save(external_model("../cwd/secret.txt"), model_dir / "escape.onnx")
    with pytest.raises(OnnxImportError, match="cannot be read.*points outside"):
        dt.from_onnx(model_dir / "escape.onnx")


def test_base_dir_must_be_a_directory(tmp_path):
    with pytest.raises(dt.InputError, match="base_dir must be an existing directory"):
        dt.from_onnx(external_model("w.bin"), base_dir=tmp_path / "nowhere")


def test_base_dir_overrides_a_model_files_own_directory(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "weights").mkdir()
    w = np.array([1, 1, 2, 3], np.float32)
    (tmp_path / "weights" / "w.bin").write_bytes(w.tobytes())
    onnx.save(external_model("w.bin"), tmp_path / "model" / "m.onnx")
    with pytest.raises(OnnxImportError, match="cannot be read"):
        dt.from_onnx(tmp_path / "model" / "m.onnx")
    np.testing.assert_array_equal(add_of(dt.from_onnx(tmp_path / "model" / "m.onnx", base_dir=tmp_path / "weights")), w)
