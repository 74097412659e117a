"""``Recorder.step(fn)``: records leave the jitted step as outputs, copied to the host while
the next steps run (python/hostfeed/_src/record/step.py, hoist.py). Every case is checked
against the same function recorded the usual way (records as host callbacks inside the
computation): the same rows, bit for bit, with the same per-row metadata."""
from __future__ import annotations

import json

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hostfeed
from hostfeed import host_callback as hcb

from conftest import run_python

pytest.importorskip("zarr", reason="needs zarr-python")


def both_ways(tmp_path, make, calls, **step_kwargs):
    """Runs ``make(rec)`` (a step function recording with ``rec``) for ``calls`` (each a
    tuple of arguments, the state threaded through the first), once under ``rec.step`` and
    once under ``jax.jit``; returns both recordings' arrays, {name: (rows, steps)}."""
    out = []
    for way in ("step", "jit"):
        path = tmp_path / f"{way}.zarr"
        with hostfeed.Recorder(path) as rec:
            fn = make(rec)
            f = rec.step(fn, outputs=True, **step_kwargs) if way == "step" else jax.jit(fn)
            state = calls[0][0]
            for args in calls:
                state = f(state, *args[1:])
            jax.block_until_ready(state)
        r = hostfeed.open_recording(path)
        out.append({n: hostfeed.read_recording(path, n) for n in r.names})
    stepped, jitted = out
    assert sorted(stepped) == sorted(jitted)
    for name in jitted:
        rows_s, meta_s = stepped[name]
        rows_j, meta_j = jitted[name]
        np.testing.assert_array_equal(rows_s, rows_j, err_msg=name)
        assert rows_s.dtype == rows_j.dtype, name
        for field in ("step", "device", "transform_index"):
            np.testing.assert_array_equal(meta_s[field], meta_j[field], err_msg=f"{name}.{field}")
        assert meta_s["transforms"] == meta_j["transforms"], name
    return stepped


def lowered_callbacks(step, *args):
    """How many host callbacks remain in the step's computation (hostfeed's custom calls,
    JAX's callbacks, a TPU's host transfers)."""
    text = step.lower(*args).as_text()
    return (text.count("hostfeed_tap") + text.count("callback")
            + text.count("is_host_transfer = true"))


def test_top_level_records_are_outputs_with_the_same_rows(tmp_path):
    def make(rec):
        def f(w, x, i):
            h = jnp.tanh(x @ w)
            rec.record("layer/h", h, step=i)
            rec.record("layer/h_sum", h.sum())                 # no step: -1
            rec.record("ints", jnp.arange(3, dtype=jnp.int8) + i.astype(jnp.int8), step=i)
            return w * 0.9
        return f
    x = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    got = both_ways(tmp_path, make, [(jnp.eye(3), x, jnp.int32(i)) for i in range(5)])
    assert got["layer/h"][0].shape == (5, 2, 3)
    assert got["layer/h"][1]["step"].tolist() == list(range(5))
    assert got["layer/h_sum"][1]["step"].tolist() == [-1] * 5
    with hostfeed.Recorder(tmp_path / "lowered.zarr") as rec:
        step = rec.step(make(rec), outputs=True)
        assert lowered_callbacks(step, jnp.eye(3), x, jnp.int32(0)) == 0
        # By default the records leave as outputs on a TPU only (elsewhere hostfeed's own
        # handlers copy them inside the computation for less).
        default = rec.step(make(rec))
        inside = lowered_callbacks(default, jnp.eye(3), x, jnp.int32(0))
        assert (inside == 0) == (jax.default_backend() == "tpu"), inside


