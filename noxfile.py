"""Test matrix: the Python test suite, the stub check and mypy on each supported (Python,
JAX) pair; the suite with the portable transport forced; the docs site; the GPU check's dry
run; and the Rust core's tests once (optimised, with debug assertions, and the loom models).
Which tests each session runs: SCOPES below, and tests/python/conftest.py (HOST_SIDE,
TRANSPORT_AGNOSTIC), the one list of what runs where.

    nox                                 # everything: the three environments, the host-side
                                        # tests, portable, gpu_check_dry, then the Rust tests
    nox -l                              # list the sessions
    nox -s "tests(py3.12-jax0.11.2)"    # one environment (or: nox -s tests -p 3.12)
    nox -s tests                        # the three environments
    nox -s host                         # the host-side tests, once (newest JAX)
    nox -s rust                         # the core's tests (the FFI layout against each jaxlib
                                        # seen), then the loom models
    nox -s gpu_check_dry                # .ci/accelerators/gpu_check.sh's dry run on CPU
                                        # (about a minute)
    nox -s docs                         # build the docs site (-W), check its front page
    nox -s portable                     # the tests that lower a callback, with the
                                        # portable transport forced
    nox -s releases                     # also 0.10.0, 0.10.1, 0.11.0, 0.11.1, 0.12.0, 0.12.0.1
                                        # (not in CI)
    nox -s full                         # tests, portable and rust with every test in every
                                        # session, soaks at full length (CI: SCOPES)

The third environment installs the newest jax and jaxlib that PyPI serves at the time of
the run (no pin: JAX as its users install it), prints the version it got, and fails when
that release is newer than the range hostfeed declares (compat.NEWEST_TESTED, README,
pyproject): a new JAX is then tested and declared, or the range is said to stop short of
it, never silently. The sessions of jax 0.10.2 and the newest end with the capture tests
again under the oldest Flax and Equinox releases pyproject allows (OLDEST_CAPTURE).

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

#: The third environment's jax: the newest release PyPI serves when the session installs.
NEWEST_JAX = "newest"
# (Python, jax/jaxlib) pairs: the oldest supported JAX minor release, the one on the GPU
# machines, and the newest on PyPI; each on a Python its wheels exist for (jax 0.11+ needs
# Python 3.12+). 0.12.0.1, pinned here until jax 0.12.1 came out, is in RELEASES: the newest
# covers 0.12, and a fourth suite would take CI past its 30 minutes.
MATRIX = [("3.11", "0.10.2"), ("3.12", "0.11.2"), ("3.13", NEWEST_JAX)]
# Which tests each session runs (pytest --scope, tests/python/conftest.py): the tests whose
# result may depend on the JAX release in every `tests` session, the newest JAX's running
# the soak-like tests at full length (the others run their short variant:
# conftest.soak_seconds); the host-side ones (stores, object stores, reading back,
# settings, docs, the bench's report: conftest.HOST_SIDE) once, in the `host` session, with
# the newest JAX. The portable session runs the tests whose result may also depend on the
# transport (--scope=transport). `nox -s full` runs everything everywhere, at full length.
SCOPES = {"0.10.2": "jax", "0.11.2": "jax", NEWEST_JAX: "jax"}
#: The pair of the `host` session and of the long soaks: the newest.
NEWEST = MATRIX[-1]
_FULL = os.environ.get("HOSTFEED_NOX_FULL") == "1"


def _scope(jax: str) -> list[str]:
    if _FULL:
        return ["--scope=all"]
    return [f"--scope={SCOPES.get(jax, 'jax')}",
            *([] if jax == NEWEST[1] else ["--short-soaks"])]


# Each session's Python writes the bytecode of the modules it imports into its environment
# (uv installs none, and a machine may set PYTHONDONTWRITEBYTECODE): otherwise every process
# the suite starts (hundreds: subprocess tests, helpers, the docs' blocks) compiles JAX's
# modules again, about 3 CPU-seconds each: a third of a session's CPU time.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# uv where it is installed (CI: nox[uv]): the sessions install the same jax, jaxlib and test
# tools again and again, from its cache in seconds; else the standard library's venv + pip.
nox.options.default_venv_backend = "uv|venv"
# The pair that also runs the suite with the portable transport forced on CPU
# (HOSTFEED_TRANSPORT=jax: JAX's host-callback lowering, what TPUs and ROCm GPUs use).
PORTABLE = [("3.11", "0.10.2")]

nox.options.sessions = ["tests", "host", "portable", "docs", "gpu_check_dry", "rust"]


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
            ("3.13", "0.12.0"), ("3.13", "0.12.0.1")]


@nox.session
@nox.parametrize(["python", "jax"], MATRIX, ids=[f"py{p}-jax{j}" for p, j in MATRIX])
def tests(session: nox.Session, jax: str) -> None:
    """pytest, the stub check and mypy with one Python and one jax/jaxlib release."""
    _test(session, jax)


@nox.session(python=NEWEST[0])
def host(session: nox.Session) -> None:
    """The host-side tests (conftest.HOST_SIDE: their result depends on neither the JAX
    release nor the transport), once, with the newest JAX."""
    _install(session, NEWEST[1])
    session.run("python", "-m", "pytest", "--durations=10", "--scope=host", *session.posargs,
                env={"JAX_PLATFORMS": "cpu"})


@nox.session
@nox.parametrize(["python", "jax"], RELEASES, ids=[f"py{p}-jax{j}" for p, j in RELEASES])
def releases(session: nox.Session, jax: str) -> None:
    """Like `tests`, with the other releases that differ inside the supported range."""
    _test(session, jax)


@nox.session
@nox.parametrize(["python", "jax"], PORTABLE, ids=[f"py{p}-jax{j}" for p, j in PORTABLE])
def portable(session: nox.Session, jax: str) -> None:
    """pytest with the portable transport forced for every platform (``HOSTFEED_TRANSPORT=
    jax``); tests of the native handlers themselves skip, saying why."""
    _install(session, jax)
    # The tests whose result may depend on the transport: those that lower a callback
    # through it (conftest: all but HOST_SIDE and TRANSPORT_AGNOSTIC).
    session.run("python", "-m", "pytest", "--durations=10",
                *(["--scope=all"] if _FULL else ["--scope=transport", "--short-soaks"]),
                *session.posargs, env={"JAX_PLATFORMS": "cpu", "HOSTFEED_TRANSPORT": "jax"})


# ml_dtypes (JAX's extra dtypes, which every JAX process imports) for the JAX releases
# before the newest: 0.6.0, the release before the newest, 0.7.0, whose import costs about
# 1.15 CPU-seconds (0.6.0: 0.02; 0.7.0 with numpy 2.2 or 2.4 alike): in the hundreds of
# processes a suite starts, 70 of a suite's 440 CPU-seconds. Every supported jaxlib takes
# either (ml_dtypes>=0.5.0), so the matrix covers both: the newest JAX (its tests, the
# host-side tests, the docs) with 0.7, the others (and the portable run) with 0.6.
OLDER_ML_DTYPES = "ml_dtypes==0.6.0"


def _pins(jax: str) -> list[str]:
    return [] if jax == NEWEST[1] else [OLDER_ML_DTYPES]


def _jax_requirements(jax: str) -> list[str]:
    """What installs ``jax`` (a release, or NEWEST_JAX: the newest PyPI serves now)."""
    if jax == NEWEST_JAX:
        return ["--upgrade", "jax", "jaxlib"]
    return [f"jax=={jax}", f"jaxlib=={jax}"]


def _install(session: nox.Session, jax: str) -> None:
    session.install(f"{_wheel()}[test]", *_jax_requirements(jax), *_pins(jax))


# The oldest Flax and Equinox releases pyproject allows (its lower bounds), on the JAX of the
# session: after the suite (with the newest), capture tests again with them. Python 3.11
# with JAX 0.10 has Flax 0.12.7: the capture of the three libraries (test_capture.py, about
# 70 CPU-seconds); JAX 0.11+ (Python 3.12+) has Flax 0.12.10: the idioms, nn.jit, remat and
# the scans (test_capture_idioms.py, about 35). Both files pass with both (checked by hand);
# CI runs a file each, about a minute in all.
OLDEST_CAPTURE = {"0.10.2": (["flax==0.12.7", "equinox==0.13.1"],
                             "tests/python/test_capture.py"),
                  NEWEST_JAX: (["flax==0.12.10", "equinox==0.13.1"],
                               "tests/python/test_capture_idioms.py")}


def _test(session: nox.Session, jax: str) -> None:
    _install(session, jax)
    out = session.run("python", "-c", "import jax, jaxlib, sys; "
                      "print('python', sys.version.split()[0], 'jax', jax.__version__, "
                      "'jaxlib', jaxlib.__version__); print(jax.ffi.include_dir())",
                      silent=True)
    if out is None:  # nox --install-only: nothing runs
        return
    versions, include = str(out).strip().splitlines()[-2:]
    session.log(versions + (" (the newest on PyPI now)" if jax == NEWEST_JAX else ""))
    if jax == NEWEST_JAX:
        _check_declared_range(session)
    FFI_INCLUDES.mkdir(parents=True, exist_ok=True)
    (FFI_INCLUDES / f"py{session.python}-jax{jax}").write_text(include.strip())
    env = {"JAX_PLATFORMS": "cpu"}
    # From the repository root, but importing the installed wheel: python/ is not on the
    # path, and pytest's rootdir only adds tests/python (for conftest).
    session.run("python", "-m", "pytest", "--durations=10", *_scope(jax), *session.posargs,
                env=env)
    session.run("python", "-m", "mypy.stubtest", "hostfeed._receiver", env=env)
    session.run("python", "-m", "mypy", "python/hostfeed", env=env)
    if jax in OLDEST_CAPTURE and not session.posargs:  # last: the steps above had the newest
        oldest, tests = OLDEST_CAPTURE[jax]
        session.install(*oldest, *_jax_requirements(jax), *_pins(jax))
        session.run("python", "-m", "pytest", "--durations=5", *_scope(jax), tests, env=env)


def _check_declared_range(session: nox.Session) -> None:
    """Fails the session when the installed (newest) JAX is newer than the range hostfeed
    declares: README, pyproject and compat.NEWEST_TESTED must then be brought to it, once
    the suite passes on it, or say that hostfeed stops short of it."""
    out = session.run("python", "-c", "import jax; from hostfeed._src import compat; "
                      "v = compat.JAX_VERSION[:2]; print(jax.__version__, "
                      "'ok' if v <= compat.NEWEST_TESTED else 'newer', "
                      "compat._tested_range())", silent=True)
    version, verdict, declared = str(out).strip().splitlines()[-1].split(" ", 2)
    if verdict != "ok":
        session.error(f"jax {version}, the newest on PyPI, is newer than the range hostfeed "
                      f"declares ({declared}): run the suite on it, then update "
                      "compat.NEWEST_TESTED, pyproject.toml and README.md (or say there that "
                      "hostfeed stops short of it)")
    session.log(f"jax {version} lies in the declared range ({declared})")


@nox.session(python=False)
def full(session: nox.Session) -> None:
    """The whole matrix with every test in every session, the soak-like tests at full length
    (CI runs the host-side tests once and the long soaks once: SCOPES): the `tests` and
    `portable` sessions, then the Rust tests."""
    session.run("nox", "-s", "tests", "portable", "rust", *(
        ["--", *session.posargs] if session.posargs else []), external=True,
        env={"HOSTFEED_NOX_FULL": "1"})


@nox.session(python=MATRIX[-1][0])
def docs(session: nox.Session) -> None:
    """The documentation site: built with warnings as errors (API reference from the
    installed wheel's docstrings), its front page checked in headless Chromium (title and
    navigation read back from a screenshot); needs `chromium` and `tesseract` on PATH.
    The pages' code blocks and figures are checked by the suite (tests/python/test_docs.py)."""
    python, jax = MATRIX[-1]
    session.install(_wheel(), *_jax_requirements(jax), "-r", "docs/requirements.txt")
    out = ROOT / ".nox" / "_docs_site"
    session.run("python", "docs/check_site.py", "--out", str(out), env={"JAX_PLATFORMS": "cpu"})


