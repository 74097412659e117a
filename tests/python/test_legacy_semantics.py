"""Legacy code that reads what its taps wrote, with hostfeed's default tap mode (the legacy
module's: synchronous on CPUs and GPUs): every tap function has run once the call that
dispatched it has its results (``block_until_ready()`` included) and, for an eager call,
once it returns. Each pattern is one that third-party projects used with
``jax.experimental.host_callback`` (an info dict filled by taps in a ``while_loop``, the
same dict returned through an eager ``jax.custom_vjp``, a list appended per iteration), run
200 times: all complete. ``HOSTFEED_SYNC_TAPS=0`` (asynchronous) is one switch away."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from conftest import ON_TPU
from hostfeed import host_callback as hcb

RUNS = 200

pytestmark = pytest.mark.skipif(ON_TPU, reason="on a TPU the default taps are asynchronous, "
                                               "as the legacy module's were there")


pytestmark = [pytestmark, pytest.mark.usefixtures("default_tap_mode")]


class Solver:
    """A solver in the style of cola's ``while_loop_winfo``: a ``while_loop`` whose body taps
    its error every other iteration (inside a ``cond``), an eager tap that starts the info
    dict and one that closes it (iterations), all of the info written by tap functions
    only. The functions are made once, so that repeated solves reuse one compiled loop."""

    def __init__(self) -> None:
        self.info: dict = {}
        # (Bound once: a bound method is a new object at each access, which JAX's tracing
        # cache would not recognise.)
        self.loop_cond, self.loop_body = self.cond, self.body

    def start(self, _, transforms) -> None:
        self.info.clear()
        self.info["errors"] = []

    def error(self, e, transforms) -> None:
        self.info["errors"].append(float(e))

    def close(self, i, transforms) -> None:
        self.info["iterations"] = int(i)

    def cond(self, s):
        return s[1] > 1e-3

    def body(self, s):
        i, v = s
        lax.cond(i % 2 == 0, lambda _: hcb.id_tap(self.error, v, result=i), lambda _: i, None)
        return i + 1, v * 0.5

    def solve(self, x):
        hcb.id_tap(self.start, None)
        i, v = lax.while_loop(self.loop_cond, self.loop_body, (0, x))
        hcb.id_tap(self.close, i)
        return v, self.info


def complete(info: dict) -> bool:
    # 1.0 halved until below 1e-3: 10 iterations, an error tapped at 0, 2, 4, 6, 8.
    return info.get("iterations") == 10 and info["errors"] == [0.5 ** k for k in range(0, 10, 2)]


def test_an_info_dict_filled_by_taps_in_a_while_loop_is_complete_right_after_the_call():
    s = Solver()
    done = 0
    for _ in range(RUNS):
        _, info = s.solve(jnp.float32(1.0))  # eager: no jit, no barrier_wait
        done += complete(info)
    assert done == RUNS


def test_an_eager_while_loop_has_run_its_taps_when_it_returns():
    seen: list[int] = []

    def tap(a, transforms):
        seen.append(int(a))

    def body(s):
        return hcb.id_tap(tap, s) + 1

    def cond(s):
        return s < 5

    done = 0
    for _ in range(RUNS):
        seen.clear()
        lax.while_loop(cond, body, 0)  # no closing tap: the loop itself waits
        done += seen == [0, 1, 2, 3, 4]
    assert done == RUNS


def test_the_info_dict_returned_through_an_eager_custom_vjp_is_complete():
    # cola's cg: the solver runs inside an eager jax.custom_vjp, which flattens its
    # outputs when the function returns: a copy of the dict taken then reaches the caller,
    # so the taps must have run by then (barrier_wait afterwards cannot mend the copy).
    s = Solver()

    @jax.custom_vjp
    def solve(x):
        return s.solve(x)

    solve.defvjp(lambda x: (s.solve(x), None), lambda res, g: (g[0],))
    done = 0
    for _ in range(RUNS):
        _, info = solve(jnp.float32(1.0))
        assert info is not s.info  # the copy
        done += complete(info)
    assert done == RUNS


def test_a_list_appended_per_iteration_is_complete_after_block_until_ready():
    seen: list[int] = []

    def tap(a, transforms):
        seen.append(int(a))

    f = jax.jit(lambda x: lax.fori_loop(0, 7, lambda i, c: hcb.id_tap(tap, c + i), x))
    done = 0
    for r in range(RUNS):
        seen.clear()
        f(jnp.int32(r)).block_until_ready()
        done += seen == [r + i * (i + 1) // 2 for i in range(7)]
    assert done == RUNS


def test_asynchronous_taps_are_one_switch_away_and_need_barrier_wait():
    release = []

    def tap(a, transforms):
        release.append(int(a))

    with hcb.sync_taps(False):
        assert not hcb.get_sync_taps()
        f = jax.jit(lambda x: hcb.id_tap(tap, x, result=x + 1))
        for i in range(5):
            f(jnp.int32(i)).block_until_ready()
        hcb.barrier_wait()
    assert release == list(range(5))
    assert hcb.get_sync_taps()  # back to the default