def test_records_in_scans_and_fori_loops_are_stacked_in_program_order(tmp_path):
    def make(rec):
        def f(c, i):
            def body(k, xs):
                rec.record("scan/a", k, step=i)
                rec.record("scan/b", xs * 10, step=i)
                return k + xs, k
            c, _ = lax.scan(body, c, jnp.arange(4.0))
            c, _ = lax.scan(lambda k, xs: (rec.record("rev", k + xs), k), c, jnp.arange(3.0),
                            reverse=True)
            c = lax.fori_loop(0, 3, lambda j, k: rec.record("fori", k + j, step=j), c)

            def outer(k, xs):
                inner = lax.scan(lambda q, y: (rec.record("nested", q * y), q), k,
                                 jnp.arange(2.0) + xs)[0]
                return inner, ()
            c, _ = lax.scan(outer, c, jnp.arange(2.0))
            return c
        return f
    got = both_ways(tmp_path, make, [(jnp.float32(1), jnp.int32(i)) for i in range(3)])
    assert got["scan/a"][0].shape == (12,)
    assert got["fori"][1]["step"].tolist() == [0, 1, 2] * 3


def test_conditional_records_move_nothing_when_skipped(tmp_path):
    def make(rec):
        def f(x, i):
            rec.record("every3", x, step=i, every=3)
            rec.record("window", x * 2, step=i, start=2, stop=5)
            y = lax.cond(i % 2 == 0, lambda v: rec.record("even", v + 1, step=i),
                         lambda v: rec.record("odd", v - 1, step=i), x)
            z = lax.switch(i % 3, [lambda v: v, lambda v: rec.record("s1", v),
                                   lambda v: lax.cond(v.sum() > 0,
                                                      lambda u: rec.record("s2", u),
                                                      lambda u: u, v)], y)

            def body(k, _):
                return lax.cond(k.sum() > 3, lambda u: rec.record("in_loop", u),
                                lambda u: u, k) + 1, None
            z, _ = lax.scan(body, z, None, length=3)
            return z
        return f
    got = both_ways(tmp_path, make, [(jnp.arange(3.0), jnp.int32(i)) for i in range(7)])
    assert got["every3"][1]["step"].tolist() == [0, 3, 6]
    assert got["window"][1]["step"].tolist() == [2, 3, 4]
    assert got["even"][1]["step"].tolist() == [0, 2, 4, 6]


def test_records_in_nested_jit_checkpoint_and_custom_derivatives(tmp_path):
    def make(rec):
        @jax.custom_jvp
        def soft(x):
            return rec.record("custom", jnp.tanh(x))

        soft.defjvp(lambda p, t: (soft(p[0]), t[0] * (1 - jnp.tanh(p[0]) ** 2)))

        @jax.jit
        def inner(x):
            return rec.record("nested_jit", x * 3)

        def f(x, i):
            x = inner(x)
            x = jax.checkpoint(lambda v: rec.record("remat", jnp.sin(v)))(x)
            return soft(x) + i
        return f
    both_ways(tmp_path, make, [(jnp.arange(3.0), jnp.float32(i)) for i in range(3)])


def test_cotangents_under_grad_and_lanes_under_vmap(tmp_path):
    def make(rec):
        def f(w, x):
            def loss(w):
                h = rec.record("h", jnp.tanh(x @ w))
                return jnp.mean(h ** 2)
            g = jax.grad(loss)(w)
            jax.vmap(lambda row: rec.record("rows", row * 2))(x)
            return w - 0.1 * g
        return f
    x = jnp.arange(6.0).reshape(2, 3) / 6
    got = both_ways(tmp_path, make, [(jnp.eye(3), x)] * 3)
    assert "h.cotangent" in got and got["rows"][0].shape == (6, 3)


def test_summaries_through_a_step(tmp_path):
    def make(rec):
        def f(x, i):
            rec.record("stats", x, step=i, reduce="stats")
            rec.record("hist", x, step=i, reduce=hostfeed.Histogram(4, range=(-1.0, 1.0)),
                       every=2)
            return x * -1.5
        return f
    got = both_ways(tmp_path, make, [(jnp.linspace(-1, 1, 50), jnp.int32(i)) for i in range(4)])
    assert got["stats"][0].shape == (4, len(hostfeed.STATS)) and got["hist"][0].shape == (2, 6)


