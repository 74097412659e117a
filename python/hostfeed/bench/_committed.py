"""The README's bench table as committed, for ``python -m hostfeed bench`` to print beside
a run's own figures. Generated from docs/bench.json and docs/bench-repeats/ by
``python docs/figures.py --write`` (``--check`` fails where it differs): do not edit."""
from __future__ import annotations

#: How many full runs, on what machine, at which load averages (when each started).
RUNS = 3
MACHINE = ('a 2-core Intel(R) Xeon(R) Processor machine, jax 0.10.2, Python 3.11.7, load 0.51, '
           '2026-12-06')
LOADS = '0.51-1.45'
#: (the row, its unit: "x" a time ratio, "us" its own figure in µs; the cited run's
#: figure, the lowest and the highest over the runs)
ROWS: list[tuple[str, str, float, float, float]] = [
    ('dispatch of a small jitted function with one `id_tap`, waited for (per call)',
     'x', 0.238906, 0.179471, 0.238906),
    ('the same with one `call`',
     'x', 0.112656, 0.112656, 0.115624),
    ("small tap (float32[4]) in a loop: computation per tap (the loop's time until it returns, "
     'over its taps)',
     'x', 0.15588, 0.15588, 0.23517),
    ('the same loop: until every function ran, per tap (throughput, not latency)',
     'x', 0.180816, 0.180816, 0.237681),
    ("a tap's hand-over p50: queued until its function starts (taps spaced apart)",
     'us', 2.431, 1.823, 2.431),
    ('the same in a burst of taps (behind those queued before it)',
     'us', 3932.16, 3932.16, 4325.38),
    ('synchronous tap (the default on CPUs and GPUs): each tap p50 (what the computation spends '
     'on a tap)',
     'x', 1.1593, 1.12347, 1.22183),
    ('4 MiB taps in a loop until every function ran (per byte)',
     'x', 48.195, 21.7668, 48.195),
    ('the same, against the copy it makes (why it loses to `buffer_callback` there)',
     'x', 0.991627, 0.991627, 1.00927),
    ('`call` round trip, float32[4], p50',
     'x', 0.630646, 0.630646, 0.65318),
    ('`call` round trip p50, every core busy',
     'x', 0.638468, 0.638468, 0.665358),
    ('eager `id_tap` until its function ran (per tap)',
     'x', 1.00706, 0.894603, 1.00706),
    ('compile a function with 200 taps',
     'x', 1.17794, 0.994019, 1.17794),
    ('idle `barrier_wait()` after computations that tapped',
     'x', 8.14535, 8.14535, 10.3795),
    ('the same, against its own floor (why it loses to `jax.effects_barrier`)',
     'x', 0.981558, 0.981558, 1.50364),
]
