"""Reading a recorded array back in the tests: its rows and the steps they were taken at."""
from __future__ import annotations

import hostfeed


def read(path, name):
    """The rows of the array ``name`` of the store at ``path`` and their steps (a list)."""
    rows, meta = hostfeed.read_recording(path, name)
    return rows, meta["step"].tolist()
