"""The store conformance suite: every storage back-end (the core's ``record/backend.rs``)
does what the recorder needs of a store, driven through the binding's ``Storage`` class
(the back-end itself, no Python between), as zarrs' ``store_test.rs`` does for each of its
stores. Four stores: the file system, the in-memory store (``memory://``), and the two S3
servers that ``test_object_store.py`` also starts (moto, and s3s-fs: skipped without its
binary unless ``HOSTFEED_REQUIRE_S3S=1``, as in CI).

Each case: write, read, list, overwrite, delete, a partial (byte-range) read, and the
store's lock: taken, a second taker refused naming the holder (and seen as held by
``stores.writer_open``, what ``follow`` asks), taken again once released; the same through
two ``hostfeed.Recorder``s, the second refused until the first is closed. What only the
core's store offers the recorder (fresh puts, documents, writes in place, streamed objects,
``exists``, ``create_dir``, a root prepared for each mode) is the Rust suite's
(``crates/hostfeed-core/src/record/backend/conformance.rs``, over the same back-ends); this
one checks the same back-ends through the binding."""
from __future__ import annotations

import errno
import itertools
import os

import pytest

import hostfeed
from hostfeed import _receiver
from hostfeed._src.record import stores
from hostfeed._src.record.options import options
from helpers.s3_server import serving

_fresh = itertools.count()


@pytest.fixture(scope="module", params=["fs", "memory", "moto", "s3s-fs"])
def base(request, tmp_path_factory):
    """Where the module's stores go: (prefix, url)."""
    kind = request.param
    if kind == "fs":
        yield str(tmp_path_factory.mktemp("conformance")), False
        return
    if kind == "memory":
        yield f"memory://conformance-{os.getpid()}", True
        return
    with serving(kind) as server:
        yield f"s3://{server.new_bucket()}", True


@pytest.fixture
def root(base):
    """A fresh store's root (a path or a URL) and whether it is a URL."""
    prefix, url = base
    return f"{prefix}/store{next(_fresh)}.zarr", url


def _storage(root):
    where, url = root
    return _receiver.storage.Storage(where, url=url)


def test_write_read_and_overwrite(root):
    s = _storage(root)
    s.put("g/x/c/0", b"first bytes")
    assert s.get("g/x/c/0") == b"first bytes"
    s.put("g/x/c/0", b"second")  # overwrite: a shorter object replaces a longer one
    assert s.get("g/x/c/0") == b"second"
    assert _storage(root).get("g/x/c/0") == b"second", "a second opener reads the same"
    with pytest.raises(hostfeed.RecordingError) as e:
        s.get("g/x/c/1")
    assert e.value.errno == errno.ENOENT


def test_list_names_objects_and_prefixes_below_a_key(root):
    s = _storage(root)
    assert s.list() == []
    for key in ("g/zarr.json", "g/x/c/0", "g/x/zarr.json", "g/y"):
        s.put(key, key.encode())
    assert s.list() == ["g"]
    assert s.list("g") == ["x", "y", "zarr.json"]
    assert s.list("g/x") == ["c", "zarr.json"]


def test_delete_an_object_and_everything_below_a_key(root):
    s = _storage(root)
    for key in ("d/a", "d/b/c", "d/b/d", "e"):
        s.put(key, b"x")
    s.remove("d/a")
    with pytest.raises(hostfeed.RecordingError) as e:
        s.get("d/a")
    assert e.value.errno == errno.ENOENT
    assert s.list("d") == ["b"]
    s.remove("d")
    assert s.list("d") == []
    for key in ("d/b/c", "d/b/d"):
        with pytest.raises(hostfeed.RecordingError):
            s.get(key)
    assert s.get("e") == b"x", "what is not below the key stays"


def test_a_partial_read_returns_the_range_alone(root):
    s = _storage(root)
    data = bytes(range(256)) * 5
    s.put("shard", data)
    assert s.get_range("shard", 0, 4) == data[:4]
    assert s.get_range("shard", 300, 317) == data[300:317]
    assert s.get_range("shard", len(data) - 16, len(data)) == data[-16:], "a shard's index"


def test_the_lock_is_taken_refused_and_released(root):
    first, second = _storage(root), _storage(root)
    where = stores.location(root[0])
    assert not first.is_held() and not stores.writer_open(where)
    held = first.lock()
    assert second.is_held() and stores.writer_open(where)
    with pytest.raises(hostfeed.RecordingError, match="is locked: .*hostfeed.Recorder") as e:
        second.lock()
    assert e.value.errno == errno.EBUSY
    held.release()
    assert not second.is_held() and not stores.writer_open(where)
    second.lock().release()


def test_a_second_recorder_is_refused_until_the_first_closes(root):
    where = root[0]
    rec = hostfeed.Recorder(where)
    assert stores.writer_open(stores.location(where))
    with pytest.raises(hostfeed.RecordingError, match="is locked") as e:
        hostfeed.Recorder(where, mode="w")
    assert e.value.errno == errno.EBUSY
    rec.close()
    assert not stores.writer_open(stores.location(where))
    hostfeed.Recorder(where, mode="w").close()


def test_every_message_that_lists_store_schemes_lists_them_all(tmp_path):
    # The lists come from the back-ends' registry (the binding's STORE_SCHEMES), memory://
    # among them, in Python's checks and in the binding's alike.
    listed = ", ".join(f"{s}://" for s in _receiver.storage.STORE_SCHEMES)
    assert "memory://" in listed and "s3://" in listed
    with pytest.raises(ValueError) as e:
        hostfeed.Recorder(tmp_path / "x.zarr", storage_options={"aws_region": "x"})
    assert listed in str(e.value)
    with pytest.raises(ValueError) as e:
        hostfeed.Recorder("ftp://host/r.zarr")
    assert listed in str(e.value)
    for refused in (lambda: _receiver.storage.Storage("ftp://host/r.zarr", url=True),
                    lambda: _receiver.record.Recorder("ftp://host/r.zarr", **dict(
                        options("/tmp/unused.zarr").native(), url=True))):
        with pytest.raises(ValueError) as e:
            refused()
        assert listed in str(e.value), e.value
    assert list(tmp_path.iterdir()) == []
