"""The host-side assembly of global-view taps sent shard by shard (unit level)."""
from __future__ import annotations

import numpy as np

import jax

from hostfeed import receiver
from hostfeed.primitives import CallbackSpec, make_call_assembler, make_shard_assembler


def feed(assemble, run, group, part, *shards, ordinal=None):
    receiver._run_id[0] = run
    try:
        assemble([np.array([group, part], np.int32), *shards],
                 part if ordinal is None else ordinal)
    finally:
        receiver._run_id[0] = 0


def test_parts_are_joined_in_part_order_once_all_arrived():
    got = []
    asm = make_shard_assembler(lambda arrays, ordinal: got.append((arrays, ordinal)), 3, 1)
    # Parts arrive in any order across devices, in order within each device.
    feed(asm, 7, 0, 2, np.array([4, 5]), np.array([[2]]))
    feed(asm, 7, 0, 0, np.array([0, 1]), np.array([[0]]))
    assert got == []
    feed(asm, 7, 0, 1, np.array([2, 3]), np.array([[1]]))
    (arrays, ordinal), = got
    assert [a.tolist() for a in arrays] == [[0, 1, 2, 3, 4, 5], [[0], [1], [2]]]
    assert ordinal == 1  # the source part's device


def test_successive_taps_of_one_run_are_matched_by_position():
    got = []
    asm = make_shard_assembler(lambda arrays, ordinal: got.append(arrays[0].tolist()), 2, 0)
    feed(asm, 1, 0, 0, np.array([0]))
    feed(asm, 1, 0, 0, np.array([10]))  # device 0 is a tap ahead of device 1
    feed(asm, 1, 0, 1, np.array([1]))
    feed(asm, 1, 0, 1, np.array([11]))
    assert got == [[0, 1], [10, 11]]


def test_parts_of_a_failed_run_are_dropped_not_mixed_into_later_data():
    got = []
    asm = make_shard_assembler(lambda arrays, ordinal: got.append(arrays[0].tolist()), 2, 0)
    feed(asm, 1, 0, 0, np.array([-1]))  # run 1 failed before device 1 tapped
    feed(asm, 2, 0, 0, np.array([0]))
    feed(asm, 2, 0, 1, np.array([1]))
    feed(asm, 3, 0, 1, np.array([21]))
    feed(asm, 3, 0, 0, np.array([20]))
    assert got == [[0, 1], [20, 21]]


def test_groups_are_assembled_separately():
    got = []
    asm = make_shard_assembler(lambda arrays, ordinal: got.append(arrays[0].tolist()), 2, 0)
    feed(asm, 5, 1, 0, np.array([10]))
    feed(asm, 5, 0, 0, np.array([0]))
    feed(asm, 5, 0, 1, np.array([1]))
    feed(asm, 5, 1, 1, np.array([11]))
    assert got == [[0, 1], [10, 11]]


class FakeReply:
    def __init__(self):
        self.sent = None
        self.failed = None
        self.pending = True

    def send(self, arrays):
        self.sent = [a.tolist() for a in arrays]

    def fail(self, message):
        self.failed = message


def call_assembler(host, n_elems):
    """A 2-part call assembler for `host` returning float32[n_elems]."""
    scalar_tree = jax.tree_util.tree_structure(0)
    spec = CallbackSpec(host, scalar_tree, False, "call")
    avals = (jax.core.ShapedArray((n_elems,), np.float32),)
    return make_call_assembler(spec, scalar_tree, avals, 2, 0)


def call_feed(invoke, run, part, shard, reply):
    receiver._run_id[0] = run
    try:
        invoke([np.array([0, part], np.int32), shard], part, reply)
    finally:
        receiver._run_id[0] = 0


def test_call_assembler_calls_once_and_returns_each_device_its_slice():
    calls = []

    def host(x):
        calls.append(x.tolist())
        return x * 10

    invoke = call_assembler(host, 4)
    r0, r1 = FakeReply(), FakeReply()
    call_feed(invoke, 9, 1, np.array([2, 3], np.float32), r1)
    assert calls == [] and r1.sent is None  # device 1 waits for device 0's part
    call_feed(invoke, 9, 0, np.array([0, 1], np.float32), r0)
    assert calls == [[0.0, 1.0, 2.0, 3.0]]
    assert (r0.sent, r1.sent) == ([[0.0, 10.0]], [[20.0, 30.0]])


def test_call_assembler_fails_every_device_when_the_callback_fails():
    def host(x):
        raise ValueError("nope")

    invoke = call_assembler(host, 2)
    r0, r1 = FakeReply(), FakeReply()
    call_feed(invoke, 3, 0, np.array([0], np.float32), r0)
    call_feed(invoke, 3, 1, np.array([1], np.float32), r1)
    assert "raised ValueError: nope" in r0.failed and r0.failed == r1.failed
    receiver.take_last_exception()  # recorded for barrier_wait; consumed here
