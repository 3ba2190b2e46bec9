"""`Backend`: everything codegen does differently per target, behind one interface.

A target string (``"cpu"``, ``"cuda:sm_80"``) names a backend by its part before ``:`` (`backends.resolve`);
`dt.compile` / `dt.tune` resolve it once and pass the backend down (as TVM's ``relax/pipeline.py`` picks a
pipeline per target kind). Codegen calls only these hooks, never compares target names: a new target is a
folder ``backends/<name>/`` whose ``__init__.py`` defines ``BACKEND``, plus its line in `backends.BACKENDS` and
its device type's line in ``runtime/devices.py``.
"""
from __future__ import annotations

import warnings

from dyntvm.errors import CompileError


class Backend:
    """One compilation target. Subclasses set the attributes and override the hooks their target needs."""

    name: str = ""              # the target string's kind: "cpu" in "cpu", "cuda" in "cuda:sm_80"
    device: str = ""            # the device type artifacts record (manifest "target"; runtime/devices.py)
    tvm_kinds: tuple = ()       # kinds of the TVM targets it builds for (`backends.backend_of`)
    forms: tuple = ()           # the target strings it takes, for messages: ("cuda", "cuda:sm_XX")
    device_checks = False       # run-time checks of kernel arguments are compiled into device code
    vm_program = False          # its library may hold the VM program of the whole graph (`codegen.vm_program`)
    rpc_tuning = False          # `dt.tune(rpc=...)`: its kernels can be measured on a tracker's servers
    region_timing = False       # a tuned kernel may be judged in its region, timed in this process
    isa_matched_logs = False    # tuning logs match by ISA features and core class (`tuning_keys`), not by key
    selects_conds = False       # small conds in loop bodies become both branches + where (`partition.cond_select`)
    tensor_intrinsics: tuple | None = None   # tvm.s_tir.tensor_intrin submodules a tune needs; None: all

    # ------------------------------------------------------------------ parsing
    def parse(self, target: str):
        """Check a target string naming this backend; returns its options (None: none). CompileError if bad."""
        if target != self.name:
            raise CompileError(f"compile: unknown target {target!r}; the {self.name} target takes no options")
        return None

    def concrete_target(self, target: str):
        """The TVM target the kernels of `target` (a checked target string) are built for."""
        raise NotImplementedError

    # ------------------------------------------------------------------ fusion, scheduling, build
    def fuse_passes(self, tvm_target) -> list:
        """Relax passes up to fusion: the fused kernels a build schedules and a tune gets its tasks from."""
        raise NotImplementedError

    def default_schedule(self, func, tvm_target, name: str = ""):
        """One fused kernel scheduled as a build schedules it without a tuning log (tuning's baseline)."""
        raise NotImplementedError

    def build(self, mod, tvm_target, loops=(), tuned=None, program=None):
        """Schedule and build a Relax module in this process. `tuned(func)`: a tuning log's schedule of a kernel
        or None (then the default schedule), the one scheduling hook; `loops`: compiled loops to add
        (`compiled_loops.loop_pass`); `program`: a module pass adding the VM program (only where `vm_program`)."""
        raise NotImplementedError

    def build_with_loops(self, mod, tvm_target, loops=(), tuned=None):
        """`build`, and without the compiled loops should they fail to build (warned): they are an
        optimization, never the reason a build fails."""
        if not loops:
            return self.build(mod, tvm_target, tuned=tuned)
        try:
            return self.build(mod, tvm_target, loops, tuned=tuned)
        except Exception as e:  # noqa: BLE001 - the loops then run step by step
            warnings.warn(f"dyntvm: building the compiled loops failed ({type(e).__name__}: {str(e)[:200]}); "
                          "the loops run step by step", RuntimeWarning, stacklevel=3)
            return self.build(mod, tvm_target, tuned=tuned)

    def build_library(self, regions, tvm_target, binding, build_executable, tuning=None, loops=()):
        """``(library, path, tuned kernels)`` where the build does not simply run `build_executable` in this
        process (CUDA without a GPU: a child process), else None. See `codegen.build._build_elsewhere`."""
        return None

    # ------------------------------------------------------------------ running here, caching
    def runnable_here(self) -> bool:
        """Whether this machine can load and run its kernels (else they are built and saved, not run)."""
        return True

    def check_library(self, path: str, tvm_target) -> None:
        """Refuse (CompileError) a built or cached library that lacks what its kernels need to run."""

    def recorded_facts(self, tvm_target, desc: str) -> dict:
        """The model info fields `dt.load` checks before it runs the kernels on a machine (CPU features, GPU
        arch), in their JSON form."""
        return {}

    # ------------------------------------------------------------------ compiled loops
    def loop_specs(self, graph) -> list:
        """The foreach / while_loop loops of `graph` its library compiles (`compiled_loops.loop_specs`)."""
        from ..compiled_loops import loop_specs
        return loop_specs(graph)

    # ------------------------------------------------------------------ tuning
    def tuning_device(self):
        """The TVM device tuning measures kernels on."""
        raise NotImplementedError

    def tuning_target(self, target: str, tvm_target):
        """The TVM target `dt.tune` tunes with (CompileError where this machine cannot measure `target`)."""
        return tvm_target

    def tuned_on(self) -> dict:
        """What a tuning log records, for information, of the device it was tuned on (`tuning_keys`)."""
        return {}

    def prepare_tuning(self, tvm_target) -> int:
        """Set up this process to build tuning candidates; returns how many builder workers to use."""
        return 1
