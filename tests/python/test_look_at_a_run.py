"""Looking at a run: ``python -m hostfeed show`` drawing a whole recording (the arrays
patterns choose, modules in natural order, cotangents beside their arrays, NaN marks, a
PNG or a self-contained HTML page), and ``hostfeed.to_tensorboard`` (``python -m hostfeed
tensorboard``) writing it as TensorBoard events, read back with TensorBoard's own
``EventAccumulator``: every scalar and histogram bucket equal to the store's rows, for
statistics, histograms, raw arrays, ``every=``, appended stores and a followed live store;
bad input a clear error, never a hang."""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest

import hostfeed

pytest.importorskip("zarr", reason="needs zarr-python")

STEPS = 12


def _value(s: int) -> np.ndarray:
    """A row of 3 x 8 values that changes with the step (a NaN and an inf at step 5)."""
    v = (np.arange(24, dtype=np.float32).reshape(3, 8) - 10) * (1 + s / 4)
    if s == 5:
        v[0, 0], v[1, 1] = np.nan, np.inf
    return v


@pytest.fixture
def run(tmp_path):
    """Statistics (whole and per channel), histograms (linear every 2nd step, log), a raw
    array, a top-level loss; steps 0..7 written, then 8..11 appended (``mode="a"``)."""
    path = str(tmp_path / "run.zarr")
    for mode, steps in (("w", range(8)), ("a", range(8, STEPS))):
        with hostfeed.Recorder(path, mode=mode) as rec:
            for s in steps:
                v = _value(s)
                rec.record("blocks.10/h.stats", v, step=s, reduce="stats")
                rec.record("blocks.2/h.stats", v, step=s, reduce="stats", axis=1)
                rec.record("blocks.2/h.hist", v, step=s, every=2,
                           reduce=hostfeed.Histogram(4, (-10.0, 30.0)))
                rec.record("blocks.2/h.loghist", v, step=s, reduce=hostfeed.Histogram(6))
                rec.record("blocks.2/h", v, step=s)
                rec.record("loss", np.float32(1 / (s + 1)), step=s)
    return path


# ---- the arrays chosen, and their order -------------------------------------------------
def test_patterns_choose_arrays_as_capture_matches_names_in_natural_order():
    from hostfeed._src.readback import series
    names = ["blocks.10/output", "blocks.2/output.cotangent", "blocks.2/output", "loss",
             "blocks.2.mlp/output", "head/output.stats"]
    assert series.select(names, [], "s") == [
        "loss", "blocks.2/output", "blocks.2/output.cotangent", "blocks.2.mlp/output",
        "blocks.10/output", "head/output.stats"]
    assert series.select(names, ["blocks.2"], "s") == [
        "blocks.2/output", "blocks.2/output.cotangent", "blocks.2.mlp/output"]
    assert series.select(names, ["**.cotangent", "loss"], "s") == [
        "loss", "blocks.2/output.cotangent"]
    assert series.select(names, ["blocks.*/output"], "s") == [
        "blocks.2/output", "blocks.2/output.cotangent", "blocks.10/output"]
    with pytest.raises(KeyError, match=r"no array 'blocks\.3' in s: no name matches; it has \["):
        series.select(names, ["blocks.2", "blocks.3"], "s")


def test_the_grid_puts_a_modules_arrays_side_by_side_and_wraps_without_empty_cells():
    """The arrays at the top first; then the modules in natural order, each one's arrays
    side by side (a cotangent after its array), as many whole modules a row as fit in 4
    columns, a module of more arrays wrapping onto rows of its own."""
    from hostfeed._src.readback.grid import Panel, layout
    from hostfeed._src.reductions import Stats
    from hostfeed._src.reductions.stats import COLUMNS

    def panel(name):
        return Panel(name, Stats, np.arange(3), np.zeros((3, len(COLUMNS)), np.float32), {},
                     (0, 0))

    names = ["blocks.10/out", "blocks.2/out.cotangent", "blocks.2/out", "blocks.10/hist",
             "blocks.10/out.cotangent", "loss", "grad_norm", "blocks.3/out.cotangent.stats",
             "blocks.3/out.stats", *(f"wide/a{i}" for i in range(5))]
    rows = layout([panel(n) for n in names])
    assert [[p.name for p in row] for row in rows] == [
        ["grad_norm", "loss"],
        ["blocks.2/out", "blocks.2/out.cotangent", "blocks.3/out.stats",
         "blocks.3/out.cotangent.stats"],
        ["blocks.10/hist", "blocks.10/out", "blocks.10/out.cotangent"],
        ["wide/a0", "wide/a1", "wide/a2", "wide/a3"],
        ["wide/a4"]]


