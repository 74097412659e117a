"""hcb.call round trips against io_callback (ordered and not) and pure_callback, as
percentiles, side by side in one run (a thin user of ``python -m hostfeed bench``).

Run: python benches/call.py [--quick] [--json FILE]
"""
import sys

from hostfeed import bench

if __name__ == "__main__":
    sys.exit(bench.main(["--only", "call", *sys.argv[1:]]))
