"""The host-side joining of global-view callbacks sent shard by shard, and the dispatcher
that keeps each device's messages in order around them (unit level, no device)."""
from __future__ import annotations

import sys
import threading

import jax
import numpy as np
import pytest

from hostfeed import _receiver
from hostfeed._src import consumers, dispatcher, errors, lifecycle, stall_watch
from hostfeed._src.placement import rounds_for
from hostfeed._src.consumers import ConsumerKind
from hostfeed._src.runtime import make_joined_call, make_joined_tap
from hostfeed._src.primitives import CallbackKind, CallbackSpec, ShardParts


def part(group, index, *shards):
    return [np.array([group, index], np.int32), *shards]


def joined_tap(got, n_parts=2, source=0):
    def invoke(arrays, ordinal):
        got.append(([a.tolist() for a in arrays], ordinal))

    return make_joined_tap(invoke, ShardParts(n_parts, source), "tap")


def test_parts_are_joined_in_part_order_once_all_arrived():
    got = []
    j = joined_tap(got, n_parts=3, source=1)
    # Parts arrive in any order across devices, in order within each device.
    assert j.add(7, part(0, 2, np.array([4, 5]), np.array([[2]])), 12, None) is None
    assert j.add(7, part(0, 0, np.array([0, 1]), np.array([[0]])), 10, None) is None
    assert got == []
    assert j.add(7, part(0, 1, np.array([2, 3]), np.array([[1]])), 11, None) == (10, 11, 12)
    assert got == [([[0, 1, 2, 3, 4, 5], [[0], [1], [2]]], 11)]  # as from the source part


def test_successive_taps_of_one_run_are_matched_by_position():
    got = []
    j = joined_tap(got)
    j.add(1, part(0, 0, np.array([0])), 0, None)
    j.add(1, part(0, 0, np.array([10])), 0, None)  # device 0 is a tap ahead of device 1
    j.add(1, part(0, 1, np.array([1])), 1, None)
    j.add(1, part(0, 1, np.array([11])), 1, None)
    assert [g[0][0] for g in got] == [[0, 1], [10, 11]]


def test_abandoned_parts_are_dropped_not_mixed_into_later_data():
    got = []
    j = joined_tap(got)
    j.add(1, part(0, 0, np.array([-1])), 0, None)  # run 1 failed before device 1 tapped
    assert j.abandon(1, "failed") == (0,)
    j.add(2, part(0, 0, np.array([0])), 0, None)
    j.add(2, part(0, 1, np.array([1])), 1, None)
    assert [g[0][0] for g in got] == [[0, 1]]
    assert j.incomplete_runs() == []


def test_groups_are_assembled_separately():
    got = []
    j = joined_tap(got)
    j.add(5, part(1, 0, np.array([10])), 2, None)
    j.add(5, part(0, 0, np.array([0])), 0, None)
    j.add(5, part(0, 1, np.array([1])), 1, None)
    j.add(5, part(1, 1, np.array([11])), 3, None)
    assert [g[0][0] for g in got] == [[0, 1], [10, 11]]


class FakeReply:
    def __init__(self):
        self.sent = None
        self.failed = None
        self.pending = True

    def send(self, arrays):
        self.sent = [a.tolist() for a in arrays]

    def fail(self, message):
        self.failed = message


def joined_call(host, n_elems, n_parts=2):
    """An `n_parts`-part joined call of `host` returning float32[n_elems]."""
    scalar_tree = jax.tree_util.tree_structure(0)
    spec = CallbackSpec(host, scalar_tree, False, CallbackKind.CALL)
    avals = (jax.core.ShapedArray((n_elems,), np.float32),)
    return make_joined_call(spec, scalar_tree, ShardParts(n_parts, 0, avals))


def test_joined_call_runs_once_and_returns_each_device_its_slice():
    calls = []

    def host(x):
        calls.append(x.tolist())
        return x * 10

    j = joined_call(host, 4)
    r0, r1 = FakeReply(), FakeReply()
    assert j.add(9, part(0, 1, np.array([2, 3], np.float32)), 1, r1) is None
    assert calls == [] and r1.sent is None  # device 1 waits for device 0's part
    assert j.add(9, part(0, 0, np.array([0, 1], np.float32)), 0, r0) == (0, 1)
    assert calls == [[0.0, 1.0, 2.0, 3.0]]
    assert (r0.sent, r1.sent) == ([[0.0, 10.0]], [[20.0, 30.0]])


def test_joined_call_fails_every_device_when_the_callback_fails():
    def host(x):
        raise ValueError("nope")

    j = joined_call(host, 2)
    r0, r1 = FakeReply(), FakeReply()
    j.add(3, part(0, 0, np.array([0], np.float32)), 0, r0)
    j.add(3, part(0, 1, np.array([1], np.float32)), 1, r1)
    assert "raised ValueError: nope" in r0.failed and r0.failed == r1.failed
    errors.take_last_exception()  # recorded for barrier_wait; consumed here