def test_a_record_in_a_while_loop_stays_in_the_computation(tmp_path):
    def make(rec):
        def f(x, i):
            rec.record("top", x, step=i)
            return lax.while_loop(lambda v: v.sum() < 10, lambda v: rec.record("w", v + 1), x)
        return f
    got = both_ways(tmp_path, make, [(jnp.zeros(2), jnp.int32(i)) for i in range(2)])
    assert got["w"][0].shape == (5, 2)
    with hostfeed.Recorder(tmp_path / "lowered.zarr") as rec:
        step = rec.step(make(rec), outputs=True)
        assert lowered_callbacks(step, jnp.zeros(2), jnp.int32(0)) >= 1  # the while's


def test_the_step_compiles_once_and_takes_jit_options(tmp_path):
    traces = []
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        def f(x, n, *, scale):
            traces.append(1)
            return rec.record("x", x * scale + n)
        step = rec.step(f, static_argnums=1, static_argnames="scale", donate_argnums=0,
                        outputs=True)
        for i in range(5):
            out = step(jnp.full(3, float(i)), 2, scale=3.0)
        assert out.tolist() == [14.0] * 3
        assert len(traces) == 1
        step(jnp.ones(3), 5, scale=3.0)  # another static value: traced again
        assert len(traces) == 2
    rows, _ = hostfeed.read_recording(tmp_path / "run.zarr", "x")
    assert rows[:, 0].tolist() == [2.0, 5.0, 8.0, 11.0, 14.0, 8.0]


def test_rows_are_there_at_flush_barrier_and_close(tmp_path):
    path = tmp_path / "run.zarr"
    rec = hostfeed.Recorder(path)
    step = rec.step(lambda x: rec.record("x", x + 1), in_flight=1, outputs=True)
    for i in range(10):
        step(jnp.full((64, 64), float(i)))
    hcb.barrier_wait()  # waits for the steps' rows too
    assert hostfeed.read_recording(path, "x")[0].shape == (10, 64, 64)
    step(jnp.zeros((64, 64)))
    rec.flush()
    assert hostfeed.read_recording(path, "x")[0].shape == (11, 64, 64)
    step(jnp.zeros((64, 64)))
    rec.close()
    rows, _ = hostfeed.read_recording(path, "x")
    assert rows[:, 0, 0].tolist() == [float(i + 1) for i in range(10)] + [1.0, 1.0]


def test_a_name_recorded_with_another_shape_is_refused_at_the_call(tmp_path):
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        rec.record("x", jnp.zeros(3))  # "x" holds rows of 3
        step = rec.step(lambda v: rec.record("x", v), outputs=True)
        # The message names the ways out: pad, summarise, a name per shape.
        with pytest.raises(ValueError, match='"x" was first recorded as float32 .3., now as '
                                             'float32 .4.; .*pad the value to one shape.*'
                                             'reduce="stats".*a name per shape'):
            step(jnp.zeros(4))
        step(jnp.ones(3))
    assert hostfeed.read_recording(tmp_path / "run.zarr", "x")[0].tolist() == [[0.0] * 3,
                                                                              [1.0] * 3]


def test_a_failure_on_the_host_side_is_raised_by_the_next_flush(tmp_path, monkeypatch):
    from hostfeed._src.record import target as recording

    def failing(self, operands, transforms, device):
        raise OSError("the disk caught fire")

    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        step = rec.step(lambda v: rec.record("x", v), outputs=True)
        monkeypatch.setattr(recording.Target, "append_rows", failing)
        step(jnp.zeros(4))
        with pytest.raises(OSError, match="caught fire"):
            rec.flush()
        monkeypatch.undo()
        step(jnp.ones(4))
    assert hostfeed.read_recording(tmp_path / "run.zarr", "x")[0].tolist() == [[1.0] * 4]


def test_called_inside_another_trace_the_records_stay_inside(tmp_path):
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        step = rec.step(lambda v: rec.record("x", v * 2), outputs=True)
        out = jax.jit(lambda v: step(v) + 1)(jnp.ones(2))
        assert out.tolist() == [3.0, 3.0]
    rows, _ = hostfeed.read_recording(tmp_path / "run.zarr", "x")
    assert rows.tolist() == [[2.0, 2.0]]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_in_flight_must_be_a_positive_number_of_steps(tmp_path, bad):
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec, \
            pytest.raises(ValueError, match="in_flight must be a positive number"):
        rec.step(lambda x: x, in_flight=bad)


