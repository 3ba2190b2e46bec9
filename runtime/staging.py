"""The hidden folders `model.save` writes next to its target (`artifact.save`), and their cleanup.

A save writes ``.<name>.dyntvm-new-<pid>-<token>`` (plus ``.tar`` for a tar artifact) and renames it into
place; replacing an old artifact renames that to ``.<name>.dyntvm-old-<pid>-<token>`` first. A writer holds
an exclusive flock on each folder while it works, so a process killed mid-save (SIGKILL, power loss) leaves
folders no one holds. The next save or load of the same path removes those: a folder counts as stale
only when its lock is free, its writer's pid is not running and it belongs to this user, so a concurrent
writer's folder (another process, also one in another pid namespace on the same machine) and another user's
folder in a shared directory are never touched. A stale "old" folder
whose artifact was never replaced (killed between the two renames) is renamed back instead.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil

try:
    import fcntl
except ImportError:        # no flock (Windows): the writer's pid alone decides
    fcntl = None

NEW, OLD = "dyntvm-new", "dyntvm-old"


def new_token() -> str:
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def sibling(path: str, tag: str, token: str) -> str:
    """A hidden name next to `path` (same file system, so renames are atomic)."""
    parent, base = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{base}.{tag}-{token}")


@contextlib.contextmanager
def held(folder: str):
    """Hold an exclusive lock on `folder` (its inode: it stays held across renames) until the block ends."""
    if fcntl is None:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True            # another user's process, or not a pid: leave its folder alone
    return True


def _unheld(folder: str) -> bool:
    """Whether no process holds `folder`'s lock (False also when it cannot be opened)."""
    if fcntl is None:
        return True
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _own(path: str) -> bool:
    """Whether `path` (not followed) belongs to this user (always, without POSIX owners)."""
    return not hasattr(os, "getuid") or os.lstat(path).st_uid == os.getuid()


def remove_stale(path: str) -> None:
    """Remove the folders (and tar files) that killed saves of `path` left next to it. Errors are ignored:
    cleaning up is a courtesy, never the reason a save or load fails."""
    parent, base = os.path.split(os.path.abspath(os.fspath(path)))
    pattern = re.compile(rf"^\.{re.escape(base)}\.({NEW}|{OLD})-(\d+)-[0-9a-f]+(\.tar)?$")
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return
    for name in sorted(names, key=lambda n: n.endswith(".tar")):      # folders first, then their tar files
        m = pattern.match(name)
        if m is None or _pid_running(int(m.group(2))):
            continue
        found = os.path.join(parent, name)
        with contextlib.suppress(OSError):
            if not _own(found):         # another user's (a shared folder): never removed, nor renamed into place
                continue
            if m.group(3):                                  # a tar being written: stale with its folder
                if not os.path.lexists(found[:-len(".tar")]):
                    os.remove(found)
            elif os.path.isdir(found) and not os.path.islink(found) and _unheld(found):
                if m.group(1) == OLD and not os.path.lexists(os.path.join(parent, base)):
                    os.rename(found, os.path.join(parent, base))     # the artifact it was to be replaced by never came
                else:
                    shutil.rmtree(found)
