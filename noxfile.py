"""Test matrix: the whole Python test suite, the stub check and mypy on each supported
(Python, JAX) pair, and the Rust core's tests once (debug and release, and the loom models).

    nox                                 # everything: the three environments, then cargo test
    nox -l                              # list the sessions
    nox -s "tests(py3.12-jax0.11.2)"    # one environment (or: nox -s tests -p 3.12)
    nox -s tests                        # the three environments
    nox -s rust                         # the core's tests, debug and release (the FFI layout
                                        # against each jaxlib seen), then the loom models
    nox -s releases                     # also 0.10.0, 0.10.1, 0.11.0, 0.11.1, 0.12.0 (not in CI)

Each environment installs one hostfeed wheel. Set ``HOSTFEED_WHEEL`` to a wheel built
beforehand (CI builds the abi3 wheel once: ``maturin build --release --out dist``);
otherwise the session builds one from this checkout (``pip install .``). Extra arguments
go to pytest: ``nox -s tests -- -k cache``.
"""
from __future__ import annotations

import glob
import os
import pathlib

import nox

ROOT = pathlib.Path(__file__).parent
# Include directories of the jaxlibs the test sessions installed, one file per session,
# for the FFI layout check in the `rust` session.
FFI_INCLUDES = ROOT / ".nox" / "_ffi_include"

# (Python, jax/jaxlib) pairs: the oldest and newest supported JAX minor releases and the one
# on the GPU machines; each on a Python its wheels exist for (jax 0.11+ needs Python 3.12+).
MATRIX = [("3.11", "0.10.2"), ("3.12", "0.11.2"), ("3.13", "0.12.0.1")]

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "rust"]


def _wheel() -> str:
    wheel = os.environ.get("HOSTFEED_WHEEL", "")
    if not wheel:
        return str(ROOT)
    found = sorted(glob.glob(wheel))
    if len(found) != 1:
        raise RuntimeError(f"HOSTFEED_WHEEL={wheel!r} names {len(found)} files, expected one wheel")
    return found[0]


# The other releases in the supported range whose internals or FFI header differ from a
# neighbour's (see _compat.py and crates/hostfeed-core/src/ffi/c_api.rs): not in CI;
# `nox -s releases`.
RELEASES = [("3.11", "0.10.0"), ("3.11", "0.10.1"), ("3.12", "0.11.0"), ("3.12", "0.11.1"),
            ("3.13", "0.12.0")]


@nox.session
@nox.parametrize(["python", "jax"], MATRIX, ids=[f"py{p}-jax{j}" for p, j in MATRIX])
def tests(session: nox.Session, jax: str) -> None:
    """pytest, the stub check and mypy with one Python and one jax/jaxlib release."""
    _test(session, jax)


@nox.session
@nox.parametrize(["python", "jax"], RELEASES, ids=[f"py{p}-jax{j}" for p, j in RELEASES])
def releases(session: nox.Session, jax: str) -> None:
    """Like `tests`, with the other releases that differ inside the supported range."""
    _test(session, jax)


def _test(session: nox.Session, jax: str) -> None:
    session.install(f"{_wheel()}[test]", f"jax=={jax}", f"jaxlib=={jax}")
    session.run("python", "-c", "import jax, jaxlib, sys; "
                "print('python', sys.version.split()[0], 'jax', jax.__version__, "
                "'jaxlib', jaxlib.__version__)")
    include = session.run("python", "-c", "import jax; print(jax.ffi.include_dir())",
                          silent=True)
    FFI_INCLUDES.mkdir(parents=True, exist_ok=True)
    (FFI_INCLUDES / f"py{session.python}-jax{jax}").write_text(str(include).strip())
    env = {"JAX_PLATFORMS": "cpu"}
    # From the repository root, but importing the installed wheel: python/ is not on the
    # path, and pytest's rootdir only adds tests/python (for conftest).
    session.run("python", "-m", "pytest", *session.posargs, env=env)
    session.run("python", "-m", "mypy.stubtest", "hostfeed._receiver", env=env)
    session.run("python", "-m", "mypy", "python/hostfeed", env=env)


def _ffi_include_dirs(session: nox.Session) -> list[str]:
    """The jaxlib include directories the test sessions saw, or else the one of this
    interpreter's jax; fails the session when there is none (the layout check must run
    here, not skip)."""
    dirs = []
    if FFI_INCLUDES.is_dir():
        dirs = [p.read_text().strip() for p in sorted(FFI_INCLUDES.iterdir())]
    if not dirs:
        try:
            import jax  # only when no test session recorded a header
            dirs = [str(jax.ffi.include_dir())]
        except ImportError:
            pass
    dirs = [d for d in dirs if pathlib.Path(d, "xla/ffi/api/c_api.h").exists()]
    if not dirs:
        session.error("no jaxlib FFI header: run a `tests` session first (or install jax "
                      "here, or set HOSTFEED_XLA_FFI_INCLUDE)")
    return dirs


@nox.session(python=False)
def rust(session: nox.Session) -> None:
    """The core's tests (`cargo test -p hostfeed-core`) in the debug and the release
    profile, with the FFI layout checked against every jaxlib header the test sessions
    installed (required here: it fails rather than skips), then the loom models of the
    hand-made synchronisation (bounded; their own target directory, since `--cfg loom`
    rebuilds everything)."""
    dirs = os.environ.get("HOSTFEED_XLA_FFI_INCLUDE", "").split(os.pathsep)
    dirs = [d for d in dirs if d] or _ffi_include_dirs(session)
    session.log("FFI headers: " + ", ".join(dirs))
    env = {"HOSTFEED_XLA_FFI_INCLUDE": os.pathsep.join(dirs), "HOSTFEED_REQUIRE_FFI_HEADERS": "1"}
    session.run("cargo", "test", "-p", "hostfeed-core", external=True, env=env)
    session.run("cargo", "test", "-p", "hostfeed-core", "--release", external=True, env=env)
    loom = {"RUSTFLAGS": "--cfg loom", "CARGO_TARGET_DIR": str(ROOT / "target" / "loom")}
    session.run("cargo", "test", "-p", "hostfeed-core", "--release", "--lib", "loom",
                external=True, env=loom)
