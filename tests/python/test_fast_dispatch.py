"""Fast dispatch (hostfeed.fast_dispatch): a computation that taps on one device is lowered
without an effect-token argument, so JAX dispatches it through its C++ path, while
barrier_wait, eager taps and stop_outfeed_receiver still wait for every such computation
dispatched before them, even one still queued behind others on its device."""
from __future__ import annotations

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hostfeed._src import fast_dispatch
from hostfeed import host_callback as hcb

from conftest import cpu_device_or_skip, run_python


# The main function's signature in the lowered module: its arguments and results.
_MAIN = re.compile(r"func\.func public @main\((.*?)\)\s*->\s*\((.*?)\)\s*\{", re.S)


def _main_signature(lowered) -> str:
    m = _MAIN.search(lowered.as_text())
    assert m, lowered.as_text()[:2000]
    return m.group(1) + " -> " + m.group(2)


def _heavy():
    """A jitted function that keeps a CPU device busy for tens of milliseconds, so that
    what is dispatched after it waits in the device's queue."""
    def body(_, a):
        return jnp.tanh(a @ a) * 0.5
    return jax.jit(lambda a: jax.lax.fori_loop(0, 60, body, a))


def test_a_computation_that_taps_on_one_device_takes_no_token():
    seen = []
    f = jax.jit(lambda x: hcb.id_tap(lambda a, t: seen.append(a.tolist()), x) * 2)
    x = jnp.arange(3.0)
    lowered = f.lower(x)
    assert "token" not in _main_signature(lowered)
    assert "stablehlo.create_token" in lowered.as_text() or "create_token" in lowered.as_text()
    for i in range(5):
        np.testing.assert_allclose(f(x + i), (np.arange(3.0) + i) * 2)
    hcb.barrier_wait()
    assert seen == [[0.0 + i, 1.0 + i, 2.0 + i] for i in range(5)]
    assert x.devices().pop() in fast_dispatch.scoped_devices()


def test_taps_keep_program_order_inside_the_scope_through_control_flow():
    seen = []

    def log(tag):
        return lambda a, t: seen.append((tag, int(a)))

    def f(n):
        n = hcb.id_tap(log("before"), n)

        def body(i, c):
            return hcb.id_tap(log("loop"), c + i)
        c = jax.lax.fori_loop(0, 3, body, n)
        c = jax.lax.cond(c > 0, lambda v: hcb.id_tap(log("pos"), v), lambda v: v, c)
        return hcb.id_tap(log("after"), c)

    assert int(jax.jit(f)(1)) == 4
    hcb.barrier_wait()
    assert seen == [("before", 1), ("loop", 1), ("loop", 2), ("loop", 4), ("pos", 4),
                    ("after", 4)]


def test_other_ordered_effects_pass_through_the_scope():
    cpu_device_or_skip()  # io_callback's operands go there
    seen = []
    lock = threading.Lock()

    def note(tag):
        def cb(*args):
            with lock:
                seen.append(tag)
        return cb

    def f(x):
        x = hcb.id_tap(note("tap"), x)
        jax.experimental.io_callback(note("io"), None, x, ordered=True)
        return hcb.call(lambda a: np.asarray(a) + 1, x, result_shape=x)

    g = jax.jit(f)
    np.testing.assert_allclose(g(jnp.float32(1.0)), 2.0)
    np.testing.assert_allclose(g(jnp.float32(2.0)), 3.0)
    hcb.barrier_wait()
    jax.effects_barrier()
    assert seen.count("tap") == 2 and seen.count("io") == 2


def _queued_tap(tag, sync=False):
    """``(seen, dispatch)``: ``dispatch()`` dispatches, without waiting, a computation that
    taps ``tag`` into ``seen`` once its input from a busy computation is ready (so it is
    still queued on the device when ``dispatch`` returns). Both are compiled and warmed up,
    and ``seen`` is empty."""
    seen = []
    heavy = _heavy()
    tap = jax.jit(lambda a: hcb.id_tap(lambda v, t: seen.append(tag), a[0, 0], sync=sync))
    a = jnp.eye(256) * 0.1
    tap(heavy(a)).block_until_ready()
    hcb.barrier_wait()
    seen.clear()
    return seen, lambda: tap(heavy(a))


def test_barrier_waits_for_a_computation_queued_behind_another():
    seen, dispatch = _queued_tap(1)
    for _ in range(3):
        dispatch()
    hcb.barrier_wait()
    assert seen == [1, 1, 1]


def test_a_barrier_while_jax_traces_waits_and_stages_nothing():
    seen, dispatch = _queued_tap(2)
    for _ in range(3):
        dispatch()
    jaxpr = jax.make_jaxpr(lambda x: (hcb.barrier_wait(), x * 2)[1])(1.0)
    assert seen == [2, 2, 2]
    assert [e.primitive.name for e in jaxpr.eqns] == ["mul"], jaxpr