def test_abandoning_a_joined_call_fails_its_waiting_parts():
    j = joined_call(lambda x: x, 2)
    r0 = FakeReply()
    j.add(4, part(0, 0, np.array([0], np.float32)), 0, r0)
    assert j.abandon(4, "device 1 failed") == (0,)
    assert r0.failed == "device 1 failed"


# ----------------------------------------------------------------------------------------
# The dispatcher: per-device order around joined taps.


class Log:
    """Consumers for the dispatcher tests: `tap(name)` records (name, device)."""

    def __init__(self):
        self.events = []

    def tap(self, name):
        return consumers.Consumer(lambda arrays, ordinal: self.events.append((name, ordinal)),
                                  name, ConsumerKind.TAP)

    def joined(self, name, n_parts=2):
        def invoke(arrays, ordinal):
            self.events.append((name, "joined", [a.tolist() for a in arrays]))

        return consumers.Consumer(make_joined_tap(invoke, ShardParts(n_parts, 0), name), name,
                                  ConsumerKind.JOINED)


def dispatch(made, messages):
    """Runs `messages` (consumer index, device, run, *arrays) through a fresh dispatcher."""
    d = dispatcher.Dispatcher(consumers={i + 1: c for i, c in enumerate(made)})  # 0: control
    for cid, dev, run, *arrays in messages:
        d(_receiver.messages.Message(cid + 1, dev, 0, tuple(arrays), None, run))
    return d


def test_a_device_waits_for_its_joined_tap_before_its_later_taps():
    log = Log()
    consumers = [log.joined("before"), log.tap("inside"), log.joined("after")]
    d = dispatch(consumers, [
        (0, 0, 1, *part(0, 0, np.array([0]))),  # device 0: before (part 0) ...
        (1, 0, 1, np.array([10])),  # ... then inside: must wait for device 1's part
        (0, 1, 1, *part(0, 1, np.array([1]))),  # device 1: before (part 1) completes it
        (1, 1, 1, np.array([11])),
        (2, 1, 1, *part(0, 1, np.array([21]))),  # device 1 is ahead: after (part 1) ...
        (1, 1, 1, np.array([12])),  # ... and its next tap waits for device 0's part
        (2, 0, 1, *part(0, 0, np.array([20]))),
    ])
    assert log.events == [
        ("before", "joined", [[0, 1]]), ("inside", 0), ("inside", 1),
        ("after", "joined", [[20, 21]]), ("inside", 1)]
    assert not d.held


class Dispatch:
    """A fresh dispatcher over `consumers` (consumer ids 1, 2, ...; 0 is the control
    message); `send` runs messages (consumer index, device, run, *arrays)."""

    def __init__(self, consumers, charge=False):
        self.consumers = {i + 1: c for i, c in enumerate(consumers)}
        self.d = dispatcher.Dispatcher(charge=charge, consumers=self.consumers)

    def run(self, batch):
        for msg in batch:
            self.d(msg)

    def send(self, *messages, reply=None):
        self.run([_receiver.messages.Message(cid + 1, dev, 0, tuple(arrays), reply, run)
                  for cid, dev, run, *arrays in messages])

    def marker(self, action):
        marker = consumers.Consumer(lambda a, o: action(), "marker", ConsumerKind.TAP)
        self.run([_receiver.messages.Message(-1, -1, _receiver.messages.FLAG_EAGER, (),
                                             consumer=marker)])


def test_a_held_device_going_on_to_other_executions_waits_for_its_joined_tap():
    # A multi-device execution is not ordered against single-device ones: a device that
    # sent its part goes on while another device has not reached its own part yet.
    log = Log()
    d = Dispatch([log.joined("joined"), log.tap("tap")])
    d.send((0, 0, 1, *part(0, 0, np.array([0]))),  # run 1: device 0's part
           (1, 0, 2, np.array([1])),  # device 0 goes on to runs 2 and 3
           (1, 0, 3, np.array([2])),
           (1, 1, 4, np.array([7])))  # device 1 runs something else first
    assert log.events == [("tap", 1)]
    d.send((0, 1, 1, *part(0, 1, np.array([1]))))  # device 1's part arrives late
    assert log.events == [("tap", 1), ("joined", "joined", [[0, 1]]), ("tap", 0), ("tap", 0)]
    assert not d.d.held


def test_held_back_messages_count_against_the_bound_until_they_run():
    from hostfeed import _receiver
    lifecycle.ensure_started()
    log = Log()
    d = Dispatch([log.joined("joined"), log.tap("tap")], charge=True)
    base = _receiver.host.stats()["queued_bytes"]
    d.send((0, 0, 1, *part(0, 0, np.array([0]))),
           *[(1, 0, 2, np.zeros(1000, np.uint8)) for _ in range(3)])
    assert _receiver.host.stats()["queued_bytes"] - base == 3 * (1000 + 64)
    saved = _receiver.host.max_queue_bytes()
    _receiver.host.set_max_queue_bytes(8600)  # half of it: room for one more, not three
    try:
        d.send(*[(1, 0, 3, np.zeros(1000, np.uint8)) for _ in range(3)])
        assert _receiver.host.stats()["queued_bytes"] - base == 4 * (1000 + 64)
    finally:
        _receiver.host.set_max_queue_bytes(saved)
    d.send((0, 1, 1, *part(0, 1, np.array([1]))))
    assert log.events == [("joined", "joined", [[0, 1]])] + [("tap", 0)] * 6
    assert _receiver.host.stats()["queued_bytes"] == base and d.d.charged == 0


