"""The performance figures of the README and the docs, generated from committed bench runs.

    python docs/figures.py --write   # rewrite every generated table from the runs
    python docs/figures.py --check   # fail (exit 1) where a table or docs/bench.txt differs
                                     # from the runs, or a figure stands outside a table

A table sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` (NAME one of
``hostfeed.bench._markdown.TABLES``). Its figures come from ``docs/bench.json`` (the cited
run: ``python -m hostfeed bench --json docs/bench.json > docs/bench.txt``) and its ranges
from that run and the full runs in ``docs/bench-repeats/*.json``: the runs of the processor
the README shows (this project's machines). Runs of another processor keep the same layout
in a folder of their own (:data:`SETS`), and a table of theirs is marked
``<!-- bench:NAME:SET -->`` (``summary:xeon``). The runs of one set must name one
processor; a TPU table's (NAME in
``TPU_TABLES``) from the newest ``docs/tpu/bench-DATE.json`` (``.ci/accelerators/tpu_check.sh``), or
for the record table (``TPU_RECORD_TABLES``) the newest ``docs/tpu/record-DATE.json`` (the
check with ``TPU_CHECK_BENCH_ONLY=record``).
The summary's last columns are quick runs on a busy machine (``docs/bench-loaded/*.json``:
``python -m hostfeed bench --quick --json``, while other processes load it), showing how
load moves each figure. ``python/hostfeed/bench/_committed.py`` holds the summary's rows as
the committed runs answer them, which ``python -m hostfeed bench`` prints beside its own.
A performance figure (a time in ns, µs or ms, a rate in MB/s or GB/s, a ratio such as
``0.25x``) anywhere else in ``README.md`` or ``docs/*.md`` is an error: a figure a reader
sees must be one a committed run produced. CI runs ``--check`` (``tests/python/test_docs.py``).
"""
from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CITED = DOCS / "bench.json"
REPEATS = DOCS / "bench-repeats"
LOADED = DOCS / "bench-loaded"
COMMITTED = ROOT / "python" / "hostfeed" / "bench" / "_committed.py"
TPU_RUNS = DOCS / "tpu"
#: The committed runs, one set per processor, by the name a table's marker gives after
#: its table's (``""``: the README's, in ``docs/`` itself): each folder holds the cited
#: run (``bench.json``), its text (``bench.txt``), the repeats (``bench-repeats/``) and
#: the quick runs on a busy machine (``bench-loaded/``).
SETS = {"": DOCS, "xeon": DOCS / "bench-xeon"}

_BLOCK = re.compile(r"(<!-- bench:([\w:]+) -->\n)(.*?)(<!-- /bench:\2 -->)", re.S)
_FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:\s?-\s?\d+(?:\.\d+)?)?\s?"
                     r"(?:[nµum]s|[MG]B/s|x)(?![\w/])")


def pages() -> list[pathlib.Path]:
    """The README and every page of the docs."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def runs(folder: pathlib.Path = DOCS) -> list[dict]:
    """The cited run of a set's ``folder`` first, then the repeats."""
    cited = CITED if folder == DOCS else folder / "bench.json"
    repeats = REPEATS if folder == DOCS else folder / "bench-repeats"
    return [json.loads(p.read_text())
            for p in [cited, *sorted(repeats.glob("*.json"))]]


def loaded_runs(folder: pathlib.Path = DOCS) -> list[dict]:
    """The quick runs on a busy machine (``bench-loaded/*.json`` of a set), by name."""
    loaded = LOADED if folder == DOCS else folder / "bench-loaded"
    return [json.loads(p.read_text()) for p in sorted(loaded.glob("*.json"))]


def _where(folder: pathlib.Path) -> str:
    """A set's folder as the docs name it (``docs/``, ``docs/bench-xeon/``)."""
    return f"{folder.relative_to(ROOT).as_posix()}/"


def tpu_runs() -> list[dict]:
    """The committed TPU runs (``docs/tpu/bench-DATE.json``), the newest first."""
    return [json.loads(p.read_text())
            for p in sorted(TPU_RUNS.glob("bench-*.json"), reverse=True)]


def render(name: str, all_runs: list[dict], loaded: list[dict] | None = None,
           folder: pathlib.Path = DOCS) -> str:
    from hostfeed.bench import _markdown

    if name in _markdown.TPU_TABLES:
        pattern = "record-*.json" if name in _markdown.TPU_RECORD_TABLES else "bench-*.json"
        found = sorted(TPU_RUNS.glob(pattern), reverse=True)
        tpu = [json.loads(f.read_text()) for f in found]
        newest = found[0].relative_to(ROOT)
        return (f"Measured on {_markdown.tpu_machine(tpu[0])} (`{newest}`, "
                "`python -m hostfeed bench` there). Ratios are time ratios (below one: "
                "faster than the baseline).\n\n"
                f"{_markdown.TPU_TABLES[name](tpu)}\n")
    if name not in _markdown.TABLES:
        raise KeyError(f"no bench table {name!r}; tables: {sorted(_markdown.TABLES)}")
    quiet = noise = ""
    if name == "summary":  # the table the bench's report ends with, and its load columns
        loaded = loaded_runs(folder) if loaded is None else loaded
        quiet = f", a quiet machine: load {_markdown.loads(all_runs)} when each run started"
        noise = (" A ratio is the median of its rounds' ratios where the run measured "
                 "rounds; `~` after it: noisy in the cited run (its rounds say two runs may "
                 "differ by more than 15%).")
    else:
        loaded = []
    where = _where(folder)
    return (f"Measured on {_markdown.machine(all_runs[0])} "
            f"(`{where}bench.json`; ranges over {len(all_runs)} full runs, "
            f"`{where}bench-repeats/`){quiet}. Ratios are time ratios (below one: faster "
            f"than the baseline).{noise}{_markdown.loaded_note(loaded, where)}\n\n"
            f"{_markdown.TABLES[name](all_runs, loaded)}\n")


