"""Builds the documentation site with warnings as errors, then checks its front page as a
reader sees it: a screenshot taken in headless Chromium, read back with Tesseract OCR, must
show the site's title and every entry of the navigation.

    python docs/check_site.py [--out DIR]   # needs sphinx (docs/requirements.txt),
                                            # chromium and tesseract on PATH

CI runs it in the ``docs`` session of ``noxfile.py`` (``.ci/run`` installs Debian's
``chromium`` and ``tesseract-ocr``). Exit status 1 names what is missing.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

DOCS = pathlib.Path(__file__).resolve().parent


def nav_titles() -> list[str]:
    """The first heading of each page the front page's navigation lists, in order
    (docs/navigation.py)."""
    sys.path.insert(0, str(DOCS))
    import navigation
    index = (DOCS / "index.md").read_text()
    titles = []
    for _, _, pages in navigation.toctrees(index):
        for name in pages:
            heading = (DOCS / f"{name}.md").read_text().splitlines()[0]
            titles.append(heading.lstrip("# ").replace("`", ""))
    return titles


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


def shows(ocr: str, title: str) -> bool:
    """Whether the OCR text holds the title's words in order (OCR may split a long title
    over lines or break a word at the sidebar's edge, so a word also matches a prefix of
    4 or more letters).

    Example:
        >>> shows("Migrating from\\nhost_callbac\\nk", "Migrating from host_callback")
        True
        >>> shows("Installing", "Troubleshooting")
        False
    """
    seen = _words(ocr)
    i = 0
    for word in _words(title):
        while i < len(seen) and not (seen[i] == word or (len(seen[i]) >= 4
                                                           and word.startswith(seen[i]))):
            i += 1
        if i == len(seen):
            return False
        i += 1
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="build folder (default: a temporary one)")
    args = parser.parse_args(argv)
    missing = [t for t in ("chromium", "tesseract") if shutil.which(t) is None]
    if missing:
        print(f"check_site: {', '.join(missing)} not on PATH "
              "(Debian: apt-get install chromium tesseract-ocr)", file=sys.stderr)
        return 1
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="hostfeed-docs-"))
    subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                    str(DOCS), str(out)], check=True)
    shot = out / "front.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--user-data-dir={profile}",
                        "--window-size=1280,900", f"--screenshot={shot}",
                        (out / "index.html").as_uri()],
                       check=True, capture_output=True, timeout=120)
    ocr = subprocess.run(["tesseract", str(shot), "stdout"], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    expected = ["hostfeed", *nav_titles()]
    absent = [t for t in expected if not shows(ocr, t)]
    if absent:
        print(f"check_site: the front page's screenshot ({shot}) does not show "
              f"{absent}; OCR read:\n{ocr}", file=sys.stderr)
        return 1
    print(f"check_site: built {out}; the front page shows the title and "
          f"{len(expected) - 1} navigation entries ({shot})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
