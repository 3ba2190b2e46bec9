"""Tuning across machines (`codegen/tuning_rpc.py`, ``dyntvm tune --rpc HOST:PORT --key KEY``): a TVM RPC tracker
and two RPC servers on localhost, started as real processes (`python -m tvm.exec.rpc_tracker`,
`python -m tvm.exec.rpc_server --tracker ... --key ...`), measure MetaSchedule's candidates for a tiny kernel
(few trials). Nothing can hang: every wait has a timeout, and the processes are killed in a `finally`.
Without a tracker, with an address that is not one, or with a key no server has, the tune is a CompileError."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen import tuning_rpc
from dyntvm.errors import CompileError

KEY = "dyntvm-test"
W = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
MODEL = """import numpy as np
from dyntvm import F
W = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
def tiny(x):
    return F.tanh(F.matmul(x, W))
"""


def tiny(x):
    return F.tanh(F.matmul(x, W))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)         # its own process group: the server forks workers


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


@pytest.fixture
def tracker(tmp_path):
    """``(address, [server log paths])``: a tracker and two servers under KEY, registered (at most 60 s)."""
    port = _free_port()
    procs, logs = [], []
    try:
        with open(tmp_path / "tracker.log", "w") as log:
            procs.append(_start(["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                                 "--port-end", str(port + 1)], log))
        for i in range(2):
            logs.append(tmp_path / f"server{i}.log")
            with open(logs[-1], "w") as log:
                server_port = _free_port()
                procs.append(_start(["tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(server_port),
                                     "--port-end", str(server_port + 1), "--tracker", f"127.0.0.1:{port}",
                                     "--key", KEY], log))
        deadline = time.monotonic() + 60
        while True:
            try:
                if tuning_rpc.servers_for("127.0.0.1", port, KEY) == 2:
                    break
            except CompileError:
                pass
            assert time.monotonic() < deadline, "the RPC servers did not register with the tracker in 60 s"
            assert all(p.poll() is None for p in procs), "an RPC process ended: " + \
                "".join(open(f).read()[-500:] for f in [tmp_path / "tracker.log", *logs])
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", logs
    finally:
        for p in procs:
            _stop(p)


@pytest.mark.slow
def test_the_servers_behind_a_tracker_measure_the_candidates(tracker, tmp_path):
    address, server_logs = tracker
    model = tmp_path / "tiny.py"
    model.write_text(MODEL)
    out = tmp_path / "log"
    env = {**os.environ, "DYNTVM_TUNE_BUSY_LOAD": "1000"}
    run = subprocess.run([sys.executable, "-m", "dyntvm", "tune", f"{model}:tiny", "--input", "x:8,32:float32",
                          "--trials", "4", "--rpc", address, "--key", KEY, "-o", str(out)],
                         capture_output=True, text=True, env=env, timeout=540)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tuned_under"]["runner"] == f"rpc {address} key {KEY} (2 servers)"
    assert manifest["kernels"] and all(k["status"] == "done" for k in manifest["kernels"]), manifest["kernels"]
    records = [json.loads(line) for line in (out / "database_tuning_record.json").read_text().splitlines() if line]
    measured = [r for r in records if r[1][1] and all(0 < s < 1e9 for s in r[1][1])]
    assert measured, "no candidate was measured"
    served = [f for f in server_logs if "connected from" in f.read_text()]
    assert served, "no RPC server was used"
    model_ = dt.compile(tiny, dt.TensorSpec((8, 32)), tuning_log=str(out), use_cache=False)
    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    np.testing.assert_allclose(model_(x), np.tanh(x @ W), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_key_no_server_has_is_a_compile_error(tracker):
    address, _ = tracker
    with pytest.raises(CompileError, match=f"no RPC server is registered under the key 'other'.*{KEY}"):
        dt.tune(tiny, dt.TensorSpec((8, 32)), trials=1, rpc=address, rpc_key="other", progress=False)


def test_no_tracker_is_a_compile_error():
    with pytest.raises(CompileError, match="cannot reach a TVM RPC tracker"):
        dt.tune(tiny, dt.TensorSpec((8, 32)), trials=1, rpc=f"127.0.0.1:{_free_port()}", rpc_key=KEY, progress=False)


def test_an_address_that_never_answers_times_out():
    """A listening socket that accepts and says nothing: the tracker's answer is awaited with a timeout."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        accepted = []
        threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
        with pytest.raises(CompileError, match="cannot reach"):
            tuning_rpc.tracker_summary("127.0.0.1", server.getsockname()[1], timeout=1)
        for conn, _ in accepted:
            conn.close()


@pytest.mark.parametrize("rpc, key, match", [("localhost", KEY, "HOST:PORT"), ("h:0", KEY, "HOST:PORT"),
                                             ("h:99999", KEY, "HOST:PORT"), ("127.0.0.1:1", None, "--key"),
                                             ("127.0.0.1:1", "a b", "--key"), (None, KEY, "--rpc")])
def test_rpc_arguments_are_checked(rpc, key, match):
    with pytest.raises(CompileError, match=match):
        dt.tune(tiny, dt.TensorSpec((8, 32)), trials=1, rpc=rpc, rpc_key=key, progress=False)
