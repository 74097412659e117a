"""A reduction defined here, in a test module, and added to the registry: it records, and
``show`` and the TensorBoard export read it back through its own read side
(``Readback``), with nothing in ``hostfeed._src.readback`` knowing it."""
from __future__ import annotations

import io
from contextlib import redirect_stdout
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostfeed
from hostfeed._src import reductions


class Quantiles(reductions.Reduction):
    """The ``q`` quantiles of a value over the reduced axes: a row of ``len(q)`` values."""

    kind: ClassVar[str] = "quantiles"
    suffix: ClassVar[str] = ".q"

    def __init__(self, q: tuple[float, ...] = (0.1, 0.5, 0.9)):
        self.q = tuple(float(x) for x in q)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def row_shape(self) -> tuple[int, ...]:
        return (len(self.q),)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "q": list(self.q)}

    def compute(self, v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
        return jnp.moveaxis(jnp.quantile(v, jnp.asarray(self.q), axis=axes), 0, -1)

    @classmethod
    def plot_labels(cls, attrs: dict[str, Any], columns: int) -> list[str]:
        return [f"q{q:g}" for q in attrs["q"]]


@pytest.fixture
def quantiles_recorded(tmp_path, monkeypatch):
    """A store of 4 steps of ``Quantiles()`` of a value (recorded eagerly), and the
    quantiles numpy computes for each step."""
    monkeypatch.setitem(reductions.REDUCTIONS, Quantiles.kind, Quantiles)
    store = str(tmp_path / "q.zarr")
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(101).astype(np.float32) for _ in range(4)]
    with hostfeed.Recorder(store) as rec:
        for s, x in enumerate(xs):
            rec.record("acts/h.q", x, step=s, reduce=Quantiles())
    want = np.stack([np.quantile(x, (0.1, 0.5, 0.9)) for x in xs])
    return store, want


def test_a_reduction_added_in_a_test_module_records_its_rows(quantiles_recorded):
    store, want = quantiles_recorded
    rows, meta = hostfeed.read_recording(store, "acts/h.q")
    assert rows.shape == (4, 3) and meta["step"].tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(rows, want, rtol=1e-5, atol=1e-6)
    assert hostfeed.open_recording(store)["acts/h.q"].attrs["reduce"]["kind"] == "quantiles"


def test_show_draws_a_new_reduction_as_its_read_side_says(quantiles_recorded, tmp_path):
    pytest.importorskip("matplotlib")
    store, want = quantiles_recorded
    from hostfeed._src.readback import draw, grid
    (panel,) = grid.load(hostfeed.open_recording(store), ["acts/h.q"])
    assert (panel.reader, panel.plot, panel.kind) == (Quantiles, "lines", "quantiles")
    np.testing.assert_allclose(panel.values, want, rtol=1e-5, atol=1e-6)  # one line per quantile
    fig = draw.figure([panel], None, legend=False)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("acts/h.q  (quantiles, 4 rows)" in t for t in texts), texts
    assert "q0.1" in texts and "q0.9" in texts  # the first and last lines, by its labels
    from hostfeed.__main__ import main
    png, out = tmp_path / "q.png", io.StringIO()
    with redirect_stdout(out):
        assert main(["show", store, "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "drew acts/h.q over 4 rows" in out.getvalue()


def test_tensorboard_exports_a_new_reduction_as_its_read_side_says(quantiles_recorded,
                                                                   tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    store, want = quantiles_recorded
    assert hostfeed.to_tensorboard(store, str(tmp_path / "logs")) == {"acts/h.q": 4}
    events = EventAccumulator(str(tmp_path / "logs"))
    events.Reload()
    labels = ["q0.1", "q0.5", "q0.9"]
    assert sorted(events.Tags()["scalars"]) == [f"acts/h.q/{q}" for q in labels]
    assert events.Tags()["histograms"] == []  # a heat map's semantics are the histogram's
    for j, q in enumerate(labels):
        got = events.Scalars(f"acts/h.q/{q}")
        assert [e.step for e in got] == [0, 1, 2, 3]
        np.testing.assert_allclose([e.value for e in got], want[:, j], rtol=1e-5, atol=1e-6)
