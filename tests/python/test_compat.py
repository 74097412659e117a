"""The table of which JAX release changed what (hostfeed._src.compat.versions.CHANGES):
every entry is read by a gate, lies inside the supported range, and where its gate looks
at JAX itself, that look agrees with the table on the installed release (each CI lane runs
another JAX: 0.10.2, 0.11.2, 0.12.0.1)."""
from __future__ import annotations

import pathlib

import pytest

from hostfeed._src import compat
from hostfeed._src.compat import versions

COMPAT = pathlib.Path(compat.__file__).parent


@pytest.mark.parametrize("name", sorted(versions.CHANGES))
def test_each_change_lies_in_the_supported_range_and_a_gate_reads_it(name):
    change = versions.CHANGES[name]
    assert (*compat.MINIMUM, 0) < change.since, f"{name}: the oldest release has it"
    assert change.since[:2] <= compat.NEWEST_TESTED, change
    if not change.gated:
        assert change.probe is not None, f"{name}: a change without a gate needs a probe"
        return
    assert "(compat." in change.what, f"{name}: say which gate follows it"
    readers = [p.name for p in COMPAT.glob("*.py") if p.name != "versions.py" and
               (f'since("{name}")' in p.read_text() or f'CHANGES["{name}"]' in p.read_text())]
    assert readers, f"{name} is in the table but no gate in compat/ names it"


@pytest.mark.parametrize("name", sorted(n for n, c in versions.CHANGES.items() if c.probe))
def test_a_gate_that_looks_at_jax_agrees_with_the_table(name):
    change = versions.CHANGES[name]
    assert change.probe is not None
    assert change.probe() == versions.since(name), (
        f"jax {versions.JAX_VERSION}: {name} found {change.probe()}, the table says it came "
        f"in {change.since}")


def test_the_gates_follow_the_table():
    gates = {
        "set_sharding_takes_ctx": compat._SET_SHARDING_TAKES_CTX,
        "wrap_key_data_takes_dtype": compat._WRAP_KEY_DATA_TAKES_DTYPE,
        "nested_shard_map_names_outer_axes": not compat._NESTED_SHARD_MAP_CONTEXT_OMITS_OUTER_AXES,
        "python_callbacks_on_oneapi": "oneapi" in compat.PYTHON_CALLBACK_PLATFORMS,
        "lowering_to_hlo_takes_out_avals": compat._LOWERING_ARGS_HAVE_OUT_AVALS,
        "shardy_compiles_nested_manual_tokens": compat.SHARDY_COMPILES_NESTED_MANUAL_TOKENS,
        "dce_rules_take_live_ins": compat._DCE_RULES_TAKE_LIVE_INS,
        "no_closed_jaxpr": compat._ClosedJaxpr is None,
        "shardy_always": compat._SHARDY_ALWAYS,
    }
    assert gates == {name: versions.since(name) for name in gates}, versions.JAX_VERSION
