"""`dyntvm compile file.py:fn --autograph`: the model function's Python `if` / `for` on tensors converted (as
dt.compile(..., autograph=True)), run through the real CLI in subprocesses; outputs equal the Python function's
eager result at several sizes, incl. 0 and 1, both branches."""
import numpy as np
import pytest

import dyntvm as dt

from dyntvm.loader import import_file
from test_cli import assert_outputs, dyntvm, env, work  # noqa: F401  (fixtures)

MODEL = '''
from dyntvm import F


def clip_rows(x):
    if F.sum(x) > 0.0:                 # a Python if on a traced tensor: F.cond once converted
        y = x * 2.0
    else:
        y = x - 1.0
    total = F.zeros_like(F.sum(y, axis=0))
    for row in y:                      # a Python for over a traced tensor: F.foreach
        total = total + F.tanh(row)
    return y, total
'''


@pytest.mark.slow
def test_compile_with_autograph_runs_and_equals_python(env, work):  # noqa: F811
    (work / "ag_model.py").write_text(MODEL)
    art = work / "ag.dtvm"
    r = dyntvm(env, "compile", f"{work}/ag_model.py:clip_rows", "--input", "x:N,3", "--autograph", "-o", art)
    assert "compiling" in r.stdout
    fn = import_file(str(work / "ag_model.py")).clip_rows
    rng = np.random.default_rng(0)
    x = np.abs(rng.standard_normal((5, 3))).astype(np.float32)
    np.save(work / "x.npy", x)
    dyntvm(env, "run", art, "--input", f"x={work}/x.npy", "--output", work / "out", "--repeat", "1")
    assert_outputs(work / "out", [np.asarray(a) for a in fn(x)])
    model = dt.load(art)                 # the other sizes in this process (a subprocess each costs ~15 s)
    for n, sign in ((0, 1.0), (1, -1.0), (4, -1.0), (2, 1.0)):
        x = (np.abs(rng.standard_normal((n, 3))) * sign).astype(np.float32)
        for got, want in zip(model(x), fn(x)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_without_autograph_the_if_is_refused_and_autograph_takes_functions_only(env, work):  # noqa: F811
    (work / "ag_model.py").write_text(MODEL)
    r = dyntvm(env, "compile", f"{work}/ag_model.py:clip_rows", "--input", "x:N,3", "-o", work / "no.dtvm", ok=False)
    assert r.returncode != 0 and "F.cond" in r.stderr + r.stdout
    r = dyntvm(env, "compile", "--example", "lstm", "--autograph", "-o", work / "ex.dtvm", ok=False)
    assert r.returncode != 0 and "--autograph converts a Python model function" in r.stderr + r.stdout
