"""The rows of the second performance issue side by side in one run, with ratios: an eager
tap (and a fresh tap function per call) against jax.debug.callback, compile time with many
taps against io_callback(ordered=True), the device-side cost of a small tap (latency
section: per-tap p50 and "per tap"), an idle barrier_wait against jax.effects_barrier, and
what the latency histograms cost (a thin user of ``python -m hostfeed bench``).

Run: python benches/versus_jax.py [--quick] [--json FILE]
"""
import sys

from hostfeed import bench

if __name__ == "__main__":
    sys.exit(bench.main(["--only", "eager", "compile", "latency", "barrier", "timing",
                         *sys.argv[1:]]))
