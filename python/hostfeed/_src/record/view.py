"""What the unflushed-read warning (``unflushed``, below the Recorder) reads of a
recorder: a protocol, so that it need not import the recorder's modules, which import
it."""
from __future__ import annotations

from typing import Protocol

__all__ = ["PipelineView", "RecorderView"]


class PipelineView(Protocol):
    """A recorder's steps' pipeline, as far as a reader asks it."""

    @property
    def idle(self) -> bool: ...


class RecorderView(Protocol):
    """A :class:`~hostfeed.Recorder` as the unflushed-read warning sees it."""

    @property
    def path(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    @property
    def pipeline(self) -> PipelineView: ...

    def stats(self) -> dict[str, int]: ...
