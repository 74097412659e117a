"""The README as a new user meets it: its install commands, then every Python block in order.

    python .ci/readme_check.py --list                 # the steps, in README order
    python .ci/readme_check.py --install WHEEL --run  # fresh venv: README's pip commands, blocks

``--install WHEEL`` runs the ``pip install`` commands of the README's bash blocks that come
before its last Python block, in order, with the checkout (``.``) replaced by ``WHEEL``
(other commands, tests and benches, are not run). ``--run`` then runs every Python block
in order, in one fresh interpreter per block, all in one new working directory (so a
block may read what an earlier one wrote), and fails on the first that fails. A block
right after a line ``<!-- readme-check: skip (REASON) -->`` is listed but not run (for
blocks that need a GPU, say); the reason is printed.

The test suite imports this module (``tests/python/test_examples.py``): it checks that
each block imports only what the README installed before it, and runs the blocks in the
test environment; CI (``.ci/run``) runs it in a fresh virtual environment.
"""
from __future__ import annotations

import argparse
import ast
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)
_SKIP = re.compile(r"<!-- readme-check: skip \((.+?)\) -->\s*$")


class Block(NamedTuple):
    lang: str  # "python" or "bash"
    code: str  # dedented
    line: int  # 1-based line of the opening fence
    skip: str | None  # why it is not run, if marked


def blocks(text: str | None = None) -> list[Block]:
    """The README's python and bash blocks, in order.

    Example:
        >>> [b.lang for b in blocks("```bash\\npip install .\\n```\\n```python\\nx = 1\\n```\\n")]
        ['bash', 'python']
    """
    text = README.read_text() if text is None else text
    out = []
    for m in _FENCE.finditer(text):
        if m.group(2) not in ("python", "bash"):
            continue
        before = text[:m.start()].rstrip("\n ").rsplit("\n", 1)[-1]
        skip = _SKIP.search(before)
        out.append(Block(m.group(2), textwrap.dedent(m.group(3)),
                         text.count("\n", 0, m.start()) + 1, skip.group(1) if skip else None))
    return out


#: Commands that make a line the README's way to run the tests, not a user's step.
_TEST_COMMANDS = ("pytest", "cargo", "nox")


def pip_installs(block: Block) -> list[list[str]]:
    """The ``pip install`` commands of a bash block, as argument lists (comments dropped,
    ``&&`` chains split), leaving out lines that run the tests (their installs are for
    the tests, not for a user following the README).

    Example:
        >>> pip_installs(Block("bash", "pip install '.[zarr]' x && python -m demo  # c\\n"
        ...                            "pip install '.[test]' && cargo test\\n", 1, None))
        [['.[zarr]', 'x']]
    """
    out = []
    for line in block.code.splitlines():
        commands = [shlex.split(part, comments=True) for part in line.split("&&")]
        if any(w in _TEST_COMMANDS for words in commands for w in words):
            continue
        out += [words[2:] for words in commands if words[:2] == ["pip", "install"]]
    return out


def installs_before_last_python(steps: list[Block]) -> list[list[str]]:
    """Every ``pip install`` that the README gives before its last Python block."""
    last = max(i for i, b in enumerate(steps) if b.lang == "python")
    return [cmd for b in steps[:last] if b.lang == "bash" for cmd in pip_installs(b)]


def with_wheel(args: list[str], wheel: str) -> list[str]:
    """``args`` with the checkout (``.``, ``.[extra]``) replaced by ``wheel``.

    Example:
        >>> with_wheel([".", ".[zarr]", "nox"], "/d/h.whl")
        ['/d/h.whl', '/d/h.whl[zarr]', 'nox']
    """
    return [wheel + a[1:] if a == "." or a.startswith(".[") else a for a in args]


def imported_modules(code: str) -> set[str]:
    """Top-level names of the modules a block imports.

    Example:
        >>> sorted(imported_modules("import jax.numpy as jnp\\nfrom zarr import open"))
        ['jax', 'zarr']
    """
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def run_python_blocks(steps: list[Block], python: str = sys.executable,
                      workdir: str | None = None, source: str = "README.md") -> list[str]:
    """Runs every Python block in order, each in a fresh ``python``, all in ``workdir``
    (a new temporary directory by default); raises ``RuntimeError`` on the first failure,
    naming ``source`` (the page) and the block's line. Returns each Python block's stdout,
    in order ("" for a block marked to skip)."""
    workdir = workdir or tempfile.mkdtemp(prefix="readme-check-")
    env = dict(os.environ, MPLBACKEND="Agg")
    env.setdefault("JAX_PLATFORMS", "cpu")
    outputs = []
    for b in steps:
        if b.lang != "python":
            continue
        if b.skip:
            print(f"{source}:{b.line}: skipped ({b.skip})")
            outputs.append("")
            continue
        print(f"{source}:{b.line}: running", flush=True)
        r = subprocess.run([python, "-c", b.code], cwd=workdir, env=env, capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"{source}:{b.line}: the Python block failed "
                               f"(exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-4000:]}")
        outputs.append(r.stdout)
    return outputs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the steps")
    ap.add_argument("--install", metavar="WHEEL",
                    help="run the README's pip install commands with WHEEL for '.'")
    ap.add_argument("--run", action="store_true", help="run the Python blocks in order")
    args = ap.parse_args(argv)
    steps = blocks()
    if args.list:
        for b in steps:
            print(f"README.md:{b.line}: {b.lang}" + (f" (skip: {b.skip})" if b.skip else ""))
    if args.install:
        for cmd in installs_before_last_python(steps):
            full = [sys.executable, "-m", "pip", "install", "--quiet",
                    *with_wheel(cmd, args.install)]
            print("+", shlex.join(full), flush=True)
            subprocess.run(full, check=True)
    if args.run:
        run_python_blocks(steps)
        print(f"README: {sum(b.lang == 'python' and not b.skip for b in steps)} Python "
              f"blocks ran in order")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
