"""The portable transport (JAX's host-callback lowering, for platforms without hostfeed
handlers), forced on CPU in this process: taps stay asynchronous (the function JAX runs on
its execution thread only enqueues), selection per platform, ``HOSTFEED_TRANSPORT``.

The whole suite also runs with ``HOSTFEED_TRANSPORT=jax`` (``nox -s portable``).

Issue: "Every JAX platform: a portable transport for TPUs and any backend without hostfeed
handlers".
"""
from __future__ import annotations

import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostfeed
from hostfeed import host_callback as hcb
from hostfeed._src import transports
from hostfeed._src.transports import common

from conftest import ON_TPU, run_python


@pytest.fixture(params=["jax", "native"])
def transport(request):
    """Forces a transport for computations lowered during the test."""
    if ON_TPU and request.param == "native":
        pytest.skip("a TPU has no native transport")
    with transports.forcing(request.param):
        yield request.param


@pytest.fixture
def forced_jax():
    with transports.forcing("jax"):
        yield


def test_the_portable_lowering_uses_jax_host_callbacks_and_no_hostfeed_custom_call(
        forced_jax):
    def f(x):
        x = hcb.id_tap(lambda a, t: None, x * 2)
        return hcb.call(lambda a: a + 1, x, result_shape=x)

    text = jax.jit(f).lower(jnp.ones(3)).as_text()
    # A TPU's host callbacks are transfers to and from the host: one send for the tap, a
    # send and a receive for the call, and the fence that ends a computation with host
    # transfers (a send and a receive: its taps have run before it returns).
    if ON_TPU:
        assert text.count("stablehlo.send") == 3 and text.count("stablehlo.recv") == 2, text
    else:
        assert "xla_ffi_python_cpu_callback" in text
    assert "hostfeed_" not in text
    assert jax.jit(f)(jnp.ones(3)).tolist() == [3.0, 3.0, 3.0]


