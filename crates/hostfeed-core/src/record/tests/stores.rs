//! The recorder's tests of where rows go: an object store, appending to a recording,
//! shards, a store the processes of a run share.

use super::*;

/// The object store flavour of the flush test: no writes into part of an object, so a
/// chunk flushed half full is put again whole (its rows read back) when it fills, and the
/// metadata chunks are put whole at every commit; a second recorder is refused while the
/// first holds the lock, and the store opens again (`mode="w"`) once it is closed.
#[test]
fn an_object_store_holds_every_flushed_row() {
    use crate::record::objects::Objects;
    use crate::record::store::Store;
    for codec in [Codec::Raw, Codec::Zstd(1)] {
        let objects = Objects::in_memory("memory:///runs/r.zarr").unwrap();
        let store: &dyn Store = &*objects;
        let root = objects.root().to_path_buf();
        let budget = Arc::new(Counter::default());
        let opts = Options { codec, chunk_bytes: 40, writers: 2, ..Options::default() };
        let rec = Recorder::create_in_objects(Arc::clone(&objects), Mode::Create, opts.clone(), budget.clone(), &Access::Exclusive)
            .unwrap();
        let again = Recorder::create_in_objects(Arc::clone(&objects), Mode::Overwrite, opts.clone(), budget.clone(), &Access::Exclusive)
            .err()
            .expect("a second recorder is refused while the first is open");
        assert!(again.to_string().contains("is locked: a hostfeed.Recorder of process"), "{again}");
        let id = rec.declare("g/x", xla::S32, &[2]).unwrap(); // 8-byte rows, 5 per chunk
        let doc = |p: &str| -> Value { serde_json::from_slice(&store.get(&root.join(p)).unwrap()).unwrap() };
        for r in 0..13u32 {
            rec.append(id, &int_row(r), r.into(), 3, 0).unwrap();
            if r == 6 || r == 7 {
                assert!(rec.flush(Duration::from_secs(30)).unwrap());
                assert_eq!(doc("g/x/zarr.json")["shape"], json!([r + 1, 2]));
                // The metadata arrays announce rows ahead (their documents put once every
                // 32,768 rows, not at every commit); readers take the data array's rows.
                assert_eq!(doc("g/x.step/zarr.json")["shape"], json!([32768]));
            }
        }
        rec.close().unwrap();
        assert_eq!(budget.held.load(Ordering::SeqCst), 0, "every row's bytes were released");
        assert!(!store.exists(&root.join(".hostfeed.lock")), "the lock object is removed at close");
        assert_eq!(doc("g/x/zarr.json")["shape"], json!([13, 2]));
        let mut got = Vec::new();
        for k in 0..3 {
            let stored = store.get(&root.join(format!("g/x/c/{k}/0"))).unwrap();
            let chunk = match codec {
                Codec::Raw => stored,
                Codec::Zstd(_) | Codec::Blosc(_) => zstd::decode_all(&stored[..]).unwrap(),
            };
            assert_eq!(chunk.len(), 40, "chunks are full size");
            got.extend_from_slice(&chunk);
        }
        got.truncate(13 * 8);
        assert_eq!(got, (0..13).flat_map(int_row).collect::<Vec<u8>>(), "{codec:?}");
        assert_eq!(doc("g/x.step/zarr.json")["chunk_grid"]["configuration"]["chunk_shape"], json!([1024]));
        assert_eq!(doc("g/x.step/zarr.json")["codecs"][1]["name"], json!("blosc"), "compressed metadata");
        for suffix in crate::record::zarr::ROW_METADATA {
            assert_eq!(doc(&format!("g/x.{suffix}/zarr.json"))["shape"], json!([13]), "closed: exact rows");
        }
        let packed = store.get(&root.join("g/x.step/c/0")).unwrap();
        assert!(packed.len() < 200, "13 steps of an 8 KiB chunk compress to {} bytes", packed.len());
        let steps = crate::record::zarr::blosc_decode(&packed).unwrap();
        assert_eq!(steps.len(), 1024 * 8);
        // A chunk of zeros (every row's transforms) is not put: it reads as the fill value.
        assert!(!store.exists(&root.join("g/x.transforms/c/0")));
        assert!(store.exists(&root.join("g/x.device/c/0")), "device 3");
        let step_values: Vec<i64> =
            steps.chunks(8).take(13).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(step_values, (0..13).collect::<Vec<i64>>());
        // Closed: the store opens again, replacing the recording.
        let next = Recorder::create_in_objects(Arc::clone(&objects), Mode::Overwrite, opts, budget.clone(), &Access::Exclusive).unwrap();
        assert!(!store.exists(&root.join("g")), "mode=\"w\" replaced the earlier recording");
        next.close().unwrap();
    }
}

