"""Taps: per-tap latency distributions and the payload sweep, hostfeed against
io_callback(ordered=True), io_callback, jax.debug.callback and pure_callback, side by side
in one run (a thin user of ``python -m hostfeed bench``; options pass through).

Run: python benches/taps.py [--quick] [--json FILE] [--plot FILE.png]
"""
import sys

from hostfeed import bench

if __name__ == "__main__":
    sys.exit(bench.main(["--only", "latency", "sweep", *sys.argv[1:]]))
