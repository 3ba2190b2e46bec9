"""Models of our own making, written as torch users write them and exported to ONNX by torch's own exporters
(TorchScript: `dynamo=False`, and dynamo: `torch.export`), with dynamic axes: each imports, compiles once and
equals onnxruntime on the same file at several sizes (`torch_models.py` has the models, `zoo_small.py` the
cases: inputs and sizes; `model_exports.run_case` does the comparison)."""

import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
import zoo_small  # noqa: E402  (tests/ is on sys.path)
from model_exports import check_case  # noqa: E402

pytestmark = pytest.mark.slow

CASES = [(c, e) for c in zoo_small.CASES for e in c.exporters]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dyntvm-cache"))


@pytest.mark.parametrize("case,exporter", CASES, ids=[f"{c.name}-{e}" for c, e in CASES])
def test_exported_model_matches_onnxruntime(case, exporter, cache_dir):
    check_case(case, exporter, cache_dir)
