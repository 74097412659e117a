"""hostfeed.install(): legacy imports of jax.experimental.host_callback keep working."""
from __future__ import annotations

from conftest import run_python


def test_legacy_import_runs_unchanged_after_install():
    # Legacy code chooses no tap mode: it gets the legacy module's (on CPU, each tap has
    # run before the computation goes on), with no barrier_wait before reading.
    r = run_python("""
        import hostfeed
        hostfeed.install()

        # --- unchanged legacy code below ---
        import jax
        import jax.numpy as jnp
        from jax.experimental import host_callback as hcb
        import jax.experimental.host_callback as hcb2

        assert hcb is hcb2
        seen = []
        def f(x):
            y = hcb.id_tap(lambda arg, transforms: seen.append(arg.tolist()), x * 2)
            return hcb.id_print(y + 1, what="y")
        out = jax.jit(f)(jnp.arange(3))
        print(out.tolist())
        print(seen)  # the legacy module's CPU semantics: the taps ran before the result
        hcb.barrier_wait()
        try:
            raise hcb.TapFunctionException("x")
        except hcb.CallbackException:
            print("alias ok")
    """, env={"HOSTFEED_SYNC_TAPS": ""})  # (unset: the suite's own is asynchronous)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["what: y", "[1 3 5]", "[1, 3, 5]", "[[0, 2, 4]]",
                                     "alias ok"]


def test_without_install_the_legacy_module_is_missing():
    r = run_python("""
        import hostfeed
        try:
            from jax.experimental import host_callback
        except ImportError:
            print("missing")
    """)
    assert r.stdout.strip() == "missing", r.stderr
