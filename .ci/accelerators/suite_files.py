"""Which test files an accelerator check's suite step runs, in which order: the files whose
tests exercise the device path first (taps, calls, the Recorder, ``Recorder.step``,
selective recording, summaries, dtypes, ordering, transformations, capture), then the
others that may fail differently on an accelerator, alphabetically; never the files that
are wholly host-side (``conftest.HOST_SIDE``: stores, docs, packaging... whose result
cannot depend on the device), the bench's, the GPUs' own (a step of their own) or the
lowering-only ones. The suite runs with ``--scope=jax``, which deselects the host-side
tests of the files that are only partly so.

A check whose time runs out then has run what matters most on the device. A file named
in ``FIRST`` that no longer exists, or one that is wholly host-side, is an error (exit
status 1), which the CPU dry run in CI meets first.

    python .ci/accelerators/suite_files.py            # the files, on one line
"""
from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[2] / "tests" / "python"

#: The files that exercise what a device changes, most telling first.
FIRST = (
    "test_taps.py", "test_call.py", "test_recording.py", "test_recorded_step.py",
    "test_selective.py", "test_dtypes.py", "test_ordering.py", "test_transforms.py",
    "test_capture.py", "test_sync.py", "test_call_thread.py", "test_queue_bound.py",
    "test_errors.py", "test_eager.py", "test_while_batching.py", "test_keys.py",
    "test_surprises.py", "test_reliability.py",
)

#: Not in the suite step: the bench's (a CPU bench in a subprocess), the GPUs' own (the
#: check's "gpu tests" step), the lowering-only ones (they lower for platforms absent here).
NOT_IN_SUITE = ("test_bench.py", "test_gpu.py", "test_cuda_lowering.py",
                "test_rocm_lowering.py")


def wholly_host_side(conftest: pathlib.Path = TESTS / "conftest.py") -> set[str]:
    """The files ``conftest.HOST_SIDE`` names whole (``ALL``), read from its source (the
    conftest imports hostfeed and JAX, which this script must not need)."""
    tree = ast.parse(conftest.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.target.id == "HOST_SIDE" and isinstance(node.value, ast.Dict):
            return {ast.literal_eval(k) for k, v in zip(node.value.keys, node.value.values)
                    if k is not None and isinstance(v, ast.Name) and v.id == "ALL"}
    raise SystemExit(f"no HOST_SIDE dict in {conftest}")


def suite_files() -> list[str]:
    """The suite's files (paths from the repository root), in the order they run."""
    host = wholly_host_side()
    present = sorted(p.name for p in TESTS.glob("test_*.py"))
    problems = [f for f in FIRST if f not in present] + [f for f in FIRST if f in host]
    if problems:
        raise SystemExit(f"suite_files.py: FIRST names files that are missing or wholly "
                         f"host-side: {problems}")
    rest = [f for f in present if f not in FIRST and f not in host and f not in NOT_IN_SUITE]
    return [f"tests/python/{f}" for f in (*FIRST, *rest)]


if __name__ == "__main__":
    print(" ".join(suite_files()))
