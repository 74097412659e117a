"""Receiver lifecycle: lazy start, stop/restart, atexit drain, environment settings."""
from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import pytest

import hostfeed
from hostfeed import _receiver
from hostfeed._src import compat as _compat
from hostfeed import host_callback as hcb

from conftest import run_python


def test_stop_drains_then_restart_works_for_new_and_compiled_code():
    got = []
    f = jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append(("f", int(a))), x))
    for i in range(50):
        f(i)
    hcb.stop_outfeed_receiver()
    assert not _receiver.host.is_running()
    assert got == [("f", i) for i in range(50)]  # stop drained everything
    # Already-compiled code restarts the receiver by itself ...
    f(50)
    hcb.barrier_wait()
    assert got[-1] == ("f", 50)
    assert _receiver.host.is_running()
    # ... and so does new code, after another stop.
    hcb.stop_outfeed_receiver()
    g = jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append(("g", int(a))), x))
    g(1)
    hcb.barrier_wait()
    assert got[-1] == ("g", 1)


def test_stop_twice_is_harmless():
    hcb.stop_outfeed_receiver()
    hcb.stop_outfeed_receiver()
    hcb.id_tap(lambda a, tr: None, 1)
    hcb.barrier_wait()


def test_stats_count_messages_and_bytes():
    before = hostfeed.receiver_stats()
    jax.jit(lambda x: hcb.id_tap(lambda a, tr: None, (x, x)))(jnp.zeros(10, jnp.float32))
    hcb.barrier_wait()
    after = hostfeed.receiver_stats()
    assert after["messages_enqueued"] - before["messages_enqueued"] == 1
    assert after["messages_processed"] - before["messages_processed"] == 1
    # two float32[10] operands, the second at a 16-byte-aligned offset: 48 + 40 bytes of
    # data, plus what the message holds besides (its header, shapes and allocations)
    charged = after["bytes_enqueued"] - before["bytes_enqueued"]
    assert 88 + 128 <= charged <= 88 + 1024
    assert after["queued_bytes"] == 0


def test_start_receiver_validates_the_bound():
    with pytest.raises(ValueError, match="positive"):
        hostfeed.start_receiver(max_queue_byte_size=0)


def test_jax_older_than_0_10_is_refused_with_the_upgrade_command():
    with pytest.raises(ImportError, match=r"needs jax >= 0.10 .*found jax 0.9.2.*pip install -U"):
        _compat.check_jax_version("0.9.2")
    with pytest.raises(ImportError, match="found jax 0.4.30"):
        _compat.check_jax_version("0.4.30")


@pytest.mark.parametrize("version", ["0.10.0", "0.10.2rc1", "0.11.2", "0.12.0", "0.12.0.1",
                                     "0.12.9.dev20270101"])
def test_every_supported_jax_is_accepted_silently(version):
    _compat.check_jax_version(version)  # pytest turns any warning into an error


def test_jax_newer_than_tested_warns_once_naming_the_tested_range():
    with pytest.warns(UserWarning) as record:
        _compat.check_jax_version("0.13.0")
    assert len(record) == 1
    message = str(record[0].message)
    assert "tested with jax 0.10.0 through 0.12.x; found jax 0.13.0" in message
    assert "may well work" in message


