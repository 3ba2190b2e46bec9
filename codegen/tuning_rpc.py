"""Tuning across machines: MetaSchedule's RPC runner behind a TVM RPC tracker (``dyntvm tune --rpc HOST:PORT
--key KEY``).

The tracker (``python -m tvm.exec.rpc_tracker --port 9190``) queues the machines that registered with it
under a key (``python -m tvm.exec.rpc_server --tracker HOST:9190 --key KEY``, one per machine); the tune
builds each batch of candidates here and the RPC runner measures them on those servers, as many at once as
there are servers. What stays on this machine: the search, the builds, and the final comparison of the
best schedule with the default in its region (`tuning_verdict`), so the servers should be machines like this
one (the log is keyed to this machine's target: `tuning_keys`).

Before a tune, the tracker is asked (with timeouts: an address that is not a tracker cannot hang it) how many
servers are registered under the key; none, or no tracker, is a CompileError naming what was found.
"""
from __future__ import annotations

import socket
import struct

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import RPCRunner
from tvm.s_tir.meta_schedule.runner.config import RPCConfig

from ..errors import CompileError

CONNECT_TIMEOUT_S = 10      # reaching the tracker and hearing its answer
SESSION_TIMEOUT_S = 60      # one candidate on a server: upload, load, measure (MetaSchedule kills it after)


def parse_address(address: str) -> tuple:
    """``(host, port)`` of ``HOST:PORT``; a CompileError naming the expected form otherwise."""
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CompileError(f"tune: --rpc {address!r}: expected the tracker as HOST:PORT, e.g. 127.0.0.1:9190")
    return host.strip("[]"), int(port)


def tracker_summary(host: str, port: int, timeout: float | None = None) -> dict:
    """The tracker's summary (``{"queue_info": {key: {"free", "pending"}}, "server_info": [...]}``), asked with
    TVM's tracker protocol over a socket with a timeout; a CompileError when nothing, or not a tracker, answers."""
    from tvm.rpc import base
    where, timeout = f"{host}:{port}", timeout or CONNECT_TIMEOUT_S
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                raise CompileError(f"tune: {where} is not a TVM RPC tracker (it answered another protocol)")
            base.sendjson(sock, [base.TrackerCode.SUMMARY])
            answer = base.recvjson(sock)
    except (OSError, ValueError, struct.error) as e:
        raise CompileError(f"tune: cannot reach a TVM RPC tracker at {where} ({type(e).__name__}: {e}); start one "
                           "with `python -m tvm.exec.rpc_tracker --port PORT`") from None
    if not (isinstance(answer, list) and len(answer) == 2 and answer[0] == base.TrackerCode.SUCCESS
            and isinstance(answer[1], dict)):
        raise CompileError(f"tune: {where} is not a TVM RPC tracker (its summary is {str(answer)[:200]})")
    return answer[1]


def servers_for(host: str, port: int, key: str) -> int:
    """How many RPC servers are registered under `key` at the tracker; a CompileError naming the keys it has
    when none."""
    summary = tracker_summary(host, port)
    keys = [str(s.get("key", "")) for s in summary.get("server_info", []) if isinstance(s, dict)]
    count = keys.count(f"server:{key}")
    if count == 0:
        have = sorted({k.partition(":")[2] for k in keys}) or ["none"]
        raise CompileError(f"tune: no RPC server is registered under the key {key!r} at the tracker {host}:{port} "
                           f"(keys it has: {', '.join(have)}); start one with `python -m tvm.exec.rpc_server "
                           f"--tracker {host}:{port} --key {key}`")
    return count


def check_rpc(address: str, key) -> tuple:
    """``(host, port, key, servers)`` for a tune through the tracker at `address`, after asking it."""
    if not isinstance(key, str) or not key or any(c.isspace() for c in key):
        raise CompileError(f"tune: --rpc needs the servers' key (--key KEY, no spaces), got {key!r}")
    host, port = parse_address(address)
    return host, port, key, servers_for(host, port, key)


@derived_object
class StoppableRPCRunner(RPCRunner._cls):
    """MetaSchedule's RPCRunner, measuring no further candidate once a stop is requested (as
    `tuning_interrupt.StoppableRunner`): those get the INTERRUPTED error."""

    def __init__(self, stop, **kwargs):
        self.stop = stop
        super().__init__(**kwargs)

    def run(self, runner_inputs: list) -> list:
        from .tuning_interrupt import INTERRUPTED, LocalRunnerFuture
        if self.stop.requested:
            return [LocalRunnerFuture(error_message=INTERRUPTED) for _ in runner_inputs]
        return super().run(runner_inputs)

    def close(self) -> None:
        """Ends the pool of RPC sessions now (not in the garbage collector)."""
        self.pool.shutdown()


def rpc_runner(stop, host: str, port: int, key: str, servers: int = 1):
    """The runner of a tune through the tracker: one session per server at a time."""
    config = RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key, session_timeout_sec=SESSION_TIMEOUT_S)
    return StoppableRPCRunner(stop, rpc_config=config, max_workers=max(1, servers))
