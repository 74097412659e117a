"""id_print output in the legacy format."""
from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np

from hostfeed import host_callback as hcb
from hostfeed.printing import format_value, print_tap_func


def printed(fn, *args) -> str:
    s = io.StringIO()
    jax.jit(lambda *a: fn(s, *a))(*args)
    hcb.barrier_wait()
    return s.getvalue()


def test_print_scalar_with_kwargs_sorted():
    out = printed(lambda s, x: hcb.id_print(x * 2, what="x*2", output_stream=s, a=1), 3.0)
    assert out == "a: 1 what: x*2\n6.\n"


def test_print_tuple_layout():
    out = printed(lambda s, x: hcb.id_print((x, x * x), what="x,x^2", output_stream=s), 3.0)
    assert out == "what: x,x^2\n( 3.\n  9. )\n"


def test_print_nested_containers():
    out = printed(lambda s, x: hcb.id_print({"b": [x, x + 1], "a": (x,)}, output_stream=s),
                  jnp.int32(1))
    assert out == "{ a=( 1 )\n  b=[ 1\n      2 ] }\n"


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