def test_a_sweep_drops_only_sets_held_before_its_mark():
    log = Log()
    d = Dispatch([log.joined("a"), log.joined("b"), log.tap("tap")])
    d.send((0, 0, 1, *part(0, 0, np.array([0]))),  # set a: device 1's part never comes
           (2, 0, 2, np.array([1])))
    d.marker(lambda: d.d.mark(1))  # a barrier's mark ...
    d.send((1, 1, 5, *part(0, 1, np.array([5]))),  # ... then a set of a later execution
           (2, 1, 6, np.array([2])))
    d.marker(lambda: d.d.sweep(1))  # ... and its sweep, after waiting
    assert log.events == [("tap", 0)]  # set a dropped: device 0 released
    assert list(d.d.held) == [1]  # set b is newer than the mark: still waited for
    d.send((1, 0, 5, *part(0, 0, np.array([4]))))
    assert log.events == [("tap", 0), ("b", "joined", [[4, 5]]), ("tap", 1)]
    assert not d.d.held


class FakeCallReply:
    def __init__(self):
        self.pending, self.failed, self.sent = True, None, None

    def fail(self, why):
        self.pending, self.failed = False, why
        return True

    def send(self, results):
        self.pending, self.sent = False, results
        return True


def test_a_failed_call_drops_its_executions_joined_sets_and_later_parts():
    log = Log()

    def call(arrays, ordinal, reply):
        reply.fail("host function raised")
        return True

    d = Dispatch([log.joined("joined"), log.tap("tap"),
                  consumers.Consumer(call, "c", ConsumerKind.CALL)])
    d.send((0, 0, 1, *part(0, 0, np.array([0]))),  # device 0's part of run 1
           (1, 0, 2, np.array([1])))  # held behind it
    d.send((2, 1, 1, np.array([0])), reply=FakeCallReply())  # run 1's call fails on device 1
    assert log.events == [("tap", 0)]
    assert not d.d.held
    late = FakeCallReply()  # a later part of run 1 (another device) is not waited for
    d.send((0, 2, 1, *part(0, 0, np.array([9]))), reply=late)
    assert not d.d.held and "never came" in late.failed
    errors.take_last_exception()


def test_a_failure_without_an_execution_id_lasts_until_the_next_sweep():
    # The portable transport's messages all carry run 0: a failed call there cannot fail
    # the joined sets of later executions for ever, only those dispatched before the
    # barrier that follows it.
    log = Log()

    def call(arrays, ordinal, reply):
        reply.fail("host function raised")
        return True

    run = dispatcher.UNKNOWN_RUN
    single = consumers.Consumer(call, "single", ConsumerKind.CALL)
    d = Dispatch([log.joined("joined"), consumers.Consumer(call, "c", ConsumerKind.CALL),
                  single])
    # (As registering a joined consumer and lowering a call into a computation on several
    # devices note.)
    joined, consumers.registry.joined = consumers.registry.joined, True
    consumers.registry.several_devices.add(d.consumers[2])
    try:
        # A call lowered into a computation on one device fails nothing else (it has no
        # parts elsewhere) ...
        d.send((2, 1, run, np.array([0])), reply=FakeCallReply())
        assert not d.d.awaits_sweep
        errors.take_last_exception()
        # ... one lowered into a computation on several devices fails its execution's parts.
        d.send((1, 1, run, np.array([0])), reply=FakeCallReply())  # fails on device 1
    finally:
        consumers.registry.several_devices.discard(d.consumers[2])
        consumers.registry.joined = joined
    assert d.d.awaits_sweep
    late = FakeCallReply()  # a part of that execution, from another device
    d.send((0, 0, run, *part(0, 0, np.array([9]))), reply=late)
    assert not d.d.held and "never came" in late.failed
    d.marker(lambda: d.d.mark(1))  # the barrier that follows, after waiting ...
    d.marker(lambda: d.d.sweep(1))
    assert not d.d.awaits_sweep
    d.send((0, 0, run, *part(0, 0, np.array([1]))),  # ... and a later execution joins
           (0, 1, run, *part(0, 1, np.array([2]))))
    assert log.events == [("joined", "joined", [[1, 2]])]
    d.send((1, 0, 7, np.array([0])), reply=FakeCallReply())  # a run with an id: kept
    d.marker(lambda: d.d.mark(2))
    d.marker(lambda: d.d.sweep(2))
    assert 7 in d.d.failed_runs and not d.d.awaits_sweep
    errors.take_last_exception()


