"""The host-side assembly of global-view taps sent shard by shard (unit level)."""
from __future__ import annotations

import numpy as np

from hostfeed import receiver
from hostfeed.primitives import make_shard_assembler


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
