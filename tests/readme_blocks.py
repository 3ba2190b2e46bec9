"""The code blocks of a Markdown file, and a driver that runs them in order as a user would.

    python tests/readme_blocks.py BLOCKS.json     # (cwd: the folder to run in) run the blocks test_readme.py wrote

A block is a fenced ```python or ```bash block. `<!-- readme-test: skip REASON -->` on the line before its
fence marks one the suite cannot run; a python block whose first line is a file name comment (`# my_model.py`)
is a file the reader saves, not code to run. Python blocks share one namespace (one interpreter session);
bash blocks each run in `bash -e -o pipefail` with the environment the caller gives (the activated venv).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

DIRECTIVE = re.compile(r"<!--\s*readme-test:\s*(\w+)\s*(.*?)\s*-->")
FILE_COMMENT = re.compile(r"#\s*([\w./-]+\.py)\s*$")


@dataclass
class Block:
    path: str              # the Markdown file
    line: int              # 1-based line of the opening fence
    lang: str              # "python", "bash", or another info string ("" for none)
    code: str
    skip: str | None       # the reason given by a skip directive
    save_as: str | None    # python blocks that are a file to save: its name


def parse_blocks(path: str, name: str | None = None) -> list[Block]:
    """The fenced blocks of `path`; each names its file as `name` (default: the file name)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks, i, previous = [], 0, ""
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            lang, start, body = line[3:].strip(), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"{path}:{start}: code block never closed")
            directive = DIRECTIVE.search(previous)
            if directive and directive.group(1) != "skip":
                raise ValueError(f"{path}:{start - 1}: unknown readme-test directive {directive.group(1)!r}")
            if directive and not directive.group(2):
                raise ValueError(f"{path}:{start - 1}: a readme-test skip needs a reason")
            save = FILE_COMMENT.match(body[0]) if body and lang == "python" else None
            blocks.append(Block(name or os.path.basename(path), start, lang, "\n".join(body) + "\n",
                                directive.group(2) if directive else None, save.group(1) if save else None))
        if line.strip():
            previous = line
        i += 1
    return blocks


def run_blocks(blocks: list[dict]) -> None:
    """Run the blocks in the current folder; stop at the first failure, naming its file and line."""
    namespace: dict = {"__name__": "__main__"}
    sys.path.insert(0, os.getcwd())          # as in an interactive session: files the reader saved import
    for b in map(lambda d: Block(**d), blocks):
        where, start = f"{b.path}:{b.line}", time.perf_counter()
        print(f"--- {where} ({b.lang}{', saved as ' + b.save_as if b.save_as else ''})", flush=True)
        if b.save_as:
            with open(b.save_as, "w") as f:
                f.write(b.code)
        elif b.lang == "python":
            exec(compile(b.code, where, "exec"), namespace)      # noqa: S102 - the README's own code
        elif b.lang == "bash":
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b.code])
            if r.returncode:
                sys.exit(f"{where}: the bash block exited with {r.returncode}")
        print(f"--- {where} done in {time.perf_counter() - start:.1f} s", flush=True)


def block_dicts(blocks: list[Block]) -> list[dict]:
    return [asdict(b) for b in blocks]


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        run_blocks(json.load(f))
