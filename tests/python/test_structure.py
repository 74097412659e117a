"""The structure's rules (.ci/structure_check.py, run by CI): no import circle among the
Python modules or the Rust files, no overlong Python module, Python class or Rust file; and
the check finds them."""
from __future__ import annotations

import importlib.util
import pathlib
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("structure_check",
                                              ROOT / ".ci" / "structure_check.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_the_checkout_has_no_circle_and_no_overlong_module(capsys):
    assert check.main([]) == 0, capsys.readouterr().err


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_a_python_circle_is_found_through_deferred_and_relative_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "hostfeed"
    _write(pkg, {
        "__init__.py": "",
        "_src/__init__.py": "",
        "_src/a.py": "from .b import thing\n",
        "_src/b.py": "def thing():\n    from . import c\n",
        "_src/c.py": "from hostfeed._src import a\n",
        "_src/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
    })
    monkeypatch.setattr(check, "PACKAGE", pkg)
    graph = check.python_graph()
    assert graph["hostfeed._src.d"] == set()  # typing-only imports are not dependencies
    assert check.circles(graph) == [["hostfeed._src.a", "hostfeed._src.b", "hostfeed._src.c"]]


def test_a_rust_circle_is_found_through_use_groups_and_super(tmp_path, monkeypatch):
    src = tmp_path / "src"
    _write(src, {
        "lib.rs": "mod host;\nmod ffi;\n",
        "host/mod.rs": "pub(crate) mod hub;\n",
        "host/hub.rs": "use crate::ffi::{handlers::FLAG, other};\n",
        "ffi/mod.rs": "pub(crate) mod handlers;\n",
        "ffi/handlers.rs": "use super::super::host::hub::Hub;\n#[cfg(test)]\nmod tests {\n}\n",
    })
    monkeypatch.setattr(check, "ROOT", tmp_path)
    circles = check.circles(check.rust_graph(src))
    assert circles == [["src/ffi/handlers.rs", "src/host/hub.rs"]]


def test_an_overlong_module_or_rust_file_is_found(tmp_path, monkeypatch, capsys):
    pkg, src = tmp_path / "hostfeed", tmp_path / "crate" / "src"
    _write(pkg, {"__init__.py": "", "long.py": "x = 1\n" * (check.MAX_PYTHON_LINES + 1)})
    _write(src, {"lib.rs": "mod long;\n",
                 "long.rs": "// a line\n" * (check.MAX_RUST_LINES + 1),
                 "short.rs": "// a line\n" * check.MAX_RUST_LINES})
    monkeypatch.setattr(check, "ROOT", tmp_path)
    monkeypatch.setattr(check, "PACKAGE", pkg)
    monkeypatch.setattr(check, "CRATES", [src])
    assert check.main([]) == 1
    err = capsys.readouterr().err
    assert f"hostfeed/long.py has {check.MAX_PYTHON_LINES + 1} lines" in err
    assert f"crate/src/long.rs has {check.MAX_RUST_LINES + 1} lines" in err
    assert "short.rs" not in err


def test_the_bench_uses_the_public_api_and_the_measuring_hooks_alone():
    # Everything the bench needs beyond the public API goes through one documented module,
    # so that a change of hostfeed's internals shows in one place.
    # (``hostfeed._src`` itself is a package without code, the way to its modules.)
    allowed = {"hostfeed", "hostfeed.host_callback", "hostfeed._src", "hostfeed._src.measuring"}
    graph = check.python_graph()
    reached = {target for module, targets in graph.items()
               if module == "hostfeed.bench" or module.startswith("hostfeed.bench.")
               for target in targets if not target.startswith("hostfeed.bench")}
    assert reached <= allowed, sorted(reached - allowed)
    assert "hostfeed._src.measuring" in reached


def test_an_overlong_class_is_found_at_any_depth(tmp_path, monkeypatch, capsys):
    pkg = tmp_path / "hostfeed"
    body = "    x = 1\n" * check.MAX_CLASS_LINES
    _write(pkg, {"__init__.py": "",
                 "short.py": "class Fits:\n" + "    x = 1\n" * (check.MAX_CLASS_LINES - 1),
                 "long.py": "def make():\n    class Inner:\n" + "    " + body.replace(
                     "\n", "\n    ").rstrip() + "\n"})
    monkeypatch.setattr(check, "ROOT", tmp_path)
    monkeypatch.setattr(check, "PACKAGE", pkg)
    monkeypatch.setattr(check, "CRATES", [])
    assert check.main([]) == 1
    err = capsys.readouterr().err
    assert f"hostfeed/long.py: class make.Inner has {check.MAX_CLASS_LINES + 1} lines" in err
    assert "Fits" not in err
