"""A new full bench run against committed ones: for each row of the README's table (and of
the portable transport's), hostfeed's time ratio to its baseline in the new run, beside the
range of that ratio over the reference runs; a row is flagged where the new ratio lies
outside the range widened by ``--slack`` (default 10%: the reference runs are few). Every
ratio compares hostfeed with JAX measured in the same run, so two runs on a shared machine
compare by their ratios, not their times.

Run, after a change that should not move the figures (a restructuring), on a machine with
the processor of the reference runs:

    python -m hostfeed bench --json /tmp/after.json
    python benches/against_runs.py /tmp/after.json \
        docs/bench.json docs/bench-repeats/2.json docs/bench-repeats/3.json

Exits 1 when a row is outside its widened range, 0 otherwise; 2 when a reference run is
of another processor than the new one (the runs of each processor are kept apart:
docs/bench.json and docs/bench-repeats/ for this project's machines, docs/bench-xeon/ for
the Intel Xeon before).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hostfeed.bench import _markdown, _processor

Run = dict[str, Any]


def _portable_rows() -> list[tuple[str, Callable[[Run], float | None]]]:
    def ratio(section: str, key: str) -> Callable[[Run], float | None]:
        def of(run: Run) -> float | None:
            p = (run.get("portable") or {}).get(section)
            if not p:
                return None
            return p["hostfeed (portable)"][key] / p["hostfeed (native)"][key]
        return of

    def slow(run: Run) -> float | None:
        p = run.get("portable") or {}
        return p["slow_taps"]["ratio"] if "slow_taps" in p else None

    return [("portable / native: small tap", ratio("taps", "device_side_per_tap_us")),
            ("portable / native: call in a loop", ratio("calls", "per_call_us")),
            ("portable: slow taps against as many no-op taps", slow)]


def rows() -> list[tuple[str, Callable[[Run], float | None]]]:
    """Each compared row: its question and the function giving its ratio in a run."""
    def of(figure: Callable[[Run], Any]) -> Callable[[Run], float | None]:
        def ratio(run: Run) -> float | None:
            f = figure(run)
            return None if f is None or math.isnan(f.ratio) else float(f.ratio)
        return ratio
    return [(row.question, of(row.figure)) for row in _markdown.SUMMARY] + _portable_rows()


def compare(new: Run, references: Sequence[Run], slack: float) -> tuple[list[str], int]:
    """The report's lines and how many rows lie outside their widened range.

    Example:
        >>> def run(ratio):
        ...     return {"portable": {"slow_taps": {"ratio": ratio}}}
        >>> compare(run(0.5), [run(0.45), run(0.55)], 0.1)[1]
        0
        >>> compare(run(0.8), [run(0.45), run(0.55)], 0.1)[1]
        1
    """
    lines = [f"{'row':<72} {'reference range':>17} {'new':>7}  verdict"]
    outside = 0
    for question, ratio in rows():
        ref = [r for r in map(ratio, references) if r is not None]
        got = ratio(new)
        if not ref or got is None:
            continue
        lo, hi = min(ref), max(ref)
        inside = lo * (1 - slack) <= got <= hi * (1 + slack)
        outside += not inside
        verdict = "within" if inside else ("BETTER" if got < lo else "WORSE")
        lines.append(f"{question[:72]:<72} {f'{lo:.2f}-{hi:.2f}x':>17} {got:>6.2f}x  {verdict}")
    return lines, outside


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("new", help="the new run's JSON (python -m hostfeed bench --json)")
    parser.add_argument("references", nargs="+", help="the reference runs' JSON files")
    parser.add_argument("--slack", type=float, default=0.10,
                        help="how far outside the references' range a ratio may lie "
                             "(a fraction; default 0.10)")
    args = parser.parse_args(argv)
    with open(args.new) as f:
        new = json.load(f)
    references = []
    for path in args.references:
        with open(path) as f:
            references.append(json.load(f))
    others = [p for p, r in zip(args.references, references, strict=True)
              if not _processor.same(new["header"], r["header"])]
    if others:
        print(f"{', '.join(others)}: not of the new run's processor "
              f"({_processor.name(new['header'])}); compare runs of one processor (ratios "
              "measured on one say little about another)", file=sys.stderr)
        return 2
    lines, outside = compare(new, references, args.slack)
    print("\n".join(lines))
    print(f"{outside} row(s) outside the reference range widened by {args.slack:.0%}")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