def test_crossed_parts_run_out_of_order_as_soon_as_the_crossing_forms():
    # Devices 0 and 1 ran executions 1 and 2 in opposite orders (dispatched by two
    # threads): each holds back the part the other waits for. No barrier is needed.
    log = Log()
    d = Dispatch([log.joined("x"), log.joined("y"), log.tap("tap")])
    d.send((0, 0, 1, *part(0, 0, np.array([10]))),
           (2, 0, 7, np.array([1])),  # device 0's tap between its two parts
           (1, 0, 2, *part(0, 0, np.array([20]))),
           (1, 1, 2, *part(0, 1, np.array([21]))))
    assert log.events == []  # no circle yet: device 1 may still send its part of x
    assert sorted(d.d.held) == [0, 1]
    d.send((0, 1, 1, *part(0, 1, np.array([11]))))  # held back behind y: a circle
    assert sorted(log.events[:2]) == [("x", "joined", [[10, 11]]),
                                      ("y", "joined", [[20, 21]])]
    assert log.events[2:] == [("tap", 0)]  # device 0's tap after x, its place
    assert not d.d.held


def test_a_crossing_of_three_devices_is_resolved():
    # Three executions, each on two of three devices, run in a circle of orders.
    log = Log()
    d = Dispatch([log.joined("a"), log.joined("b"), log.joined("c")])
    d.send((0, 0, 1, *part(0, 0, np.array([0]))),  # device 0: a, then c
           (2, 0, 3, *part(0, 1, np.array([3]))),
           (1, 1, 2, *part(0, 0, np.array([1]))),  # device 1: b, then a
           (0, 1, 1, *part(0, 1, np.array([2]))),
           (2, 2, 3, *part(0, 0, np.array([4]))))  # device 2: c, then b
    assert log.events == []  # device 2 may still send its part of b in its order
    d.send((1, 2, 2, *part(0, 1, np.array([5]))))  # held back behind c: a circle of three
    assert sorted(log.events) == [("a", "joined", [[0, 2]]), ("b", "joined", [[1, 5]]),
                                  ("c", "joined", [[4, 3]])]
    assert not d.d.held


def test_calls_held_behind_crossed_executions_run_out_of_order():
    # Issue 65.2's soak hang (portable transport, 1 run in about 200): devices 0 and 1 ran
    # executions x and y (dispatched by two threads) in opposite orders, and each then ran
    # a single-device computation that calls. Held back behind its device's joined tap,
    # each call blocked its device, so neither device sent its part of the other's set
    # (on CPU its later executions wait behind the call): a circle that no held-back part
    # shows, and every thread waited for ever. One call now runs out of its order.
    log = Log()

    def call(arrays, ordinal, reply):
        log.events.append(("call", ordinal))
        return not reply.send([])

    d = Dispatch([log.joined("x"), log.joined("y"),
                  consumers.Consumer(call, "c", ConsumerKind.CALL)])
    r0, r1 = FakeCallReply(), FakeCallReply()
    d.send((0, 0, 1, *part(0, 0, np.array([10]))))  # device 0: its part of x
    d.send((2, 0, 3, np.array([0])), reply=r0)  # then a call: held, device 0 waits
    d.send((1, 1, 2, *part(0, 1, np.array([21]))))  # device 1: its part of y
    assert log.events == [] and r0.pending  # device 1 may still send its part of x
    d.send((2, 1, 4, np.array([1])), reply=r1)  # device 1's call, held: a circle
    assert log.events == [("call", 0)] and not r0.pending and r1.pending
    # Device 0 goes on: its part of y (held behind x) completes y out of its order, which
    # lets device 1's call run, and device 1's part of x completes x.
    d.send((1, 0, 2, *part(0, 0, np.array([20]))))
    assert log.events == [("call", 0), ("y", "joined", [[20, 21]]), ("call", 1)]
    d.send((0, 1, 1, *part(0, 1, np.array([11]))))
    assert log.events[3:] == [("x", "joined", [[10, 11]])]
    assert not d.d.held and not r1.pending


def test_synchronous_taps_held_behind_crossed_executions_let_their_devices_go_on_in_order():
    # The same circle with synchronous taps instead of calls (the default tap mode): a tap
    # needs no result, so the device goes on at once (its reply is sent) and the tap still
    # runs in its device's order: nothing runs out of order.
    log = Log()
    d = Dispatch([log.joined("x"), log.joined("y"), log.tap("tap")])
    r0, r1 = FakeCallReply(), FakeCallReply()
    sync = _receiver.messages.FLAG_SYNC_TAP

    def send_sync_tap(device, run, value, reply):
        d.run([_receiver.messages.Message(3, device, sync, (np.array([value]),), reply, run)])

    d.send((0, 0, 1, *part(0, 0, np.array([10]))))  # device 0: its part of x
    send_sync_tap(0, 3, 0, r0)  # then a synchronous tap: held, device 0 waits
    d.send((1, 1, 2, *part(0, 1, np.array([21]))))  # device 1: its part of y
    send_sync_tap(1, 4, 1, r1)  # device 1's, held: a circle; device 1 goes on
    assert log.events == [] and not r0.pending and r1.pending  # device 0 goes on
    d.send((1, 0, 2, *part(0, 0, np.array([20]))))  # its part of y completes y
    d.send((0, 1, 1, *part(0, 1, np.array([11]))))  # device 1's part of x
    # (y completes before x on device 0: the executions crossed.) Each tap after the set
    # its device sent a part of before it.
    assert log.events == [("y", "joined", [[20, 21]]), ("tap", 1),
                          ("x", "joined", [[10, 11]]), ("tap", 0)]
    assert not d.d.held and not r1.pending