/// Where a test records: a directory, or an in-memory object store (`objects`).
struct Place {
    objects: bool,
    root: PathBuf,
    mem: Arc<crate::record::objects::Objects>,
    fs: crate::record::store::FsStore,
}

impl Place {
    fn new(tag: &str, objects: bool) -> Place {
        let mem = crate::record::objects::Objects::in_memory(&format!("memory:///{tag}.zarr")).unwrap();
        Place { objects, root: temp_root(tag), mem, fs: crate::record::store::FsStore { durable: false } }
    }

    fn open(&self, mode: Mode, opts: &Options, budget: &Arc<Counter>) -> Result<Arc<Recorder>, RecordError> {
        if self.objects {
            Recorder::create_in_objects(Arc::clone(&self.mem), mode, opts.clone(), budget.clone(), &Access::Exclusive)
        } else {
            Recorder::create(&self.root, mode, opts.clone(), budget.clone())
        }
    }

    fn store(&self) -> &dyn crate::record::store::Store {
        if self.objects {
            &*self.mem
        } else {
            &self.fs
        }
    }

    /// The bytes stored at `p` below the store's root.
    fn get(&self, p: &str) -> Vec<u8> {
        let top = if self.objects { self.mem.root().to_path_buf() } else { self.root.clone() };
        self.store().get(&top.join(p)).unwrap()
    }