# The GPU machine's Python and JAX, for the dry run of its check.
GPU_MACHINE = ("3.12", "0.11.2")
# The dry run's suite step: a few quick files (the GPU run takes the whole suite).
DRY_SUITE = "tests/python/test_taps.py tests/python/test_call.py"


@nox.session(python=GPU_MACHINE[0])
def gpu_check_dry(session: nox.Session) -> None:
    """.ci/accelerators/gpu_check.sh on CPU (GPU_CHECK_PLATFORM=cpu): every step (install, smoke,
    GPU tests, bench, suite) and its verdict, as on the GPU machine; it fails if the check
    would bring back more than the 8 files that machine returns, or run its steps without
    JAX's CPU backend. Like that machine, the environment has JAX, flax, pytest and
    pytest-timeout but not zarr, which the script must unpack (with its dependencies)
    from the wheel directory (pip downloads them)."""
    jax = GPU_MACHINE[1]
    session.install(f"jax=={jax}", f"jaxlib=={jax}", "flax>=0.12.8", "pytest>=8",
                    "pytest-timeout>=2.3", "pip", *_pins(jax))
    dist = ROOT / ".nox" / "_gpu_check_dist"
    if dist.exists():
        for old in dist.iterdir():
            old.unlink()
    dist.mkdir(parents=True, exist_ok=True)
    wheel = _wheel()
    if wheel == str(ROOT):
        session.run("python", "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(ROOT))
    else:
        session.run("cp", wheel, str(dist), external=True)
    session.run("python", "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                "--dest", str(dist), "zarr>=3.1")
    out = ROOT / ".nox" / "_gpu_check_out"
    out.mkdir(parents=True, exist_ok=True)
    session.run("bash", ".ci/accelerators/gpu_check.sh", external=True, env={
        "GPU_CHECK_PLATFORM": "cpu", "GPU_CHECK_DIST": str(dist), "OUT": str(out),
        "PYTHON": "python", "GPU_CHECK_SUITE_FILES": DRY_SUITE,
        "GPU_CHECK_BUDGET_S": "300"})


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
    """The core's tests (`cargo test -p hostfeed-core`) in the `ci` profile (Cargo.toml:
    release's optimisation with the debug profile's assertions and overflow checks), with
    the FFI layout checked against every jaxlib header the test sessions installed
    (required here: it fails rather than skips), and the store conformance suite over every
    back-end: the file system, `memory://`, the object store in memory and on an S3 server
    (s3s-fs, started by the test: its binary `$S3S_FS` or on PATH; skipped without one
    unless `HOSTFEED_REQUIRE_S3S=1`, which CI sets); then the loom models of the hand-made
    synchronisation (bounded; their own target directory, since `--cfg loom` rebuilds
    everything)."""
    dirs = os.environ.get("HOSTFEED_XLA_FFI_INCLUDE", "").split(os.pathsep)
    dirs = [d for d in dirs if d] or _ffi_include_dirs(session)
    session.log("FFI headers: " + ", ".join(dirs))
    env = {"HOSTFEED_XLA_FFI_INCLUDE": os.pathsep.join(dirs), "HOSTFEED_REQUIRE_FFI_HEADERS": "1"}
    session.run("cargo", "test", "-p", "hostfeed-core", "--profile", "ci", external=True,
                env=env)
    loom = {"RUSTFLAGS": "--cfg loom", "CARGO_TARGET_DIR": str(ROOT / "target" / "loom")}
    session.run("cargo", "test", "-p", "hostfeed-core", "--lib", "loom", external=True,
                env=loom)