def test_calls_held_in_order_behind_one_execution_wait_for_it():
    # Devices 0 and 1 each wait for a call held behind their parts of the same set x:
    # no circle (each has sent its part of x), so the calls wait for x, in order.
    log = Log()

    def call(arrays, ordinal, reply):
        log.events.append(("call", ordinal))
        return not reply.send([])

    d = Dispatch([log.joined("x", n_parts=3), consumers.Consumer(call, "c", ConsumerKind.CALL)])
    r0, r1 = FakeCallReply(), FakeCallReply()
    d.send((0, 0, 1, *part(0, 0, np.array([10]))))
    d.send((1, 0, 3, np.array([0])), reply=r0)
    d.send((0, 1, 1, *part(0, 1, np.array([11]))))
    d.send((1, 1, 4, np.array([1])), reply=r1)
    assert log.events == [] and r0.pending and r1.pending
    d.send((0, 2, 1, *part(0, 2, np.array([12]))))  # device 2's part, later
    assert log.events == [("x", "joined", [[10, 11, 12]]), ("call", 0), ("call", 1)]
    assert not d.d.held


def test_a_call_held_in_a_circle_through_the_runtime_runs_out_of_order_at_the_stall_check():
    # Issue 65.2's soak, its second hang: the part a held device waits for may never be
    # launched, with no circle the dispatcher can see (on CPU a device's later executions
    # wait behind its call and fill its in-flight semaphore, and then the launches of
    # multi-device executions on every device wait for it). The whole process then waits;
    # the stall watch's check, pushed once it saw that, runs the call out of its order.
    log = Log()

    def call(arrays, ordinal, reply):
        log.events.append(("call", ordinal))
        return not reply.send([])

    d = Dispatch([log.joined("x", n_parts=3), consumers.Consumer(call, "c", ConsumerKind.CALL)])
    r0 = FakeCallReply()
    d.send((0, 0, 1, *part(0, 0, np.array([10]))))
    d.send((1, 0, 3, np.array([0])), reply=r0)  # held behind x: device 0 waits
    n = _receiver.host.stats()["messages_enqueued"]
    d.marker(lambda: d.d._unstall(n + 1))  # a message came since the check: nothing runs
    assert log.events == [] and r0.pending
    d.marker(lambda: d.d._unstall(n))
    assert log.events == [("call", 0)] and not r0.pending
    assert list(d.d.held) == [0]  # still held on x, which completes in its own time
    d.send((0, 1, 1, *part(0, 1, np.array([11]))), (0, 2, 1, *part(0, 2, np.array([12]))))
    assert log.events[1:] == [("x", "joined", [[10, 11, 12]])] and not d.d.held


def test_a_synchronous_joined_tap_holds_only_its_source_device_until_it_ran():
    # As the legacy module ran a global-view tap on one device: the device of the source
    # part (0 here) waits until the tap ran; another device's part is answered on arrival
    # (its later callbacks still wait for the tap).
    got = []
    j = joined_tap(got, n_parts=2, source=0)
    r0, r1 = FakeCallReply(), FakeCallReply()
    assert j.add(5, part(0, 1, np.array([1])), 1, r1) is None
    assert r1.sent == [] and r0.pending
    assert j.add(5, part(0, 0, np.array([0])), 0, r0) == (0, 1)
    assert got == [([[0, 1]], 0)] and r0.sent == []
    # In the dispatcher the tap belongs to the source device's order only: device 1 is not
    # held (its next tap runs at once), device 0 is, until the tap ran.
    log = Log()
    d = Dispatch([log.joined("x"), log.tap("tap")])
    r0, r1 = FakeCallReply(), FakeCallReply()
    d.send((0, 1, 1, *part(0, 1, np.array([11]))), reply=r1)
    d.send((1, 1, 2, np.array([1])))
    d.send((0, 0, 1, *part(0, 0, np.array([10]))), reply=r0)
    d.send((1, 0, 3, np.array([0])))
    assert log.events == [("tap", 1), ("x", "joined", [[10, 11]]), ("tap", 0)]
    assert not d.d.held and not r0.pending and not r1.pending


def test_the_stall_check_lets_a_device_waiting_for_its_own_synchronous_joined_tap_go_on():
    # The source device's part waits for the others, which a circle through the runtime
    # keeps from coming (the thread the source's part holds is one they need): at the
    # stall check the source goes on before the tap ran; the tap runs once the set is
    # complete, before the device's later callbacks.
    log = Log()
    d = Dispatch([log.joined("x"), log.tap("tap")])
    r0 = FakeCallReply()
    d.send((0, 0, 1, *part(0, 0, np.array([10]))), reply=r0)
    assert r0.pending and list(d.d.held) == [0]
    n = _receiver.host.stats()["messages_enqueued"]
    d.marker(lambda: d.d._unstall(n))
    assert r0.sent == [] and log.events == []
    d.send((1, 0, 2, np.array([3])))  # device 0 went on: its next tap waits for x
    d.send((0, 1, 1, *part(0, 1, np.array([11]))))
    assert log.events == [("x", "joined", [[10, 11]]), ("tap", 0)] and not d.d.held


