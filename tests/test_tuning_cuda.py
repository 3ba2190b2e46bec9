"""CUDA autotuning (`dt.tune(..., target="cuda")`, `dyntvm tune --target cuda`).

Tuning times candidates on a GPU, so the end-to-end tune skips without one. Applying a CUDA log needs no GPU
(a CUDA build runs anywhere nvcc is): the build tests here make a log from MetaSchedule's real CUDA search
space (its candidates timed by MetaSchedule's dummy runner instead of a GPU), then check that a CUDA build
with it schedules exactly the log's winning kernels with their tuned traces and still holds device code. On
a GPU host the same builds also run and must match numpy at the hinted size and others."""
import json
import os
import shutil
import tempfile

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen import tuning
from dyntvm.codegen.build import stats, tuning_tasks
from dyntvm.codegen.backends.cuda.gpu import cuda_target, gpu_present
from dyntvm.pipeline import partition_graph
from dyntvm.runtime.artifact import kernel_binding
from helpers import assert_same
from test_cuda import assert_device_code, needs_gpu, needs_nvcc

pytestmark = pytest.mark.slow

W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)


def model(x):
    """Two kernels after fusion (a matmul, a softmax); N symbolic."""
    return F.softmax(F.matmul(x, W), axis=-1)


SPEC = dt.TensorSpec(("N", 64))