def test_an_eager_tap_comes_after_the_taps_of_queued_computations():
    one = jnp.ones(())  # a JAX array already: the eager tap converts nothing
    seen, dispatch = _queued_tap("computation")
    dispatch()
    hcb.id_tap(lambda v, t: seen.append("eager"), one)
    hcb.barrier_wait()
    assert seen == ["computation", "eager"]


def test_stop_processes_computations_queued_behind_others():
    seen, dispatch = _queued_tap(1)
    dispatch()
    hcb.stop_outfeed_receiver()
    assert seen == [1]


def test_jax_effects_barrier_still_waits_for_computations_that_tap():
    # Code that makes its taps synchronous and waits with jax.effects_barrier() (README,
    # Behaviour) relies on it waiting for the computation, as it does with the token chain.
    seen, dispatch = _queued_tap(1, sync=True)
    dispatch()
    jax.effects_barrier()
    assert seen == [1]


def test_the_marker_waits_on_the_runtimes_completion_token():
    # The barrier's marker runs through the runtime's executable and waits on its
    # completion token (about 0.6x the time of calling the Compiled and blocking on its
    # output); on every JAX release hostfeed supports, not the fallback. That it waits at
    # all is what the tests above check.
    seen, dispatch = _queued_tap(1)
    dispatch()
    hcb.barrier_wait()
    assert seen == [1]
    markers = [fast_dispatch._marker(d) for d in fast_dispatch.scoped_devices()]
    assert markers and all(m.__name__ == "through_runtime" for m in markers), markers


def test_turned_off_by_the_environment_keeps_the_token_chain():
    r = run_python("""
        import jax, jax.numpy as jnp
        from hostfeed import host_callback as hcb
        from hostfeed._src import fast_dispatch
        seen = []
        f = jax.jit(lambda x: hcb.id_tap(lambda a, t: seen.append(int(a)), x) + 1)
        text = f.lower(1).as_text()
        main = text[text.index("func.func public @main"):]
        main = main[:main.index("{")]
        print(fast_dispatch.enabled(), "token" in main)
        print([int(f(i)) for i in range(3)])
        hcb.barrier_wait()
        print(seen, fast_dispatch.scoped_devices())
    """, env={"HOSTFEED_FAST_DISPATCH": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["False True", "[1, 2, 3]", "[0, 1, 2] ()"]


def test_a_bad_setting_is_refused_at_import():
    r = run_python("import hostfeed", env={"HOSTFEED_FAST_DISPATCH": "sometimes"})
    assert r.returncode != 0
    assert "HOSTFEED_FAST_DISPATCH='sometimes' is not a boolean; use 1 or 0" in r.stderr


@pytest.mark.several_devices
def test_computations_on_several_devices_keep_the_token_chain():
    r = run_python("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        from hostfeed import host_callback as hcb
        from hostfeed._src import fast_dispatch
        seen = []
        def log(a, t, device):
            seen.append((device.id, a.tolist()))
        f = jax.jit(lambda x: hcb.id_tap(log, x, tap_with_device=True) * 2)
        mesh = jax.make_mesh((2,), ("d",))
        xs = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("d")))
        one = jax.device_put(jnp.arange(2.0), jax.devices()[1])
        def main_args(lowered):
            text = lowered.as_text()
            main = text[text.index("func.func public @main"):]
            return "token" in main[:main.index("{")]
        print(main_args(f.lower(xs)), main_args(f.lower(one)))
        f(xs); f(one)
        hcb.barrier_wait()
        print(sorted(d.id for d in fast_dispatch.scoped_devices()))
        print(sorted(seen))
    """, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == "True False"
    assert lines[1] == "[1]"
    # The global view taps the whole sharded operand once (on device 0).
    assert lines[2] == "[(0, [0.0, 1.0, 2.0, 3.0]), (1, [0.0, 1.0])]"


@pytest.mark.several_devices
def test_a_device_first_used_after_a_barrier_is_waited_for_by_the_next():
    # An idle barrier runs the markers it made last time; a device that a single-device
    # computation is compiled for afterwards gets its own marker at the next barrier.
    r = run_python("""
        import jax, jax.numpy as jnp
        from hostfeed import host_callback as hcb
        from hostfeed._src import fast_dispatch
        seen = []
        heavy = jax.jit(lambda a: [a := jnp.tanh(a @ a) for _ in range(30)][-1])
        f = jax.jit(lambda a: hcb.id_tap(lambda v, t: seen.append(float(v)), a[0, 0]))
        a0 = jax.device_put(jnp.eye(256) * 0.1, jax.devices()[0])
        a1 = jax.device_put(jnp.eye(256) * 0.2, jax.devices()[1])
        f(heavy(a0)); hcb.barrier_wait(); hcb.barrier_wait()  # markers made, then reused
        print(sorted(d.id for d in fast_dispatch.scoped_devices()), len(seen))
        for _ in range(3):
            f(heavy(a1))  # device 1: compiled now, queued behind its heavy computations
        hcb.barrier_wait()
        print(sorted(d.id for d in fast_dispatch.scoped_devices()), len(seen))
    """, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[0] 1", "[0, 1] 4"]
