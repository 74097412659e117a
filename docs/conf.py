"""Sphinx configuration of hostfeed's documentation (MyST Markdown pages, the API reference
generated from the docstrings of the installed package).

    pip install -r docs/requirements.txt
    sphinx-build -W --keep-going -b html docs docs/_build/html
"""
from __future__ import annotations

import os
import sys
from typing import Any

import hostfeed

sys.path.insert(0, os.path.dirname(__file__))
import navigation  # docs/navigation.py, beside this file

project = "hostfeed"
author = "the hostfeed authors"
copyright = "2026, the hostfeed authors"
release = hostfeed.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "bench-repeats", "README.md", "gpu"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# No network in the build: links to JAX's and numpy's docs are written out, not resolved.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}

html_theme = "furo"
html_title = f"hostfeed {release}"
html_static_path: list[str] = []


def _navigation(app: Any, docname: str, source: list[str]) -> None:
    """The front page's lists of links, each also a hidden toctree (docs/navigation.py)."""
    if docname == root_doc:
        source[0] = navigation.expand(source[0])


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _navigation)
    return {"parallel_read_safe": True}
