"""The consumer registry: which Python callable a custom call's ``consumer_id`` names,
kept alive by leases that the lowered modules hold, with ids that are the same in every
process (so that compiled code can come from JAX's persistent compilation cache); and a
plain tap's callable, its invoker (:func:`make_tap_invoker`, which the receiver calls with
each message's arrays). A call's invokers and the joins of global-view callbacks are
:mod:`hostfeed._src.runtime`'s."""
from __future__ import annotations

import collections
import functools
import hashlib
import re
import threading
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _receiver
from .devices import device_for_ordinal
from .primitives import CallbackSpec, unpack_transforms


#: A registered consumer (``_receiver.consumers.Consumer``): ``Consumer(invoke, name, kind,
#: direct=None)``, how the receiver runs the user's callable for one message. ``kind`` is a
#: :class:`ConsumerKind`: ``TAP`` (``invoke(arrays, ordinal)``), ``CALL`` (``invoke(arrays,
#: ordinal, reply)``, which must answer ``reply``; ``direct``, a ``DirectCall``, runs the
#: function without ``invoke``'s Python frames) or ``JOINED`` (a
#: :class:`hostfeed._src.runtime.Joiner`: one part of a global-view tap or call sent shard
#: by shard). The receiver reads these fields itself.
Consumer = _receiver.consumers.Consumer
ConsumerKind = _receiver.consumers.ConsumerKind


def make_tap_invoker(spec: CallbackSpec, transforms: tuple) -> Callable[..., None]:
    """``invoke(arrays, device_ordinal)``: calls the tap function with ``arg`` rebuilt
    from ``arrays`` and the legacy ``transforms`` (and the device, if asked for)."""
    func = spec.func
    treedef = spec.arg_treedef
    unpacked = unpack_transforms(transforms)
    single = treedef.num_leaves == 1 and treedef.num_nodes == 1
    if spec.with_device:
        def invoke(arrays: Sequence[np.ndarray], ordinal: int) -> None:
            arg = arrays[0] if single else treedef.unflatten(arrays)
            func(arg, unpacked, device=device_for_ordinal(ordinal))
    else:
        def invoke(arrays: Sequence[np.ndarray], ordinal: int) -> None:
            func(arrays[0] if single else treedef.unflatten(arrays), unpacked)
    return invoke


class Lease:
    """Keeps consumer ``cid`` registered while it lives. The lowering attaches one to every
    lowered module (JAX keeps a module's keepalives as long as the executables compiled
    from it), so a consumer, and the user's function it holds, is released once no
    compiled computation refers to it any more."""

    __slots__ = ("__weakref__", "cid")

    def __init__(self, cid: int):
        self.cid = cid


class Registry:
    """Consumers by id (index; id 0 is reserved for control messages), with the number of
    live leases of each. A consumer whose last lease died is released at the next
    ``barrier_wait``, once every computation dispatched before has finished and its
    messages are processed (so no message can name it any more)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Consumer id -> consumer (id 0 is reserved for control messages): a table the
        # receiver looks consumers up in itself.
        self.consumers = _receiver.consumers.ConsumerTable()
        self.ids: dict[Any, int] = {}
        self.keys: dict[int, Any] = {}
        self.leases: dict[int, int] = {}
        # Ids whose leases died (appended from garbage collection, any thread: no lock).
        self.dying: collections.deque[int] = collections.deque()
        # Ids left without leases, to release at the next barrier.
        self.pending_release: list[int] = []
        # Whether a "joined" consumer was ever registered: only then can a device be held
        # by the dispatcher, and barriers need marks.
        self.joined = False
        # The call consumers lowered into a computation on several devices: only the
        # failure of one of those can end an execution that global-view callbacks take
        # part in (what the dispatcher needs to know where messages carry no execution id).
        self.several_devices: set[Consumer] = set()
        # Per description of a key (see `_describe`), the lowest attempt that may be free
        # (every lower one is taken), and each id's description and attempt: registering
        # many callbacks that describe alike (lambdas of one line) probes from there, not
        # from attempt 0 every time (quadratic in their number).
        self.first_free: dict[str, int] = {}
        self.attempt_of: dict[int, tuple[str, int]] = {}


registry = Registry()


def _lease_died(cid: int) -> None:
    registry.dying.append(cid)


# Consumer ids and JAX's persistent compilation cache. The id is an attribute of the custom
# call, so it is part of the lowered module and hence of the cache key: a process that
# gets an executable from the cache has lowered the same module itself, and so registered
# each of its ids for its own functions first. Cache hits therefore always call the
# functions the hitting process wrote. For them to happen at all, a callback must get the
# same id in every process, whatever else was registered before it: the id is a hash of a
# description of the callback that holds no memory addresses (module and qualified name of
# the function, the pytree and transformation records, ...). Callbacks that this
# description cannot tell apart (closures made by one factory) are numbered in the order
# they are first lowered; two processes that lower them in another order may compile
# again, and never call the wrong one.

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _describe(obj: Any, depth: int = 0) -> str:
    """A text naming ``obj`` the same way in every process (no memory addresses).

    Example:
        >>> _describe((len, functools.partial(print, sep=","), None))
        "(builtins.len,partial(builtins.print;();sep=','),None)"
    """
    if depth > 8:
        text = type(obj).__qualname__
    elif isinstance(obj, str):  # (a str enum, such as a CallbackKind, as its value)
        text = str.__repr__(obj)
    elif obj is None or isinstance(obj, (bool, int, float, complex, bytes)):
        text = repr(obj)
    elif isinstance(obj, (tuple, list)):
        text = "(" + ",".join(_describe(o, depth + 1) for o in obj) + ")"
    elif isinstance(obj, functools.partial):
        kws = ";".join(f"{k}={_describe(v, depth + 1)}" for k, v in sorted(obj.keywords.items()))
        text = f"partial({_describe(obj.func, depth + 1)};{_describe(obj.args, depth + 1)};{kws})"
    elif isinstance(obj, types.MethodType):
        text = f"method({_describe(obj.__func__, depth + 1)};{type(obj.__self__).__qualname__})"
    elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        text = f"{getattr(obj, '__module__', None)}.{obj.__qualname__}"
    elif _slots(type(obj)):
        # e.g. spec.CallbackSpec: its fields (a subclass's too), described the same way
        fields = ",".join(f"{n}={_describe(getattr(obj, n, None), depth + 1)}"
                          for n in _slots(type(obj)) if not n.startswith("_"))
        text = f"{type(obj).__qualname__}({fields})"
    else:  # pytree definitions, abstract values, callable objects
        try:
            text = _ADDRESS.sub("", repr(obj))
        except Exception:  # noqa: BLE001 - a failing repr only makes the id less stable
            text = type(obj).__qualname__
    return text


def _slots(cls: type) -> tuple[str, ...]:
    """The ``__slots__`` of ``cls`` and of its bases, the bases' first."""
    out: list[str] = []
    for c in reversed(cls.__mro__):
        slots = c.__dict__.get("__slots__", ())
        if isinstance(slots, tuple):
            out += [n for n in slots if n not in out]
    return tuple(out)


