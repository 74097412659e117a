"""The TPU transport (``tpu``: a TPU's taps and calls over its host transfers) on CPU: its
sends and receives emulated with JAX's CPU host callbacks, one mailbox per channel, so that
the plan, the packing on the device, the host side and the fence run here as a TPU runs them
(the transfers themselves run on the TPU machine: .ci/accelerators/tpu_check.sh)."""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostfeed
from hostfeed import host_callback as hcb
from hostfeed._src import compat, transports
from hostfeed._src.transports import tpu

from conftest import ON_TPU

pytestmark = [
    pytest.mark.skipif(ON_TPU, reason="emulates a TPU's transfers on CPU"),
    pytest.mark.native_transport("forces the TPU transport, emulated on CPU, itself"),
]


class Transfers:
    """Emulated host transfers: what each channel carries, and the host callbacks."""

    def __init__(self) -> None:
        self.mail: dict[int, np.ndarray] = {}
        self.hosts: list[tuple[Any, list[int], list[int]]] = []
        self.log: list[tuple[str, int, tuple]] = []  # (send|recv, channel, shape)

    def _arrived(self, channel: int, value: np.ndarray) -> None:
        self.mail[channel] = np.array(value, copy=True)
        for fn, sends, recvs in self.hosts:
            if channel in sends and all(c in self.mail for c in sends):
                results = fn(*[self.mail.pop(c) for c in sends])
                for c, r in zip(recvs, results):
                    self.mail[c] = np.asarray(r)

    def send(self, ctx: Any, token: Any, value: Any, sharding: Any) -> tuple[int, Any]:
        channel = ctx.module_context.new_channel()
        aval = _aval_of(value)
        self.log.append(("send", channel, aval.shape))
        sub = dataclasses.replace(ctx, avals_in=[aval], avals_out=[])
        _, token, _ = compat.emit_python_callback(
            sub, lambda v: (self._arrived(channel, v), ())[1], token, [value], [aval], [],
            has_side_effect=True, returns_token=True)
        return channel, token

    def receive(self, ctx: Any, token: Any, aval: Any, sharding: Any) -> tuple[int, Any, Any]:
        channel = ctx.module_context.new_channel()
        self.log.append(("recv", channel, aval.shape))
        sub = dataclasses.replace(ctx, avals_in=[], avals_out=[aval])
        (value,), token, _ = compat.emit_python_callback(
            sub, lambda: (self.mail.pop(channel),), token, [], [], [aval],
            has_side_effect=True, returns_token=True)
        return channel, token, value

    def callback(self, ctx: Any, fn: Any, operand_avals: Any, result_avals: Any,
                 sends: Any, recvs: Any) -> None:
        self.hosts.append((fn, list(sends), list(recvs)))


_DTYPES = {"ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "i1": np.bool_,
           "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "f16": np.float16,
           "bf16": jnp.bfloat16, "f32": np.float32, "f64": np.float64,
           "complex<f32>": np.complex64, "complex<f64>": np.complex128}


def _aval_of(value: Any) -> Any:
    """The aval of an MLIR value of a ranked tensor type."""
    t = value.type
    return jax.core.ShapedArray(tuple(t.shape), np.dtype(_DTYPES[str(t.element_type)]))


@pytest.fixture
def emulated(monkeypatch):
    """Computations lowered in the test take the TPU transport on CPU."""
    t = Transfers()
    monkeypatch.setattr(compat, "send_to_host", t.send)
    monkeypatch.setattr(compat, "receive_from_host", t.receive)
    monkeypatch.setattr(compat, "add_host_transfer_callback", t.callback)
    monkeypatch.setattr(tpu, "PLATFORMS", frozenset({"cpu"}))
    with transports.forcing("jax"):
        yield t


def test_a_tap_is_one_send_of_its_packed_operands_and_a_computation_ends_with_a_fence(
        emulated):
    got = []
    f = jax.jit(lambda x, i: hcb.id_tap(lambda a, t: got.append(a), (x, i, x > 1)))
    f(jnp.arange(3, dtype=jnp.float32), jnp.int8(-4))
    hcb.barrier_wait()
    (a,) = got
    assert a[0].tolist() == [0.0, 1.0, 2.0] and int(a[1]) == -4
    assert a[2].tolist() == [False, False, True]
    # One send for the tap (three operands in one buffer), then the fence: a send and a
    # receive.
    assert [(k, s) for k, _, s in emulated.log] == [("send", (35,)), ("send", (1,)),
                                                     ("recv", ())]


