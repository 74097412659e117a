"""A recorder's plain record: :class:`PlainRecord`, one row of a value bound as a record
(``outside_call_p`` with a :class:`~hostfeed._src.primitives.RecordSpec` that carries the
recorder's catalogue and the record's name), then its watch, if the name is watched.

It is the end of a record's road on the Python side: ``Recorder.record`` checks what it
is given, :func:`.selection.selective` picks the steps (and the summary), and this binds;
nothing here calls back into the recorder.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Optional

import jax
import numpy as np

from .. import compat, dtypes
from ..primitives import RecordSpec, outside_call_p, outside_call_params
from . import inputs, watch as _watch
from .catalogue import Catalogue
from .roles import KIND, KIND_WITH_STEP
from .target import Target

__all__ = ["PlainRecord"]


class PlainRecord:
    """One recorder's plain record (a :class:`~.selection.Record`): its ``catalogue``, its
    targets (one per name and kind: the host function of the records that go through
    Python) and its watches (name -> :class:`~.watch.WatchTap`, set by
    ``Recorder.watch``). ``pid``: the process that opened the recorder (a forked child's
    record is refused: the recorder is its parent's)."""

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue
        self.watches: dict[str, _watch.WatchTap] = {}
        self.pid = os.getpid()
        self._targets: dict[tuple[str, str], Target] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, value: Any, *, step: Any = None, result: Any = None,
                 ad_taps: Optional[str] = None) -> Any:
        """Binds one record of ``value`` (and ``step``) as ``name``; returns ``value``, or
        ``result`` through the record if given."""
        catalogue = self.catalogue
        if catalogue.closed:
            if os.getpid() != self.pid:
                raise ValueError(
                    f"hostfeed: Recorder.record({name!r}): this recorder ({catalogue.path}) "
                    f"was opened by the parent of this forked process; open a new one here")
            raise ValueError(f"hostfeed: Recorder.record({name!r}) on a closed recorder "
                             f"({catalogue.path})")
        treedef: Any
        leaves, treedef = jax.tree_util.tree_flatten(value)
        if treedef.num_leaves != 1 or treedef.num_nodes != 1:
            raise TypeError(f"hostfeed: Recorder.record({name!r}) records one array, got "
                            f"{inputs.describe_pytree(value, treedef.num_leaves, name)}")
        leaves, value_keys = dtypes.unwrap_keys(leaves, "Recorder.record", "value")
        operands = [inputs.as_value(leaves[0], name)]
        catalogue.check_name(name, np.ndim(operands[0]))
        if not compat.is_tracer(operands[0]):
            # An eager record: its row is appended later, on the consumer thread; a shape or
            # dtype clash is raised here, at the call, as under jit (and, for a shared
            # store, an array another process writes).
            catalogue.claim(name)
            catalogue.declare(name, jax.dtypes.canonicalize_dtype(operands[0].dtype),
                              np.shape(operands[0]))
        if step is not None:
            operands.append(inputs.as_step(step, name))
        spec = RecordSpec(catalogue, name, self._target(name, step is not None),
                          jax.tree_util.tree_structure(tuple(operands)), step is not None,
                          ad_taps)
        flat_results: list = []
        result_keys: Any = None
        result_treedef: Any = None
        if result is not None:
            flat_results, result_treedef = jax.tree_util.tree_flatten(result)
            flat_results, result_keys = dtypes.unwrap_keys(flat_results, "Recorder.record",
                                                         "result")
            flat_results = [r if compat.is_tracer(r) or isinstance(r, jax.Array)
                            else jax.numpy.asarray(r) for r in flat_results]
        outs = outside_call_p.bind(*operands, *flat_results,
                                   **outside_call_params(spec, len(operands)))
        watching = self.watches.get(name)
        if watching is not None:  # after the record: its row reaches the recorder first
            _watch.watched(watching, outs[0], None if step is None else outs[1])
        if result_treedef is not None:
            return result_treedef.unflatten(
                dtypes.rewrap_keys(outs[len(operands):], result_keys))
        return treedef.unflatten(dtypes.rewrap_keys(outs[:1], value_keys))

    def _target(self, name: str, with_step: bool) -> Target:
        kind = KIND_WITH_STEP if with_step else KIND
        with self._lock:
            t = self._targets.get((name, kind))
            if t is None:
                t = self._targets[(name, kind)] = Target(self.catalogue, name, kind)
            return t
