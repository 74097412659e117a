"""The environment maturin gave cargo for the wheel's build: what `env` takes to repeat it.

CI builds the wheel with zig (`maturin build --zig`): maturin then runs cargo with zig as
linker and C compiler for glibc 2.27 (``CARGO_TARGET_<triple>_LINKER``, ``CC_<triple>``,
``CARGO_ZIGBUILD_*`` and the like). cargo keeps a compiled crate only for the flags and
tools it was compiled with, so the Rust lane's clippy, rustdoc and test builds reuse the
wheel's dependencies only in that same environment; in any other, every crate compiles
again (about 250 CPU-seconds more on CI's machine). A cargo shim ahead on PATH during the
wheel's build writes its environment (``env -0``) when maturin runs ``cargo rustc``; this
prints what differs from the environment before the build, what maturin added, as
``NAME=value`` items each ended by a NUL byte (some names hold a ``-``, which no shell
``export`` takes; ``env`` takes them all):

    python .ci/wheel_env.py BEFORE DURING > .nox/_wheel_env
    mapfile -d '' wheel_env < .nox/_wheel_env; env "${wheel_env[@]}" cargo test ...

Prints nothing (and exits 0) when DURING is missing or names no zig linker: the Rust lane
then builds in cargo's own environment, only more slowly.
"""
from __future__ import annotations

import pathlib
import sys

# What the shell or the shim itself changes, not maturin.
IGNORED = {"PATH", "PWD", "OLDPWD", "SHLVL", "_"}


def read(path: pathlib.Path) -> dict[str, str]:
    pairs = path.read_bytes().decode("utf-8", "surrogateescape").split("\0")
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def main(before_path: str, during_path: str) -> int:
    during_file = pathlib.Path(during_path)
    if not during_file.exists():
        print(f"{during_path}: missing (maturin ran no `cargo rustc`?)", file=sys.stderr)
        return 0
    before, during = read(pathlib.Path(before_path)), read(during_file)
    added = {k: v for k, v in during.items() if k not in IGNORED and before.get(k) != v}
    if not any(k.startswith("CARGO_ZIGBUILD") for k in added):
        print(f"{during_path}: no zig in maturin's environment", file=sys.stderr)
        return 0
    out = "".join(f"{key}={added[key]}\0" for key in sorted(added))
    sys.stdout.buffer.write(out.encode("utf-8", "surrogateescape"))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
