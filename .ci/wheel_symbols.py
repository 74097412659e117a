"""Fails when the wheel's extension module needs a C library symbol without a version.

A wheel tagged manylinux_2_27 may use only what glibc 2.27 defines. maturin checks the
versions of the symbols the module takes from the C library, but a symbol that the glibc
it was linked against (zig's 2.27) does not define at all stays undefined with no
version, and passes that check: on a glibc without it, importing the module fails
("undefined symbol: ..."). The only such symbols allowed are weak ones (the code checks
for them at run time) and Python's own (an abi3 module takes them from the interpreter).

    python .ci/wheel_symbols.py dist/hostfeed-*.whl
"""
from __future__ import annotations

import pathlib
import subprocess
import sys
import tempfile
import zipfile


def unversioned(so: pathlib.Path) -> list[str]:
    """The strong undefined dynamic symbols of ``so`` that carry no version and are not
    Python's."""
    out = subprocess.run(["nm", "-D", "--undefined-only", str(so)], check=True,
                         capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        kind, name = line.split()[-2:]
        if kind == "U" and "@" not in name and not name.startswith(("Py", "_Py")):
            found.append(name)
    return found


def main(wheel: str) -> int:
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as z:
        modules = [n for n in z.namelist() if n.endswith(".so")]
        if not modules:
            print(f"{wheel}: no extension module", file=sys.stderr)
            return 1
        bad = {}
        for name in modules:
            so = pathlib.Path(z.extract(name, tmp))
            missing = unversioned(so)
            if missing:
                bad[name] = missing
    if bad:
        for name, symbols in bad.items():
            print(f"{wheel}: {name} needs symbols without a version, which a glibc older "
                  f"than the one linked against may lack: {', '.join(symbols)}",
                  file=sys.stderr)
        return 1
    print(f"{wheel}: every C library symbol the module needs has a version")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
