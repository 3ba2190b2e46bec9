"""Which machines a tuning log applies to (`codegen/tuning_keys.py`): CPU logs match by ISA features and core-count
class, not by CPU model: a znver4 log applies on znver5, a log of the first format (keyed ``llvm-znver4-2c``,
features derived from its -mcpu) still loads, a log for other features or another core class does not. The
logs here are written by hand (no tuning)."""
import json
import os
import warnings

import pytest
import tvm

from dyntvm.codegen import log_files, tuning, tuning_keys
from dyntvm.codegen.build import concrete_target
from dyntvm.pipeline import _shipped_log

# CPUs LLVM knows, to find one other than this machine's with the same tuning features
CANDIDATES = ("znver5", "znver4", "znver3", "znver2", "sapphirerapids", "icelake-server", "cascadelake",
              "skylake-avx512", "tigerlake", "alderlake", "haswell", "skylake", "x86-64-v4", "x86-64-v3")


def cpu(mcpu: str, cores: int = 2):
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": cores, "mtriple": "x86_64-linux-gnu"})


def old_manifest(target) -> dict:
    """A manifest of the first format (as the shipped logs): keyed by -mcpu, no ISA list."""
    return {"format": tuning.FORMAT, "model": "m", "model_hash": "0" * 64, "target": str(target),
            "target_key": f"llvm-{dict(target.export())['mcpu']}-2c", "cpu": "Some CPU", "hints": {},
            "specialized": {}, "kernels": []}


def write_log(path, manifest) -> str:
    os.makedirs(path)
    for name in log_files.DATABASE_FILES:
        open(os.path.join(path, name), "w").close()
    tuning.write_manifest(str(path), manifest)
    return str(path)


def test_core_classes():
    assert [tuning_keys.core_class(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, None, 0)] == [1, 2, 4, 4, 8, 8, 16, 64, 1, 1]


def test_a_znver4_log_applies_on_znver5():
    zen4, zen5 = cpu("znver4"), cpu("znver5")
    assert tuning_keys.tuning_isa(zen4) == tuning_keys.tuning_isa(zen5)
    assert "avx512f" in tuning_keys.tuning_isa(zen4)
    assert tuning_keys.target_key(zen4) == tuning_keys.target_key(zen5) == "llvm-avx512bf16-2c"
    assert tuning_keys.log_mismatch(old_manifest(zen4), zen5) is None                     # first format
    assert tuning_keys.log_mismatch({**old_manifest(zen4), **tuning_keys.target_identity(zen4)}, zen5) is None


@pytest.mark.parametrize("other, why", [(cpu("haswell"), "has avx512"), (cpu("znver4", 4), "core class"),
                                        (cpu("znver4", 8), "core class")])
def test_a_log_for_other_features_or_another_core_class_does_not_apply(other, why):
    assert why in tuning_keys.log_mismatch(old_manifest(cpu("znver4")), other)
    assert why in tuning_keys.log_mismatch({**old_manifest(cpu("znver4")),
                                            **tuning_keys.target_identity(cpu("znver4"))}, other)


def test_a_log_keyed_to_another_cpu_model_with_the_same_features_applies_here(tmp_path):
    """A log made on another CPU model (first format: its folder named by that model's -mcpu) is found among the
    shipped logs and loads here, when that CPU has the tuning features of this one."""
    here = concrete_target("cpu")
    mine = dict(here.export()).get("mcpu")
    same = [c for c in CANDIDATES if c != mine and tuning_keys.tuning_isa(cpu(c)) == tuning_keys.tuning_isa(here)]
    if tuning_keys.tuning_isa(here) is None or not same:
        pytest.skip(f"no other CPU model LLVM knows has this machine's ({mine}) tuning features")
    cores = dict(here.export())["num-cores"]
    other = cpu(same[0], cores)
    manifest = {**old_manifest(other), "target_key": f"llvm-{same[0]}-{cores}c"}
    path = write_log(tmp_path / "m" / manifest["target_key"], manifest)
    assert manifest["target_key"] != tuning.target_key(here)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.load_log(path, None, here) is not None
        found = _shipped_log(str(tmp_path / "m"), None, here)
    assert found is not None and found.path == path


def test_a_log_for_other_features_warns_when_named_and_is_silent_when_shipped(tmp_path):
    here = concrete_target("cpu")
    manifest = {**old_manifest(here), **tuning_keys.target_identity(here)}
    manifest["isa"] = [f for f in manifest["isa"] or ["sse4_2"] if f != "sse4_2"] + ["amx_tile"]
    path = write_log(tmp_path / "m" / "llvm-other-2c", manifest)
    with pytest.warns(tuning.TuningWarning, match="another target.*ISA features"):
        assert tuning.load_log(path, None, here) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _shipped_log(str(tmp_path / "m"), None, here) is None


@pytest.mark.parametrize("isa", ["avx512f", [1, 2], {"a": 1}])
def test_a_hand_edited_isa_list_does_not_apply(isa, tmp_path):
    here = concrete_target("cpu")
    manifest = {**old_manifest(here), **tuning_keys.target_identity(here), "isa": isa}
    if tuning_keys.tuning_isa(here) is None:
        pytest.skip("LLVM names no tuning feature of this CPU")
    assert tuning_keys.log_mismatch(json.loads(json.dumps(manifest)), here) is not None


def test_a_deeply_nested_target_in_a_manifest_is_no_target():
    """Review 33 #7: the manifest's `target` string (untrusted) parsed without a depth guard raised a raw
    RecursionError out of dt.compile; now it is a log for no known machine: it does not apply."""
    here = concrete_target("cpu")
    manifest = old_manifest(here)
    manifest["target"] = "[" * 100000 + "]" * 100000
    del manifest["target_key"]
    assert tuning_keys._recorded_cpu(manifest)[0] is None
    assert tuning_keys.log_mismatch(manifest, here) is not None
