"""``hostfeed._receiver.consumers``: the contract with Python's consumers (``consumers.rs``):
``Consumer``, its ``ConsumerKind``, a call's ``DirectCall``, and the ``ConsumerTable`` the
registry fills and the receiver looks consumers up in.
"""
from typing import Any, ClassVar, final
from collections.abc import Callable

import numpy as np

__all__ = [
    "ConsumerKind", "Consumer", "DirectCall", "ConsumerTable",
]

@final
class ConsumerKind:
    """How a consumer's messages run. Each kind is one object: compare with ``is``;
    ``str(kind)`` is its word (``tap``, ``call``, ``joined``)."""

    #: ``invoke(arrays, device)``; a synchronous tap's message also has a reply, answered
    #: with no results once it ran.
    TAP: ClassVar[ConsumerKind]
    #: ``invoke(arrays, device, reply) -> failed``, which answers ``reply``.
    CALL: ClassVar[ConsumerKind]
    #: One part of a global-view tap or call sent shard by shard: ``invoke`` is the
    #: ``Joiner`` (``invoke.add(run, arrays, device, reply)``).
    JOINED: ClassVar[ConsumerKind]

@final
class Consumer:
    """A registered consumer (or an eager tap's): how the receiver runs the user's callable
    for one message. The receiver reads its fields itself. ``direct`` (a ``CALL`` one's
    only) runs the host function without ``invoke``'s Python frames."""

    def __new__(cls, invoke: Any, name: str, kind: ConsumerKind,
                direct: DirectCall | None = None) -> Consumer: ...
    @property
    def invoke(self) -> Any:
        """What runs a message (see ``ConsumerKind``)."""
    @property
    def name(self) -> str:
        """The callback's name, for messages about it."""
    @property
    def kind(self) -> ConsumerKind:
        """How its messages run."""
    @property
    def direct(self) -> DirectCall | None:
        """A call's ``DirectCall``, or None."""

@final
class DirectCall:
    """A ``call``'s host function as the receiver runs it without hostfeed's Python frames
    around it: ``func`` gets the one array (``treedef`` None) or ``treedef.unflatten`` of
    the arrays; one result of exactly ``shape`` and ``dtype`` is copied straight into the
    call's results; an exception goes to ``raised(exc) -> message``, any other results to
    ``results(res) -> (flat, None) | (None, message)``."""

    def __new__(cls, func: Callable[[Any], Any], treedef: Any | None,
                shape: tuple[int, ...] | None, dtype: np.dtype | None,
                raised: Callable[[BaseException], str],
                results: Callable[[Any], tuple[list | None, str | None]]) -> DirectCall: ...

@final
class ConsumerTable:
    """The consumers by id: a mapping of ``int`` to ``Consumer`` that the registry fills
    and the receiver reads."""

    def __new__(cls) -> ConsumerTable: ...
    def get(self, cid: int) -> Consumer | None:
        """The consumer of ``cid``, or None."""
    def values(self) -> list[Consumer]:
        """The consumers (in no particular order)."""
    def pop(self, cid: int) -> Consumer:
        """Removes the consumer of ``cid`` and returns it (``KeyError`` if there is none)."""
    def __getitem__(self, cid: int, /) -> Consumer: ...
    def __setitem__(self, cid: int, consumer: Consumer, /) -> None: ...
    def __contains__(self, cid: int, /) -> bool: ...
    def __len__(self) -> int: ...
