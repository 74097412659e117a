"""What the lowering, a record's :class:`~.target.Target` and a recorded step ask of a
recorder: :class:`Catalogue`, the arrays it declared and the Rust sinks they are bound
to. Nothing outside :class:`~.recorder.Recorder` reaches into its attributes; they talk to
its ``catalogue``."""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from ..dtypes import DTYPE_CODES

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
    and where the errors of those rows are kept (``keep_error``: the recorder's flush,
    close or the next barrier raises them)."""

    __slots__ = ("_native", "_coord", "_keep_error", "_lock", "_declared")

    def __init__(self, native: Any, coord: Any, keep_error: Callable[[BaseException], None]):
        self._native = native
        self._coord = coord
        self._keep_error = keep_error
        self._lock = threading.Lock()
        self._declared: dict[tuple, int] = {}

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
        self._native.declare_parted(name, dtype_code(dtype), list(key[2]), count,
                                    self._coord.leader)
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
