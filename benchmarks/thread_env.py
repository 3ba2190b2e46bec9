"""Thread counts for every pool (TVM, OpenMP, BLAS), set in the environment before they are imported: the
benchmark scripts call `threads_from_argv` first thing, before numpy / torch / TVM."""
import os


def threads_from_argv(argv: list, default: int) -> int:
    """`--threads N` (or `--threads=N`) of `argv`, else `default`, written to the pools' environment variables."""
    n = default
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            n = int(argv[i + 1])
        elif a.startswith("--threads="):
            n = int(a.split("=", 1)[1])
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[var] = str(n)
    return n