def test_summaries_lower_through_jax_where_jax_lowering_is_forced(transport, tmp_path):
    # HOSTFEED_TRANSPORT=jax means no hostfeed custom call at all: a summary's kernels
    # too lower to JAX's operations then, with the same rows as the native kernels'.
    x = jnp.asarray(np.linspace(-3.0, 5.0, 24, dtype=np.float32).reshape(4, 6))
    with hostfeed.Recorder(str(tmp_path / "r.zarr"), mode="w") as rec:
        def f(v):
            rec.record("stats", v, reduce="stats", axis=1)
            rec.record("hist", v, reduce=hostfeed.Histogram(4, (-4.0, 4.0)))
            return v + 1

        text = jax.jit(f).lower(x).as_text()
        assert ("hostfeed_stats" in text) == (transport == "native"), text
        assert ("hostfeed_histogram" in text) == (transport == "native"), text
        jax.jit(f)(x)
    stats, _ = hostfeed.read_recording(str(tmp_path / "r.zarr"), "stats")
    hist, _ = hostfeed.read_recording(str(tmp_path / "r.zarr"), "hist")
    v = np.asarray(x)
    np.testing.assert_array_equal(stats[0, :, 0], [6, 6, 6, 6])  # count, mean, std, min, max
    np.testing.assert_allclose(stats[0, :, 1], v.mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(stats[0, :, 3], v.min(axis=1))
    np.testing.assert_allclose(stats[0, :, 4], v.max(axis=1))
    assert int(hist.sum()) == v.size


def test_the_tpu_transport_is_chosen_only_where_every_platform_is_a_tpu():
    class Ctx:
        def __init__(self, *platforms):
            self.platforms = platforms

    with transports.forcing(None):
        assert transports.for_context(Ctx("tpu")).name == "tpu"
        assert transports.for_context(Ctx("tpu", "cpu")).name == "jax"
        assert transports.for_context(Ctx("cpu")).name == "native"
        assert transports.for_platform("tpu").records_as_outputs
        assert transports.for_platform("tpu").summarize_every_step
        assert not transports.for_platform("cpu").records_as_outputs
    with transports.forcing("jax"):
        assert transports.for_context(Ctx("cpu")).name == "jax"
        assert not transports.for_context(Ctx("cpu")).native_kernels
    with transports.forcing("native"), pytest.raises(NotImplementedError,
                                                     match="HOSTFEED_TRANSPORT=native"):
        transports.for_context(Ctx("tpu")).prepare(Ctx("tpu"), None)


def test_each_transport_is_an_instance_of_the_transport_type_named_by_the_setting():
    import dataclasses

    from hostfeed._src import settings
    from hostfeed._src.transports import native, portable, tpu

    instances = (native.TRANSPORT, portable.TRANSPORT, tpu.TRANSPORT)
    assert all(isinstance(t, transports.Transport) for t in instances)
    assert [t.name for t in instances] == ["native", "jax", "tpu"]
    # The setting names every transport, and only those.
    assert set(settings.TRANSPORTS) == set(transports.BY_NAME) == {"native", "jax", "tpu"}
    assert [transports.BY_NAME[t.name] for t in instances] == list(instances)
    # Policies are typed fields, read as attributes and fixed.
    assert [t.summarize_every_step for t in instances] == [False, False, True]
    assert [t.records_as_outputs for t in instances] == [False, False, True]
    assert [t.native_kernels for t in instances] == [True, False, False]
    with pytest.raises(dataclasses.FrozenInstanceError):
        tpu.TRANSPORT.records_as_outputs = False
    with transports.forcing(None):
        assert transports.platforms_where(lambda t: t.summarize_every_step) == ("tpu",)
        assert transports.platforms_where(lambda t: t.native_kernels) == ("cpu", "cuda", "rocm")


def test_the_tpu_transport_can_be_forced_by_name_and_refuses_other_platforms_clearly():
    class Ctx:
        def __init__(self, *platforms):
            self.platforms = platforms

    from hostfeed._src import settings

    assert settings.check_transport(" TPU", "HOSTFEED_TRANSPORT") == "tpu"
    with transports.forcing("tpu"):
        assert transports.forced() == "tpu"
        assert transports.for_context(Ctx("tpu")).name == "tpu"
        assert transports.for_context(Ctx("tpu", "cpu")).name == "tpu"
        assert transports.for_platform("cpu") is transports.BY_NAME["tpu"]
        with pytest.raises(NotImplementedError, match=r"TPUs only.*targets cpu.*"
                                                      r"HOSTFEED_TRANSPORT=tpu"):
            jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x)).trace(1.0).lower(
                lowering_platforms=("cpu",))
    r = run_python("""
        import hostfeed
        from hostfeed._src import transports
        print(transports.forced(), transports.for_platform("tpu").name)
    """, env={"HOSTFEED_TRANSPORT": "tpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[-2] == "tpu tpu"


def test_slow_tap_functions_do_not_hold_up_the_computation(transport):
    # 100 taps whose function is slow: the first waits for `gate`, every one then takes
    # 10 ms. The computation's results are ready while the tap functions have not even
    # started (the function JAX runs on its execution thread only enqueues).
    gate = threading.Event()
    seen = []

    def slow(i, transforms):
        if not seen:
            assert gate.wait(120)
        time.sleep(0.01)
        seen.append(int(i))

    def step(c, i):
        hcb.id_tap(slow, i)
        return c + i, None

    f = jax.jit(lambda x: lax.scan(step, x, jnp.arange(100))[0])
    total = f(jnp.int32(0))
    total.block_until_ready()
    assert int(total) == 4950
    assert seen == [] and not gate.is_set()
    gate.set()
    hcb.barrier_wait()
    assert seen == list(range(100))


def test_a_failing_call_fails_its_computation_with_the_host_message(forced_jax):
    def host(x):
        raise ValueError("no such thing as portable luck")

    f = jax.jit(lambda x: hcb.call(host, x, result_shape=x))
    with pytest.raises(Exception, match="no such thing as portable luck"):
        f(jnp.ones(2)).block_until_ready()
    with pytest.raises(hcb.CallbackException, match="no such thing as portable luck"):
        hcb.barrier_wait()


def test_tap_with_device_names_the_executing_device(forced_jax):
    got = []
    dev = jax.devices()[0]
    x = jax.device_put(jnp.arange(2.0), dev)
    jax.jit(lambda v: hcb.id_tap(lambda a, t, device: got.append(device), v,
                                 tap_with_device=True))(x)
    hcb.barrier_wait()
    assert got == [dev]


def test_transports_name_each_platforms_row_under_every_forced_transport():
    # hostfeed.transports() is the platform -> transport table itself, by name, not a
    # second table beside it: under every value HOSTFEED_TRANSPORT can take.
    for forced in (None, "native", "jax", "tpu"):
        with transports.forcing(forced):
            t = hostfeed.transports()
            assert set(t) >= {"cpu", "cuda", "rocm", "tpu"}
            assert t == {p: transports.row(p).name for p in t}, (forced, t)
    with transports.forcing(None):
        t = hostfeed.transports()
        # ROCm lowers natively, as CUDA does (its handlers register, or no ROCm backend is
        # here to need them); a TPU over its own host transfers.
        assert [t[p] for p in ("cpu", "cuda", "rocm", "tpu")] == ["native"] * 3 + ["tpu"]
    with transports.forcing("jax"):  # the portable transport, but a TPU keeps its own
        t = hostfeed.transports()
        assert [t[p] for p in ("cpu", "cuda", "rocm", "tpu")] == ["jax"] * 3 + ["tpu"]


def test_one_lowering_chooses_its_transport_once_and_every_rule_reads_it(monkeypatch, tmp_path):
    # The taps', the call's and the summary kernel's rules and the token scope's end ask
    # for the transport; it is chosen once per lowering (per set of platforms lowered
    # for), kept there, and chosen again for the next lowering.
    chosen, asked = [], []
    choose, for_context = transports.choose, transports.for_context

    def counted_choose(lowered_for):
        chosen.append(tuple(lowered_for))
        return choose(lowered_for)

    def noted_for_context(ctx):
        asked.append(for_context(ctx))
        return asked[-1]

    monkeypatch.setattr(transports, "choose", counted_choose)
    monkeypatch.setattr(transports, "for_context", noted_for_context)
    rec = hostfeed.Recorder(tmp_path / "run.zarr")

    def f(x):
        x = hcb.id_tap(lambda a, t: None, x)
        y = hcb.call(lambda a: a, x, result_shape=x)
        rec.record("s", y, reduce="stats")
        return hcb.id_tap(lambda a, t: None, y + 1)

    try:
        with transports.forcing(None):
            jax.jit(f).trace(jnp.arange(4.0)).lower()
            assert chosen == [("cpu",)] and len(asked) >= 5, (chosen, asked)
            assert {t.name for t in asked} == {"native"}
            jax.jit(f).trace(jnp.arange(3.0)).lower()  # another lowering chooses anew
            assert chosen == [("cpu",)] * 2
            # Lowered for two platforms at once: each branch chooses for its own platform
            # (the scope around both for the pair), once.
            chosen.clear()
            jax.jit(lambda v: hcb.id_tap(lambda a, t: None, v) + 1).trace(1.0).lower(
                lowering_platforms=("cpu", "cuda"))
            assert sorted(chosen) == [("cpu",), ("cpu", "cuda"), ("cuda",)], chosen
    finally:
        rec.close()


def test_hostfeed_transport_is_read_at_import_and_checked():
    r = run_python("""
        import hostfeed
        from hostfeed._src import transports
        t = hostfeed.transports()
        assert t == {p: transports.row(p).name for p in t}, t
        print(sorted(set(t.values())))
    """, env={"HOSTFEED_TRANSPORT": "jax"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[-2] == "['jax', 'tpu']"
    r = run_python("import hostfeed", env={"HOSTFEED_TRANSPORT": "outfeed"})
    assert r.returncode != 0
    assert "HOSTFEED_TRANSPORT='outfeed' is not a hostfeed transport" in r.stderr


def test_failure_text_is_padded_like_the_native_handler():
    assert bytes(common.padded("h\u00e9llo", 8)) == "h\u00e9llo".encode() + b"\0\0"
    cut = bytes(common.padded("\u00e9" * 10, 9))  # cut before a character's 2nd byte
    assert cut == "\u00e9".encode() + b" [...]\0"
    assert np.asarray(common.padded("", 4)).tolist() == [0, 0, 0, 0]


@pytest.mark.several_devices
def test_failed_single_device_calls_leave_later_sharded_calls_alone():
    # Issue 65.4. The portable transport knows no execution ids, so a failed call used to
    # mark "the" execution failed for every later global-view call until a barrier swept
    # it, and no barrier swept it while no global-view callback existed yet: after single-
    # device calls that raised (each followed by a barrier_wait, which raised the
    # CallbackException), a good sharded call failed with "another device's part of
    # execution 0 never came", and so did its barrier_wait (a JaxRuntimeError). A call
    # lowered into a computation on one device ends no execution that a global-view
    # callback takes part in: as on the native transport, with or without a barrier between.
    r = run_python("""
        import json
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import hostfeed
        from hostfeed import host_callback as hcb

        def host(x):
            if x[0] < 0:
                raise ValueError("a negative first value")
            return x * 2

        f = jax.jit(lambda x: hcb.call(host, x, result_shape=x))
        devices = jax.devices()
        xs = jax.device_put(jnp.arange(8.0), NamedSharding(Mesh(np.array(devices), ("x",)),
                                                           P("x")))
        out = {"transports": sorted(set(hostfeed.transports().values()))}

        def outcome(thunk):
            try:
                value = thunk()
                return np.asarray(value).tolist() if value is not None else "clean"
            except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
                return type(e).__name__

        def single(i, barrier):
            x = jax.device_put(jnp.array([-1.0 if i % 2 else 1.0, 2.0]),
                               devices[i % len(devices)])
            got = [outcome(lambda: f(x))]
            return got + [outcome(hcb.barrier_wait)] if barrier else got

        out["singles"] = [single(i, True) for i in range(7)]
        out["sharded"] = [outcome(lambda: f(xs)), outcome(hcb.barrier_wait)]
        # A failed single-device call, then a sharded call before any barrier.
        out["no_barrier"] = [single(1, False), outcome(lambda: f(xs)),
                             outcome(hcb.barrier_wait)]
        print(json.dumps(out))
    """, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4",
              "HOSTFEED_TRANSPORT": "jax"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["transports"] == ["jax", "tpu"]  # a TPU keeps its own host transfers
    good, bad = [[2.0, 4.0], "clean"], ["JaxRuntimeError", "CallbackException"]
    assert out["singles"] == [good, bad, good, bad, good, bad, good], out
    doubled = [2.0 * i for i in range(8)]
    assert out["sharded"] == [doubled, "clean"], out
    assert out["no_barrier"] == [["JaxRuntimeError"], doubled, "CallbackException"], out
