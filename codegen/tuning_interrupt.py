"""Ctrl-C during a tune: acted upon only at safe points.

A KeyboardInterrupt raised wherever SIGINT happens to land broke MetaSchedule: raised inside one of its
Python callbacks (builder, runner, cost model) called from its C++ task scheduler, it unwound through C++
frames (a SIGSEGV, or a TVM error with an empty message), or left a builder's process pool unclosed, which
the garbage collector then shut down from one of the pool's own threads ("cannot join current thread").

So while kernels are tuned, SIGINT only sets a flag (`deferred_interrupt`). MetaSchedule sees it through
the objects it is given here: the builder drops its builds (kills their processes), the runner measures no
further candidate, the task scheduler hands out no further batch, and only the candidates actually measured
are committed to the database. Between kernels the tune checks the flag itself, and raises KeyboardInterrupt with the manifest
and database as the last finished step left them.

A build or measuring process that does not answer is killed `HUNG_GRACE_S` after its own timeout could have
fired: that timeout is a timer thread in the process, which never runs while a hung call holds the GIL.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import threading
import time

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule import measure_callback
from tvm.s_tir.meta_schedule.builder import BuilderResult, LocalBuilder
from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params, _worker_func
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.runner import LocalRunner
from tvm.s_tir.meta_schedule.utils import get_global_func_with_default_on_worker
from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture
from tvm.s_tir.meta_schedule.runner.local_runner import _worker_func as _runner_worker_func
from tvm.s_tir.meta_schedule.task_scheduler import PyTaskScheduler
from tvm.support.popen_pool import PopenPoolExecutor

INTERRUPTED = "dyntvm: not measured: the tune was interrupted (Ctrl-C)"
NOTICE = (b"\ndyntvm tune: interrupted: stopping once the candidate being measured is done "
          b"(what was tuned is kept; Ctrl-\\ quits at once, keeping less)\n")


#: seconds past a build's / measurement's timeout after which a process that has not answered is killed (the
#: wait can include the process's start: imports, ~25 s on a loaded machine)
HUNG_GRACE_S = 120.0


def _kill_workers(pool: PopenPoolExecutor) -> None:
    """Kill the processes of `pool`'s workers (not `PopenWorker.kill`: closing a worker's reader would wait for
    the pool thread reading it, i.e. for the answer). The reading thread then sees the end of the pipe: its job
    fails with ChildProcessError, and the pool starts a new process for the next job."""
    for worker in list(pool._worker_map.values()):     # noqa: SLF001 - the pool has no API for it
        proc = worker._proc                             # noqa: SLF001
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()


def _close(pool: PopenPoolExecutor, jobs: list) -> None:
    """Shut `pool` down once `jobs` are done, killing its worker processes until they are (PopenPoolExecutor's
    shutdown closes a worker's pipes, which waits for a thread blocked on them: for a worker's answer)."""
    for job in jobs:
        job.cancel()
    while not all(job.done() for job in jobs):
        _kill_workers(pool)
        concurrent.futures.wait(jobs, timeout=0.1)
    pool.shutdown()


class StopRequest:
    """Whether SIGINT arrived during the tune; `check` raises KeyboardInterrupt at a safe point if so."""

    def __init__(self):
        self.requested = False

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_interrupt():
    """A `StopRequest` that SIGINT sets (with a notice on stderr) for the duration instead of raising
    KeyboardInterrupt; on leaving, KeyboardInterrupt is raised if it was set. Only where Ctrl-C means
    KeyboardInterrupt (Python's default handler, in the main thread): a program that ignores SIGINT or handles
    it itself keeps its way, and the flag is never set."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield stop
        return

    def on_sigint(_signum, _frame):
        if not stop.requested:
            stop.requested = True
            os.write(2, NOTICE)             # not print: the handler may run while sys.stderr is mid-write
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
    stop.check()                            # one that arrived after the last check


def _checked(sanity_check, stop: StopRequest) -> None:
    """Run a builder's / runner's sanity check (a job in a worker process, while they are made). A Ctrl-C from a
    terminal reaches that worker too, which then fails ("Subprocess terminated"): with a stop requested, that
    is the KeyboardInterrupt it stands for (here Python, not MetaSchedule's C++, is running)."""
    try:
        sanity_check()
    except Exception:
        if not stop.requested:
            raise
        raise KeyboardInterrupt from None


def _check_builder(f_build, f_export) -> None:
    """LocalBuilder's sanity check, run in a worker."""
    get_global_func_with_default_on_worker(name=f_build, default=None)
    get_global_func_with_default_on_worker(name=f_export, default=None)


@derived_object
class StoppableBuilder(LocalBuilder._cls):
    """MetaSchedule's LocalBuilder, which starts no further build once a stop is requested: those candidates
    (and any build failing after the request: a Ctrl-C in a terminal also kills the build processes) get the
    INTERRUPTED error."""

    def __init__(self, stop: StopRequest, **kwargs):
        self.stop = stop                    # before LocalBuilder's __init__, which runs `_sanity_check`
        super().__init__(**kwargs)

    def _sanity_check(self) -> None:
        """LocalBuilder's (its builder functions can be found in a worker), with its one-use pool always shut
        down (LocalBuilder's is left to the garbage collector when the check fails)."""
        pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec, initializer=self.initializer)
        job = pool.submit(_check_builder, self.f_build, self.f_export)
        try:
            _checked(job.result, self.stop)
        finally:
            _close(pool, [job])

    def build(self, build_inputs: list) -> list:
        """LocalBuilder.build, waited for here: once a stop is requested the builds are abandoned (their worker
        processes killed: the runner measures nothing more anyway), and workers that have not answered
        `timeout_sec` + `HUNG_GRACE_S` after their last job could have started are killed."""
        if self.stop.requested:
            return [BuilderResult(None, INTERRUPTED)] * len(build_inputs)
        pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec,
                                 initializer=self.initializer)  # one per call, as LocalBuilder (its workers leak)
        jobs = [pool.submit(_worker_func, self.f_build, self.f_export, b.mod, b.target, _serialize_params(b.params))
                for b in build_inputs]
        rounds = -(-len(jobs) // max(1, self.max_workers or 1))
        wait_s = rounds * self.timeout_sec + HUNG_GRACE_S
        deadline = time.monotonic() + wait_s
        hung: set = set()                   # the jobs not done at the deadline
        try:
            while not all(job.done() for job in jobs):
                concurrent.futures.wait(jobs, timeout=0.1)
                if self.stop.requested:
                    for job in jobs:
                        job.cancel()
                    _kill_workers(pool)
                elif time.monotonic() > deadline:
                    hung |= {i for i, job in enumerate(jobs) if not job.done()}
                    _kill_workers(pool)
        finally:
            _close(pool, jobs)
        return [self._result(job, wait_s if i in hung else None) for i, job in enumerate(jobs)]

    def _result(self, job, hung_after: float | None) -> BuilderResult:
        """As LocalBuilder.build reads a pool's outcome."""
        if job.cancelled():
            return BuilderResult(None, INTERRUPTED)
        error = job.exception()
        if error is None:
            return BuilderResult(job.result(), None)
        if self.stop.requested:
            return BuilderResult(None, INTERRUPTED)
        if hung_after is not None:
            return BuilderResult(None, f"LocalBuilder: no answer from the build process {hung_after:.0f} s after "
                                       "the batch's builds were started (killed)")
        if isinstance(error, TimeoutError):
            return BuilderResult(None, f"LocalBuilder: Timeout, killed after {self.timeout_sec} seconds")
        return BuilderResult(None, "LocalBuilder: An exception occurred\n" + str(error))


@derived_object
class StoppableRunner(LocalRunner._cls):
    """MetaSchedule's LocalRunner (which measures one candidate at a time), measuring no further candidate
    once a stop is requested: those, and a measurement failing after the request, get the INTERRUPTED error."""

    def __init__(self, stop: StopRequest, **kwargs):
        self.stop = stop                    # before LocalRunner's __init__, which runs `_sanity_check`
        super().__init__(**kwargs)

    def _sanity_check(self) -> None:
        try:
            _checked(super()._sanity_check, self.stop)
        except KeyboardInterrupt:
            self.pool.shutdown()
            raise

    def run(self, runner_inputs: list) -> list:
        return [self._measure(one) if not self.stop.requested else LocalRunnerFuture(error_message=INTERRUPTED)
                for one in runner_inputs]

    def _measure(self, one) -> LocalRunnerFuture:
        """LocalRunner.run of one candidate, waited for here: when the worker has not answered `timeout_sec` +
        `HUNG_GRACE_S` after the job was sent, its process is killed. The worker's own timeout is a Python timer
        thread, which never runs when the measurement hangs holding the GIL: a tune under load once waited on such
        a worker for good."""
        job = self.pool.submit(_runner_worker_func, self.f_alloc_argument, self.f_run_evaluator, self.f_cleanup,
                               self.evaluator_config, self.alloc_repeat, str(one.artifact_path),
                               str(one.device_type), tuple(info.as_json() for info in one.args_info))
        deadline = time.monotonic() + self.timeout_sec + HUNG_GRACE_S
        hung = False
        while not job.done():
            try:
                job.exception(timeout=0.1)
            except concurrent.futures.TimeoutError:
                if time.monotonic() > deadline:
                    hung = True
                    _kill_workers(self.pool)            # its reader then ends: the job fails, the pool restarts it
        if self.stop.requested and (hung or job.exception() is not None):
            return LocalRunnerFuture(error_message=INTERRUPTED)
        if hung:
            return LocalRunnerFuture(error_message=f"LocalRunner: no answer from the measuring process "
                                                   f"{self.timeout_sec + HUNG_GRACE_S:.0f} s after the job was "
                                                   f"sent (killed)\n")
        error = job.exception()
        if error is None:
            return LocalRunnerFuture(res=job.result(), error_message=None)
        if isinstance(error, TimeoutError):
            return LocalRunnerFuture(error_message=f"LocalRunner: Timeout, killed after {self.timeout_sec} seconds\n")
        return LocalRunnerFuture(error_message="LocalRunner: An exception occurred\n" + str(error))

    def close(self) -> None:
        """Ends the measuring process now, not whenever the garbage collector gets to it (maybe in one of the
        pool's own threads: "cannot join current thread")."""
        _close(self.pool, [])


@derived_object
class StoppableRoundRobin(PyTaskScheduler):
    """MetaSchedule's round-robin task scheduler, which hands out no further batch once a stop is requested
    (MetaSchedule then joins the batch being measured and ends the tune)."""

    def __init__(self, stop: StopRequest):
        super().__init__()
        self.stop = stop
        self.last = -1

    def next_task_id(self) -> int:
        if self.stop.requested:
            return -1
        scheduler = self._outer()
        tasks = scheduler.tasks_
        for task_id in range(len(tasks)):
            scheduler.touch_task(task_id)
        for _ in range(len(tasks)):
            self.last = (self.last + 1) % len(tasks)
            if not tasks[self.last].is_terminated:
                if tasks[self.last].runner_futures is not None:
                    scheduler.join_running_task(self.last)
                return self.last
        return -1


@derived_object
class MeasuredOnly(PyMeasureCallback):
    """MetaSchedule's default measure callbacks, which record only the candidates that were measured (or
    failed on their own): an INTERRUPTED one is not a failed schedule, and recorded as one (1e10 s) it would
    never be tried again when the tune resumes. The cost model is not trained once a stop is requested."""

    def __init__(self, stop: StopRequest):
        super().__init__()
        self.stop = stop
        self.record = measure_callback.AddToDatabase()
        self.train = measure_callback.UpdateCostModel()
        self.cleanup = measure_callback.RemoveBuildArtifact()

    def apply(self, task_scheduler, task_id, candidates, builder_results, runner_results) -> None:
        keep = [i for i, r in enumerate(runner_results) if r.error_msg is None or str(r.error_msg) != INTERRUPTED]
        if keep:
            kept = [[items[i] for i in keep] for items in (candidates, builder_results, runner_results)]
            for callback in (self.record,) if self.stop.requested else (self.record, self.train):
                callback.apply(task_scheduler, task_id, *kept)
        self.cleanup.apply(task_scheduler, task_id, candidates, builder_results, runner_results)