def test_the_stall_check_leaves_a_device_that_is_not_a_cpu_waiting():
    # A GPU (or a TPU, through the portable transport) that computes leaves the process
    # idle too: no circle through the CPU runtime, so its call waits in its order.
    log = Log()

    def call(arrays, ordinal, reply):
        log.events.append(("call", ordinal))
        return not reply.send([])

    d = Dispatch([log.joined("x"), consumers.Consumer(call, "c", ConsumerKind.CALL)])
    r = FakeCallReply()
    gpu = -2  # GPU 0's device key
    d.send((0, gpu, 1, *part(0, 0, np.array([10]))))
    d.send((1, gpu, 3, np.array([0])), reply=r)
    n = _receiver.host.stats()["messages_enqueued"]
    d.marker(lambda: d.d._unstall(n))
    assert log.events == [] and r.pending
    d.send((0, -3, 1, *part(0, 1, np.array([11]))))
    assert log.events == [("x", "joined", [[10, 11]]), ("call", gpu)] and not r.pending


def _samples(windows):
    """A sampler of the stall watch (two samples a window) that plays ``windows``, one
    entry per window (``"busy"``: the process used CPU time; ``"callback"``: a host
    callback ran; ``"message"``: one reached the receiver), then idle windows; with the
    samples taken so far."""
    taken, state = [], {"cpu": 0.0, "enqueued": 0}

    def sample():
        window, second = divmod(len(taken), 2)
        what = windows[window] if window < len(windows) else "idle"
        taken.append(what)
        if second and what == "busy":
            state["cpu"] += 1.0
        if second and what == "message":
            state["enqueued"] += 1
        return stall_watch.Activity(state["enqueued"], state["cpu"],
                                    second and what == "callback")
    return sample, taken


@pytest.mark.parametrize("busy", ["busy", "callback", "message"])
def test_the_stall_watch_checks_only_after_windows_in_which_the_process_did_nothing(busy):
    # A device that computes (CPU time), waits in a host callback, or sends anything keeps
    # the watch from checking, however long that lasts: the check comes after two windows
    # in a row in which the whole process did nothing.
    lifecycle.ensure_started()
    ran = threading.Event()
    sample, taken = _samples([busy, busy, "idle", busy, busy, busy])
    watch = stall_watch.StallWatch(lambda: not ran.is_set(), lambda n: ran.set(),
                                   window=0.001, quiet=2, sample=sample)
    watch.note()
    assert ran.wait(60)
    assert len(taken) == 2 * (6 + 2)  # the six scripted windows, then two idle ones


def test_the_stall_watch_checks_on_the_consumer_thread_once_the_process_did_nothing():
    lifecycle.ensure_started()
    held, seen, ran = [True], [], threading.Event()

    def unstall(n):
        seen.append((n, _receiver.host.in_callback_thread(),
                     _receiver.host.stats()["messages_enqueued"]))
        held[0] = False
        ran.set()

    idle = stall_watch.Activity(0, 0.0, False)
    watch = stall_watch.StallWatch(lambda: held[0], unstall, window=0.01,
                                   sample=lambda: idle._replace(
                                       enqueued=_receiver.host.stats()["messages_enqueued"]))
    watch.note()
    assert ran.wait(60)
    n, on_consumer_thread, enqueued = seen[0]
    assert on_consumer_thread and n == enqueued  # nothing but the check came meanwhile


def test_a_thread_inside_a_jax_callback_is_seen_and_hostfeeds_own_waits_are_not():
    entered, release = threading.Event(), threading.Event()

    def host(v):
        entered.set()
        release.wait(60)
        return v

    f = jax.jit(lambda v: jax.pure_callback(host, jax.ShapeDtypeStruct((), np.float32), v))
    worker = threading.Thread(target=lambda: f(np.float32(1)).block_until_ready())
    worker.start()
    assert entered.wait(60)
    try:
        assert stall_watch.in_jax_callback()
        # The same stack with hostfeed's code innermost (a portable call waiting for its
        # reply) is a wait for the receiver, not a callback at work.
        frames = sys._current_frames()
        own = {i: f for i, f in frames.items()
               if i != threading.get_ident() and f.f_code.co_filename.startswith(
                   stall_watch._OWN)}
        assert not stall_watch.in_jax_callback(own)
    finally:
        release.set()
        worker.join(60)
    assert not stall_watch.in_jax_callback()


def test_a_device_that_waits_in_order_is_no_crossing():
    # Device 0 sent parts of x and then y, device 1 has sent neither yet: y waits behind
    # x on device 0, in its order.
    log = Log()
    d = Dispatch([log.joined("x"), log.joined("y"), log.tap("tap")])
    d.send((0, 0, 1, *part(0, 0, np.array([10]))),
           (1, 0, 2, *part(0, 0, np.array([20]))),
           (2, 1, 9, np.array([5])))
    assert log.events == [("tap", 1)]
    d.send((0, 1, 1, *part(0, 1, np.array([11]))),
           (1, 1, 2, *part(0, 1, np.array([21]))))
    assert log.events == [("tap", 1), ("x", "joined", [[10, 11]]),
                          ("y", "joined", [[20, 21]])]
    assert not d.d.held


