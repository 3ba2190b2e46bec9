"""A tuning log is untrusted input (`codegen/tuning_trust.py`): hostile MetaSchedule records are refused with a
TuningWarning naming the kernel and the reason, and the default kernel is built instead; the shipped logs
still apply without a warning.

The logs here hold one hand-written MetaSchedule trace of the one kernel of `affine` (the primitives
MetaSchedule's CPU rules use: sampled tiles, split, reorder, parallel, a sampled unroll, fuse, vectorize),
written with MetaSchedule's own database classes; the hostile variants add one primitive each through the
schedule API (so the trace JSON is TVM's own) or edit the JSON."""
import json
import os
import platform
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen import log_files, tuning, tuning_trust
from dyntvm.codegen.build import concrete_target, stats, tuning_tasks
from dyntvm.pipeline import partition_graph
from dyntvm.runtime.artifact import kernel_binding
from helpers import assert_same

pytestmark = pytest.mark.slow

W = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
B = np.random.default_rng(1).standard_normal(64).astype(np.float32)
SPEC = dt.TensorSpec(("N", 64))
X16 = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)


def affine(x):
    """One kernel after fusion (matmul + bias: blocks "matmul" and "T_add"); N symbolic."""
    return F.matmul(x, W) + B


def _schedule(sch, hostile=None):
    """The primitives MetaSchedule's CPU space applies, then `hostile(sch, loops)` if given."""
    mm, add = sch.get_sblock("matmul", "main"), sch.get_sblock("T_add", "main")
    i, j, k = sch.get_loops(mm)
    j0, j1 = sch.split(j, sch.sample_perfect_tile(j, n=2, max_innermost_factor=16))
    sch.reorder(i, j0, k, j1)
    sch.parallel(i)
    sch.annotate(i, "pragma_auto_unroll_max_step", sch.sample_categorical([0, 16, 64], [0.3, 0.3, 0.4]))
    sch.annotate(i, "pragma_unroll_explicit", 1)
    fused = sch.fuse(*sch.get_loops(add))
    outer, inner = sch.split(fused, [None, 16])
    sch.parallel(outer)
    sch.vectorize(inner)
    if hostile is not None:
        hostile(sch, {"i": i, "k": k, "fused": outer, "mm": mm, "add": add})


@pytest.fixture(scope="module")
def task():
    """(the kernel's workload key, its MetaSchedule task module, the manifest of a log applying it)."""
    target = concrete_target("cpu")
    pg = partition_graph(dt.trace(affine, SPEC))
    table, kernels, failed = tuning_tasks(pg, {"N": [16]}, target)
    ((key, (name, func)),) = kernels.items()
    manifest = {"format": tuning.FORMAT, "model": "affine", "model_hash": kernel_binding(pg),
                **tuning.target_identity(target), "hints": {"N": [16]},
                "specialized": {r: [[c, n] for c, n in specs] for r, specs in table.items()}, "not_specialized": {},
                "kernels": [{"workload": key, "name": name, "status": "done", "default_us": 2.0, "tuned_us": 1.0,
                             "use": "tuned"}]}
    return key, tuning._main_mod(tuning.task_func(func)), manifest