def _id_candidate(description: str, attempt: int) -> int:
    digest = hashlib.blake2b(f"{attempt}:{description}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 2) or 1  # a positive int64, never 0


def register(key: Any, make: Callable[[], Consumer]) -> Lease:
    """A lease on the consumer id for ``key``, registering ``make()`` under it if new.

    The id depends only on what ``key`` describes (see the comment above), not on what
    else this process registered, so compiled code can be shared through JAX's persistent
    compilation cache.
    """
    with registry.lock:
        registry.pending_release += count_dead_leases()
        cid = registry.ids.get(key)
        if cid is None:
            consumer = make()
            if consumer.kind is ConsumerKind.JOINED:
                registry.joined = True
            description = _describe(key)
            attempt = registry.first_free.get(description, 0)
            cid = _id_candidate(description, attempt)
            while cid in registry.consumers:  # another callback with the same description
                attempt += 1
                cid = _id_candidate(description, attempt)
            registry.first_free[description] = attempt + 1
            registry.attempt_of[cid] = (description, attempt)
            registry.consumers[cid] = consumer
            registry.ids[key] = cid
            registry.keys[cid] = key
            _receiver.host.set_consumer_name(cid, consumer.name)
        registry.leases[cid] = registry.leases.get(cid, 0) + 1
    lease = Lease(cid)
    weakref.finalize(lease, _lease_died, cid)
    return lease


def note_several_devices(cid: int) -> None:
    """Notes that the call consumer ``cid`` was lowered into a computation on several
    devices (see ``Registry.several_devices``)."""
    with registry.lock:
        consumer = registry.consumers.get(cid)
        if consumer is not None:
            registry.several_devices.add(consumer)


def count_dead_leases() -> list[int]:
    """(Under the registry lock.) Counts the leases that died; returns the ids left
    without any."""
    unleased = []
    while registry.dying:
        cid = registry.dying.popleft()
        left = registry.leases.get(cid, 0) - 1
        registry.leases[cid] = left
        if left <= 0:
            unleased.append(cid)
    return unleased


def release_unleased(candidates: list[int]) -> int:
    """Releases the consumers among ``candidates`` that still have no lease (a new
    lowering may have leased them again meanwhile); returns how many were released."""
    released = 0
    with registry.lock:
        for cid in candidates:
            if registry.leases.get(cid, 0) <= 0 and cid in registry.consumers:
                registry.several_devices.discard(registry.consumers.pop(cid))
                registry.ids.pop(registry.keys.pop(cid), None)
                registry.leases.pop(cid, None)
                description, attempt = registry.attempt_of.pop(cid)
                registry.first_free[description] = min(attempt,
                                                       registry.first_free[description])
                released += 1
    return released


def registered_consumers() -> int:
    """How many consumers are registered now (for tests and diagnostics)."""
    with registry.lock:
        return len(registry.consumers)

