"""``hostfeed.capture``: record the inputs and outputs of a model's submodules chosen by
name, without editing the model (Flax NNX, Flax Linen, Equinox).

- :mod:`.selection`: glob patterns or a predicate over the names each library gives its
  submodules, and the error listing the names there are;
- :mod:`.calls`: what is recorded around one call (``Recorder.record`` of each array input
  and output, under ``MODULE/output``, ``MODULE/input.0``, ...), and ``Capturing``, the
  Flax model whose calls capture;
- :mod:`.watch`: each capture watched until it records a row; a ``CaptureWarning`` at the
  next ``barrier_wait`` or its recorder's ``close`` says why one recorded nothing;
- :mod:`.nnx`, :mod:`.linen`, :mod:`.equinox`: each library's hook (a patched ``__call__``
  while capturing, ``nn.intercept_methods``, a wrapper module in the pytree), imported
  only for a model of that library: Flax and Equinox are optional (``pip install flax``,
  ``pip install equinox``; in hostfeed's checkout ``pip install '.[flax]'``).
"""
from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any, Optional

import numpy as np

from .. import settings
from .calls import CaptureSpec, Capturing, summary_suffix
from .selection import Select, Selector
from .watch import CaptureWarning, enroll, watch

__all__ = ["capture", "Capturing", "CaptureWarning"]

# library -> (hostfeed module, what it is called in messages, the extra that installs it,
# the distribution)
_LIBRARIES = {
    "nnx": ("nnx", "a Flax NNX model", "flax", "flax"),
    "linen": ("linen", "a Flax Linen model", "flax", "flax"),
    "equinox": ("equinox", "an Equinox model", "equinox", "equinox"),
}


def _library(model: Any) -> Optional[str]:
    """Which library ``model`` is a module of, from its classes' modules (nothing imported)."""
    model = model.model if isinstance(model, Capturing) else model
    wheres = [getattr(cls, "__module__", "") or "" for cls in type(model).__mro__]
    if any(w.startswith("flax.linen") for w in wheres):
        return "linen"  # Linen first: a Linen wrapper of an NNX module (nnx.bridge.ToLinen)
    for where in wheres:
        if where.startswith("flax.nnx"):
            return "nnx"
        if where.startswith("equinox"):
            return "equinox"
    return None


