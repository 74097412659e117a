"""Installation step of the accelerator checks (gpu_check.sh and tpu_check.sh), for a machine
without network whose Python already has JAX (and maybe some of the test tools): puts
hostfeed's wheel and only the *missing* test tools on a directory meant for PYTHONPATH,
never shadowing what the machine has (a foreign pytest or plugin loaded against the
machine's own would break the run).

For each module the tests need (pytest, pytest_timeout, zarr; matplotlib and tqdm when
their wheels are at hand, else the tests that use them skip) it tries the import in a
fresh interpreter with the directory on the path; on ModuleNotFoundError it unpacks the
wheel in the wheel directory that provides the missing top-level module and tries again,
so a package's dependencies come in one by one, only as far as the machine lacks them.

    python .ci/accelerators/check_install.py WHEEL_DIR SITE_DIR     # prints what it unpacked
Exit status: 0 when hostfeed and the required tools import, else 2 (with the reason).
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import zipfile

REQUIRED = ("pytest", "pytest_timeout", "zarr")
OPTIONAL = ("matplotlib", "tqdm")


def top_levels(wheel: str) -> set[str]:
    """Top-level modules and packages a wheel installs."""
    names = set()
    for name in zipfile.ZipFile(wheel).namelist():
        first = name.split("/", 1)[0]
        if first.endswith((".dist-info", ".data")):
            continue
        names.add(first[:-3] if first.endswith(".py") else first.split(".", 1)[0])
    return names


def missing_module(module: str, site: str) -> str | None:
    """The top-level module whose absence makes ``import module`` fail, or None if it
    imports (in a fresh interpreter, ``site`` first on the path)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [site] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    r = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, cwd="/",
                       capture_output=True, text=True)
    if r.returncode == 0:
        return None
    found = re.search(r"No module named '([^'.]+)", r.stderr)
    if found is None:
        raise RuntimeError(f"import {module} fails for another reason:\n{r.stderr[-1500:]}")
    return found.group(1)


def main() -> int:
    wheel_dir, site = sys.argv[1], sys.argv[2]
    os.makedirs(site, exist_ok=True)
    wheels = sorted(glob.glob(os.path.join(wheel_dir, "*.whl")))
    ours = [w for w in wheels if os.path.basename(w).startswith("hostfeed-")]
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    ours.sort(key=lambda w: ("abi3" not in w, tag not in w))
    if not ours:
        print(f"no hostfeed wheel in {wheel_dir} (build it with .ci/accelerators/gpu_wheel.sh or "
              f".ci/accelerators/tpu_wheel.sh)")
        return 2
    zipfile.ZipFile(ours[0]).extractall(site)
    print(f"unpacked {os.path.basename(ours[0])}")
    providers: dict[str, str] = {}
    for w in wheels:
        if w not in ours:
            for name in top_levels(w):
                providers.setdefault(name, w)
    unpacked: set[str] = set()
    for module, required in [(m, True) for m in ("hostfeed",) + REQUIRED] + \
            [(m, False) for m in OPTIONAL]:
        try:
            for _ in range(40):  # a package and its dependencies, one by one
                lacking = missing_module(module, site)
                if lacking is None:
                    break
                wheel = providers.get(lacking)
                if wheel is None or wheel in unpacked:
                    raise RuntimeError(f"{module} needs {lacking}, which no wheel in "
                                       f"{wheel_dir} provides")
                zipfile.ZipFile(wheel).extractall(site)
                unpacked.add(wheel)
                print(f"unpacked {os.path.basename(wheel)} (for {module}: {lacking})")
        except RuntimeError as exc:
            if required:
                print(f"cannot make {module} importable: {exc}")
                return 2
            print(f"optional {module} unavailable ({exc}); its tests skip")
    print(f"ready: {len(unpacked)} tool wheel(s) unpacked besides hostfeed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
