"""One record's layout (``hostfeed._src.record.layout``): the roles of its operands, its
lanes, the arrays declared, and the rows of a message, as the lowering, a record written
through Python and a recorded step all use it. No JAX: a catalogue that notes its calls."""
import numpy as np
import pytest

from hostfeed._src.record.layout import Layout, declare


class NotingCatalogue:
    """Notes claims and declarations in order; array ids count up from 10."""

    def __init__(self):
        self.calls = []

    def claim(self, name):
        self.calls.append(("claim", name))

    def declare(self, name, dtype, shape):
        self.calls.append(("declare", name, np.dtype(dtype).name, tuple(shape)))
        return 10 + sum(c[0] == "declare" for c in self.calls) - 1


def test_a_vmapped_jvp_record_claims_then_declares_its_value_and_tangent_per_lane():
    cat = NotingCatalogue()
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    tangent = -value
    steps = np.array([5, 6, 7], np.int32)
    operands = [value, steps, tangent, np.zeros(3, np.int32)]  # the step's tangent last
    layout = declare(cat, "h", "record+step", (("batch", (0, 0)), ("jvp",)), operands,
                     claim=True)
    assert cat.calls == [("claim", "h"), ("claim", "h.tangent"),
                         ("declare", "h", "float32", (4,)),
                         ("declare", "h.tangent", "float32", (4,))]
    assert layout == Layout(("", "step", ".tangent", None), 1, 3, 1, ((0, 10), (2, 11)))
    assert layout.ids == [10, None, 11, None]
    rows = layout.rows(operands)
    # lane by lane, the value before its tangent, each row with its lane's step
    assert [(array_id, step) for array_id, _, step in rows] == [
        (10, 5), (11, 5), (10, 6), (11, 6), (10, 7), (11, 7)]
    for (array_id, row, _), want in zip(rows, [value[0], tangent[0], value[1], tangent[1],
                                               value[2], tangent[2]]):
        assert row.dtype == np.uint8 and row.tobytes() == want.tobytes()
        assert np.shares_memory(row, value if array_id == 10 else tangent)  # lent, not copied


@pytest.mark.parametrize(("kind", "ops", "want_steps"), [
    ("record", [np.ones((2, 3), np.float32)], [-1, -1]),  # no step: -1 on every lane
    ("record+step", [np.ones((2, 3), np.float32), np.array(9)], [9, 9]),  # one for all lanes
])
def test_a_step_given_once_or_not_at_all_is_every_lanes_step(kind, ops, want_steps):
    layout = declare(NotingCatalogue(), "h", kind, (("batch", (0, None)),), ops)
    assert layout.lanes == 2 and layout.steps(ops) == want_steps
    assert [step for _, _, step in layout.rows(ops)] == want_steps


def test_an_empty_batch_declares_the_array_and_has_no_rows():
    cat = NotingCatalogue()
    ops = [np.ones((0, 3), np.float32)]
    layout = declare(cat, "h", "record", (("batch", (0,)),), ops)
    assert cat.calls == [("declare", "h", "float32", (3,))]  # no claim unless asked
    assert layout.lanes == 0 and layout.rows(ops) == []


def test_the_cotangent_of_a_grad_record_and_its_step_are_declared_by_roles():
    cat = NotingCatalogue()
    ops = [np.ones((2, 2), np.float32), np.array(3)]
    layout = declare(cat, "g", "record+step", (("jvp",), ("transpose",)), ops)
    assert layout.roles == (".cotangent", "step") and layout.step == 1
    assert cat.calls == [("declare", "g.cotangent", "float32", (2, 2))]
    assert [(i, s) for i, _, s in layout.rows(ops)] == [(10, 3)]
