"""``id_print`` output, in the legacy module's format.

Values are laid out as blocks of lines: a tuple prints as ``( a`` / ``  b )``, a list as
``[ a`` / ``  b ]``, a dict as ``{ k=v`` / ``  k2=v2 }`` (keys sorted), arrays through
``numpy.array2string``.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import numpy as np


def _hcat(left: list[str], right: list[str]) -> list[str]:
    # Put `right` after the last line of `left`, indenting its later lines to match.
    if not left:
        return right
    if not right:
        return left
    indent = " " * len(left[-1])
    return left[:-1] + [left[-1] + right[0]] + [indent + r for r in right[1:]]


def _vcat(blocks: Sequence[list[str]]) -> list[str]:
    return [line for b in blocks for line in b]


def format_value(arg: Any, threshold: int | None = None) -> list[str]:
    """Lines that ``id_print`` shows for ``arg``.

    Example:
        >>> format_value((np.float32(3.), np.array([1, 2])))
        ['( 3.0', '  [1 2] )']
    """
    if isinstance(arg, tuple):
        return _hcat(_hcat(["( "], _vcat([format_value(e, threshold) for e in arg])), [" )"])
    if isinstance(arg, list):
        return _hcat(_hcat(["[ "], _vcat([format_value(e, threshold) for e in arg])), [" ]"])
    if isinstance(arg, dict):
        items = [_hcat([f"{k}="], format_value(v, threshold)) for k, v in sorted(arg.items())]
        return _hcat(_hcat(["{ "], _vcat(items)), [" }"])
    if isinstance(arg, np.ndarray):
        return np.array2string(arg, threshold=threshold).split("\n")
    return str(arg).split("\n")


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