def test_outputs_must_be_a_bool_or_none(tmp_path):
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec, \
            pytest.raises(TypeError, match="outputs must be True, False or None"):
        rec.step(lambda x: x, outputs="yes")


def test_a_step_returning_a_non_array_names_the_users_function(tmp_path):
    def my_train_step(x):
        rec.record("x", x)
        return "done"

    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        step = rec.step(my_train_step, outputs=True)
        with pytest.raises(TypeError, match=r"function my_train_step at .*test_recorded_step"
                                            r"\.py:\d+ traced for jit returned a value of type "
                                            r"<class 'str'>"):
            step(jnp.zeros(2))


def test_a_step_needs_a_callable(tmp_path):
    with hostfeed.Recorder(tmp_path / "run.zarr") as rec, \
            pytest.raises(TypeError, match="needs a callable"):
        rec.step("train")


def test_in_flight_bounds_the_steps_waiting_on_the_device(tmp_path):
    # The pipeline thread is held in the first row's append: with in_flight=2, the third
    # call waits until the first step is appended.
    import threading
    from hostfeed._src.record import target as recording
    held, go = threading.Event(), threading.Event()
    original = recording.Target.append_rows

    def slow(self, operands, transforms, device):
        held.set()
        assert go.wait(60)
        original(self, operands, transforms, device)

    with hostfeed.Recorder(tmp_path / "run.zarr") as rec:
        step = rec.step(lambda x: rec.record("x", x), in_flight=2, outputs=True)
        recording.Target.append_rows = slow
        try:
            step(jnp.zeros(2))
            assert held.wait(60)
            step(jnp.ones(2))  # queued: one being appended, one waiting
            third = threading.Thread(target=lambda: step(jnp.full(2, 2.0)))
            third.start()
            third.join(0.5)
            assert third.is_alive(), "the third call waits for room"
            go.set()
            third.join(60)
            assert not third.is_alive()
        finally:
            recording.Target.append_rows = original
            go.set()
    rows, _ = hostfeed.read_recording(tmp_path / "run.zarr", "x")
    assert rows[:, 0].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.several_devices
def test_a_value_sharded_over_devices_is_recorded_whole(tmp_path):
    out = run_python(f"""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import json, numpy as np, jax, jax.numpy as jnp, hostfeed
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        mesh = Mesh(np.array(jax.devices()), ("x",))
        v = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("x")))
        res = {{}}
        for way in ("step", "jit"):
            path = {str(tmp_path)!r} + "/" + way + ".zarr"
            with hostfeed.Recorder(path) as rec:
                f = lambda v, i: rec.record("v", jnp.sin(v) * i, step=i.astype(jnp.int32)) + 1
                f = rec.step(f, outputs=True) if way == "step" else jax.jit(f)
                for i in range(3):
                    v = f(v, jnp.float32(i))
            rows, meta = hostfeed.read_recording(path, "v")
            res[way] = [rows.tolist(), meta["step"].tolist(), meta["device"].tolist()]
        print(json.dumps(res))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["step"] == res["jit"]
    assert len(res["step"][0]) == 3 and len(res["step"][0][0]) == 8



def test_a_host_step_decides_the_selection_without_fetching_a_flag(tmp_path, monkeypatch):
    # every= with the step passed as a Python int: the host knows which calls record, so a
    # skipped call copies nothing from the device (not even the flag), a selected one only
    # its operands.
    from hostfeed._src.record import step as step_module
    copied = []
    real = step_module._copy
    monkeypatch.setattr(step_module, "_copy", lambda a: (copied.append(a.shape), real(a)))

    def make(rec):
        def f(x, i):
            rec.record("sel", x * 2, step=i, every=3, start=1)
            return x + 1
        return f
    calls = [(jnp.zeros(5), i) for i in range(8)]  # Python ints
    got = both_ways(tmp_path, make, calls)
    assert got["sel"][1]["step"].tolist() == [1, 4, 7]
    # the three selected calls' operands (the value and its step), no flag
    assert copied == [(5,), ()] * 3, copied
