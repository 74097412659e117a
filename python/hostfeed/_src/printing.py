"""``id_print`` output, in the format of JAX 0.4.x's legacy module.

A tuple prints as ``( a b )``, a list as ``[ a b ]``, a dict as ``{ k=v k2=v2 }`` (keys
sorted; empty ones as ``(  )``, ``[  ]``, ``{  }``) when it fits in 80 columns; otherwise
each element goes on its own line, indented under the first (``( a`` / ``  b )``), and
nested groups decide for themselves. Arrays print through ``numpy.array2string``.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import numpy as np


#: Width within which a tuple, list or dict prints on one line (JAX 0.4.x's module).
WIDTH = 80


def _hcat(left: list[str], right: list[str]) -> list[str]:
    # Put `right` after the last line of `left`, indenting its later lines to match.
    if not left:
        return right
    if not right:
        return left
    indent = " " * len(left[-1])
    return left[:-1] + [left[-1] + right[0]] + [indent + r for r in right[1:]]


def _group(arg: Any) -> tuple[str, str, list[tuple[str, Any]]] | None:
    """``(open, close, [(prefix, element), ...])`` of a tuple, list or dict, else None."""
    if isinstance(arg, tuple):
        return "( ", " )", [("", e) for e in arg]
    if isinstance(arg, list):
        return "[ ", " ]", [("", e) for e in arg]
    if isinstance(arg, dict):
        return "{ ", " }", [(f"{k}=", v) for k, v in sorted(arg.items())]
    return None


def _leaf(arg: Any, threshold: int | None) -> list[str]:
    if isinstance(arg, np.ndarray):
        return np.array2string(arg, threshold=threshold).split("\n")
    return str(arg).split("\n")


def _one_line(arg: Any, threshold: int | None) -> str | None:
    """``arg`` on one line, or None when some element spans several lines."""
    group = _group(arg)
    if group is None:
        lines = _leaf(arg, threshold)
        return lines[0] if len(lines) == 1 else None
    open_, close, items = group
    parts = []
    for prefix, e in items:
        line = _one_line(e, threshold)
        if line is None:
            return None
        parts.append(prefix + line)
    return open_ + " ".join(parts) + close  # empty: "(  )", as JAX 0.4.x printed it


def _layout(arg: Any, threshold: int | None, column: int, trail: int) -> list[str]:
    """The lines of ``arg`` printed from ``column``, with ``trail`` characters (closing
    brackets) following it on its last line."""
    group = _group(arg)
    if group is None:
        return _leaf(arg, threshold)
    line = _one_line(arg, threshold)
    if line is not None and column + len(line) + trail <= WIDTH:
        return [line]
    open_, close, items = group
    if not items:
        return [open_ + close]
    blocks = []
    for k, (prefix, e) in enumerate(items):
        last = k == len(items) - 1
        inner = column + len(open_) + len(prefix)
        blocks.append(_hcat([prefix], _layout(e, threshold, inner,
                                              trail + len(close) if last else 0)))
    return _hcat(_hcat([open_], [line for b in blocks for line in b]), [close])


def format_value(arg: Any, threshold: int | None = None) -> list[str]:
    """Lines that ``id_print`` shows for ``arg``: a tuple, list or dict on one line when it
    fits in :data:`WIDTH` columns, else one element per line, nested groups deciding for
    themselves; arrays through ``numpy.array2string``.

    Example:
        >>> format_value((np.float32(3.), np.array([1, 2])))
        ['( 3.0 [1 2] )']
        >>> print("\\n".join(format_value(("x" * 50, "y" * 50))))
        ( xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx
          yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy )
    """
    return _layout(arg, threshold, 0, 0)


def print_tap_func(arg: Any, transforms: Sequence[tuple[str, dict]], *, device: Any = None,
                   output_stream: Any = None, threshold: int | None = None,
                   **kwargs: Any) -> None:
    """The tap function behind ``id_print``.

    Prints the keyword arguments (sorted, ``key: value``), the transforms and the device if
    any, on one line, then ``arg``.

    Example:
        >>> import io
        >>> s = io.StringIO()
        >>> print_tap_func(np.array(2.), (), output_stream=s, what="x")
        >>> s.getvalue()
        'what: x\\n2.\\n'
    """
    def emit(s: str) -> None:
        if output_stream is not None:
            output_stream.write(s + "\n")
        else:
            print(s)

    if transforms:
        kwargs["transforms"] = [(name, params) if params else name for name, params in transforms]
    if device is not None:
        kwargs["device"] = device
    kv_pairs = " ".join(f"{k}: {v}" for k, v in sorted(kwargs.items()))
    if kv_pairs:
        emit(kv_pairs)
    emit("\n".join(format_value(arg, threshold)))


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


class Printer:
    """The tap function of one ``id_print``: its keyword arguments, stream, threshold and
    the numpy print options in effect where ``id_print`` was called. (numpy keeps print
    options per thread since 2.x, and callbacks run on the receiver's thread, so they are
    captured here.)

    Two printers with the same settings are equal, so repeated eager ``id_print`` calls
    reuse one compiled tap instead of compiling and registering a new one each time.

    Example:
        >>> import io
        >>> s = io.StringIO()
        >>> Printer(s, None, {"what": "x"}) == Printer(s, None, {"what": "x"})
        True
        >>> Printer(s, None, {"what": "x"})(np.array([1.25]), ())
        >>> s.getvalue()
        'what: x\\n[1.25]\\n'
    """

    __hostfeed_by_value__ = True
    __slots__ = ("_hash", "_key", "kwargs", "options", "output_stream", "threshold")
    __name__ = "id_print"  # the name error messages and logs show for this callback

    def __init__(self, output_stream: Any, threshold: int | None, kwargs: dict[str, Any]):
        if output_stream is not None and not callable(getattr(output_stream, "write", None)):
            raise TypeError(f"id_print: output_stream must have a write(str) method (a file, "
                            f"io.StringIO, sys.stderr), got {type(output_stream).__name__}: "
                            f"{output_stream!r}")
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(
                threshold, (int, np.integer)) or threshold < 0):
            raise TypeError(f"id_print: threshold must be a non-negative int (the number of "
                            f"elements above which numpy summarises an array) or None, got "
                            f"{threshold!r}")
        self.output_stream = output_stream
        self.threshold = threshold
        self.kwargs = dict(kwargs)
        self.options = np.get_printoptions()
        self._key: tuple = (id(output_stream), threshold, _freeze(self.kwargs),
                            _freeze(self.options))
        try:
            self._hash = hash(self._key)
        except TypeError:  # unhashable keyword values: this printer equals only itself
            self._key = (id(self),)
            self._hash = hash(self._key)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Printer) and self._key == other._key
                and self.output_stream is other.output_stream)

    def __hash__(self) -> int:
        return self._hash

    def __call__(self, arg: Any, transforms: Sequence[tuple[str, dict]], *,
                 device: Any = None) -> None:
        with np.printoptions(**self.options):
            print_tap_func(arg, transforms, device=device, output_stream=self.output_stream,
                           threshold=self.threshold, **self.kwargs)