def searched_log(fn, spec, target, search_target, path: str, trials: int = 4, strategy: str = "evolutionary") -> dict:
    """A log at `path` for `fn` at N=16 made by MetaSchedule's search over each kernel for `search_target`, its
    candidates 'timed' by the dummy runner: a database of real schedules (for CUDA: sampled from the design
    space and checked by its GPU postprocessors; "replay-trace": random samples of it, much faster), every kernel
    marked as won by its tuned schedule. Returns
    ``{workload key: kernel name}``."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
    from tvm.s_tir.meta_schedule.testing.dummy_object import DummyRunner

    @derived_object
    class FileBuilder(PyBuilder):       # no build: an empty artifact file for the runner to ignore
        def build(self, build_inputs):
            out = []
            for _ in build_inputs:
                artifact = os.path.join(tempfile.mkdtemp(prefix="dyntvm-ms-"), "x.so")
                open(artifact, "w").close()
                out.append(BuilderResult(artifact, None))
            return out
    os.makedirs(path)
    graph = dt.trace(fn, spec)
    pg = partition_graph(graph)
    table, kernels, failed = tuning_tasks(pg, {"N": [16]}, target)
    assert not failed, failed
    db = ms.database.JSONDatabase(work_dir=path)
    for name, func in kernels.values():
        with tuning._meta_schedule_logging():       # pytest's handlers would break MetaSchedule's logging setup
            ms.tune_tir(tuning._main_mod(tuning.task_func(func)), search_target, os.path.join(path, "logs"),
                        max_trials_global=trials, num_trials_per_iter=trials, builder=FileBuilder(),
                        runner=DummyRunner(), database=db, cost_model="random", strategy=strategy, seed=0)
    tuning.write_manifest(path, {
        "format": tuning.FORMAT, "model": graph.name, "model_hash": kernel_binding(pg),
        **tuning.target_identity(target), "hints": {"N": [16]},
        "specialized": {r: [[c, n] for c, n in specs] for r, specs in table.items()}, "not_specialized": {},
        "kernels": [{"workload": k, "name": n, "status": "done", "default_us": 2.0, "tuned_us": 1.0, "use": "tuned"}
                    for k, (n, _) in kernels.items()]})
    return {k: n for k, (n, _) in kernels.items()}


def tvm_cuda_limits(target):
    import tvm
    return tvm.target.Target({**dict(target.export()), "max_threads_per_block": 1024, "thread_warp_size": 32,
                              "max_shared_memory_per_block": 49152})


@pytest.fixture(scope="module")
def cuda_log(tmp_path_factory):
    """A CUDA log for `model` at N=16 whose every kernel is marked as won by its tuned schedule."""
    path = str(tmp_path_factory.mktemp("cuda-tune") / "model")
    target = cuda_target()
    kernels = searched_log(model, SPEC, target, target if "max_threads_per_block" in target.attrs
                           else tvm_cuda_limits(target), path)
    assert len(kernels) == 2, kernels
    return path


def _compile(log, **kw):
    before = stats.tuned_kernels
    m = dt.compile(model, SPEC, target="cuda", tuning_log=log, use_cache=False, **kw)
    return m, stats.tuned_kernels - before


@needs_nvcc
def test_a_cuda_build_applies_the_logs_winning_kernels(cuda_log, tmp_path):
    m, tuned = _compile(cuda_log)
    assert tuned == 2                               # both kernels of the N=16 build, with their tuned traces
    assert m.info["tuning"]["specialized"] == {"model_r0": [[{"N": 16}, "model_r0__at_N16"]]}
    m.save(str(tmp_path / "art"))
    assert_device_code(str(tmp_path / "art" / "kernels.so"), m.info["cuda_arch"])
    if gpu_present():
        x16 = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)
        x5 = x16[:5].copy()
        for x in (x16, x5, x16[:1].copy()):
            assert_same(m(x), model(x))
        assert m.specialized_calls == 1


def _edited_copy(log: str, path: str, edit) -> str:
    """A copy of `log` at `path` whose manifest `edit(manifest)` changed."""
    shutil.copytree(log, path)
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    edit(manifest)
    tuning.write_manifest(path, manifest)
    return path


@needs_nvcc
def test_kernels_whose_default_won_keep_dlight_schedules(cuda_log, tmp_path):
    path = _edited_copy(cuda_log, str(tmp_path / "defaults"), lambda m: m["kernels"][0].update(use="default"))
    _, tuned = _compile(path)
    assert tuned == 1


@needs_nvcc
def test_a_cpu_log_is_not_applied_to_a_cuda_build(cuda_log, tmp_path):
    path = _edited_copy(cuda_log, str(tmp_path / "cpu"),
                        lambda m: m.update(tuning.target_identity(dt.codegen.build.concrete_target("cpu"))))
    with pytest.warns(tuning.TuningWarning, match="made for another target"):
        m, tuned = _compile(path)
    assert tuned == 0 and "tuning" not in m.info


@pytest.mark.skipif(gpu_present(), reason="checks the error given where there is no GPU")
def test_cuda_tuning_needs_a_gpu(tmp_path):
    with pytest.raises(dt.CompileError, match="needs a GPU here"):
        dt.tune(model, SPEC, target="cuda", log_dir=str(tmp_path / "x"), progress=False)


@needs_gpu
def test_a_cuda_tune_on_the_gpu_writes_a_log_that_applies(tmp_path):
    """The whole flow on a GPU: MetaSchedule (XGBoost) candidates timed on it against dlight's defaults."""
    path = dt.tune(model, SPEC, target="cuda", trials=8, shape_hints={"N": [16]}, log_dir=str(tmp_path / "log"),
                   progress=False)
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["target_key"] == tuning.target_key(cuda_target()) and manifest["gpu"]
    assert len(manifest["kernels"]) == 2
    for k in manifest["kernels"]:
        assert k["status"] == "done", k
        assert k["default_us"] > 0 and k["tuned_us"] > 0
        assert k["use"] == k["verdict"]["use"] and k["verdict"]["compared"] == "kernel alone"
        k["use"] = "tuned"                          # apply both, whichever won on this GPU
    tuning.write_manifest(path, manifest)
    m, tuned = _compile(path)
    assert tuned == 2
    x16 = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    for x in (x16, x16[:7].copy(), x16[:1].copy()):
        assert_same(m(x), model(x))
    assert m.specialized_calls == 1


