"""Loops against JAX's compiled loops (issue 25): dyntvm's compiled model vs the same program written the way a
JAX user writes it (`jax.jit` of `lax.while_loop` / `lax.scan` / `lax.cond`), interleaved in one process.

    pip install "jax[cpu]"
    .venv/bin/python benchmarks/bench_jax_loops.py [--rounds 5] [--threads 1] [--only decoder,nested,lstm]

Programs:
* ``decoder``: the bundled GRU greedy decoder (`examples/decoder.py`): a prompt-encoding foreach, then a
  while_loop whose carry *grows* (the token list) and whose stop depends on the data. JAX loop carries keep
  their shapes, so the JAX version preallocates the token and logits buffers to ``P + max_steps`` /
  ``max_steps`` rows, writes one row per step (``.at[].set``) and returns the count; the caller slices.
* ``nested``: a while_loop of ``n`` steps whose body is a foreach over the rows of ``x[N, 32]`` with a cond per
  row (``tanh(r @ W)`` if ``sum(r) > 0`` else ``r / 2``) - a cond in a foreach in a while.
* ``lstm``: the bundled LSTM example (a foreach with a static body: dyntvm's compiled loop) vs ``lax.scan``.

Each result is checked against dyntvm's eager mode (numpy) first. One thread each by default (TVM, XLA's CPU
client, BLAS): the loops are latency bound. Prints per program the median over rounds of each block's median
call, and the ratio dyntvm / JAX (below 1: dyntvm faster). Not a test: numbers depend on the machine and load.
"""
from __future__ import annotations

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from thread_env import threads_from_argv  # noqa: E402

import os  # noqa: E402

if __name__ == "__main__":          # imported (tests/test_bench_jax_loops.py): the importer's pools stay as they are
    THREADS = threads_from_argv(sys.argv, 1)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
                          if THREADS == 1 else "")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402

import dyntvm as dt  # noqa: E402
from dyntvm import F, examples  # noqa: E402
from bench_peers import measure  # noqa: E402

D = 32
_W = (np.random.default_rng(5).standard_normal((D, D)) / np.sqrt(D)).astype(np.float32)


def nested(x, n):
    """while i < n: x = [tanh(r @ W) if sum(r) > 0 else r / 2 for r in x]."""
    def rows(x):
        def row(r, _states):
            y = F.cond(F.sum(r) > 0, lambda: F.reshape(F.tanh(F.matmul(F.reshape(r, (1, D)), _W)), (D,)),
                       lambda: r * 0.5)
            return y, []
        ys, _ = F.foreach(row, x, [])
        return ys

    def body(i, x):
        return [i + 1, rows(x)]
    _, out = F.while_loop(lambda i, x: i < n, body, [np.int64(0), x])
    return out


def jax_nested():
    import jax
    import jax.numpy as jnp
    from jax import lax
    w = jnp.asarray(_W)

    def row(_c, r):
        return None, lax.cond(jnp.sum(r) > 0, lambda r: jnp.tanh(r @ w), lambda r: r * 0.5, r)

    @jax.jit
    def run(x, n):
        def body(c):
            i, x = c
            return i + 1, lax.scan(row, None, x)[1]
        return lax.while_loop(lambda c: c[0] < n, body, (0, x))[1]
    return run


def jax_decoder(max_steps: int):
    import jax
    import jax.numpy as jnp
    from jax import lax
    from dyntvm.examples import decoder as d
    E, Wx, Wh, bx, bh, Wout, bout, onehot = (jnp.asarray(a) for a in (d.E, d.Wx, d.Wh, d.bx, d.bh, d.Wout,
                                                                          d.bout, d.END_ONEHOT))
    H = d.HIDDEN

    def gru(tok, h):
        x = E[tok][None]
        xr, xz, xn = jnp.split(x @ Wx + bx, 3, axis=-1)
        hr, hz, hn = jnp.split(h @ Wh + bh, 3, axis=-1)
        r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        return (1.0 - z) * n + z * h

    @jax.jit
    def run(prompt):
        P = prompt.shape[0]
        (h, last), _ = lax.scan(lambda c, t: ((gru(t, c[0]), t), None), (jnp.zeros((1, H)), jnp.int32(d.BOS)),
                                prompt)
        tokens = jnp.zeros((P + max_steps,), jnp.int32).at[:P].set(prompt)
        logits = jnp.zeros((max_steps, d.VOCAB), jnp.float32)

        def body(c):
            i, tokens, logits, h, last = c
            h = gru(last, h)
            lg = (h @ Wout)[0] + bout + (P + i).astype(jnp.float32) * onehot
            nxt = jnp.argmax(lg).astype(jnp.int32)
            return i + 1, tokens.at[P + i].set(nxt), logits.at[i].set(lg), h, nxt
        n, tokens, logits, _, _ = lax.while_loop(lambda c: (c[4] != d.END) & (c[0] < max_steps), body,
                                                 (0, tokens, logits, h, last))
        return tokens, logits, n

    def call(prompt):
        tokens, logits, n = run(prompt)
        n = int(n)                                  # the host reads the count (one sync), as a JAX user would
        return np.asarray(tokens)[:prompt.shape[0] + n], np.asarray(logits)[:n]
    return call


