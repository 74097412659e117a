"""What the modules below the Recorder (``target``, ``unflushed``) read of one: a protocol,
so that they need not import ``recorder``, which imports them."""
from __future__ import annotations

from typing import Protocol

from .catalogue import Catalogue

__all__ = ["PipelineView", "RecorderView"]


class PipelineView(Protocol):
    """A recorder's steps' pipeline, as far as a reader asks it."""

    @property
    def idle(self) -> bool: ...


class RecorderView(Protocol):
    """A :class:`~hostfeed.Recorder` as its targets and the unflushed-read warning see it."""

    @property
    def path(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    @property
    def catalogue(self) -> Catalogue: ...

    @property
    def pipeline(self) -> PipelineView: ...

    def stats(self) -> dict[str, int]: ...
