"""Tuning-log files read as untrusted input: a log folder may come from anyone ($DYNTVM_TUNING_LOGS, a shared
folder), so before anything parses ``manifest.json`` or MetaSchedule's database, each file must be a regular
file (not a FIFO that would block the open, nor ``/dev/zero`` that would fill memory, nor a symlink to one) of
bounded size, and its JSON must be nested no deeper than real logs are (TVM's own JSON parser recurses: a deep
nesting would overflow its stack). MetaSchedule only ever reads copies of the bytes checked here.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile

MAX_MANIFEST_BYTES = 64 << 20
MAX_DATABASE_BYTES = 64 << 20       # each database file; a tune of 200 kernels x 64 trials: ~20 MB
MAX_JSON_DEPTH = 32                 # real manifests nest 5 deep, database records 7
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")


class LogFileError(ValueError):
    """A tuning-log file that is refused: the message names the file and the reason."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def check_regular(path: str, limit: int) -> os.stat_result:
    """The stat of `path` (symlinks followed) if it is a regular file of at most `limit` bytes; else
    LogFileError (FileNotFoundError's message for a missing one)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise LogFileError(f"{path} is missing") from None
    except OSError as e:
        raise LogFileError(f"{path} cannot be read ({type(e).__name__}: {e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise LogFileError(f"{path} is a {_kind(st.st_mode)}, not a regular file")
    if st.st_size > limit:
        raise LogFileError(f"{path} is {st.st_size} bytes, more than the {limit >> 20} MiB a tuning log file may be")
    return st


def read_regular_file(path: str, limit: int) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes, else LogFileError. The file is checked
    before it is opened (opening a FIFO blocks) and again once open (it may have been swapped meanwhile),
    and never more than `limit` bytes are read (it may grow meanwhile)."""
    before = check_regular(path, limit)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise LogFileError(f"{path} cannot be read ({type(e).__name__}: {e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise LogFileError(f"{path} was replaced while being read")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise LogFileError(f"{path} cannot be read ({type(e).__name__}: {e.strerror or e})") from None
    if len(data) > limit:
        raise LogFileError(f"{path} is more than the {limit >> 20} MiB a tuning log file may be")
    return data


def json_depth(value) -> int:
    """How deeply lists and dicts nest in `value` (0: a scalar); iterative, so any depth is measured."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(data: bytes, what: str):
    """`data` parsed as JSON, nested at most MAX_JSON_DEPTH deep; LogFileError naming `what` otherwise."""
    try:
        value = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise LogFileError(f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise LogFileError(f"{what} is not valid JSON ({type(e).__name__}: {e})") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise LogFileError(f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels")
    return value


def read_json(path: str, limit: int = MAX_MANIFEST_BYTES):
    """The JSON value of the file `path` (see `read_regular_file`, `parse_json`)."""
    return parse_json(read_regular_file(path, limit), path)


def check_json_lines(data: bytes, path: str) -> None:
    """`data` (a MetaSchedule database file: one JSON value per line) must parse line by line."""
    for number, line in enumerate(data.split(b"\n"), 1):
        if line.strip():
            parse_json(line, f"{path} line {number}")


def read_database_files(folder: str) -> dict:
    """``{file name: bytes}`` of the MetaSchedule database files of a log folder, checked (`check_json_lines`)."""
    out = {}
    for name in DATABASE_FILES:
        path = os.path.join(folder, name)
        out[name] = read_regular_file(path, MAX_DATABASE_BYTES)
        check_json_lines(out[name], path)
    return out


def load_database(files: dict):
    """A MetaSchedule database of the checked `files` (`read_database_files`): TVM reads copies of them in a
    private folder, so what it parses is what was checked. Raises what TVM raises on records it rejects."""
    from tvm.s_tir import meta_schedule as ms
    private = tempfile.mkdtemp(prefix="dyntvm-log-")
    try:
        for name, data in files.items():
            with open(os.path.join(private, name), "wb") as f:
                f.write(data)
        return ms.database.JSONDatabase(*(os.path.join(private, name) for name in DATABASE_FILES),
                                        allow_missing=False)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def check_folder_to_resume(folder: str) -> None:
    """LogFileError unless the files a tune resumes from (and appends to) in `folder` are regular files with
    database lines that parse: MetaSchedule opens them itself. What is absent is created by the tune."""
    for name in DATABASE_FILES:
        path = os.path.join(folder, name)
        if os.path.lexists(path):
            data = read_regular_file(path, MAX_DATABASE_BYTES)
            if data and not data.endswith(b"\n"):
                raise LogFileError(f"{path} ends in an unfinished line (a tune killed while writing it?)")
            check_json_lines(data, path)
    logs = os.path.join(folder, "logs")                 # MetaSchedule's log files, opened for appending
    if os.path.lexists(logs):
        if not os.path.isdir(logs):
            raise LogFileError(f"{logs} is not a folder")
        for entry in os.scandir(logs):
            if entry.name.endswith(".log"):
                check_regular(entry.path, 1 << 62)


def create_database_files(folder: str) -> None:
    """Empty MetaSchedule database files in `folder` where there are none, so that a log interrupted before
    MetaSchedule wrote any is still complete (an empty database is a valid one)."""
    for name in DATABASE_FILES:
        os.close(os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o666))