def jax_lstm():
    import jax
    import jax.numpy as jnp
    from jax import lax
    from dyntvm.examples import lstm as m
    W, U, b = (jnp.asarray(a) for a in (m.W, m.U, m.b))

    def step(c, x):
        h, cc = c
        i, f, g, o = jnp.split(x @ W + h @ U + b, 4, axis=-1)
        cc = jax.nn.sigmoid(f) * cc + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(cc)
        return (h, cc), h

    @jax.jit
    def run(xs, h0, c0):
        (h, _), hs = lax.scan(step, (h0, c0), xs)
        return hs, h
    return run


def cases():
    """name -> (dyntvm function, specs, inputs, a function making the JAX callable on numpy inputs)."""
    rng = np.random.default_rng(0)
    dec = examples.get("decoder")
    prompt, max_steps = dec.make_inputs(rng, P=3, max_steps=32)
    x = rng.standard_normal((16, D)).astype(np.float32)
    lstm = examples.get("lstm")
    ls = lstm.make_inputs(rng, T=64, B=1)

    def decoder_jax():
        run = jax_decoder(int(max_steps))
        return lambda p, _m: run(p.astype(np.int32))

    def nested_jax():
        run = jax_nested()
        return lambda x, n: np.asarray(run(x, int(n)))

    def lstm_jax():
        run = jax_lstm()
        return lambda *a: tuple(np.asarray(v) for v in run(*a))
    return {
        "decoder": (dec.fn, dec.specs, (prompt, max_steps), decoder_jax),
        "nested": (nested, (dt.TensorSpec(("N", D)), dt.TensorSpec((), "int64")), (x, np.int64(6)), nested_jax),
        "lstm": (lstm.fn, lstm.specs, ls, lstm_jax),
    }


def _leaves(v):
    return [np.asarray(a) for a in (v if isinstance(v, (list, tuple)) else [v])]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--block", type=float, default=0.5, help="seconds per timed block")
    ap.add_argument("--only", default="", help="comma-separated program names")
    args = ap.parse_args(argv)
    try:
        import jax  # noqa: F401 - only to know it is there; its threads start at the first jit
    except ImportError:
        sys.exit('bench_jax_loops: needs JAX: pip install "jax[cpu]"')
    rows = []
    chosen = {k: v for k, v in cases().items() if not args.only or k in args.only.split(",")}
    # every dyntvm model compiled before JAX starts its threads (compiling may fork a child process)
    models = {name: dt.compile(fn, *specs) for name, (fn, specs, _, _) in chosen.items()}
    for name, (fn, specs, inputs, make_jax) in chosen.items():
        model, jfn = models[name], make_jax()
        want = _leaves(fn(*inputs))
        for who, got in (("dyntvm", _leaves(model(*inputs))), ("jax", _leaves(jfn(*inputs)))):
            assert len(got) == len(want), (name, who)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=2e-3, atol=2e-3,
                                           err_msg=f"{name}: {who} differs from eager")
        prepared = {"dyntvm": types.SimpleNamespace(fn=model, args=inputs),
                    "jax": types.SimpleNamespace(fn=jfn, args=inputs)}
        res = measure(prepared, args.rounds, args.block, 0.05)
        d, j = res["dyntvm"]["median_ms"], res["jax"]["median_ms"]
        rows.append((name, d, j, res["dyntvm"]["min_ms"], res["jax"]["min_ms"]))
        print(f"{name}: dyntvm {d:.4f} ms, jax {j:.4f} ms, dyntvm / jax {d / j:.2f}", flush=True)
    print(f"\njax {jax.__version__}, {THREADS} thread(s), load average {os.getloadavg()[0]:.2f}")
    print("| program | dyntvm ms | JAX (jit) ms | dyntvm / JAX | fastest call dyntvm / JAX |")
    print("|---|---|---|---|---|")
    for name, d, j, dm, jm in rows:
        print(f"| {name} | {d:.4f} | {j:.4f} | {d / j:.2f} | {dm:.4f} / {jm:.4f} = {dm / jm:.2f} |")


if __name__ == "__main__":
    main()
