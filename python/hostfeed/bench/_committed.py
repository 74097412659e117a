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
                 'load 0.99, 2026-12-07'),
     'loads': '0.99-1.45',
     'rows': [
         ('dispatch of a small jitted function with one `id_tap`, waited for (per call)',
          'x', 0.134952, 0.128554, 0.135104),
         ('the same with one `call`',
          'x', 0.169952, 0.159722, 0.169952),
         ("small tap (float32[4]) in a loop: computation per tap (the loop's time until it "
         'returns, over its taps)',
          'x', 0.174687, 0.171991, 0.177271),
         ('the same loop: until every function ran, per tap (throughput, not latency)',
          'x', 0.176377, 0.176377, 0.189717),
         ("a tap's hand-over p50: queued until its function starts (taps spaced apart)",
          'us', 0.287, 0.279, 0.287),
         ('the same in a burst of taps (behind those queued before it)',
          'us', 737.279, 720.895, 835.583),
         ('synchronous tap (the default on CPUs and GPUs): each tap p50 (what the computation '
         'spends on a tap)',
          'x', 0.793341, 0.793341, 0.804822),
         ('4 MiB taps in a loop until every function ran (per byte)',
          'x', 7.19688, 6.1741, 7.19688),
         ('the same, against the copy it makes (why it loses to `buffer_callback` there)',
          'x', 1.1254, 1.01575, 1.1254),
         ('4 MiB taps whose function reads every byte (a sum), until every function ran',
          'x', 0.97882, 0.874682, 0.97882),
         ('`call` round trip, float32[4], p50',
          'x', 0.70906, 0.70906, 0.726676),
         ('`call` round trip p50, every core busy',
          'x', 0.70971, 0.70971, 0.729289),
         ('eager `id_tap` until its function ran (per tap)',
          'x', 1.06762, 1.04971, 1.07714),
         ('compile a function with 200 taps',
          'x', 1.01749, 0.98255, 1.0296),
         ('idle `barrier_wait()` after computations that tapped',
          'x', 11.1524, 10.4354, 11.1524),
         ('the same, against its own floor (why it loses to `jax.effects_barrier`)',
          'x', 1.20779, 1.18913, 1.20779),
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
