"""Throughput of large taps: 4 MiB taps in a jitted loop until every tap function ran,
hostfeed against the floor of what an asynchronous tap does (a numpy copy of the same
bytes passed to the same function), with a function that sums the array (reads every byte)
and one that does nothing, side by side in interleaved rounds (a thin user of
``python -m hostfeed bench``'s ``throughput`` section; options pass through).

Run: python benches/throughput.py [--n-64mb N] [--quick] [--json FILE]

``--n-64mb N``: each method moves N x 64 MiB per round (16 taps of 4 MiB per 64 MiB).
"""
import sys

from hostfeed import bench

if __name__ == "__main__":
    sys.exit(bench.main(["--only", "throughput", *sys.argv[1:]]))
