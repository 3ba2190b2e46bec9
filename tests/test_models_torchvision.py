"""torchvision models (tests/zoo_torchvision.py) with random weights, exported by torch's two exporters with dynamic
batch / image size: each imports, compiles once and matches onnxruntime at >= 3 sizes. A (model, exporter) listed in
`ModelCase.cannot` must fail with exactly the listed reason, so that a fix shows up here; one that neither runs nor
is listed fails."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
if importlib.util.find_spec("torchvision") is None:   # not imported here: tests/torchvision_cpu.py does that
    pytest.skip("torchvision is not installed", allow_module_level=True)

from model_exports import check_case  # noqa: E402  (tests/ is on sys.path)
from zoo_torchvision import CASES  # noqa: E402

pytestmark = pytest.mark.slow

PAIRS = [(case, exporter) for case in CASES for exporter in case.exporters]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dyntvm-cache"))


@pytest.mark.parametrize("case,exporter", PAIRS, ids=[f"{c.name}-{e}" for c, e in PAIRS])
def test_torchvision_model_matches_onnxruntime(case, exporter, cache_dir):
    check_case(case, exporter, cache_dir)