    fn doc(&self, p: &str) -> Value {
        serde_json::from_slice(&self.get(p)).unwrap()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// `Mode::Append`: a recording reopened goes on after its last announced row in every
/// array (record numbers after the largest); with `resume_after_step`, the rows after that
/// step are dropped first, so a job restarted from its checkpoint records each step once.
/// On a file system (raw: rows appended in place) and in an object store (zstd: a chunk
/// flushed half full is read back and put again whole).
#[test]
fn append_and_resume_record_each_step_once() {
    for objects in [false, true] {
        let place = Place::new(&format!("append_{objects}"), objects);
        let budget = Arc::new(Counter::default());
        let codec = if objects { Codec::Zstd(1) } else { Codec::Raw };
        let opts = Options { codec, chunk_bytes: 40, ..Options::default() }; // 5 rows a chunk
        let open = |mode: Mode| place.open(mode, &opts, &budget);
        let doc = |p: &str| place.doc(p);
        let values = |p: &str, rows: usize| -> Vec<i64> {
            // An object store's metadata chunks are compressed.
            let stored = if objects { crate::record::zarr::blosc_decode(&place.get(p)).unwrap() } else { place.get(p) };
            stored.chunks(8).take(rows).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
        };
        let run = |rec: &Recorder, steps: std::ops::Range<u32>, flush_at: u32| {
            let id = rec.declare("g/x", xla::S32, &[2]).unwrap();
            for s in steps {
                rec.append(id, &int_row(s), s.into(), 0, 0).unwrap();
                if s == flush_at {
                    assert!(rec.flush(Duration::from_secs(30)).unwrap());
                }
            }
        };
        // First run: steps 0..8, flushed at 6 (mid-chunk), then "preempted" after 7 with
        // its checkpoint at step 4.
        let rec = open(Mode::Create).unwrap();
        run(&rec, 0..8, 6);
        rec.close().unwrap();
        assert_eq!(doc("g/x/zarr.json")["shape"], json!([8, 2]));
        // A plain append goes on after row 8.
        let rec = open(Mode::Append { resume_after_step: None }).unwrap();
        let e = rec.declare("g/x", xla::S32, &[3]).unwrap_err();
        assert!(e.to_string().contains("was first recorded as int32 [2]"), "{e}");
        run(&rec, 8..9, 99);
        rec.close().unwrap();
        assert_eq!(doc("g/x/zarr.json")["shape"], json!([9, 2]));
        // Resumed from the checkpoint of step 4: steps 5.. are dropped, then recorded again.
        let rec = open(Mode::Append { resume_after_step: Some(4) }).unwrap();
        assert_eq!(doc("g/x/zarr.json")["shape"], json!([5, 2]), "dropped at open");
        run(&rec, 5..12, 7);
        rec.close().unwrap();
        assert_eq!(doc("g/x/zarr.json")["shape"], json!([12, 2]));
        assert_eq!(doc("g/x.step/zarr.json")["shape"], json!([12]));
        let mut rows = Vec::new();
        for k in 0..3 {
            let stored = place.get(&format!("g/x/c/{k}/0"));
            rows.extend(if objects { zstd::decode_all(&stored[..]).unwrap() } else { stored });
        }
        rows.truncate(12 * 8);
        assert_eq!(rows, (0..12).flat_map(int_row).collect::<Vec<u8>>(), "objects={objects}");
        assert_eq!(values("g/x.step/c/0", 12), (0..12).collect::<Vec<i64>>());
        // Record numbers go on after the largest kept: 0..5, then 5.. in the resumed run.
        assert_eq!(values("g/x.seq/c/0", 12), (0..12).collect::<Vec<i64>>());
    }
}

/// Sharded arrays: each chunk of 3 inner chunks (5 rows each) is one object with an index
/// at its end. On a file system uncompressed (rows and the index written in place), on a
/// file system compressed (partial shards put whole at flushes and read back when more rows
/// come) and in an object store (each shard streamed as a multipart upload, completed when
/// full or at a flush, then read back when more rows come): every row reads back, at every flush, in the middle of
/// an inner chunk and of a shard; appending to the store goes on where it stopped.
#[test]
fn sharded_arrays_hold_every_flushed_row() {
    use crate::record::shard;
    for (objects, codec) in [(false, Codec::Raw), (false, Codec::Zstd(1)), (true, Codec::Raw), (true, Codec::Zstd(1))] {
        let place = Place::new(&format!("sharded_{objects}_{codec:?}"), objects);
        let budget = Arc::new(Counter::default());
        let opts = Options { codec, chunk_bytes: 40, shard_bytes: Some(120), ..Options::default() };
        let open = |mode: Mode| place.open(mode, &opts, &budget);
        let doc = |p: &str| place.doc(p);
        let read = |rows: usize| -> Vec<u8> {
            let mut out = Vec::new();
            for k in 0..rows.div_ceil(15) {
                let stored = place.get(&format!("g/x/c/{k}/0"));
                let want = (rows - 15 * k).min(15) * 8;
                out.extend(shard::read_rows(&stored, want, 40, 3, codec).unwrap());
            }
            out
        };
        let rec = open(Mode::Create).unwrap();
        let id = rec.declare("g/x", xla::S32, &[2]).unwrap();
        let meta = doc("g/x/zarr.json");
        assert_eq!(meta["chunk_grid"]["configuration"]["chunk_shape"], json!([15, 2]));
        assert_eq!(meta["codecs"][0]["name"], json!("sharding_indexed"));
        assert_eq!(meta["codecs"][0]["configuration"]["chunk_shape"], json!([5, 2]));
        for r in 0..23u32 {
            rec.append(id, &int_row(r), r.into(), 0, 0).unwrap();
            // Mid inner chunk and mid shard; at an inner chunk's end mid shard (19: a
            // streamed shard's upload in progress with no row pending).
            if [2, 6, 7, 16, 19].contains(&r) {
                assert!(rec.flush(Duration::from_secs(30)).unwrap());
                let n = r as usize + 1;
                assert_eq!(doc("g/x/zarr.json")["shape"], json!([n, 2]));
                assert_eq!(read(n), (0..=r).flat_map(int_row).collect::<Vec<u8>>(), "{codec:?} at {r}");
            }
        }
        rec.close().unwrap();
        assert_eq!(read(23), (0..23).flat_map(int_row).collect::<Vec<u8>>(), "objects={objects} {codec:?}");
        let rec = open(Mode::Append { resume_after_step: Some(19) }).unwrap();
        for r in 20..31u32 {
            rec.append(id, &int_row(r), r.into(), 0, 0).unwrap();
        }
        rec.close().unwrap();
        assert_eq!(doc("g/x/zarr.json")["shape"], json!([31, 2]));
        assert_eq!(read(31), (0..31).flat_map(int_row).collect::<Vec<u8>>(), "appended, objects={objects} {codec:?}");
    }
}

/// The processes of one run sharing an object store: the leader takes the lock naming the
/// run, a member joins it (another run, or a store nobody holds, is refused), each writes
/// its own part of a sharded parted array (shards `c/k/part/0`), and the leader announces
/// the rows both parts have. (One in-memory store stands for the bucket both processes
/// reach.)
#[test]
fn the_processes_of_a_run_share_an_object_store() {
    use crate::record::objects::Objects;
    use crate::record::shard;
    let objects = Objects::in_memory("memory:///runs/shared.zarr").unwrap();
    let store: &dyn crate::record::store::Store = &*objects;
    let root = objects.root().to_path_buf();
    let budget = Arc::new(Counter::default());
    // 8-byte slices, 2 rows an inner chunk, 4 rows a shard.
    let opts = Options { chunk_bytes: 16, shard_bytes: Some(32), ..Options::default() };
    let open = |access: Access| Recorder::create_in_objects(Arc::clone(&objects), Mode::Create, opts.clone(), budget.clone(), &access);
    let member = |group: &str| Access::SharedMember { group: group.into() };
    let e = open(member("run-1")).err().unwrap().to_string();
    assert!(e.contains("holds no lock"), "{e}");
    let leader = open(Access::SharedLeader { group: "run-1".into() }).unwrap();
    let lock_record: Value = serde_json::from_slice(&store.get(&root.join(".hostfeed.lock")).unwrap()).unwrap();
    assert_eq!((lock_record["group"].as_str(), lock_record["access"].as_str()), (Some("run-1"), Some("shared")));
    let e = open(member("run-2")).err().unwrap().to_string();
    assert!(e.contains("locked"), "{e}");
    let e = open(Access::Exclusive).err().unwrap().to_string();
    assert!(e.contains("locked"), "{e}");
    let joined = open(member("run-1")).unwrap();
    for rec in [&leader, &joined] {
        rec.declare_parted("g/h", xla::S32, &[1, 2], 2, Arc::ptr_eq(rec, &leader)).unwrap();
    }
    let doc = |p: &str| -> Value { serde_json::from_slice(&store.get(&root.join(p)).unwrap()).unwrap() };
    let meta = doc("g/h/zarr.json");
    assert_eq!(meta["chunk_grid"]["configuration"]["chunk_shape"], json!([4, 1, 2]));
    assert_eq!(meta["codecs"][0]["configuration"]["chunk_shape"], json!([2, 1, 2]));
    let sinks = [
        Sink::parted(&leader, "g/h", Some(2), "[]").unwrap(),
        Sink::parted(&joined, "g/h", Some(2), "[]").unwrap(),
    ];
    for r in 0..6 {
        for (part, sink) in sinks.iter().enumerate() {
            let p = i32::try_from(part).unwrap();
            budget.charge(100);
            sink.route(part_message(p, &[100 * p + 2 * r, 100 * p + 2 * r + 1], r, 4 + p), 100);
        }
    }
    for rec in [&leader, &joined] {
        assert!(rec.flush(Duration::from_secs(30)).unwrap());
    }
    assert_eq!((leader.parted_rows("g/h").unwrap()[0], joined.parted_rows("g/h").unwrap()[1]), (6, 6));
    leader.commit_parted("g/h", 6).unwrap();
    assert_eq!(doc("g/h/zarr.json")["shape"], json!([6, 2, 2]));
    for part in 0..2i32 {
        let mut rows = Vec::new();
        for k in 0..2 {
            let stored = store.get(&root.join(format!("g/h/c/{k}/{part}/0"))).unwrap();
            let want = if k == 0 { 4 } else { 2 } * 8;
            rows.extend(shard::read_rows(&stored, want, 16, 2, Codec::Raw).unwrap());
        }
        let expect: Vec<u8> = (0..12).flat_map(|v: i32| (100 * part + v).to_le_bytes()).collect();
        assert_eq!(rows, expect, "part {part}");
    }
    joined.close().unwrap();
    leader.close().unwrap();
    assert!(!store.exists(&root.join(".hostfeed.lock")), "the leader releases the lock");
    assert_eq!(budget.held.load(Ordering::SeqCst), 0);
}

/// On a store that allows one update of an object every so often (Google Cloud Storage:
/// a second), flushes in quick succession wait for it: an array's `zarr.json` (and a
/// partial shard, put again) is never written twice within the interval, and nothing is
/// lost.
#[test]
fn an_object_is_updated_at_most_once_an_interval() {
    use crate::record::objects::Objects;
    use crate::record::store::Store;
    let every = Duration::from_millis(150);
    let objects = Objects::in_memory_paced("memory:///runs/paced.zarr", every).unwrap();
    let store: &dyn Store = &*objects;
    let root = objects.root().to_path_buf();
    let budget = Arc::new(Counter::default());
    let opts = Options { chunk_bytes: 40, shard_bytes: Some(120), ..Options::default() };
    let rec = Recorder::create_in_objects(Arc::clone(&objects), Mode::Create, opts, budget.clone(), &Access::Exclusive)
        .unwrap();
    let id = rec.declare("x", xla::S32, &[2]).unwrap();
    let start = Instant::now();
    for r in 0..4u32 {
        rec.append(id, &int_row(r), r.into(), 0, 0).unwrap();
        assert!(rec.flush(Duration::from_secs(30)).unwrap());
        let doc: Value = serde_json::from_slice(&store.get(&root.join("x/zarr.json")).unwrap()).unwrap();
        assert_eq!(doc["shape"], json!([r + 1, 2]));
    }
    // Four announcements of `x/zarr.json` (and four puts of its partial shard) after its
    // first write at the declaration: at least four intervals apart.
    assert!(start.elapsed() >= every * 4, "{:?}", start.elapsed());
    rec.close().unwrap();
}

/// Small rows in an object store make small objects: a shard holds at most 256 rows in
/// chunks of 32, the per-row metadata is compressed in chunks of 1,024 rows, and a
/// chunk of zeros is not put, so that 16-byte rows flushed every 1,000 rows are stored in
/// less than twice their bytes (not a chunk's padding, nor 30 bytes of metadata a row),
/// and read back whole.
#[test]
fn small_rows_flushed_often_are_stored_in_proportion_in_an_object_store() {
    use crate::record::objects::Objects;
    use crate::record::shard;
    use crate::record::store::Store;
    fn stored_bytes(store: &dyn Store, dir: &Path) -> usize {
        store
            .list(dir)
            .unwrap()
            .iter()
            .map(|p| store.get(p).map_or_else(|_| stored_bytes(store, p), |b| b.len()))
            .sum()
    }
    let objects = Objects::in_memory("memory:///runs/small.zarr").unwrap();
    let store: &dyn Store = &*objects;
    let root = objects.root().to_path_buf();
    let budget = Arc::new(Counter::default());
    let opts = Options { shard_bytes: Some(256 << 20), ..Options::default() };
    let rec = Recorder::create_in_objects(Arc::clone(&objects), Mode::Create, opts, budget.clone(), &Access::Exclusive)
        .unwrap();
    let id = rec.declare("x", xla::S32, &[4]).unwrap(); // 16-byte rows
    let doc = |p: &str| -> Value { serde_json::from_slice(&store.get(&root.join(p)).unwrap()).unwrap() };
    assert_eq!(doc("x/zarr.json")["chunk_grid"]["configuration"]["chunk_shape"], json!([256, 4]));
    assert_eq!(doc("x/zarr.json")["codecs"][0]["configuration"]["chunk_shape"], json!([32, 4]));
    let row = |r: u32| -> Vec<u8> { [r, r + 1, r + 2, r + 3].iter().flat_map(|v| v.to_le_bytes()).collect() };
    let rows = 10_000u32;
    for r in 0..rows {
        rec.append(id, &row(r), r.into(), 0, 0).unwrap();
        if r % 1000 == 999 {
            assert!(rec.flush(Duration::from_secs(30)).unwrap());
            assert_eq!(doc("x/zarr.json")["shape"], json!([r + 1, 4]));
            let ahead = doc("x.seq/zarr.json")["shape"][0].as_u64().unwrap();
            assert!(ahead >= u64::from(r + 1) && ahead % 32768 == 0, "{ahead} metadata rows announced");
        }
    }
    rec.close().unwrap();
    assert_eq!(doc("x.seq/zarr.json")["shape"], json!([rows]));
    let recorded = rows as usize * 16;
    let stored = stored_bytes(store, &root);
    assert!(stored < 2 * recorded, "{stored} bytes stored for {recorded} recorded");
    for zeros in ["device", "transforms"] {
        assert!(store.list(&root.join(format!("x.{zeros}/c"))).map_or(true, |l| l.is_empty()), "{zeros}");
    }
    let mut got = Vec::new();
    for k in 0..rows.div_ceil(256) as usize {
        let shard_bytes = store.get(&root.join(format!("x/c/{k}/0"))).unwrap();
        let want = (rows as usize - 256 * k).min(256) * 16;
        got.extend(shard::read_rows(&shard_bytes, want, 32 * 16, 8, Codec::Raw).unwrap());
    }
    assert_eq!(got, (0..rows).flat_map(row).collect::<Vec<u8>>());
}

/// With no flush, every row is announced within the commit interval (the ticker's live
/// cycles), a partial chunk included: on a file system uncompressed (appended in place),
/// compressed (the partial chunk put again whole), sharded (rows and index in place); in
/// an object store sharded (the partial shard put again), raw and compressed. A chunk made
/// visible partial and filled later reads back exactly, and so does the whole store once
/// closed.
#[test]
fn live_cycles_announce_every_row_without_a_flush() {
    use crate::record::shard;
    let cases = [
        (false, Codec::Raw, None),
        (false, Codec::Zstd(1), None),
        (false, Codec::Raw, Some(120)),
        (true, Codec::Raw, Some(120)),
        (true, Codec::Zstd(1), Some(120)),
    ];
    for (objects, codec, shard_bytes) in cases {
        let tag = format!("live_{objects}_{codec:?}_{}", shard_bytes.is_some());
        let place = Place::new(&tag, objects);
        let budget = Arc::new(Counter::default());
        let every = Duration::from_millis(100);
        // 8-byte rows: 5 a chunk; sharded, 15 a shard.
        let opts = Options { codec, chunk_bytes: 40, shard_bytes, commit_interval: every, ..Options::default() };
        let rec = place.open(Mode::Create, &opts, &budget).unwrap();
        let id = rec.declare("x", xla::S32, &[2]).unwrap();
        let read = |rows: usize| -> Vec<u8> {
            let (per_object, inner) = if shard_bytes.is_some() { (15, 3) } else { (5, 1) };
            let mut out = Vec::new();
            for k in 0..rows.div_ceil(per_object) {
                let stored = place.get(&format!("x/c/{k}/0"));
                let want = (rows - per_object * k).min(per_object) * 8;
                match (shard_bytes, codec) {
                    (Some(_), _) => out.extend(shard::read_rows(&stored, want, 40, inner, codec).unwrap()),
                    (None, Codec::Raw) => out.extend_from_slice(&stored[..want]),
                    (None, _) => out.extend_from_slice(&zstd::decode_all(&stored[..]).unwrap()[..want]),
                }
            }
            out
        };
        for r in 0..23u32 {
            rec.append(id, &int_row(r), r.into(), 0, 0).unwrap();
            // Mid chunk, at a chunk's end, mid shard, and again in a chunk shown partial.
            if [1, 3, 4, 8, 16, 17, 22].contains(&r) {
                let n = r as usize + 1;
                let deadline = Instant::now() + Duration::from_secs(30);
                while place.doc("x/zarr.json")["shape"] != json!([n, 2]) {
                    assert!(Instant::now() < deadline, "{tag}: row {r} was never announced");
                    std::thread::sleep(Duration::from_millis(5));
                }
                assert_eq!(read(n), (0..=r).flat_map(int_row).collect::<Vec<u8>>(), "{tag} at {r}");
            }
        }
        assert_eq!(rec.stats().spills, 0, "{tag}: written by the live cycles, not by spills");
        rec.close().unwrap();
        assert_eq!(read(23), (0..23).flat_map(int_row).collect::<Vec<u8>>(), "{tag}");
        assert_eq!(budget.held.load(Ordering::SeqCst), 0, "{tag}");
    }
}

/// In an object store, while rows are announced live, an object holds at most 16 KiB of
/// rows or 16 rows where that is more (a live cycle puts the object being filled again);
/// announced at flushes only (`commit_interval` unbounded), up to 256 rows as before.
#[test]
fn live_objects_hold_few_large_rows() {
    for (interval, shard, inner) in [(Duration::from_secs(30), 16, 2), (Duration::MAX, 256, 32)] {
        let place = Place::new(&format!("live_objects_{}", interval.as_secs()), true);
        let budget = Arc::new(Counter::default());
        let opts = Options { shard_bytes: Some(256 << 20), commit_interval: interval, ..Options::default() };
        let rec = place.open(Mode::Create, &opts, &budget).unwrap();
        rec.declare("kib", xla::F32, &[256]).unwrap(); // 1 KiB rows
        rec.declare("small", xla::F32, &[4]).unwrap(); // 16-byte rows: 256 either way
        let doc = place.doc("kib/zarr.json");
        assert_eq!(doc["chunk_grid"]["configuration"]["chunk_shape"], json!([shard, 256]));
        assert_eq!(doc["codecs"][0]["configuration"]["chunk_shape"], json!([inner, 256]));
        let doc = place.doc("small/zarr.json");
        assert_eq!(doc["chunk_grid"]["configuration"]["chunk_shape"], json!([256, 4]));
        rec.close().unwrap();
    }
}
