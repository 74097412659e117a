"""Exceptions in tap functions: logged, recorded, raised by the next barrier_wait; the
receiver keeps going."""
from __future__ import annotations

import functools
import logging
import traceback
import threading

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from hostfeed import _receiver
from hostfeed import host_callback as hcb

from conftest import queue_bound


def test_exception_surfaces_at_barrier_and_later_taps_run(caplog):
    got = []

    def tap(a, transforms):
        if int(a) == 2:
            raise ValueError("tap failed on 2")
        got.append(int(a))

    f = jax.jit(lambda x: lax.fori_loop(0, 5, lambda i, c: hcb.id_tap(tap, i, result=c), x))
    with caplog.at_level(logging.ERROR, logger="hostfeed"):
        f(0)
        with pytest.raises(hcb.CallbackException, match="tap failed on 2") as info:
            hcb.barrier_wait()
    assert got == [0, 1, 3, 4]
    assert isinstance(info.value.__cause__, ValueError)
    # Reported once with its traceback (printed as the cause), once in a line of the log
    # that names the function and the line, and refers to barrier_wait.
    printed = "".join(traceback.format_exception(info.value))
    assert printed.count("Traceback") == 2, printed  # the cause's, then barrier_wait's
    assert printed.count('raise ValueError("tap failed on 2")') == 1, printed
    assert "Last one was: ValueError: tap failed on 2 (at " in str(info.value)
    assert "Traceback" not in str(info.value)
    logged = [r.getMessage() for r in caplog.records if "tap failed on 2" in r.getMessage()]
    assert len(logged) == 1 and "Traceback" not in logged[0], logged
    assert "barrier_wait() raises it" in logged[0], logged
    # Reported once: the next barrier is clean, and new taps still work.
    hcb.barrier_wait()
    f(0)
    with pytest.raises(hcb.CallbackException):
        hcb.barrier_wait()


def test_last_exception_is_the_one_reported():
    def tap(a, transforms):
        raise KeyError(f"key {int(a)}")

    jax.jit(lambda x: lax.fori_loop(0, 3, lambda i, c: hcb.id_tap(tap, i, result=c), x))(0)
    with pytest.raises(hcb.CallbackException, match="key 2"):
        hcb.barrier_wait()


def test_tap_function_exception_is_an_alias():
    assert hcb.TapFunctionException is hcb.CallbackException


def test_barrier_wait_inside_callback_is_refused_not_deadlocked():
    jax.jit(lambda x: hcb.id_tap(lambda a, tr: hcb.barrier_wait(), x))(1.0)
    with pytest.raises(hcb.CallbackException) as info:
        hcb.barrier_wait()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "from inside a host callback" in str(info.value.__cause__)


def test_stop_inside_callback_is_refused():
    jax.jit(lambda x: hcb.id_tap(lambda a, tr: hcb.stop_outfeed_receiver(), x))(1.0)
    with pytest.raises(hcb.CallbackException, match="stop_outfeed_receiver was called from inside"):
        hcb.barrier_wait()
    assert _receiver.host.is_running()


def test_barrier_timeout_names_pending_messages():
    release = threading.Event()
    jax.jit(lambda x: hcb.id_tap(lambda a, tr: release.wait(60), x))(jnp.float32(1))
    try:
        with pytest.raises(TimeoutError, match="still unprocessed"):
            hcb.barrier_wait(timeout=0.05)
    finally:
        release.set()
    hcb.barrier_wait()


def test_bad_timeout_is_rejected():
    with pytest.raises(ValueError, match="timeout"):
        hcb.barrier_wait(timeout=-1)


def test_call_inside_a_callback_is_refused():
    def outer(a, transforms):
        hcb.call(lambda v: v, a, result_shape=a)

    jax.jit(lambda x: hcb.id_tap(outer, x))(1.0)
    with pytest.raises(hcb.CallbackException) as info:
        hcb.barrier_wait()
    assert "hcb.call was used inside a host callback" in str(info.value.__cause__)