def test_importing_under_a_newer_or_older_jax():
    r = run_python("""
        import warnings
        import jax
        jax.__version__ = "0.13.1"   # pretend a newer JAX than hostfeed was tested with
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import hostfeed
        print([(w.category.__name__, "0.13.1" in str(w.message)) for w in caught])
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[('UserWarning', True)]"
    r = run_python("""
        import jax
        jax.__version__ = "0.9.2"
        import hostfeed
    """)
    assert r.returncode != 0
    assert "ImportError: hostfeed needs jax >= 0.10" in r.stderr


def test_callbacks_run_on_the_receiver_thread_not_the_caller():
    threads = []
    jax.jit(lambda x: hcb.id_tap(lambda a, tr: threads.append(threading.current_thread()), x))(1)
    hcb.barrier_wait()
    assert threads[0] is not threading.main_thread()


def test_atexit_drains_pending_taps():
    r = run_python("""
        import sys
        import jax
        from jax import lax
        from hostfeed import host_callback as hcb
        def tap(a, tr):
            sys.stdout.write(f"tap {int(a)}\\n")  # one write per line: threads interleave
        f = jax.jit(lambda x: lax.fori_loop(0, 200, lambda i, c: hcb.id_tap(tap, i, result=c), x))
        f(0)
        sys.stdout.write("main done\\n")
    """)
    assert r.returncode == 0, r.stderr
    taps = [line for line in r.stdout.splitlines() if line != "main done"]
    assert taps == [f"tap {i}" for i in range(200)]
    assert "main done" in r.stdout


def test_atexit_reports_a_pending_callback_exception():
    r = run_python("""
        import jax
        from hostfeed import host_callback as hcb
        def bad(a, tr):
            raise RuntimeError("failed during shutdown")
        jax.jit(lambda x: hcb.id_tap(bad, x))(1.0)
    """)
    assert "CallbackException" in r.stderr and "failed during shutdown" in r.stderr


def test_inline_mode_runs_eager_taps_in_the_caller():
    r = run_python("""
        import threading
        import jax, jax.numpy as jnp
        from hostfeed import host_callback as hcb
        seen = []
        hcb.id_tap(lambda a, tr: seen.append((a.tolist(), threading.current_thread().name)),
                   jnp.arange(2))
        assert seen == [([0, 1], "MainThread")], seen
        def bad(a, tr):
            raise ValueError("inline boom")
        try:
            hcb.id_tap(bad, 1.0)
        except ValueError as e:
            print("raised at call site:", e)
        # Under jit, taps still go through the receiver.
        jax.jit(lambda x: hcb.id_tap(lambda a, tr: seen.append(
            threading.current_thread().name), x))(1.0)
        hcb.barrier_wait()
        assert seen[-1] != "MainThread", seen
        print("ok")
    """, env={"JAX_HOST_CALLBACK_INLINE": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["raised at call site: inline boom", "ok"]


def test_queue_bound_comes_from_the_environment():
    r = run_python("""
        import hostfeed
        from hostfeed import host_callback as hcb
        hcb.id_tap(lambda a, tr: None, 1)
        hcb.barrier_wait()
        print(hostfeed.receiver_stats()["max_queue_bytes"])
    """, env={"JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": "1.5e5"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "150000"


def test_invalid_queue_bound_environment_is_a_clear_error():
    r = run_python("""
        from hostfeed import host_callback as hcb
        hcb.id_tap(lambda a, tr: None, 1)
    """, env={"JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": "lots"})
    assert r.returncode != 0
    assert "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE='lots' is not a number of bytes" in r.stderr


def test_start_while_another_thread_stops_does_not_deadlock():
    # A stop holds the receiver's control lock while it waits for the consumer, which needs
    # the GIL to finish its callback; a concurrent start must wait without the GIL.
    import hostfeed

    entered, release = threading.Event(), threading.Event()

    def slow(a, tr):
        entered.set()
        release.wait(60)

    jax.jit(lambda x: hcb.id_tap(slow, x))(1.0)
    assert entered.wait(60)
    stopper = threading.Thread(target=hcb.stop_outfeed_receiver)
    starter = threading.Thread(target=hostfeed.start_receiver)
    stopper.start()
    starter.start()
    release.set()
    stopper.join(60)
    starter.join(60)
    assert not stopper.is_alive() and not starter.is_alive()
    got = []
    jax.jit(lambda x: hcb.id_tap(lambda a, tr: got.append(float(a)), x))(2.0)
    hcb.barrier_wait(timeout=60)
    assert got == [2.0]
