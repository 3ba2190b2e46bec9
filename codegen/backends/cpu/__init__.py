"""The CPU backend: LLVM for the host CPU, scheduled by our own rules (`cpu_schedule` and the files beside it).

Its modules are imported by the hooks, not here: `cpu_schedule` sets the TVM thread pool's size on import.
"""
from __future__ import annotations

import os

from ....native import ISA_FEATURES, cpu_features
from ..base import Backend

#: "1": a CPU library also gets the device loops, so that tests run the executor's device path on the CPU
#: (`CompiledModel._use_device_path`) through the device loops' code without a GPU
DEVICE_LOOPS_ON_CPU = "DYNTVM_DEVICE_LOOPS_ON_CPU"


def isa_features(tvm_target) -> list:
    """This CPU's ISA features (/proc/cpuinfo names, `native.ISA_FEATURES`) that LLVM enables for the target's
    -mcpu / -mattr: those the kernels may use. All of this CPU's, where LLVM cannot say."""
    here = cpu_features()
    try:
        from tvm.target import codegen
        llvm = {str(f) for f in codegen.llvm_get_cpu_features(tvm_target)}
    except Exception:  # noqa: BLE001 - an LLVM without the query: assume every feature of this CPU is used
        return sorted(here)
    return sorted(f for f in here if ISA_FEATURES[f] in llvm)


class CPUBackend(Backend):
    name = "cpu"
    device = "cpu"
    tvm_kinds = ("llvm",)
    forms = ("cpu",)
    vm_program = True
    rpc_tuning = True
    region_timing = True
    isa_matched_logs = True
    selects_conds = True
    tensor_intrinsics = ("x86", "arm_cpu")

    def concrete_target(self, target: str):
        """The host CPU's model and its physical core count (`cpu_schedule.cpu_target`)."""
        from .cpu_schedule import cpu_target
        return cpu_target()

    def fuse_passes(self, tvm_target) -> list:
        from .cpu_schedule import fuse_passes
        return fuse_passes(tvm_target)

    def default_schedule(self, func, tvm_target, name: str = ""):
        from . import cpu_schedule
        return cpu_schedule._schedule_func(func, tvm_target, name)

    def build(self, mod, tvm_target, loops=(), tuned=None, program=None):
        from .cpu_schedule import build_cpu
        return build_cpu(mod, tvm_target, loops, tuned=tuned, program=program)

    def recorded_facts(self, tvm_target, desc: str) -> dict:
        """The CPU features the kernels may use: dt.load refuses a CPU lacking one."""
        return {"cpu_features": isa_features(tvm_target)}

    def loop_specs(self, graph) -> list:
        """The host loops, plus the device loops where $DYNTVM_DEVICE_LOOPS_ON_CPU is 1."""
        from ...compiled_loops import loop_specs
        return loop_specs(graph) + (loop_specs(graph, "cpu") if os.environ.get(DEVICE_LOOPS_ON_CPU) == "1" else [])

    def tuning_device(self):
        import tvm
        return tvm.cpu(0)

    def prepare_tuning(self, tvm_target) -> int:
        return max(1, int(tvm_target.attrs.get("num-cores", 1)))


BACKEND = CPUBackend()