def test_a_late_part_of_a_swept_set_holds_no_device():
    # A failure swept run 1's set; device 1's part of it comes after all (its execution
    # did not fail there): it is dropped, and device 1's later taps run.
    log = Log()
    d = Dispatch([log.joined("x"), log.tap("tap")])
    d.send((0, 0, 1, *part(0, 0, np.array([10]))))
    d.marker(lambda: d.d.mark(1))
    d.marker(lambda: d.d.sweep(1))
    d.send((0, 1, 1, *part(0, 1, np.array([11]))), (1, 1, 2, np.array([3])))
    assert log.events == [("tap", 1)]
    assert not d.d.held


# ----------------------------------------------------------------------------------------
# Many processes: the owner process's devices send several parts (slots) per message.


def test_a_message_carries_several_parts_in_slots():
    got = []
    j = joined_tap(got, n_parts=4, source=0)
    # Device 10 sends its own part 0 and part 2 received from another process; device 11
    # its part 1 and part 3.
    assert j.add(5, [np.array([0, 0, 2], np.int32), np.array([0]), np.array([2])], 10,
                 None) is None
    assert j.add(5, [np.array([0, 1, 3], np.int32), np.array([1]), np.array([3])], 11,
                 None) == (10, 11)
    assert got == [([[0, 1, 2, 3]], 10)]


def test_joined_call_answers_every_slot_and_zeros_an_empty_one():
    j = joined_call(lambda x: x * 10, 3, n_parts=3)
    r0, r1 = FakeReply(), FakeReply()
    assert j.add(2, [np.array([0, 0, 2], np.int32), np.array([0], np.float32),
                     np.array([2], np.float32)], 0, r0) is None
    # Device 1 received nothing in round 0: slot 1 is empty (-1).
    assert j.add(2, [np.array([0, 1, -1], np.int32), np.array([1], np.float32),
                     np.array([0], np.float32)], 1, r1) == (0, 1)
    assert r0.sent == [[0.0], [20.0]]
    assert r1.sent == [[10.0], [0.0]]


def test_joined_call_fails_a_message_with_several_slots_once():
    def host(x):
        raise ValueError("nope")

    j = joined_call(host, 2)
    r0 = FakeReply()
    j.add(3, [np.array([0, 0, 1], np.int32), np.array([0], np.float32),
              np.array([1], np.float32)], 0, r0)
    assert "raised ValueError: nope" in r0.failed
    errors.take_last_exception()


@pytest.mark.parametrize("processes, device_index", [
    ([0, 0, 1, 1], 0), ([0, 0, 1, 1], 3), ([0, 1, 2, 3], 2), ([0, 0, 0, 1, 1, 2], 4),
    ([1, 0, 1, 0], 1), ([0, 0, 0, 0], 1)])
def test_rounds_bring_every_slice_to_the_owner_process_once(processes, device_index):
    r = rounds_for(processes, device_index)
    owner = processes[device_index]
    assert r.owner == tuple(p == owner for p in processes)
    for perm in r.perms:  # each round is a partial permutation towards owner devices
        sources, targets = [s for s, _ in perm], [t for _, t in perm]
        assert len(set(sources)) == len(sources) and len(set(targets)) == len(targets)
        assert all(processes[t] == owner and processes[s] != owner for s, t in perm)
    # Every part is sent exactly once, by an owner device; others send nothing.
    sent = [part for k, slots in enumerate(r.slots) for part in slots if part >= 0]
    assert sorted(sent) == list(range(len(processes)))
    assert all(all(p < 0 for p in r.slots[k]) for k, o in enumerate(r.owner) if not o)
    assert all(r.slots[k][0] == k for k, o in enumerate(r.owner) if o)
    for k, j in enumerate(r.round_of):
        assert (j == -1) == r.owner[k]
        if j >= 0:
            assert any(s == k for s, _ in r.perms[j])


