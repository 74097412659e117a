"""id_print output in the legacy format."""
from __future__ import annotations

import io
import re

import jax
import jax.numpy as jnp
import numpy as np

from hostfeed import host_callback as hcb
from hostfeed._src.printing import format_value, print_tap_func


def printed(fn, *args) -> str:
    s = io.StringIO()
    jax.jit(lambda *a: fn(s, *a))(*args)
    hcb.barrier_wait()
    return s.getvalue()


def test_print_scalar_with_kwargs_sorted():
    out = printed(lambda s, x: hcb.id_print(x * 2, what="x*2", output_stream=s, a=1), 3.0)
    assert out == "a: 1 what: x*2\n6.\n"


def test_print_tuple_on_one_line_when_it_fits():
    out = printed(lambda s, x: hcb.id_print((x, x * x), what="x,x^2", output_stream=s), 3.0)
    assert out == "what: x,x^2\n( 3. 9. )\n"


def test_print_nested_containers_on_one_line_when_they_fit():
    out = printed(lambda s, x: hcb.id_print({"b": [x, x + 1], "a": (x,)}, output_stream=s),
                  jnp.int32(1))
    assert out == "{ a=( 1 ) b=[ 1 2 ] }\n"


def test_print_layouts_of_the_legacy_module_examples():
    # The outputs JAX 0.4.x's module documented and its users' tests assert.
    with np.printoptions(precision=2, floatmode="fixed"):
        d = printed(lambda s, x: hcb.id_print({"a": x * 2, "b": x * 3}, output_stream=s), 3.0)
        pair = printed(lambda s, x, y: hcb.id_print((x, y), output_stream=s),
                       jnp.array([0.7, 0.8]), jnp.array([11, 12, 13]))
        empty = printed(lambda s, x, y: hcb.id_print((x, y), output_stream=s),
                        jnp.float32(1.0), jnp.zeros((0,)))
    assert (d, pair, empty) == ("{ a=6.00 b=9.00 }\n", "( [0.70 0.80] [11 12 13] )\n",
                                "( 1.00 [] )\n")


def test_print_breaks_a_group_that_does_not_fit_one_element_per_line():
    out = printed(lambda s, x, y: hcb.id_print((x, y), output_stream=s),
                  jnp.arange(20.0), jnp.arange(3))
    assert out == ("( [ 0.  1.  2.  3.  4.  5.  6.  7.  8.  9. 10. 11. 12. 13. 14. 15. 16. 17.\n"
                   "   18. 19.]\n"
                   "  [0 1 2] )\n")


def test_print_nested_groups_decide_for_themselves():
    lines = format_value({"long": tuple("x" * 30 for _ in range(3)), "short": (1, 2)})
    assert lines == ["{ long=( " + "x" * 30,
                     "         " + "x" * 30,
                     "         " + "x" * 30 + " )",
                     "  short=( 1 2 ) }"]


def test_print_width_counts_the_column_and_closing_brackets():
    # 77 characters fit alone on a line, but not after "( " and before " )".
    inner = ("a" * 36, "b" * 36)
    assert format_value(inner) == ["( " + "a" * 36 + " " + "b" * 36 + " )"]
    assert format_value((inner,)) == ["( ( " + "a" * 36, "    " + "b" * 36 + " ) )"]


def test_print_array_uses_array2string_and_threshold():
    out = printed(lambda s, x: hcb.id_print(x, output_stream=s, threshold=4), jnp.arange(10))
    assert out == np.array2string(np.arange(10), threshold=4) + "\n"


def test_print_with_device():
    out = printed(lambda s, x: hcb.id_print(x, output_stream=s, tap_with_device=True), 1)
    assert out == f"device: {jax.devices()[0]}\n1\n"


def test_print_to_stdout_by_default(capfd):
    jax.jit(lambda x: hcb.id_print(x, what="here"))(jnp.float32(2.5))
    hcb.barrier_wait()
    assert capfd.readouterr().out == "what: here\n2.5\n"


def test_transforms_render_as_in_legacy_module():
    s = io.StringIO()
    print_tap_func(np.array(1.0), (("jvp", {}), ("transpose", {})), output_stream=s)
    print_tap_func(np.array(1.0), (("batch", {"batch_dims": (0, 0)}),), output_stream=s)
    assert s.getvalue() == ("transforms: ['jvp', 'transpose']\n1.\n"
                            "transforms: [('batch', {'batch_dims': (0, 0)})]\n1.\n")


def test_format_value_of_multiline_array_indents_under_bracket():
    lines = format_value((np.arange(4).reshape(2, 2), 1))
    assert lines == ["( [[0 1]", "   [2 3]]", "  1 )"]


def _round_floats(text: str) -> str:
    # How JAX's legacy tests compared printed floats: rounded to two decimals.
    return re.sub(r"-?\d+\.\d*", lambda m: f"{round(float(m.group()), 2):.2f}", text)


def test_tap_empty():
    """JAX v0.4.25's ``host_callback_test.test_tap_empty``: an empty tuple prints as
    ``(  )``; an empty array as ``[]``."""
    s = io.StringIO()
    hcb.id_print((), output_stream=s)
    hcb.id_print((1., np.ones((2, 0))), what="second", output_stream=s)
    hcb.barrier_wait()
    lines = [line.strip() for line in _round_floats(s.getvalue()).strip().splitlines()]
    assert lines == ["(  )", "what: second", "( 1.00 [] )"]


def test_empty_groups_print_with_two_spaces_under_jit():
    out = printed(lambda s, x: hcb.id_print(((), [], {}, (x,)), output_stream=s),
                  jnp.int32(1))
    assert out == "( (  ) [  ] {  } ( 1 ) )\n"
    assert format_value(()) == ["(  )"]
