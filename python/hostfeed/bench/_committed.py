"""The README's bench table as committed, for ``python -m hostfeed bench`` to print beside
a run's own figures on the same processor. Generated from the committed runs (docs/bench.json,
docs/bench-repeats/; another processor's under docs/bench-NAME/) by
``python docs/figures.py --write`` (``--check`` fails where it differs): do not edit."""
from __future__ import annotations

from typing import Any

#: One set of committed full runs per processor, the README's first: the processor (as the
#: runs' headers record it), its name, the folder of the runs, how many, the machine and
#: the load averages when each started, and the rows: (the row, its unit: "x" a time ratio,
#: "us" its own figure in µs; the cited run's figure, the lowest and the highest over the runs)
SETS: list[dict[str, Any]] = [
    {'processor': {'vendor': 'AuthenticAMD',
                   'family': 26,
                   'model_number': 2,
                   'model': 'AMD EPYC',
                   'stepping': 1,
                   'caches_kib': {'L1d': 48, 'L1i': 32, 'L2': 1024, 'L3': 32768}},
     'name': 'AMD EPYC (family 26, model 2)',
     'folder': '',
     'runs': 3,
     'machine': ('a 2-core AMD EPYC (family 26, model 2) machine, jax 0.10.2, Python 3.11.7, '
                 'load 0.38, 2026-12-07'),
     'loads': '0.38-1.53',
     'rows': [
         ('dispatch of a small jitted function with one `id_tap`, waited for (per call)',
          'x', 0.593422, 0.120051, 0.593422),
         ('the same with one `call`',
          'x', 0.167344, 0.157845, 0.167344),
         ("small tap (float32[4]) in a loop: computation per tap (the loop's time until it "
         'returns, over its taps)',
          'x', 0.175291, 0.175291, 0.183672),
         ('the same loop: until every function ran, per tap (throughput, not latency)',
          'x', 0.199418, 0.181132, 0.203424),
         ("a tap's hand-over p50: queued until its function starts (taps spaced apart)",
          'us', 0.263, 0.263, 1.055),
         ('the same in a burst of taps (behind those queued before it)',
          'us', 884.735, 835.583, 884.735),
         ('synchronous tap (the default on CPUs and GPUs): each tap p50 (what the computation '
         'spends on a tap)',
          'x', 0.795096, 0.795096, 0.799765),
         ('4 MiB taps in a loop until every function ran (per byte)',
          'x', 6.78513, 6.24231, 6.78513),
         ('the same, against the copy it makes (why it loses to `buffer_callback` there)',
          'x', 1.06285, 0.994981, 1.06285),
         ('4 MiB taps whose function reads every byte (a sum), until every function ran',
          'x', 0.899342, 0.890654, 0.90925),
         ('`call` round trip, float32[4], p50',
          'x', 0.724524, 0.723813, 0.738104),
         ('`call` round trip p50, every core busy',
          'x', 0.727304, 0.717815, 0.734065),
         ('eager `id_tap` until its function ran (per tap)',
          'x', 1.62669, 0.931957, 1.62669),
         ('compile a function with 200 taps',
          'x', 1.22174, 1.21395, 1.23416),
         ('idle `barrier_wait()` after computations that tapped',
          'x', 11.1342, 10.6713, 11.1342),
         ('the same, against its own floor (why it loses to `jax.effects_barrier`)',
          'x', 1.18865, 1.18865, 1.21208),
     ]},
    {'processor': {'model': 'Intel(R) Xeon(R) Processor'},
     'name': 'Intel(R) Xeon(R) Processor',
     'folder': 'docs/bench-xeon/',
     'runs': 3,
     'machine': ('a 2-core Intel(R) Xeon(R) Processor machine, jax 0.10.2, Python 3.11.7, load '
                 '0.51, 2026-12-06'),
     'loads': '0.51-1.45',
     'rows': [
         ('dispatch of a small jitted function with one `id_tap`, waited for (per call)',
          'x', 0.238906, 0.179471, 0.238906),
         ('the same with one `call`',
          'x', 0.112656, 0.112656, 0.115624),
         ("small tap (float32[4]) in a loop: computation per tap (the loop's time until it "
         'returns, over its taps)',
          'x', 0.15588, 0.15588, 0.23517),
         ('the same loop: until every function ran, per tap (throughput, not latency)',
          'x', 0.180816, 0.180816, 0.237681),
         ("a tap's hand-over p50: queued until its function starts (taps spaced apart)",
          'us', 2.431, 1.823, 2.431),
         ('the same in a burst of taps (behind those queued before it)',
          'us', 3932.16, 3932.16, 4325.38),
         ('synchronous tap (the default on CPUs and GPUs): each tap p50 (what the computation '
         'spends on a tap)',
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
     ]},
]
