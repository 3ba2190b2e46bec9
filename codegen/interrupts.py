"""Ctrl-C during a build: KeyboardInterrupt where it lands, and again before anything is kept.

A KeyboardInterrupt raised while TVM's C++ runs our Python (a schedule rule calling a schedule primitive, a
legalization, a Python module pass: tvm-ffi runs pending signal handlers from inside long C++ calls) comes
back out of the C++ call as an ordinary error, which a fallback around that call takes for a failure of the
call (a schedule rule that does not apply, say) and goes on: the compile then finished as if no Ctrl-C had
come (seen: a Ctrl-C 7-8 s into the transformer example's 15 s build, caught as a failing matmul schedule).

`noted_interrupt` keeps Python's own behaviour (KeyboardInterrupt where the signal lands) and notes that the
signal came; `check` raises KeyboardInterrupt again if it did: before a build is stored in the compile
cache (`build._store`: a library built through such a fallback is never cached) and before `dt.compile`
returns. An error that ends the build after such a signal (the KeyboardInterrupt come back out of the C++
call as a RuntimeError, where no fallback took it) ends `dt.compile` as KeyboardInterrupt, from that error.
A program that ignores SIGINT or handles it itself, or a build outside the main thread, keeps its own way
(nothing is noted). `tuning_interrupt` is the tune's stricter form (the signal only sets a flag).
"""
from __future__ import annotations

import contextlib
import signal
import threading

_came = False        # a SIGINT arrived inside the outermost `noted_interrupt`


def _on_sigint(_signum, _frame):
    global _came
    _came = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def noted_interrupt():
    """Note SIGINTs for the duration (see the module); nested uses share the outermost's note."""
    global _came
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield           # nested in one (our handler is in place), or a program's own SIGINT handling
        return
    _came = False
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    except Exception as e:
        if _came:       # the Ctrl-C came back out of a C++ call as this error (a RuntimeError): say what it was
            raise KeyboardInterrupt from e
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        came, _came = _came, False
    if came:            # raised and caught as an error somewhere inside: the build must not go on
        raise KeyboardInterrupt


def check() -> None:
    """KeyboardInterrupt if a SIGINT came inside the current `noted_interrupt` (swallowed where it landed)."""
    if _came:
        raise KeyboardInterrupt