def test_a_grid_too_tall_for_one_png_takes_more_columns_and_past_that_is_refused():
    """Agg draws at most 2^16 pixels a side: 400 modules of 2 arrays take more than four
    columns; 1000 of 3 would need more than sixteen and are refused, saying what to do."""
    from hostfeed._src.readback import draw
    from hostfeed._src.readback.grid import Panel
    from hostfeed._src.reductions import Stats

    def panels(modules, each):
        return [Panel(f"m.{i}/a{j}", Stats, np.arange(3), np.zeros((3, 9), np.float32), {},
                      (0, 0)) for i in range(modules) for j in range(each)]

    rows = draw._grid(panels(400, 2))
    assert max(len(r) for r in rows) > 4 and len(rows) * draw.PANEL_H < draw.MAX_HEIGHT
    assert sorted(p.name for r in rows for p in r) == sorted(p.name for p in panels(400, 2))
    with pytest.raises(ValueError, match=r"3000 arrays are too many for one picture .*: "
                                         r"choose some with patterns .* or write an HTML"):
        draw._grid(panels(1000, 3))


def test_show_reads_each_array_as_its_statistics_and_marks_nan_steps(run):
    from hostfeed._src.readback import grid, series
    rec = hostfeed.open_recording(run)
    panels = {p.name: p for p in grid.load(rec, series.select(rec.names, [], run))}
    raw, _ = hostfeed.read_recording(run, "blocks.2/h")
    per_channel, _ = hostfeed.read_recording(run, "blocks.2/h.stats")
    whole, meta = hostfeed.read_recording(run, "blocks.10/h.stats")
    for name in ("blocks.2/h", "blocks.2/h.stats", "blocks.10/h.stats"):
        p = panels[name]
        assert p.steps.tolist() == list(range(STEPS)), name
        assert p.bad_steps.tolist() == [5], name
        n = len(hostfeed.STATS)  # and no cast's counts: NaN
        np.testing.assert_allclose(p.values[:, :n], whole, rtol=2e-6, err_msg=name)
        assert np.isnan(p.values[:, n:]).all(), name
    assert per_channel.shape == (STEPS, 3, len(hostfeed.STATS))  # axis=1 reduced, 3 rows kept
    hist, hmeta = hostfeed.read_recording(run, "blocks.2/h.hist")
    assert panels["blocks.2/h.hist"].steps.tolist() == hmeta["step"].tolist() == [0, 2, 4, 6,
                                                                                   8, 10]
    np.testing.assert_array_equal(panels["blocks.2/h.hist"].values, hist)
    title = grid.header(rec.path, list(panels.values()))
    assert re.fullmatch(rf"{re.escape(rec.path)}: 6 arrays, steps 0\.\.11, written "
                        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d to [\d:\- ]+ UTC", title), title
    assert int(meta["time_ns"][-1]) >= int(meta["time_ns"][0]) > 0


def test_show_reads_large_rows_a_block_at_a_time_and_draws_arrays_without_rows(
        run, tmp_path, monkeypatch):
    from hostfeed._src.readback import draw, grid, series
    rec = hostfeed.open_recording(run)
    whole = grid.load(rec, ["blocks.2/h", "blocks.2/h.loghist"])
    monkeypatch.setattr(series, "BLOCK_BYTES", 3 * 24 * 4)  # 3 rows a read
    reads = []
    read = hostfeed.RecordedArray._read
    monkeypatch.setattr(hostfeed.RecordedArray, "_read",
                        lambda self, lo, hi: reads.append(hi - lo) or read(self, lo, hi))
    blocked = grid.load(rec, ["blocks.2/h", "blocks.2/h.loghist"])
    # raw rows of 96 bytes: 4 reads of 3; histogram rows of 32 bytes: 9, then 3
    assert sorted(reads) == [3, 3, 3, 3, 3, 9]
    np.testing.assert_array_equal(blocked[0].values, whole[0].values)
    np.testing.assert_array_equal(blocked[1].values, whole[1].values)
    # An array without rows (its rows dropped on resuming): drawn as such, exported as
    # nothing.
    empty = str(tmp_path / "empty.zarr")
    with hostfeed.Recorder(empty) as rec_w:
        rec_w.record("x", np.zeros(3, np.float32), step=9)
        rec_w.record("y", np.float32(2.0), step=7)
    hostfeed.Recorder(empty, mode="a", resume_after_step=8).close()
    panels = grid.load(hostfeed.open_recording(empty), ["x", "y"])
    assert [len(p.steps) for p in panels] == [0, 1]
    draw.draw_png(panels, "empty", str(tmp_path / "empty.png"))
    pytest.importorskip("tensorboard")
    assert hostfeed.to_tensorboard(empty, str(tmp_path / "logs")) == {"x": 0, "y": 1}


def _show(capsys, *args):
    """``python -m hostfeed show ARGS`` in this process: its exit code, stdout, stderr."""
    from hostfeed.__main__ import main
    code = main(["show", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_show_draws_the_whole_run_into_a_png_and_a_self_contained_html(run, tmp_path,
                                                                       capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    code, out, err = _show(capsys, run)  # every array, into run.png here, saying so
    assert code == 0, err
    said = out.splitlines()[-2:]
    assert said[0].startswith(f"drew 6 arrays over 66 rows into {tmp_path / 'run.png'} (")
    assert said[1].startswith("(the default without -o: the store's name")
    code, out, err = _show(capsys, run)
    assert "; the file that was there replaced)" in out.splitlines()[-2]
    from PIL import Image
    with Image.open(tmp_path / "run.png") as im:
        w, h = im.size
    assert w > 3 * 250 and h > 3 * 180, (w, h)  # 4 columns (h, h.hist, ...), 3 rows
    page = str(tmp_path / "run.html")
    code, out, err = _show(capsys, run, "blocks.2", "-o", page)
    assert code == 0, err
    assert "drew 4 arrays" in out
    with open(page, encoding="utf-8") as f:
        text = f.read()
    assert text.count("src='data:image/png;base64,") == 1  # one module: one row of panels
    assert not re.search(r"(src|href)=['\"](https?:|//)", text), "nothing fetched"
    assert "<script" not in text and "<link" not in text
    names = re.findall(r"<td><a href='#[^']*'>([^<]+)</a>", text)
    assert names == ["blocks.2/h", "blocks.2/h.hist", "blocks.2/h.loghist", "blocks.2/h.stats"]
    code, _, err = _show(capsys, run, "blocks.3")
    assert code == 2 and "no array 'blocks.3' in" in err
    code, _, err = _show(capsys, run, "-o", str(tmp_path / "run.pdf"))
    assert code == 2 and "draws into a .png or an .html file" in err


def test_the_png_is_a_dense_grid_read_at_full_size(run, tmp_path, capsys):
    """The PNG read back: its size is the grid's, a panel per array, every cell drawn
    across its width and height (rows of 1, 2 and 4 panels: no empty cell), absmax and l2 each
    on its own axis, a colour bar beside each heat map, text of 11 pixels or more, tick
    labels without offsets or float noise (a loss falling to 1e-20)."""
    pytest.importorskip("matplotlib")
    from PIL import Image
    from hostfeed._src.readback import canvas, draw, grid, series
    with hostfeed.Recorder(run, mode="a") as rec:
        for s in range(STEPS):
            rec.record("fall", np.float32(0.009 * np.exp(-s)), step=s)
    png = tmp_path / "run.png"
    code, out, err = _show(capsys, run, "-o", str(png))
    assert code == 0, err
    rec = hostfeed.open_recording(run)
    panels = grid.load(rec, series.select(rec.names, [], run))
    fig = draw.figure(panels, grid.header(rec.path, panels), legend=True)
    with Image.open(png) as im:
        assert im.size == (round(fig.get_figwidth() * canvas.DPI),
                           round(fig.get_figheight() * canvas.DPI))
        pixels = np.asarray(im.convert("RGB"), dtype=np.int16)
    cells = fig.hostfeed_cells
    assert sorted(cells) == sorted(rec.names)  # a panel per array
    rows = {}
    for x, y, w, _ in cells.values():
        rows.setdefault(round(y, 6), []).append((x, w))
    assert sorted(len(r) for r in rows.values()) == [1, 2, 4], rows  # blocks.10; fall, loss
    width = max(x + w for r in rows.values() for x, w in r) - min(x for r in rows.values()
                                                                for x, _ in r)
    for r in rows.values():  # each row's cells side by side across the whole width
        r.sort()
        assert sum(w for _, w in r) == pytest.approx(width)
        assert all(a[0] + a[1] == pytest.approx(b[0]) for a, b in itertools.pairwise(r))
    height = pixels.shape[0]
    for name, (x, y, w, h) in cells.items():
        left, top = round(x * canvas.DPI), height - round((y + h) * canvas.DPI)
        cell = pixels[top:top + round(h * canvas.DPI), left:left + round(w * canvas.DPI)]
        inked = (cell < 200).any(axis=2)  # frames, lines, text, heat maps
        assert inked.any(axis=0).mean() > 0.75 and inked.any(axis=1).mean() > 0.6, name
    texts = [t for t in fig.axes[0].texts if t.get_text()]
    assert min(t.get_fontsize() for t in texts) * canvas.DPI / 72 >= 11
    said = [t.get_text() for t in texts]
    axes = [t.get_text() for t in texts if t.get_rotation() == 90]  # the y axes' labels
    stats = [p for p in panels if p.plot == "stats" and not draw._scalar(p)]
    assert axes.count("value") == len(stats) + 2  # the loss and "fall": their values
    assert axes.count("|x|") == axes.count("l2") == len(stats) == 3  # absmax, absmin≠0
    heatmaps = [p for p in panels if p.plot == "heatmap"]
    assert len(fig.axes[0].images) == 2 * len(heatmaps) == 4  # each with its colour bar
    assert said.count("count") == len(heatmaps)
    numbers = [s for s in said if re.fullmatch(r"-?[\d.]+(e-?\d+)?", s)]
    assert "0" in numbers and len(numbers) > 40
    for s in numbers:
        assert re.fullmatch(r"0|-?\d+(\.\d+)?|-?\d(\.\d+)?e-?[1-9]\d*", s), s
        assert not re.search(r"e-?(1[0-9]|[2-9]\d)", s), s  # no 1e-13 for a zero


def _browser_tools() -> None:
    """Chromium and Tesseract (Debian's chromium, tesseract-ocr), which CI installs: a skip
    here, a failure under CI."""
    missing = [t for t in ("chromium", "tesseract") if shutil.which(t) is None]
    if missing:
        why = f"{', '.join(missing)} not on PATH (apt-get install chromium tesseract-ocr)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def test_the_html_page_opens_in_a_browser_without_network(run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _browser_tools()
    page = tmp_path / "run.html"
    code, _, err = _show(capsys, run, "-o", str(page))
    assert code == 0, err
    shot = tmp_path / "page.png"
    # Every request through a proxy that is not there: whatever the page needed from a
    # network would be missing from the screenshot.
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--user-data-dir={profile}",
                        "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
                        "--window-size=1400,2400", f"--screenshot={shot}", page.as_uri()],
                       check=True, capture_output=True, timeout=120)
    ocr = subprocess.run(["tesseract", str(shot), "stdout"], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    assert "run.zarr" in ocr and "blocks.2" in ocr, ocr  # the title and the table
    from PIL import Image
    with Image.open(shot) as im:
        rgb = np.asarray(im.convert("RGB"), dtype=np.int16)
    # The embedded plots drawn (the histograms' heat maps above all): a page whose images
    # did not load holds only text, black and a few blue links.
    colourful = (rgb.max(axis=2) - rgb.min(axis=2) > 100).sum()
    assert colourful > 20_000, (colourful, shot)


# ---- TensorBoard --------------------------------------------------------------------------
def _accumulator(logdir):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    ea = ea_mod.EventAccumulator(str(logdir), size_guidance={ea_mod.SCALARS: 0,
                                                             ea_mod.HISTOGRAMS: 0})
    ea.Reload()
    return ea


def _stats_reference(v: np.ndarray) -> list[float]:
    """numpy's statistics of one raw row (hostfeed.STATS)."""
    from helpers.stats_reference import stats_of
    return stats_of(v)


def test_tensorboard_scalars_and_histograms_equal_the_stores_rows(run, tmp_path):
    pytest.importorskip("tensorboard")
    logdir = tmp_path / "logs"
    exported = hostfeed.to_tensorboard(run, str(logdir))
    assert exported == {"blocks.2/h": STEPS, "blocks.2/h.hist": 6, "blocks.2/h.loghist": STEPS,
                        "blocks.2/h.stats": STEPS, "blocks.10/h.stats": STEPS, "loss": STEPS}
    ea = _accumulator(logdir)
    # hostfeed's event file checksums its records as TensorBoard's own writer does
    from hostfeed._src.readback import tensorboard as tb
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    assert all(tb._masked_crc()(b) == masked_crc32c(b) for b in (b"", b"hostfeed" * 99))
    stats, meta = hostfeed.read_recording(run, "blocks.10/h.stats")
    # The NaN and infinity counts change at step 5 (0 before and after it): written from
    # there on, the steps before it as a flat line from its first to its last row. The
    # count never changes: no tag.
    assert not [t for t in ea.Tags()["scalars"] if t.endswith("/count")]
    rows = {col: [0, 4, *range(5, STEPS)] if col in ("nan_count", "inf_count")
            else list(range(STEPS)) for col in hostfeed.STATS if col != "count"}
    for col, kept in rows.items():
        j = hostfeed.STATS.index(col)
        got = ea.Scalars(f"blocks.10/h.stats/{col}")
        assert [e.step for e in got] == meta["step"][kept].tolist(), col
        np.testing.assert_array_equal([e.value for e in got], stats[kept, j], err_msg=col)
        assert [e.wall_time for e in got] == pytest.approx(meta["time_ns"][kept] / 1e9,
                                                           abs=1e-6)
        # per-channel statistics (axis=1 kept): one row of statistics each, pooled
        pooled = [e.value for e in ea.Scalars(f"blocks.2/h.stats/{col}")]
        np.testing.assert_allclose(pooled, stats[kept, j], rtol=2e-6, err_msg=col)
        # the raw array: numpy's statistics of each row
        raw = [e.value for e in ea.Scalars(f"blocks.2/h/{col}")]
        want = [_stats_reference(_value(s))[j] for s in kept]
        np.testing.assert_allclose(raw, np.float32(want), rtol=2e-6, err_msg=col)
    for name, log in (("blocks.2/h.hist", False), ("blocks.2/h.loghist", True)):
        rows, hmeta = hostfeed.read_recording(run, name)
        edges = hostfeed.open_recording(run)[name].attrs["reduce"]["edges"]
        got = ea.Histograms(name)
        assert [e.step for e in got] == hmeta["step"].tolist()
        for e, row in zip(got, rows):
            h = e.histogram_value
            assert h.bucket == row.astype(float).tolist()  # below, bins, above
            assert h.bucket_limit[:-1] == edges and h.num == row.sum()
            assert h.bucket_limit[-1] == (2 * edges[-1] if log else
                                          edges[-1] + edges[-1] - edges[-2])
    for e, s in zip(ea.Histograms("blocks.2/h"), range(STEPS)):
        v = _value(s)
        f = v[np.isfinite(v)].astype(np.float64)
        counts, bins = np.histogram(f, bins=np.linspace(f.min(), f.max(), 31))
        h = e.histogram_value
        assert e.step == s and h.bucket == counts.tolist() and h.bucket_limit == \
            bins[1:].tolist() and (h.min, h.max) == (f.min(), f.max()), s
    # a raw scalar is itself
    assert [e.value for e in ea.Scalars("loss")] == \
        np.float32([1 / (s + 1) for s in range(STEPS)]).tolist()
    assert "loss" not in ea.Tags()["histograms"] and "loss/mean" not in ea.Tags()["scalars"]


def test_tensorboard_writes_count_nan_and_inf_tags_only_where_they_change(tmp_path,
                                                                         monkeypatch):
    """Five layers' statistics and a loss: six scalars an array and the loss, no flat line
    of counts; the one NaN, at step 7, read in a later block than the steps before it (a
    block at a time, as a followed store's rows come): its count from step 7 on, the steps
    before it as the flat line from the first to the last."""
    pytest.importorskip("tensorboard")
    from hostfeed._src.readback import tensorboard as tb
    monkeypatch.setattr(tb, "BLOCK_ROWS", 4)
    path = str(tmp_path / "run.zarr")
    with hostfeed.Recorder(path, mode="w") as rec:
        for s in range(10):
            for layer in range(5):
                v = np.linspace(-1, 1, 8, dtype=np.float32) * (layer + 1) / (s + 1)
                if (layer, s) == (4, 7):
                    v[2] = np.nan
                rec.record(f"blocks.{layer}/output.stats", v, step=s, reduce="stats")
            rec.record("loss", np.float32(1 / (s + 1)), step=s)
    hostfeed.to_tensorboard(path, str(tmp_path / "logs"))
    ea = _accumulator(tmp_path / "logs")
    # (zeros: none in these rows, so quiet too; the dynamic range comes with absmin≠0)
    plain = ("mean", "std", "min", "max", "absmax", "l2", "l1", "absmin_nonzero",
             "dynamic_range_bits")
    assert sorted(ea.Tags()["scalars"]) == sorted(
        ["loss", "blocks.4/output.stats/nan_count",
         *(f"blocks.{layer}/output.stats/{c}" for layer in range(5) for c in plain)])
    assert [(e.step, e.value) for e in ea.Scalars("blocks.4/output.stats/nan_count")] == [
        (0, 0.0), (6, 0.0), (7, 1.0), (8, 0.0), (9, 0.0)]
    assert [e.step for e in ea.Scalars("blocks.4/output.stats/mean")] == list(range(10))


def test_tensorboard_follows_a_live_store_until_its_recorder_closes(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from hostfeed._src.readback import tensorboard as tb
    path, logdir = str(tmp_path / "live.zarr"), str(tmp_path / "logs")
    seen = {"rows": 0}
    cond = threading.Condition()
    write = tb._Exporter.write

    def counting(self, name, *args):
        write(self, name, *args)
        with cond:
            seen["rows"] = sum(self.rows.values())
            cond.notify_all()

    monkeypatch.setattr(tb._Exporter, "write", counting)
    result: dict = {}

    def follower():
        try:
            result["rows"] = hostfeed.to_tensorboard(path, logdir, follow=True, poll=0.01,
                                                     timeout=120)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            result["error"] = exc

    thread = threading.Thread(target=follower)
    thread.start()  # before the store exists: the follower waits for it
    rec = hostfeed.Recorder(path, mode="w", chunk_bytes=64)
    for block in range(3):
        for s in range(block * 5, block * 5 + 5):
            rec.record("x", np.full(4, s, np.float32), step=10 * s)
        rec.flush()
        with cond:  # the follower wrote these rows while the recorder holds the store
            assert cond.wait_for(lambda b=block: seen["rows"] >= 5 * b + 5, timeout=60)
    assert thread.is_alive(), "the follower goes on while the recorder holds the store"
    rec.close()
    thread.join(60)
    assert not thread.is_alive() and "error" not in result, result
    assert result["rows"] == {"x": 15}
    got = _accumulator(logdir).Scalars("x/mean")
    assert [(e.step, e.value) for e in got] == [(10 * s, float(s)) for s in range(15)]


def test_tensorboard_refuses_bad_input_with_clear_errors(run, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    zarr = pytest.importorskip("zarr")
    other = zarr.open_group(str(tmp_path / "other.zarr"), mode="w")
    other.create_array("a", shape=(3,), dtype="f4")
    with pytest.raises(ValueError, match="'a' .* was not recorded by hostfeed"):
        hostfeed.to_tensorboard(str(tmp_path / "other.zarr"), str(tmp_path / "l1"))
    with pytest.raises(FileNotFoundError, match="no recording at"):
        hostfeed.to_tensorboard(str(tmp_path / "nothing.zarr"), str(tmp_path / "l2"))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="no recording at"):
        hostfeed.to_tensorboard(str(tmp_path / "plain"), str(tmp_path / "l2"))
    with pytest.raises(ValueError, match="is not a recording"):  # at once, not a wait
        hostfeed.to_tensorboard(str(tmp_path / "plain"), str(tmp_path / "l2b"), follow=True,
                                poll=0.01)
    with pytest.raises(KeyError, match="no array 'blocks.3' in"):
        hostfeed.to_tensorboard(run, str(tmp_path / "l3"), ["blocks.3"])
    (tmp_path / "a_file").write_text("")
    with pytest.raises(OSError, match="cannot make the log directory"):
        hostfeed.to_tensorboard(run, str(tmp_path / "a_file" / "logs"))
    hostfeed.to_tensorboard(run, str(tmp_path / "l4"), ["loss"])
    with pytest.raises(FileExistsError, match="holds event files already"):
        hostfeed.to_tensorboard(run, str(tmp_path / "l4"), ["loss"])
    with pytest.raises(TimeoutError, match="no writer closed the store"):
        hostfeed.to_tensorboard(str(tmp_path / "never.zarr"), str(tmp_path / "l5"),
                                follow=True, poll=0.01, timeout=0.2)
    # A store deleted while it is followed (its recorder still open) is an error at once.
    from hostfeed._src.readback import tensorboard as tb
    live = str(tmp_path / "deleted.zarr")
    rec = hostfeed.Recorder(live, mode="w", chunk_bytes=64)
    rec.record("x", np.zeros(4, np.float32), step=0)
    rec.flush()
    write = tb._Exporter.write

    def then_delete(self, name, *args):
        write(self, name, *args)
        shutil.rmtree(live)

    monkeypatch.setattr(tb._Exporter, "write", then_delete)
    with pytest.raises(FileNotFoundError, match="deleted while it was followed"):
        hostfeed.to_tensorboard(live, str(tmp_path / "l6"), follow=True, poll=0.01,
                                timeout=60)
    # Its store is gone: whether a write was left to fail is not this test's concern.
    with contextlib.suppress(hostfeed.RecordingError):
        rec.close()


def test_the_tensorboard_command_writes_the_events_and_says_how_to_look(run, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    logdir = str(tmp_path / "logs")
    cmd = [sys.executable, "-m", "hostfeed", "tensorboard", run, logdir, "loss", "**.hist"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr
    assert f"wrote {STEPS + 6} rows of 2 arrays into {logdir}" in r.stdout
    assert f"tensorboard --logdir {logdir}" in r.stdout
    assert sorted(_accumulator(logdir).Tags()["histograms"]) == ["blocks.2/h.hist"]
    from hostfeed.__main__ import main
    assert main(cmd[3:]) == 2  # again, in this process: refused
    assert "holds event files already" in capsys.readouterr().err


def test_the_tensorboard_server_serves_the_exported_scalars_and_histograms(run, tmp_path):
    """TensorBoard itself (its server on 127.0.0.1, a free port) reads the export: the
    scalars and the histograms its HTTP data API serves are the store's rows."""
    pytest.importorskip("tensorboard")
    import json
    import socket
    import time
    import urllib.parse
    import urllib.request

    logdir = str(tmp_path / "logs")
    hostfeed.to_tensorboard(run, logdir, ["blocks.10", "blocks.2/h.hist"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1",
         "--port", str(port), "--load_fast", "false", "--reload_interval", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(route, **query):
        url = f"http://127.0.0.1:{port}/data/{route}?{urllib.parse.urlencode(query)}"
        with opener.open(url, timeout=10) as r:
            return json.loads(r.read())

    try:
        deadline = time.monotonic() + 120
        while True:  # until the server answers with every row (it loads in the background)
            assert server.poll() is None, server.communicate()[0]
            try:
                scalars = get("plugin/scalars/scalars", run=".", tag="blocks.10/h.stats/l2")
                if len(scalars) == STEPS:
                    break
            except OSError:
                pass  # not listening yet, or the tag not loaded yet
            assert time.monotonic() < deadline, "TensorBoard served no scalars in 120 s"
            time.sleep(0.2)
        stats, meta = hostfeed.read_recording(run, "blocks.10/h.stats")
        assert [(step, value) for _, step, value in scalars] == \
            [(int(s), float(v)) for s, v in zip(meta["step"], stats[:, 6])]
        rows, hmeta = hostfeed.read_recording(run, "blocks.2/h.hist")
        edges = hostfeed.open_recording(run)["blocks.2/h.hist"].attrs["reduce"]["edges"]
        lefts = [edges[0] - (edges[1] - edges[0]), *edges]
        rights = [*edges, edges[-1] + edges[-1] - edges[-2]]
        served = get("plugin/histograms/histograms", run=".", tag="blocks.2/h.hist")
        assert [step for _, step, _ in served] == hmeta["step"].tolist()
        for (_, _, buckets), row in zip(served, rows):
            full = np.nonzero(row)[0]  # TensorBoard leaves out empty buckets at the ends
            want = [[lefts[i], rights[i], float(row[i])]
                    for i in range(full[0], full[-1] + 1)]
            assert buckets == want
    finally:
        server.kill()
        server.communicate()