def test_barrier_waits_for_a_tap_held_back_behind_a_joined_tap_of_a_later_execution():
    # Issue 65, point 3: a device ran its part of a multi-device execution (dispatched
    # after the barrier waited for the computations, by another thread), then a tap that
    # was dispatched before the barrier; the tap waits for the joined tap's other part.
    # The receiver counted it as processed once its batch ended, so barrier_wait returned
    # before it ran (about one barrier in 600 under load). Here the devices' messages are
    # pushed as the portable transport pushes them, in that order, with no device.
    from hostfeed import host_callback as hcb

    lifecycle.ensure_started()
    events = []

    def joined(arrays, ordinal):
        events.append(("joined", [a.tolist() for a in arrays]))

    tap_lease = consumers.register(("held-behind-a-later-execution", "tap"), lambda: (
        consumers.Consumer(lambda arrays, ordinal: events.append(("tap", int(arrays[0]))),
                           "held-tap", ConsumerKind.TAP)))
    joined_lease = consumers.register(("held-behind-a-later-execution", "joined"), lambda: (
        consumers.Consumer(make_joined_tap(joined, ShardParts(2, 0), "held-joined"),
                           "held-joined", ConsumerKind.JOINED)))
    i32 = _receiver.host.DTYPE_CODES["int32"]

    def send_part(device, value):
        _receiver.portable.push_host(joined_lease.cid,
                                     list(part(0, device, np.array([value], np.int32))),
                                     [i32, i32], device, _receiver.messages.FLAG_SHARD)

    send_part(0, 10)  # device 0's part; device 1 has not reached its part yet
    _receiver.portable.push_host(tap_lease.cid, [np.array(5, np.int32)], [i32], 0)  # held behind it
    with pytest.raises(TimeoutError):  # before: returned at once, the tap not run
        hcb.barrier_wait(timeout=0.2)
    assert events == []
    send_part(1, 11)  # device 1's part completes the joined tap: the tap runs after it
    hcb.barrier_wait()
    assert events == [("joined", [[10, 11]]), ("tap", 5)]
    assert not dispatcher.dispatcher.held and dispatcher.dispatcher.charged == 0


def test_barrier_waiting_for_a_held_tap_sweeps_a_set_whose_part_failed(caplog):
    # The other side of the barrier waiting for held messages: a joined part that failed
    # on the host (here an unknown consumer id) never completes its set; the barrier that
    # waits for the tap held behind it sweeps that set after HELD_PATIENCE (a host
    # function failed), so the tap runs and the barrier raises the failure, not hangs.
    from hostfeed import host_callback as hcb

    lifecycle.ensure_started()
    events = []
    tap_lease = consumers.register(("held-behind-a-failed-part", "tap"), lambda: (
        consumers.Consumer(lambda arrays, ordinal: events.append(("tap", int(arrays[0]))),
                           "held-tap", ConsumerKind.TAP)))
    joined_lease = consumers.register(("held-behind-a-failed-part", "joined"), lambda: (
        consumers.Consumer(make_joined_tap(lambda arrays, ordinal: events.append("joined"),
                                           ShardParts(2, 0), "held-joined"),
                           "held-joined", ConsumerKind.JOINED)))
    i32 = _receiver.host.DTYPE_CODES["int32"]
    _receiver.portable.push_host(joined_lease.cid, list(part(0, 0, np.array([10], np.int32))),
                                 [i32, i32], 0, _receiver.messages.FLAG_SHARD)
    _receiver.portable.push_host(tap_lease.cid, [np.array(5, np.int32)], [i32], 0)
    unknown = next(c for c in range(1 << 40, (1 << 40) + 100)
                   if c not in consumers.registry.consumers)
    _receiver.portable.push_host(unknown, list(part(0, 1, np.array([11], np.int32))),
                                 [i32, i32], 1, _receiver.messages.FLAG_SHARD)
    with pytest.raises(hcb.CallbackException, match="no host callback is registered"):
        hcb.barrier_wait(timeout=60)
    assert events == [("tap", 5)]
    assert "dropped an incomplete global-view host callback" in caplog.text
    assert not dispatcher.dispatcher.held and dispatcher.dispatcher.charged == 0


def test_the_receiver_is_handed_the_dispatchers_state_not_its_attribute_names():
    # What the receiver reads of the dispatcher is one typed object made once: the
    # dispatcher's Holds and the consumer table (both languages go through their methods,
    # no container is lent) and the callables that take failures.
    d = dispatcher.Dispatcher()
    state = d.state()
    assert isinstance(state, _receiver.batch.DispatcherState)
    assert state.holds is d.held and state.consumers is consumers.registry.consumers
    table = _receiver.consumers.ConsumerTable()
    with pytest.raises(TypeError, match="call_failed must be callable"):
        _receiver.batch.DispatcherState(d, holds=d.held, consumers=table, tap_failed=print,
                                        call_failed=None)
    with pytest.raises(TypeError):  # a dict is no Holds
        _receiver.batch.DispatcherState(d, holds={}, consumers=table, tap_failed=print,
                                        call_failed=print)


def test_holds_keep_devices_in_the_order_held_and_orphans_apart():
    # The state both languages share: a device is held once, released once; what an
    # abandoned consumer leaves runs first, in order; emptiness is what the receiver asks.
    holds = _receiver.batch.Holds()
    assert holds.is_empty() and not holds and list(holds) == []
    holds.hold(3, "a")
    holds.hold(1, "b")
    with pytest.raises(ValueError, match="device 3 is held already"):
        holds.hold(3, "c")
    assert list(holds) == [3, 1] and holds.items() == [(3, "a"), (1, "b")]
    assert 1 in holds and 2 not in holds and holds.get(1) == "b" and holds.get(2) is None
    assert holds.release(3) == "a" and holds.release(3) is None and len(holds) == 1
    assert holds.release(1) == "b" and holds.is_empty()
    holds.leave(0, "m1")
    holds.leave(0, "m2")
    assert not holds.is_empty() and not holds and holds.orphaned() == [0]
    assert holds.take_orphans(0) == ["m1", "m2"] and holds.take_orphans(0) == []
    assert holds.is_empty()
