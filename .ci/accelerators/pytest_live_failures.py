"""A pytest plugin for the accelerator checks (.ci/accelerators/check_lib.sh): appends each failing
test's report to the file that ``LIVE_FAILURES`` names as soon as the test fails, so that
the reasons survive a run that is killed later (a hung test, the step's time running out).

    LIVE_FAILURES=failures.txt python -m pytest -p pytest_live_failures ...
"""
from __future__ import annotations

import os

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Appends a failed (or errored) phase of a test to the file, with its report text."""
    path = os.environ.get("LIVE_FAILURES")
    if not path or not report.failed:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"==== {report.nodeid} ({report.when}) ====\n{report.longreprtext}\n\n")