def test_large_and_unpackable_operands_travel_apart_and_zero_size_ones_not_at_all(emulated):
    got = []
    big = jnp.arange(tpu.PACK_LIMIT_BYTES // 4 + 1, dtype=jnp.float32)
    f = jax.jit(lambda b, c, e, s: hcb.id_tap(lambda a, t: got.append(a), (b, c, e, s)))
    f(big, jnp.complex64(1 + 2j), jnp.zeros((0, 3)), jnp.int32(7))
    hcb.barrier_wait()
    (a,) = got
    assert np.array_equal(a[0], np.asarray(big)) and complex(a[1]) == 1 + 2j
    assert a[2].shape == (0, 3) and int(a[3]) == 7
    sends = [s for k, _, s in emulated.log if k == "send"]
    assert sends == [(4,), big.shape, (), (1,)]  # the step packed; the big one and the
    # complex one apart; then the fence


def test_taps_keep_their_order_in_loops_and_across_computations(emulated):
    got = []

    def body(i, c):
        c = hcb.id_tap(lambda a, t: got.append(("a", int(a))), i, result=c)
        return hcb.id_tap(lambda a, t: got.append(("b", int(a[0]))),
                          jnp.full((3,), i, jnp.float32), result=c)

    f = jax.jit(lambda c: lax.fori_loop(0, 20, body, c))
    for _ in range(3):
        f(jnp.int32(0))
    hcb.barrier_wait()
    assert got == [(s, i) for i in range(20) for s in "ab"] * 3


def test_a_call_packs_its_results_into_one_receive(emulated):
    spec = (jax.ShapeDtypeStruct((2,), jnp.float32), jax.ShapeDtypeStruct((), jnp.bool_),
            jax.ShapeDtypeStruct((0,), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.complex64))
    f = jax.jit(lambda x: hcb.call(
        lambda a: (a * 2, np.True_, np.zeros(0, np.int32), np.complex64([1.5, 2j])), x,
        result_shape=spec))
    out = f(jnp.float32([1, 2]))
    assert np.asarray(out[0]).tolist() == [2.0, 4.0] and bool(out[1])
    assert out[2].shape == (0,) and np.asarray(out[3]).tolist() == [1.5, 2j]
    # float32[2] and the bool in one buffer, the complex64 apart, the empty one not at all
    recvs = [s for k, _, s in emulated.log if k == "recv"]
    assert recvs[:2] == [(17,), (2,)]
    hcb.barrier_wait()


def test_a_failed_call_fails_the_computation_with_the_host_functions_message(emulated):
    def bad(a):
        raise ValueError("emulated boom")

    f = jax.jit(lambda x: hcb.call(bad, x, result_shape=x))
    with pytest.raises(jax.errors.JaxRuntimeError, match="emulated boom"):
        np.asarray(f(jnp.float32(1)))
    with pytest.raises(hcb.CallbackException):
        hcb.barrier_wait()


def test_sync_taps_compiled_inside_a_host_function_are_refused_not_deadlocked(emulated):
    # The computation would wait for the receiver, which runs the host function waiting
    # for the computation: refused where it is compiled.
    inner = jax.jit(lambda x: hcb.id_tap(lambda v, tr: None, x, sync=True))

    def outer(x, transforms):
        inner(x).block_until_ready()

    jax.jit(lambda x: hcb.id_tap(outer, x))(jnp.float32(1))
    with pytest.raises(hcb.CallbackException, match="a computation with synchronous taps "
                                                    "was called from inside a host callback"):
        hcb.barrier_wait()


def test_records_name_the_devices_id(emulated, tmp_path):
    with hostfeed.Recorder(str(tmp_path / "r.zarr")) as rec:
        f = jax.jit(lambda x, s: rec.record("h", x, step=s))
        for s in range(3):
            f(jnp.float32([s, s]), s)
    rows, meta = hostfeed.read_recording(str(tmp_path / "r.zarr"), "h")
    assert rows.tolist() == [[0, 0], [1, 1], [2, 2]] and meta["step"].tolist() == [0, 1, 2]
    assert meta["device"].tolist() == [jax.devices()[0].id] * 3


def test_a_platform_that_cannot_compile_the_transfers_says_so_naming_the_operations(
        monkeypatch):
    # CPU has no host transfers: lowered for them anyway, the tap fails to compile, as
    # hostfeed's lowering would on a platform or JAX release that stopped accepting it.
    monkeypatch.setattr(tpu, "PLATFORMS", frozenset({"cpu"}))
    with transports.forcing("jax"):
        f = jax.jit(lambda x: hcb.id_tap(lambda a, t: None, x) + 1)
        with pytest.raises(jax.errors.JaxRuntimeError) as raised:
            f(jnp.float32(1))
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "failed to compile for cpu holds hostfeed's taps" in notes, notes
    assert "jax " + jax.__version__ in notes