def _attribute(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - a property that fails is no model
        return None


def _not_a_model(model: Any) -> TypeError:
    """The error for a ``model`` of no supported library: what it is, what to pass instead
    where that can be known."""
    cls = type(model)
    what = f"{cls.__module__}.{cls.__qualname__}"
    head = (f"hostfeed.capture: model must be a Flax NNX module, a Flax Linen module or an "
            f"Equinox module, got {what}")
    for attr in ("module", "model"):
        inner = _attribute(model, attr)
        library = _library(inner) if inner is not None else None
        if library is None:
            continue
        kind = _LIBRARIES[library][1]
        if library == "linen":
            how = (f"capture model.{attr} and turn it on around the wrapper's call, "
                   f"`with hostfeed.capture(model.{attr}, rec, ...): model(...)`, or call "
                   f"its apply, `hostfeed.capture(model.{attr}, rec, ...).apply("
                   f"{{'params': model.params}}, ...)`")
        elif library == "nnx":
            how = (f"capture model.{attr}: `with hostfeed.capture(model.{attr}, rec, ...): "
                   f"model(...)`")
        else:
            how = f"capture model.{attr} and call what capture returns"
        return TypeError(f"{head}, a wrapper whose .{attr} is {kind} "
                         f"({type(inner).__module__}.{type(inner).__qualname__}): {how}")
    if isinstance(model, (dict, list, tuple)) or cls.__module__.startswith(("jax", "numpy")):
        return TypeError(f"{head}: pass the model (the module object), not its parameters "
                         f"or outputs")
    library = cls.__module__.split(".")[0]
    if library not in ("builtins", "__main__"):
        return TypeError(f"{head}, a model of {library}, which hostfeed.capture does not "
                         f"know: record its layers' values with rec.record(name, value, "
                         f"step=...) where the model computes them")
    return TypeError(head)


def _load(library: str) -> ModuleType:
    module, what, extra, dist = _LIBRARIES[library]
    try:
        return importlib.import_module(f"{__name__}.{module}")
    except ImportError as exc:
        raise ImportError(
            f"hostfeed.capture of {what} needs {dist}: pip install '{dist}' (or, in "
            f"hostfeed's checkout, pip install '.[{extra}]') ({exc})") from exc


def capture(model: Any, recorder: Any, select: Select, *, step: Any = None,
            every: Optional[int] = None, start: Optional[int] = None,
            stop: Optional[int] = None, reduce: Any = None, axis: Any = None,
            inputs: bool = False, outputs: bool = True, prefix: Optional[str] = None,
            cotangents: Optional[bool] = None, keep: str = "always") -> Any:
    """Records the outputs (and/or inputs) of a model's submodules chosen by name, with
    ``recorder.record``, without editing the model: a Flax NNX or Linen model, or an
    Equinox model.

    Names are the library's own: NNX's attribute path (``blocks.3.mlp``), Linen's scope
    path (``Block_3/MLP_0``), Equinox's pytree path (``blocks.3.mlp`` for
    ``model.blocks[3].mlp``). Each submodule is a group of the store holding ``output``
    (an output that is one array; ``output.0``, ``output.1``, ... or ``output.KEY`` for a
    tuple, list or dict) and, with ``inputs=True``, ``input.0``, ... (positional
    arguments) and ``input.NAME`` (keyword arguments); ``reduce`` adds ``.stats`` or
    ``.hist``. Under ``grad`` the cotangents go to ``OUTPUT.cotangent`` as with every
    record (a summary's, summarised the same way, to ``OUTPUT.cotangent.stats``, ...).
    Arrays are found in any pytree a submodule returns or takes (named by their path: a
    dataclass's fields); a node holding one array (a named array) is recorded as that
    array, under its own name. The model's results are unchanged; its gradients are too,
    but for rounding where cotangents are recorded (their records in the backward pass
    change how XLA fuses the operations around them, as hand-placed records do):
    ``cotangents=False`` leaves them out, and the gradients bit for bit as without
    hostfeed.

    Use the result in place of the model, inside the function you jit (the step is
    usually traced there): for Equinox, a copy of the model with the selected submodules
    wrapped, in a module whose call, attributes and methods are the model's; for Flax,
    a :class:`Capturing` whose calls and methods are the model's (``captured(x)``,
    ``captured.apply(variables, x)``), also a context manager
    (``with hostfeed.capture(model, rec, ...): model(x)``).

    Args:
      model: an ``nnx.Module``, a Linen ``nn.Module`` (unbound, or bound) or an
        ``eqx.Module``; or a model ``capture`` returned, to add another capture.
      recorder: the :class:`hostfeed.Recorder` to record with.
      select: a glob pattern, a list of them, or a predicate ``(name, module) -> bool``.
        A pattern is matched part by part (parts split on ``.``, on ``/`` for Linen):
        ``*`` within a part, ``**`` any number of parts (``"blocks.*.mlp"``,
        ``"**.attn"``, ``"Block_*/MLP_0"``). Only submodules that can be called are
        selected, not the model itself.
      step, every, start, stop, reduce, axis: as for :meth:`hostfeed.Recorder.record`,
        for every captured array (``every=``/``start=``/``stop=`` need ``step``).
      inputs, outputs: which to record (default: outputs only).
      prefix: a group to store the submodules' groups under (``"acts"``:
        ``acts/blocks.3.mlp/output``).
      cotangents: whether ``grad`` records the cotangents of the captured arrays (as
        :meth:`hostfeed.Recorder.record`'s ``cotangents``; None: the process's
        ``HOSTFEED_AD_TAPS``, which records them by default).
      keep: ``"always"`` (default) or ``"window"``: every captured array's rows wait in
        the recorder's window (``Recorder(..., window=N)``) and go to the store when a
        trigger fires (needs ``step``; not with ``reduce``). See docs, "Debugging a run".

    Returns:
      The model with the capture on (see above).

    Raises:
      ValueError: a pattern (or the predicate) selects nothing: the message lists the
        submodules there are (for Linen, those called, when the capture ends); after a
        call of what capture returned (NNX, Equinox), none of the selected submodules was
        called; a selected submodule returned no array; a Linen wrapper of an NNX module
        the capture cannot reach into; every=, start= or stop= without step; a reduce= a
        record does not take.
      TypeError: ``model`` is not a module of those libraries (the message says what it
        is, and what to pass where that is known: a wrapper's ``.module``), or ``select``
        is not a pattern, a list of them or a callable.
      ImportError: the library of ``model`` cannot be imported (the message names the
        package to install: ``pip install flax`` or ``pip install equinox``).

    Warns:
      CaptureWarning: at the next ``barrier_wait`` (or the recorder's ``close``, or exit),
        if the capture recorded no row: never used (the original model called in place of
        what capture returned), no record taken, records traced but never compiled into
        a computation that ran, or (at ``close``) no step selected by ``every=``.

    Example:
        >>> def loss_fn(model, x, y, step):                    # doctest: +SKIP
        ...     model = hostfeed.capture(model, rec, "blocks.*.mlp", step=step, every=100)
        ...     return jnp.mean((model(x) - y) ** 2)
        >>> # rows of blocks.0.mlp/output, blocks.0.mlp/output.cotangent, ...
    """
    library = _library(model)
    if library is None:
        raise _not_a_model(model)
    impl = _load(library)
    spec = _spec(recorder, step, every, start, stop, reduce, axis, inputs, outputs, prefix,
                 cotangents, keep)
    selector = Selector(select, impl.SEP, _LIBRARIES[library][1])
    inner = model.model if isinstance(model, Capturing) else model
    inner = getattr(inner, "hostfeed_model", inner)  # an Equinox CapturedModel's
    patterns = (f"a predicate ({getattr(select, '__name__', 'callable')})"
                if selector.predicate is not None
                else ", ".join(repr(p) for p in selector.patterns))
    options = "".join(f", {k}={v!r}" for k, v in (
        ("reduce", reduce), ("axis", axis), ("every", every), ("start", start),
        ("stop", stop), ("inputs", spec.inputs), ("outputs", spec.outputs),
        ("prefix", prefix), ("cotangents", spec.cotangents))
        if v is not None and not (k == "inputs" and v is False)
        and not (k == "outputs" and v is True))
    spec = dataclasses.replace(spec, watch=watch(
        recorder, f"hostfeed.capture({type(inner).__name__}, {patterns}{options})",
        selecting=every is not None or start is not None or stop is not None))
    if library == "equinox":
        captured = impl.capture(model, spec, selector, step)
    else:
        earlier: tuple = ()
        if isinstance(model, Capturing):
            model, earlier = model.model, model._hooks
        captured = impl.capture(model, spec, selector, step, earlier)
    enroll(spec.watch)
    return captured


def _spec(recorder: Any, step: Any, every: Any, start: Any, stop: Any, reduce: Any,
          axis: Any, inputs: Any, outputs: Any, prefix: Any,
          cotangents: Any = None, keep: Any = "always") -> CaptureSpec:
    """The checked arguments of :func:`capture` (errors at the call, not at trace time)."""
    if keep not in ("always", "window"):
        raise ValueError(f"hostfeed.capture: keep must be \"always\" or \"window\", got "
                         f"{keep!r}")
    if keep == "window" and (step is None or reduce is not None):
        raise ValueError("hostfeed.capture: keep=\"window\" keeps the raw rows of the last "
                         "steps: pass step=..., and no reduce= (summaries always go to the "
                         "store)")
    if not callable(getattr(recorder, "record", None)):
        raise TypeError(f"hostfeed.capture: recorder must be a hostfeed.Recorder, got "
                        f"{type(recorder).__name__}")
    for what, v in (("every", every), ("start", start), ("stop", stop)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise TypeError(f"hostfeed.capture: {what} must be an int (a step), got {v!r}")
    if every is not None and every < 1:
        raise ValueError(f"hostfeed.capture: every must be >= 1, got {every}")
    if step is None and (every is not None or start is not None or stop is not None):
        raise ValueError("hostfeed.capture: every=, start= and stop= select steps: pass the "
                         "step too (step=...)")
    summary_suffix(reduce)
    inputs = settings.flag(inputs, "hostfeed.capture: inputs")
    outputs = settings.flag(outputs, "hostfeed.capture: outputs")
    if cotangents is not None:
        if not isinstance(cotangents, (bool, np.bool_)):
            raise TypeError(f"hostfeed.capture: cotangents must be True, False or None, got "
                            f"{cotangents!r}")
        cotangents = bool(cotangents)
    if not (inputs or outputs):
        raise ValueError("hostfeed.capture: inputs=False and outputs=False record nothing")
    if prefix is not None and (not isinstance(prefix, str) or not prefix.strip("/")):
        raise ValueError(f"hostfeed.capture: prefix must be a non-empty group name, got "
                         f"{prefix!r}")
    return CaptureSpec(recorder, every=every, start=start, stop=stop, reduce=reduce,
                       axis=tuple(axis) if isinstance(axis, list) else axis, inputs=inputs,
                       outputs=outputs, prefix=(prefix or "").strip("/"),
                       cotangents=cotangents, keep=keep)
