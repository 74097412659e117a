"""Stubs for ``hostfeed._receiver``, the native (Rust) core of hostfeed: one submodule per
module of the binding (``bindings/python/src``), importable by name
(``from hostfeed._receiver import host``, ``import hostfeed._receiver.host``). Imported by
hostfeed's internal modules (``hostfeed._src``), each for the part it owns. Checked against
the built module by ``mypy.stubtest`` (``noxfile.py``).
"""
from . import error as error
from . import messages as messages
from . import consumers as consumers
from . import batch as batch
from . import host as host
from . import portable as portable
from . import record as record
from . import storage as storage
from . import gpu as gpu

__all__ = ["error", "messages", "consumers", "batch", "host", "portable", "record", "storage",
           "gpu"]