def write_log(path, task, hostile=None) -> str:
    """A log folder at `path` whose database holds the kernel's trace (`_schedule` with `hostile`)."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms
    _, mod, manifest = task
    os.makedirs(path)
    sch = s_tir.Schedule(mod)
    _schedule(sch, hostile)
    db = ms.database.JSONDatabase(work_dir=str(path))
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod), [1e-6],
                                                     concrete_target("cpu"),
                                                     ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
    tuning.write_manifest(str(path), manifest)
    return str(path)


def edit_trace(path, edit) -> None:
    """Rewrite every record of the log at `path` with `edit(instructions, decisions)` (on the trace's JSON)."""
    rpath = os.path.join(path, tuning_trust.RECORDS)
    with open(rpath) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for rec in records:
        edit(*rec[1][0])
    with open(rpath, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def compile_with(path, **kw):
    """(model, tuned kernels, TuningWarnings) of a compile of `affine` with the log at `path`."""
    before = stats.tuned_kernels
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = dt.compile(affine, SPEC, tuning_log=path, **{"use_cache": False, **kw})
    found = [str(w.message) for w in caught if issubclass(w.category, tuning.TuningWarning)]
    assert_same(model(X16), affine(X16), rtol=1e-4, atol=1e-4)
    return model, stats.tuned_kernels - before, found


def test_a_log_of_allowed_primitives_applies_and_is_checked(task, tmp_path):
    model, tuned, found = compile_with(write_log(tmp_path / "good", task))
    assert (tuned, found, model.info["tuning"]["kernels_tuned"]) == (1, [], 1)
    assert model.specialized_calls == 1


def _marker_payload(marker: str) -> str:
    """LLVM IR whose module assembly puts a function in .init_array: it creates `marker` when the library is
    loaded (what a hostile log would make run a shell command). x86-64 only."""
    asm = [".pushsection .text", "dyntvm_test_marker:", "push %rbp", "lea dyntvm_test_path(%rip), %rdi",
           "lea dyntvm_test_mode(%rip), %rsi", "call fopen@PLT", "pop %rbp", "ret", ".popsection",
           ".pushsection .rodata", f'dyntvm_test_path: .asciz "{marker}"', 'dyntvm_test_mode: .asciz "w"',
           ".popsection", '.pushsection .init_array,"aw"', ".quad dyntvm_test_marker", ".popsection"]
    return "".join('module asm "' + line.replace('"', "\\22") + '"\n' for line in asm)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the payload is x86-64 assembly")
def test_a_log_linking_llvm_ir_is_refused_and_its_code_never_runs(task, tmp_path):
    """``pragma_import_llvm`` links the IR into the kernel library, and its .init_array ran at the library's
    load: in the compile (from the compile cache) and in every `dt.load` of a saved artifact."""
    marker = str(tmp_path / "marker")
    path = write_log(tmp_path / "llvm", task,
                     lambda sch, at: sch.annotate(at["fused"], "pragma_import_llvm", _marker_payload(marker)))
    model, tuned, (warning,) = compile_with(path, cache_dir=str(tmp_path / "cache"), use_cache=True)
    assert tuned == 0 and model.info["tuning"]["kernels_tuned"] == 0
    assert "'fused_matmul_add'" in warning and "pragma_import_llvm" in warning and "1 tuned kernel refused" in warning
    model.save(str(tmp_path / "m.dtvm"))
    run = subprocess.run([sys.executable, "-c", f"import dyntvm as dt; dt.load({str(tmp_path / 'm.dtvm')!r})"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert not os.path.exists(marker)


@pytest.mark.parametrize("hostile, reason", [
    # an imperfect split without its bounds check: writes out of bounds (free(): invalid pointer)
    (lambda sch, at: sch.split(at["fused"], [None, 48], disable_predication=True), "attributes [1, 1]"),
    # unrolling until the build runs out of memory (bad_alloc at 5.5 GB)
    (lambda sch, at: sch.annotate(at["i"], "pragma_auto_unroll_max_step", 1 << 30),
     "annotates pragma_auto_unroll_max_step = 1073741824, out of bounds"),
    # the accumulator in 8-bit integers: wrong results, no error
    (lambda sch, at: sch.unsafe_set_dtype(at["mm"], 0, "int8"), "'UnsafeSetDType'"),
    (lambda sch, at: sch.annotate(at["mm"], "pragma_import_c", "int x;"), "'pragma_import_c'"),
    # replayed: factors that do not multiply to the loop's extent (64)
    (lambda sch, at: sch.split(at["k"], [7, 16]), "a split of a loop of 64 into [7, 16]"),
], ids=["disable_predication", "huge_unroll", "unsafe_set_dtype", "pragma_import_c", "split_factors"])
def test_hostile_primitives_are_refused(task, tmp_path, hostile, reason):
    model, tuned, (warning,) = compile_with(write_log(tmp_path / "bad", task, hostile))
    assert tuned == 0 and model.info["tuning"]["kernels_tuned"] == 0
    assert "'fused_matmul_add'" in warning and reason in warning, warning


def test_edited_trace_json_is_checked_before_tvm_reads_it(task, tmp_path):
    """Kinds TVM does not know, sampled candidates out of bounds, traces over the length bound: refused from
    the JSON (TVM replays every trace as it loads a database)."""
    def unknown_kind(insts, _):
        insts.insert(0, ["NoSuchPrimitive", [], [], []])

    def huge_candidates(insts, _):
        (cat,) = [i for i in insts if i[0] == "SampleCategorical"]
        cat[2][0] = [0, 16, 1 << 30]

    def too_long(insts, _):
        insts[:0] = [["GetSBlock", [], ["matmul", "main"], [f"b{900 + n}"]]
                     for n in range(tuning_trust.MAX_TRACE_INSTRUCTIONS)]
    for edit, reason in ((unknown_kind, "'NoSuchPrimitive'"), (huge_candidates, "(SampleCategorical) has attributes"),
                         (too_long, "instructions (at most")):
        path = write_log(tmp_path / edit.__name__, task)
        edit_trace(path, edit)
        _, tuned, (warning,) = compile_with(path)
        assert tuned == 0 and reason in warning, warning


def test_a_wrong_kernel_of_allowed_primitives_is_refused_by_running_it(task, tmp_path, monkeypatch):
    """The numeric check: a tuned kernel that passes the allow-list but computes something else (here: one that
    writes nothing) is run against the default kernel at build time and refused."""
    real = tuning_trust.replay_checked
    monkeypatch.setattr(tuning_trust, "replay_checked",
                        lambda mod, trace: real(mod, trace).with_body(__import__("tvm").tirx.Evaluate(0)))
    _, tuned, (warning,) = compile_with(write_log(tmp_path / "wrong", task))
    assert tuned == 0
    assert "results differ from the default kernel's on random inputs" in warning and "1024 elements" in warning


def test_bounded_reading(task, tmp_path, monkeypatch):
    """More records than the bound, and a database file over the size bound: the log is not applied."""
    path = write_log(tmp_path / "many", task)
    with open(os.path.join(path, tuning_trust.RECORDS)) as f:
        line = f.read()
    with open(os.path.join(path, tuning_trust.RECORDS), "w") as f:
        f.write(line * 5)
    monkeypatch.setattr(tuning_trust, "MAX_RECORDS", 4)
    _, tuned, (warning,) = compile_with(path)
    assert tuned == 0 and "more than 4 records" in warning
    monkeypatch.setattr(log_files, "MAX_DATABASE_BYTES", len(line) * 4)
    monkeypatch.setattr(tuning_trust, "MAX_RECORDS", 10)
    _, tuned, (warning,) = compile_with(path)
    assert tuned == 0 and "more than" in warning


def test_a_tune_does_not_resume_from_a_hostile_database(task, tmp_path):
    """A resumed tune seeds MetaSchedule's search with the folder's records, which it builds and runs."""
    path = write_log(tmp_path / "resume", task, lambda sch, at: sch.annotate(at["fused"], "pragma_import_llvm", "x"))
    with pytest.raises(dt.CompileError, match="pragma_import_llvm"):
        dt.tune(affine, SPEC, trials=1, shape_hints={"N": [16]}, log_dir=path, progress=False)


SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tuning_logs")


def test_every_shipped_record_passes_the_checks():
    """The best record of every workload of every shipped log (CPU and CUDA, as MetaSchedule's search made
    them) is accepted from the JSON and replays within the bounds."""
    folders = sorted(os.path.join(SHIPPED, m, t) for m in os.listdir(SHIPPED) if os.path.isdir(os.path.join(SHIPPED, m))
                     for t in os.listdir(os.path.join(SHIPPED, m)))
    assert len(folders) >= 8
    for folder in folders:
        db, rejected = tuning_trust.load_checked_database(folder)
        assert rejected == {}, folder
        records = db.get_all_tuning_records()
        assert records, folder
        for record in records:
            tuning_trust.replay_checked(record.workload.mod, record.trace)


@pytest.mark.parametrize("example, folder, stale", [("transformer", "encoder_layer", 1)])
def test_the_shipped_cpu_logs_apply_without_a_warning(example, folder, stale, tmp_path):
    """The shipped CPU logs with tuned kernels (made for AMD EPYC znver4; re-targeted here to this CPU), run
    against the default kernels at build time: no kernel refused. `stale`: winners whose kernel the default
    lowering no longer makes (branchy's `fused_matmul2_add1_less2_where2`: relu is one TE compute now, not
    less + where - a new workload, which needs a re-tune on a Zen 4; the transformer's `fused_reshape9_add5`: a
    projection's bias add, now in its matmul's kernel, `converters.sink_flat`), so they do not apply."""
    from dyntvm import examples
    path = str(tmp_path / folder)
    shutil.copytree(os.path.join(SHIPPED, folder, "llvm-znver4-2c"), path)
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    manifest.update(tuning.target_identity(concrete_target("cpu")))
    tuning.write_manifest(path, manifest)
    won = sum(k.get("use") == "tuned" for k in manifest["kernels"])
    ex = examples.get(example)
    before = stats.tuned_kernels
    with warnings.catch_warnings():
        warnings.simplefilter("error", tuning.TuningWarning)
        model = dt.compile(ex.fn, *ex.specs, tuning_log=path, use_cache=False)
    assert stats.tuned_kernels - before == won - stale > 0
    assert model.info["tuning"]["kernels_tuned"] == won - stale      # what applied, not what the log lists


def test_the_shipped_branchy_log_is_refused_as_made_for_another_model(tmp_path):
    """branchy's per-row cond is a select since session 38 (`partition/cond_select.py`): its partitioned graph, and
    so the model hash the shipped log was made for, changed. The log is refused with the reason, never applied to
    kernels it was not tuned for (a re-tune on a Zen 4 would ship a new one)."""
    from dyntvm import examples
    path = str(tmp_path / "branchy")
    shutil.copytree(os.path.join(SHIPPED, "branchy", "llvm-znver4-2c"), path)
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    manifest.update(tuning.target_identity(concrete_target("cpu")))
    tuning.write_manifest(path, manifest)
    ex = examples.get("branchy")
    before = stats.tuned_kernels
    with pytest.warns(tuning.TuningWarning, match="made for another model"):
        model = dt.compile(ex.fn, *ex.specs, tuning_log=path, use_cache=False)
    assert stats.tuned_kernels == before and "tuning" not in model.info
