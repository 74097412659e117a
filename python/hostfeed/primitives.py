"""The ``outside_call`` primitive and the effect that keeps it alive and ordered.

``outside_call_p`` is the identity on all its operands; the first ``nr_tapped_args`` of
them are sent to the host, where the callback named by ``callback`` runs. Its effect is
ordered, so JAX threads a token through it: taps run in program order, are never dropped
by dead-code elimination even when their outputs are unused, and keep their order through
jit, nested jit and control flow.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from . import _compat


class HostCallbackEffect(_compat.Effect):
    """The ordered side effect of sending data to a hostfeed host callback."""

    def __str__(self) -> str:
        return "HostCallback"


host_callback_effect = HostCallbackEffect()
for _effect_set in _compat.EFFECT_SETS:
    _effect_set.add_type(HostCallbackEffect)

INLINE_ENV = "JAX_HOST_CALLBACK_INLINE"


def inline_enabled() -> bool:
    """Whether ``JAX_HOST_CALLBACK_INLINE`` asks for callbacks to run inline when eager."""
    return os.environ.get(INLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class CallbackSpec:
    """What a host callback is: the user's function, the pytree of its argument, and how to
    call it. Hashable by the function's identity, so it can be a primitive parameter."""

    __slots__ = ("func", "arg_treedef", "with_device", "kind")

    def __init__(self, func: Any, arg_treedef: Any, with_device: bool, kind: str):
        self.func = func
        self.arg_treedef = arg_treedef
        self.with_device = bool(with_device)
        self.kind = kind

    def _key(self) -> tuple:
        return (id(self.func), self.arg_treedef, self.with_device, self.kind)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CallbackSpec) and self.func is other.func
                and self._key() == other._key())

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{self.kind}:{getattr(self.func, '__name__', type(self.func).__name__)}"

    @property
    def name(self) -> str:
        return getattr(self.func, "__qualname__", None) or repr(self.func)


def unpack_transforms(transforms: tuple) -> tuple[tuple[str, dict], ...]:
    """Internal ``(name, *params)`` tuples -> the legacy ``(name, params_dict)`` form.

    Example:
        >>> unpack_transforms((("batch", (0,)), ("jvp",)))
        (('batch', {'batch_dims': (0,)}), ('jvp', {}))
    """
    out = []
    for name, *params in transforms:
        if name == "batch":
            out.append((name, {"batch_dims": params[0]}))
        else:
            out.append((name, {}))
    return tuple(out)


def make_invoker(spec: CallbackSpec, transforms: tuple):
    """A fast ``invoke(arrays, device_ordinal)`` for the consumer thread."""
    from .receiver import device_for_ordinal

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


outside_call_p = _compat.Primitive("outside_call")
outside_call_p.multiple_results = True


@outside_call_p.def_effectful_abstract_eval
def _outside_call_abstract_eval(*avals, callback, nr_tapped_args, transforms, device_index):
    del callback, nr_tapped_args, transforms, device_index
    return avals, {host_callback_effect}


def _outside_call_impl(*args, callback, nr_tapped_args, transforms, device_index):
    if inline_enabled():
        # Legacy JAX_HOST_CALLBACK_INLINE: run the callback here, in the caller's thread,
        # so its exceptions propagate with the caller's stack.
        import jax

        tapped = args[:nr_tapped_args]
        arrays = [np.asarray(a) for a in tapped]
        device = None
        if callback.with_device:
            devs = [next(iter(a.devices())) for a in tapped if isinstance(a, jax.Array)]
            device = devs[0] if devs else jax.devices()[0]
        arg = callback.arg_treedef.unflatten(arrays)
        unpacked = unpack_transforms(transforms)
        if callback.with_device:
            callback.func(arg, unpacked, device=device)
        else:
            callback.func(arg, unpacked)
        return list(args)
    # Eager use goes through the device like staged code, so that all callbacks arrive
    # through the receiver, in order.
    return _compat.apply_primitive(outside_call_p, *args, callback=callback,
                                   nr_tapped_args=nr_tapped_args, transforms=transforms,
                                   device_index=device_index)


outside_call_p.def_impl(_outside_call_impl)
