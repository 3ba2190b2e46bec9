"""Which machines a tuning log applies to: its target key (the log folder's name) and the match rule.

A tuned schedule is a choice of tiles, loop order, vector width and parallel split. What makes the same choice
good on two CPUs is the vector ISA the kernels are compiled to and how many cores the parallel loops are split
over, not the CPU's model name. So a CPU log is keyed and matched by:

* the ISA features of `TUNING_ISA` that LLVM enables for the target's ``-mcpu`` (vector width, FMA, the
  AVX-512 subsets, bf16 / fp16 / AMX): a Zen 4 (``znver4``) log applies on a Zen 5 (``znver5``), both
  AVX-512 with bf16; an AVX2-only machine is another class;
* the core-count class: the target's cores rounded up to a power of two (1, 2, 4, 8, ...): a log made on
  2 cores applies on 2, one made on 3 or 4 on 3 or 4.

The key is ``llvm-<ISA label>-<class>c`` (``llvm-avx512bf16-2c``), readable, while the match compares the
manifest's full ``isa`` list and ``core_class`` (`log_mismatch`). A log of an earlier format recorded only the
target (``llvm-znver4-2c``): its ISA list is derived from the ``-mcpu`` its manifest names, so it still
applies where its features match. Where LLVM cannot name the features (not x86), the key and the match fall
back to ``-mcpu`` and the class. A CUDA log is keyed by its arch (``cuda-sm_90``) and applies to every build for it.
"""
from __future__ import annotations

import json
import platform
import re

import tvm

from ..native import ISA_FEATURES
from .backends import backend_of

# /proc/cpuinfo names (`native.ISA_FEATURES`) of the features that change how a tuned kernel performs: the
# vector width and the float / bf16 / fp16 / int8-dot instructions. Features for crypto, bit tricks or
# AVX-VNNI's VEX form (Zen 5 has it, Zen 4 not) do not enter a float kernel's schedule.
TUNING_ISA = ("sse4_2", "avx", "fma", "avx2", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni",
              "avx512_bf16", "avx512_fp16", "amx_tile")
# The key's readable label: the first of these the ISA list holds.
_LABELS = (("amx_tile", "amx"), ("avx512_fp16", "avx512fp16"), ("avx512_bf16", "avx512bf16"),
           ("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx"), ("sse4_2", "sse4"))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def core_class(cores) -> int:
    """`cores` rounded up to a power of two (1, 2, 4, 8, ...); 1 for anything that is not a positive int."""
    n = cores if isinstance(cores, int) and not isinstance(cores, bool) and cores > 0 else 1
    return 1 << (n - 1).bit_length()


def tuning_isa(target) -> list | None:
    """The `TUNING_ISA` features LLVM enables for the target's -mcpu / -mattr, in that order; None where LLVM
    cannot say, or names none of them (not x86)."""
    try:
        from tvm.target import codegen
        llvm = {str(f) for f in codegen.llvm_get_cpu_features(target)}
    except Exception:  # noqa: BLE001 - an LLVM without the query, or a target it does not know
        return None
    found = [f for f in TUNING_ISA if ISA_FEATURES[f] in llvm]
    return found or None


def _cfg(target) -> dict:
    return dict(target.export())


def target_key(target) -> str:
    """A folder name for the target: ``llvm-<ISA label>-<core class>c`` for a CPU (``llvm-avx512bf16-2c``),
    ``llvm-<mcpu>-<class>c`` where the ISA is unknown, ``cuda-<arch>`` for CUDA."""
    cfg = _cfg(target)
    parts = [str(cfg.get("kind", "target"))]
    if not backend_of(target).isa_matched_logs:
        parts += [str(cfg[k]) for k in ("mcpu", "arch") if cfg.get(k)]
    else:
        isa = tuning_isa(target)
        label = next((name for f, name in _LABELS if isa and f in isa), None)
        parts.append(label or str(cfg.get("mcpu") or platform.machine()))
        parts.append(f"{core_class(cfg.get('num-cores'))}c")
    return re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(parts))


def target_identity(target) -> dict:
    """What a log records of its target: the target string and key; for a CPU the ISA list and core class it
    is matched by (and, for information, the CPU model); for CUDA, informally, the GPU it was tuned on."""
    ident = {"target": str(target), "target_key": target_key(target)}
    if not backend_of(target).isa_matched_logs:
        ident.update(backend_of(target).tuned_on())
    else:
        ident.update(cpu=cpu_model(), isa=tuning_isa(target), core_class=core_class(_cfg(target).get("num-cores")))
    return ident


def _recorded_cpu(manifest: dict):
    """``(isa, core class, mcpu)`` a CPU log's manifest stands for: recorded, or (a log of the first format,
    keyed by -mcpu) derived from the target it names. None for what cannot be read."""
    try:
        cfg = json.loads(manifest.get("target")) if isinstance(manifest.get("target"), str) else {}
        cfg = cfg if isinstance(cfg, dict) else {}
    except (ValueError, RecursionError):        # an untrusted manifest: a deeply nested target is no target
        cfg = {}
    isa = manifest.get("isa")
    isa = isa if isinstance(isa, list) and all(isinstance(f, str) for f in isa) else None
    if "isa" not in manifest and cfg:          # a log of the first format: its CPU target's ISA (None: not one)
        try:
            isa = tuning_isa(tvm.target.Target(cfg))
        except Exception:  # noqa: BLE001 - an untrusted manifest's target TVM refuses: no ISA known
            isa = None
    cls = manifest.get("core_class", core_class(cfg.get("num-cores")))
    return isa, cls, cfg.get("mcpu")


def log_mismatch(manifest: dict, target) -> str | None:
    """Why a log (its manifest) does not apply to `target`, or None when it does (the rule in this module's
    docstring)."""
    ident = target_identity(target)
    theirs = manifest.get("target_key")
    backend = backend_of(target)
    if not backend.isa_matched_logs or str(theirs).split("-", 1)[0] not in backend.tvm_kinds:
        return None if theirs == ident["target_key"] else f"it was made for {theirs}; this is {ident['target_key']}"
    isa, cls, mcpu = _recorded_cpu(manifest)
    mine_mcpu = _cfg(target).get("mcpu")
    if manifest.get("isa") is not None and isa is None:
        return f"its 'isa' is not a list of feature names ({theirs})"
    if cls != ident["core_class"]:
        return (f"it was made for the core class {cls} (cores rounded up to a power of two); this target's is "
                f"{ident['core_class']} ({theirs}; this is {ident['target_key']})")
    if ident["isa"] is None or isa is None:
        return None if mcpu == mine_mcpu and mcpu else \
            f"it was made for -mcpu={mcpu} ({theirs}); this is -mcpu={mine_mcpu} and no ISA features are known"
    if list(isa) != list(ident["isa"]):
        missing, extra = sorted(set(ident["isa"]) - set(isa)), sorted(set(isa) - set(ident["isa"]))
        return (f"it was made for other ISA features ({theirs}: {'lacks ' + ', '.join(missing) if missing else ''}"
                f"{'; ' if missing and extra else ''}{'has ' + ', '.join(extra) if extra else ''} compared with "
                f"this {ident['target_key']})")
    return None
