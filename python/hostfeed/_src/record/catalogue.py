"""What the lowering, a record's :class:`~.target.Target` and a recorded step ask of a
recorder: :class:`Catalogue`, the arrays it declared and the Rust sinks they are bound
to. A record's spec carries its recorder's catalogue (``spec.RecordSpec``); nothing
outside :class:`~.recorder.Recorder` reaches into its attributes."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from ..dtypes import DTYPE_CODES
from .roles import COTANGENT_SUFFIX, TANGENT_SUFFIX
from .window import counting_columns

__all__ = ["Catalogue"]


def dtype_code(dtype: Any) -> int:
    """The XLA dtype code the native recorder takes for ``dtype``; raises TypeError for a
    dtype it cannot record.

    Example:
        >>> dtype_code(np.float32) == DTYPE_CODES["float32"]
        True
    """
    name = np.dtype(dtype).name
    code = DTYPE_CODES.get(name)
    if code is None:
        raise TypeError(f"hostfeed: values of dtype {name} cannot be recorded")
    return code


class Catalogue:
    """One recorder's arrays: declared once per (name, dtype, shape), in the store (the
    native recorder) and with the other processes of a shared store (``coord``); the
    consumer ids bound to their Rust sinks; where the rows recorded through Python go;
    where the errors of those rows are kept (``keep_error``: the recorder's flush,
    close or the next barrier raises them); and, with a window (``flight``, a
    :class:`~.window.Flight`), which arrays it keeps (``keep="window"``) and the columns of
    summaries that count non-finite values, handed to the core as each array is
    declared."""

    __slots__ = ("path", "_native", "_coord", "_keep_error", "_lock", "_declared", "flight",
                 "_windowed", "_counting")

    def __init__(self, native: Any, coord: Any, keep_error: Callable[[BaseException], None],
                 flight: Any = None):
        #: The store's path or URL (what names its recorder in messages).
        self.path = str(native.path)
        self._native = native
        self._coord = coord
        self._keep_error = keep_error
        self._lock = threading.Lock()
        self._declared: dict[tuple, int] = {}
        self.flight = flight
        # Record name -> whether its rows (and its tangents' and cotangents') are windowed.
        self._windowed: dict[str, bool] = {}
        # Summary array name -> (row width, the columns that count non-finite values).
        self._counting: dict[str, Optional[tuple[int, list[int]]]] = {}

    def __repr__(self) -> str:
        return f"hostfeed.Recorder({self.path!r}{', closed' if self.closed else ''})"

    @property
    def closed(self) -> bool:
        """Whether the recorder was closed."""
        return bool(self._native.closed)

    def check_name(self, name: str, ndim: int) -> None:
        """Raises ``ValueError`` for a record name the store refuses (for rows of ``ndim``
        dimensions: every part, lengths, the paths it makes)."""
        self._native.check_name(name, ndim)

    def describe_summary(self, name: str, description: str) -> None:
        """Says what the rows of array ``name`` summarize (``hostfeed.reduce``, JSON), and
        notes the columns that count non-finite values (the window's trigger)."""
        self._native.describe_summary(name, description)
        self.counting(name, counting_columns(json.loads(description)))

    def describe_axes(self, name: str, axes: list) -> None:
        """Names the axes of array ``name``'s rows (``hostfeed.axes`` in its attributes)."""
        self._native.describe_axes(name, json.dumps(axes))

    def keep(self, name: str, windowed: bool) -> None:
        """Notes whether record ``name`` is kept in the window; raises ``ValueError`` when
        it was recorded with the other ``keep=`` before (one array, one way)."""
        with self._lock:
            earlier = self._windowed.setdefault(name, windowed)
        if earlier != windowed:
            was, now = ("window", "always") if earlier else ("always", "window")
            raise ValueError(f"hostfeed: Recorder.record({name!r}, keep={now!r}): {name!r} was "
                             f"recorded with keep={was!r} before; an array is kept one way "
                             f"(record the other under another name)")

    def counting(self, name: str, columns: Optional[tuple[int, list[int]]]) -> None:
        """Notes the columns of summary array ``name`` that count non-finite values."""
        with self._lock:
            self._counting[name] = columns

    def _traits(self, name: str, ids: Sequence[int]) -> None:
        """Hands the window how the rows of array ``name`` (its handles ``ids``) go."""
        if self.flight is None:
            return
        base = name
        for suffix in (TANGENT_SUFFIX, COTANGENT_SUFFIX):
            if base.endswith(suffix):
                base = base[:-len(suffix)]
        with self._lock:
            windowed = self._windowed.get(base, False)
            columns = self._counting.get(name)
        for array_id in ids:
            self.flight.traits(array_id, windowed, columns)

    @property
    def shared(self) -> bool:
        """Whether the store is shared by the processes of a jax.distributed run."""
        return bool(self._coord.shared)

    def claim(self, name: str) -> None:
        """Claims array ``name`` for this process (a shared store's arrays each have one
        writer); raises if another process writes it."""
        self._coord.claim(name)

    def declare(self, name: str, dtype: Any, shape: Sequence[int]) -> int:
        """Declares array ``name`` of rows of ``shape`` and ``dtype`` (a clash with an earlier
        declaration raises); returns its id in the native recorder."""
        key = (name, np.dtype(dtype).name, tuple(int(d) for d in shape))
        with self._lock:
            array_id = self._declared.get(key)
        if array_id is None:
            self._coord.declare(name, {"dtype": key[1], "shape": list(key[2]),
                                       "layout": "rows"})
            array_id = int(self._native.declare(name, dtype_code(dtype), list(key[2])))
            self._traits(name, [array_id])
            with self._lock:
                self._declared[key] = array_id
        return array_id

    def declare_parted(self, name: str, dtype: Any, part_shape: Sequence[int],
                       count: int) -> None:
        """Declares parted array ``name``: ``count`` parts of ``part_shape`` per row."""
        key = (name, np.dtype(dtype).name, tuple(int(d) for d in part_shape), count)
        with self._lock:
            if key in self._declared:
                return
        shape = [key[2][0] * count, *key[2][1:]]
        self._coord.declare(name, {"dtype": key[1], "shape": shape, "layout": "parts",
                                   "parts": count})
        ids = self._native.declare_parted(name, dtype_code(dtype), list(key[2]), count,
                                          self._coord.leader)
        self._traits(name, [int(i) for i in ids])
        with self._lock:
            self._declared[key] = -1

    def bind(self, cid: int, ids: Sequence[Optional[int]], step: Optional[int], transforms: str,
             lanes: int) -> None:
        """Has the Rust sink of arrays ``ids`` take the messages of consumer ``cid``."""
        self._native.bind(cid, ids, step, transforms, lanes)

    def bind_parted(self, cid: int, name: str, step: Optional[int], transforms: str) -> None:
        """Has parted array ``name``'s Rust sink take the parts consumer ``cid`` sends."""
        self._native.bind_parted(cid, name, step, transforms)

    @property
    def append(self) -> Callable[..., None]:
        """What appends a row recorded through Python: the native recorder's
        ``append(array_id, data, step, device, transforms, wait=False, lend=False)``."""
        return self._native.append  # type: ignore[no-any-return]

    def failed(self, exc: BaseException) -> None:
        """Keeps the error of rows recorded through Python for the recorder to raise."""
        self._keep_error(exc)