def test_taps_from_inside_a_callback_do_not_deadlock_on_a_full_queue():
    got = []
    with queue_bound(64):
        def outer(a, transforms):
            for i in range(5):  # each inner tap alone exceeds what the queue may hold
                hcb.id_tap(lambda v, tr: got.append(int(v[0])), jnp.full(32, i))
            got.append("outer")

        jax.jit(lambda x: hcb.id_tap(outer, x))(1.0)
        hcb.barrier_wait(timeout=60)
        # Eager taps inside a callback run inline, at once.
        assert got == [0, 1, 2, 3, 4, "outer"]


def test_a_message_the_dispatcher_cannot_handle_is_recorded_and_the_receiver_goes_on():
    # An eager item without `invoke` or `name`: the dispatcher records the failure for the
    # next barrier_wait and keeps working.
    _receiver.host.push_eager(object(), (), 0)
    with pytest.raises(hcb.CallbackException) as e:
        hcb.barrier_wait()
    assert isinstance(e.value.__cause__, AttributeError)
    hcb.barrier_wait()  # reported once
    got = []
    hcb.id_tap(lambda a, tr: got.append(int(a)), jnp.int32(7))
    hcb.barrier_wait()
    assert got == [7]


# Tap functions are checked where `id_tap` is called.

def test_io_callback_style_tap_function_is_refused_at_the_call_site():
    def log(x):
        pass

    with pytest.raises(TypeError, match=r"id_tap: tap functions are called as "
                                        r"tap_func\(arg, transforms\), but log\(x\) cannot be"
                                        r".*lambda x, transforms: f\(x\)"):
        jax.jit(lambda x: hcb.id_tap(log, x))(1.0)
    with pytest.raises(TypeError, match=r"id_tap: .*log\(x\) cannot be"):
        hcb.id_tap(log, 1.0)  # eagerly too


def test_tap_with_device_needs_a_device_keyword():
    with pytest.raises(TypeError, match=r"tap_func\(arg, transforms, device=dev\), but "
                                        r"<lambda>\(x, tr\) cannot be .*unexpected keyword "
                                        r"argument 'device'"):
        hcb.id_tap(lambda x, tr: None, 1.0, tap_with_device=True)


class _TapObject:
    def __call__(self, x, transforms, *, device=None):
        pass


@pytest.mark.parametrize(("func", "with_device"), [
    (lambda x, tr: None, False),
    (lambda x, tr, device=None: None, True),
    (lambda x, tr, *, device: None, True),
    (lambda *a, **k: None, True),
    (functools.partial(lambda x, tr, extra: None, extra=1), False),
    (_TapObject(), True),
    (print, False),  # a builtin: its signature cannot always be read; not refused
])
def test_tap_functions_that_accept_the_call_are_fine(func, with_device):
    hcb.id_tap(func, 1.0, tap_with_device=with_device)
    jax.jit(lambda x: hcb.id_tap(func, x, tap_with_device=with_device))(2.0)
    hcb.barrier_wait()


def test_a_signature_check_is_cached_per_code_object_not_per_closure():
    from hostfeed import host_callback
    before = len(host_callback._BIND_CACHE)
    for i in range(20):
        hcb.id_tap(lambda x, tr, i=i: None, 1.0)
    hcb.barrier_wait()
    assert len(host_callback._BIND_CACHE) <= before + 1


def test_print_errors_name_id_print():
    with pytest.raises(TypeError, match=r"^id_print: leaf 0 of `arg` has type str"):
        hcb.id_print("str")


# Public exceptions and typing.

def test_public_exceptions_belong_to_hostfeed():
    import hostfeed
    for exc in (hostfeed.RecordingError, hostfeed.CallbackContextError,
                hostfeed.ReceiverError, hostfeed.ReceiverTimeoutError,
                hostfeed.CallbackException):
        assert exc.__module__ == "hostfeed", exc
        assert getattr(hostfeed, exc.__name__) is exc
    assert hostfeed.CallbackContextError is hostfeed._receiver.error.CallbackContextError


def test_id_tap_and_id_print_are_typed_to_return_the_argument_or_result():
    import typing
    for func in (hcb.id_tap, hcb.id_print):
        overloads = typing.get_overloads(func)
        assert [o.__annotations__["return"] for o in overloads] == ["T", "R"], func
        assert [o.__annotations__["result"] for o in overloads] == ["None", "R"], func
