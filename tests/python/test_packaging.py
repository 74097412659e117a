"""What users install: license, metadata and the wheel's platform tag.
(CI builds the wheel and checks its tag; this checks that the build is asked for it.)"""
from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_license_file_is_apache_2_and_declared():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    assert project["urls"]


def test_ci_builds_the_wheel_for_jaxlibs_glibc_floor_and_checks_its_tag():
    run = (ROOT / ".ci" / "run").read_text()
    assert "--zig" in run and "--compatibility manylinux_2_27" in run
    assert "cp311-abi3-manylinux_2_27_x86_64" in run
    assert ".ci/readme_check.py --install" in run


def test_public_classes_say_they_are_hostfeeds():
    # A warning's category, a repr or a traceback names the class where users import it.
    import inspect

    import hostfeed
    classes = {n: getattr(hostfeed, n) for n in hostfeed.__all__
               if inspect.isclass(getattr(hostfeed, n))}
    assert {"Recorder", "Histogram", "UnflushedReadWarning", "RecordingError"} <= set(classes)
    assert {n: c.__module__ for n, c in classes.items() if c.__module__ != "hostfeed"} == {}



def test_the_extension_module_has_one_submodule_per_room_of_the_binding():
    # `hostfeed._receiver` holds only its submodules, one a module of bindings/python/src,
    # each importable by name (an extension module is no package: the binding puts them in
    # sys.modules) and stubbed by a file of python/hostfeed/_receiver/.
    import importlib
    import subprocess
    import sys

    import hostfeed._receiver as receiver
    rooms = ["error", "messages", "consumers", "batch", "host", "portable", "record", "storage",
             "gpu"]
    assert sorted(n for n in vars(receiver) if not n.startswith("__")) == sorted(rooms)
    stubs = ROOT / "python" / "hostfeed" / "_receiver"
    assert sorted(p.stem for p in stubs.glob("*.pyi")) == sorted(rooms + ["__init__"])
    for room in rooms:
        module = importlib.import_module(f"hostfeed._receiver.{room}")
        assert module is getattr(receiver, room) and module.__name__ == f"hostfeed._receiver.{room}"
    from hostfeed._receiver.host import stats
    from hostfeed._receiver.record import Recorder
    assert stats is receiver.host.stats and Recorder.__module__ == "hostfeed._receiver.record"
    # A fresh process: `import a.b` before anything else imported `a`.
    out = subprocess.run([sys.executable, "-c", "import hostfeed._receiver.messages as m; "
                          "print(m.Message.__module__)"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "hostfeed._receiver.messages"