@needs_nvcc
def test_the_shipped_cuda_log_applies_to_a_cuda_build(monkeypatch):
    """tuning_logs/detection/cuda-sm_90 (tuned on an H100) is picked up by a CUDA build for sm_90, on any
    machine: its kernels that the build still has are built with their tuned traces. Of its two winners,
    `greater` still applies; `dt_max` (the NaN-propagating max) is lowered for GPUs as an integer-key max since
    (`te_kernels.te_nan_reduce_keyed`, which a thread block can reduce), a new workload the log has no record of
    until it is tuned again on a GPU."""
    from dyntvm import examples
    from dyntvm.pipeline import shipped_logs
    monkeypatch.setenv("DYNTVM_TUNING_LOGS", os.path.join(os.path.dirname(os.path.dirname(__file__)), "tuning_logs"))
    monkeypatch.setenv("DYNTVM_CUDA_ARCH", "sm_90")
    if gpu_present() and tuning.target_key(cuda_target()) != "cuda-sm_90":
        pytest.skip("the local GPU is not sm_90: the shipped log is for sm_90")
    with open(os.path.join(shipped_logs(), "detection", "cuda-sm_90", "manifest.json")) as f:
        won = sum(k["use"] == "tuned" for k in json.load(f)["kernels"])
    ex = examples.get("detection")
    before = stats.tuned_kernels
    m = dt.compile(ex.fn, *ex.specs, target="cuda", use_cache=False)
    assert won == 2 and stats.tuned_kernels - before == 1
    assert m.info["tuning"]["log"].endswith(os.path.join("detection", "cuda-sm_90"))
    assert "tuning: {" in str(m)           # print(model) names the log


def test_a_cuda_tune_for_the_local_arch_named_uses_the_local_gpus_target(monkeypatch, tmp_path):
    """`target="cuda:sm_90"` on an sm_90 GPU tunes with the GPU's own target, as `target="cuda"` does: the bare
    "cuda -arch=sm_90" lacks the limits MetaSchedule needs (max_threads_per_block...), and every kernel failed.
    (A GPU host is simulated: `cuda_target()` answering with the local GPU's full target.)"""
    from dyntvm.codegen.backends.cuda import gpu
    plain = gpu.cuda_target
    local = tvm_cuda_limits(plain("sm_90"))
    monkeypatch.setattr(gpu, "gpu_present", lambda: True)
    monkeypatch.setattr(gpu, "cuda_target", lambda arch=None: local if arch is None else plain(arch))
    seen = []

    def tune_kernels(kernels, target, log_dir, manifest, trials, progress=None, **kwargs):
        seen.append(target)
        return manifest
    monkeypatch.setattr(tuning, "tune_kernels", tune_kernels)
    for target in ("cuda", "cuda:sm_90"):
        dt.tune(model, SPEC, target=target, shape_hints={"N": [16]}, log_dir=str(tmp_path / "log"), progress=False)
    assert [t.attrs.get("max_threads_per_block") for t in seen] == [1024, 1024]
    with pytest.raises(dt.CompileError, match="the local GPU, which is sm_90"):
        dt.tune(model, SPEC, target="cuda:sm_80", log_dir=str(tmp_path / "log80"), progress=False)


@needs_nvcc
def test_winning_kernels_missing_from_the_database_are_warned_about(cuda_log, tmp_path):
    """A manifest whose winners have no record in the database (a database emptied or from elsewhere): the
    kernels keep dlight's schedules (built in the child), with a warning, and the model does not claim them."""
    path = str(tmp_path / "empty-db")
    shutil.copytree(cuda_log, path)
    open(os.path.join(path, "database_tuning_record.json"), "w").close()
    with pytest.warns(tuning.TuningWarning, match=r"2 kernels it marks as tuned have no record in its database"):
        m, tuned = _compile(path)
    assert tuned == 0 and m.info["tuning"]["kernels_tuned"] == 0


@needs_nvcc
def test_hostile_records_are_refused_in_a_cuda_build(cuda_log, tmp_path):
    """A CUDA build without a GPU applies the log in its build child: the child checks every record against the
    allow-list too (no run-time check without a GPU), and its refusals reach the caller's TuningWarning."""
    from test_tuning_trust import edit_trace
    path = str(tmp_path / "hostile")
    shutil.copytree(cuda_log, path)

    def link_llvm_ir(insts, _):
        loop = next(i[3][0] for i in reversed(insts) if i[0] == "GetLoops")
        insts.append(["Annotate", [loop, '"x"'], ["pragma_import_llvm"], []])
    edit_trace(path, link_llvm_ir)
    with pytest.warns(tuning.TuningWarning, match=r"2 tuned kernels refused.*'pragma_import_llvm', which is not"):
        m, tuned = _compile(path)
    assert tuned == 0 and m.info["tuning"]["kernels_tuned"] == 0