def _set_of(marker: str) -> tuple[str, pathlib.Path]:
    """A marker's table and the folder of the set it shows (``summary:xeon``)."""
    name, _, set_name = marker.partition(":")
    if set_name not in SETS:
        raise KeyError(f"no set of bench runs {set_name!r} (marker {marker!r}); sets: "
                       f"{sorted(SETS)}")
    return name, SETS[set_name]


def regenerate(text: str, all_runs: list[dict], loaded: list[dict] | None = None) -> str:
    """``text`` with every generated table rewritten: the README's set's from ``all_runs``
    and ``loaded``, another set's from its folder."""
    loaded = loaded_runs() if loaded is None else loaded

    def table(marker: str) -> str:
        name, folder = _set_of(marker)
        if folder == DOCS:
            return render(name, all_runs, loaded)
        return render(name, runs(folder), loaded_runs(folder), folder)

    return _BLOCK.sub(lambda m: m.group(1) + table(m.group(2)) + m.group(4), text)


def stray_figures(text: str) -> list[tuple[int, str]]:
    """(line, figure) for each performance figure outside a generated table."""
    out = []
    spans = [m.span() for m in _BLOCK.finditer(text)]
    for m in _FIGURE.finditer(text):
        if not any(a <= m.start() < b for a, b in spans):
            out.append((text.count("\n", 0, m.start()) + 1, m.group(0)))
    return out


def mixed(sets: list[tuple[str, list[dict]]]) -> list[str]:
    """A problem for each run of a set (``(where, runs)``) whose processor is not that of
    the set's first run: a set holds the runs of one processor.

    Example:
        >>> xeon, epyc = ({"header": {"cpu": c}} for c in ("Intel Xeon", "AMD EPYC"))
        >>> mixed([("docs/", [epyc, epyc]), ("docs/bench-xeon/", [xeon])])
        []
        >>> mixed([("docs/", [epyc, xeon])])
        ['docs/: a run on Intel Xeon among runs on AMD EPYC: a set holds the runs of one processor']
    """
    from hostfeed.bench import _processor

    return [f"{where}: a run on {_processor.name(run['header'])} among runs on "
            f"{_processor.name(set_runs[0]['header'])}: a set holds the runs of one processor"
            for where, set_runs in sets for run in set_runs
            if not _processor.same(run["header"], set_runs[0]["header"])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    from hostfeed.bench import _committed, _markdown, _report

    all_runs, loaded = runs(), loaded_runs()
    problems = []
    sets = [(folder, all_runs if folder == DOCS else runs(folder)) for folder in SETS.values()]
    problems += mixed([(_where(folder), [*r, *loaded_runs(folder)]) for folder, r in sets])
    module = _markdown.committed_module([(_where(folder) if folder != DOCS else "", r)
                                         for folder, r in sets])
    where = COMMITTED.relative_to(ROOT) if COMMITTED.is_relative_to(ROOT) else COMMITTED
    if COMMITTED.read_text() != module and args.write:
        COMMITTED.write_text(module)
        importlib.reload(_committed)  # the report's last section prints it
        print(f"rewrote {where}")
    elif COMMITTED.read_text() != module:
        problems.append(f"{where} is not the README's rows of the committed runs "
                        "(python docs/figures.py --write)")
    for folder, set_runs in sets:
        text = _report.text(set_runs[0])
        bench_txt, where = folder / "bench.txt", _where(folder)
        if args.write:
            bench_txt.write_text(text)
        elif bench_txt.read_text().rstrip("\n") != text.rstrip("\n"):
            problems.append(f"{where}bench.txt is not the text of {where}bench.json "
                            "(python docs/figures.py --write)")
    for page in pages():
        old = page.read_text()
        new = regenerate(old, all_runs, loaded)
        rel = page.relative_to(ROOT)
        if args.write and new != old:
            page.write_text(new)
            print(f"rewrote {rel}")
        elif new != old:
            problems.append(f"{rel}: a bench table differs from the committed runs "
                            "(python docs/figures.py --write)")
        for line, figure in stray_figures(new):
            problems.append(f"{rel}:{line}: figure {figure!r} outside a generated bench "
                            "table")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
