//! The recorder's tests.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::error::RecordError;
use crate::ffi::c_api::dtype as xla;
use crate::host::message::Message;
use crate::host::sync::lock;
use crate::record::zarr::Codec;

use crate::host::message::{gather, Operand};
use crate::record::arrays::*;
use crate::record::common::*;
use crate::record::recorder::*;
use crate::record::sinks::Sink;
use crate::record::store::write_all_vectored_at;
use crate::record::storelock::Access;
use crate::record::writer::PoolState;

/// A budget that counts.
#[derive(Default)]
struct Counter {
    held: AtomicUsize,
    waiting: AtomicBool,
    notes: Mutex<Vec<String>>,
}

impl Budget for Counter {
    fn charge(&self, bytes: usize) {
        self.held.fetch_add(bytes, Ordering::SeqCst);
    }
    fn release(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::SeqCst);
    }
    fn bound(&self) -> usize {
        1 << 20
    }
    fn producers_waiting(&self) -> bool {
        self.waiting.load(Ordering::SeqCst)
    }
    fn note(&self, text: String) {
        lock(&self.notes).push(text);
    }
}

fn temp_root(tag: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("hostfeed_rec_{tag}_{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    root
}

/// A recorder creating a new store at `root` (`Mode::Create`), default options.
fn create_new(root: &Path) -> Result<Arc<Recorder>, RecordError> {
    Recorder::create(root, Mode::Create, Options::default(), Arc::new(Counter::default()))
}

fn json_at(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path.join("zarr.json")).unwrap()).unwrap()
}

fn int_row(r: u32) -> Vec<u8> {
    [r, r + 100].iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Reads `rows` rows of `row_bytes` from the uncompressed chunks of `dir`.
fn read_raw_rows(dir: &Path, rows: usize, row_bytes: usize, chunk_rows: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut k = 0;
    while out.len() / row_bytes < rows {
        let bytes = fs::read(dir.join(format!("c/{k}/0"))).unwrap();
        assert_eq!(bytes.len(), row_bytes * chunk_rows, "chunks are full size");
        out.extend_from_slice(&bytes);
        k += 1;
    }
    out.truncate(rows * row_bytes);
    out
}

fn read_zstd_rows(dir: &Path, rows: usize, row_bytes: usize, chunk_rows: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut k = 0;
    while out.len() / row_bytes < rows {
        let bytes = zstd::decode_all(File::open(dir.join(format!("c/{k}/0"))).unwrap()).unwrap();
        assert_eq!(bytes.len(), row_bytes * chunk_rows, "chunks are full size");
        out.extend_from_slice(&bytes);
        k += 1;
    }
    out.truncate(rows * row_bytes);
    out
}

#[test]
fn rows_survive_flushes_in_the_middle_of_a_chunk() {
    for codec in [Codec::Raw, Codec::Zstd(1)] {
        let root = temp_root(&format!("flush_{codec:?}"));
        let budget = Arc::new(Counter::default());
        let opts = Options { codec, chunk_bytes: 40, writers: 2, ..Options::default() };
        let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
        let id = rec.declare("g/x", xla::S32, &[2]).unwrap(); // 8-byte rows, 5 per chunk
        for r in 0..13u32 {
            rec.append(id, &int_row(r), r.into(), 3, 0).unwrap();
            if r == 6 || r == 7 {
                assert!(rec.flush(Duration::from_secs(30)).unwrap());
                assert_eq!(json_at(&root.join("g/x"))["shape"], json!([r + 1, 2]));
            }
        }
        rec.close().unwrap();
        assert_eq!(budget.held.load(Ordering::SeqCst), 0, "every row's bytes were released");
        assert_eq!(json_at(&root.join("g/x"))["shape"], json!([13, 2]));
        let want: Vec<u8> = (0..13).flat_map(int_row).collect();
        let got = match codec {
            Codec::Raw => read_raw_rows(&root.join("g/x"), 13, 8, 5),
            Codec::Zstd(_) | Codec::Blosc(_) => read_zstd_rows(&root.join("g/x"), 13, 8, 5),
        };
        assert_eq!(got, want, "{codec:?}");
        let steps = json_at(&root.join("g/x.step"));
        assert_eq!(steps["shape"], json!([13]));
        let step_bytes = fs::read(root.join("g/x.step/c/0")).unwrap();
        let step_values: Vec<i64> =
            step_bytes.chunks(8).take(13).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(step_values, (0..13).collect::<Vec<i64>>());
        let device = fs::read(root.join("g/x.device/c/0")).unwrap();
        assert_eq!(&device[..8], &[3, 0, 0, 0, 3, 0, 0, 0]);
        assert!(rec.append(id, &int_row(0), 0, 0, 0).is_err(), "closed");
        let _ = fs::remove_dir_all(&root);
    }
}

#[test]
fn rows_are_counted_per_array_and_axis_names_kept_in_its_attributes_across_an_append() {
    let root = temp_root("rows_axes");
    let rec = create_new(&root).unwrap();
    rec.describe_axes("g/a", r#"["batch", "embed"]"#).unwrap();
    assert!(rec.describe_axes("g/a", r#"{"batch": 2}"#).is_err(), "not an array of names");
    assert!(rec.describe_axes("g/a", r#"["batch", 2]"#).is_err(), "not an array of names");
    let a = rec.declare("g/a", xla::S32, &[2]).unwrap();
    let b = rec.declare("g/b", xla::S32, &[2]).unwrap();
    assert_eq!((rec.rows_received("g/a"), rec.rows_received("nope")), (Some(0), None));
    for r in 0..3u32 {
        rec.append(a, &int_row(r), r.into(), 0, 0).unwrap();
    }
    rec.append(b, &int_row(9), 0, 0, 0).unwrap();
    assert_eq!((rec.rows_received("g/a"), rec.rows_received("g/b")), (Some(3), Some(1)));
    rec.close().unwrap();
    assert_eq!(json_at(&root.join("g/a"))["attributes"]["hostfeed"]["axes"], json!(["batch", "embed"]));
    assert!(json_at(&root.join("g/b"))["attributes"]["hostfeed"].get("axes").is_none());
    let append = Mode::Append { resume_after_step: None };
    let rec = Recorder::create(&root, append, Options::default(), Arc::new(Counter::default())).unwrap();
    assert_eq!(rec.rows_received("g/a"), Some(3), "a resumed array counts the rows it holds");
    let b = rec.declare("g/b", xla::S32, &[2]).unwrap();
    rec.append(b, &int_row(10), 1, 0, 0).unwrap();
    rec.close().unwrap();
    assert_eq!(json_at(&root.join("g/a"))["attributes"]["hostfeed"]["axes"], json!(["batch", "embed"]));
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn rows_that_reach_a_closed_recorder_are_counted_for_the_program() {
    let root = temp_root("late");
    let rec = create_new(&root).unwrap();
    let id = rec.declare("g/late", xla::S32, &[2]).unwrap();
    rec.append(id, &int_row(0), 0, 0, 0).unwrap();
    rec.close().unwrap();
    for r in 1..3u32 {
        assert!(matches!(rec.append(id, &int_row(r), r.into(), 0, 0), Err(RecordError::Closed(_))));
    }
    let store = root.display().to_string();
    // (Other tests' recorders may be in the list too: only this store's entry is checked.)
    let late: Vec<_> = take_late_drops().into_iter().filter(|d| d.store == store).collect();
    assert_eq!(late, vec![LateDrop { store: store.clone(), array: "g/late".into(), rows: 2 }]);
    assert!(take_late_drops().iter().all(|d| d.store != store), "taken once");
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn flat_keys_with_zstd_and_many_writers_keep_every_flushed_row() {
    // Flushes in the middle of chunks: a compressed chunk is rewritten (its flushed
    // prefix read back) while the next chunk's partial copy is written by another
    // writer; with `.` keys of scalar rows both once went through one `c.tmp`.
    for (codec, sep) in [(Codec::Zstd(1), '.'), (Codec::Zstd(1), '/'), (Codec::Raw, '.')] {
        let root = temp_root(&format!("flat_{codec:?}_{}", sep == '.'));
        let budget = Arc::new(Counter::default());
        let opts = Options { codec, chunk_bytes: 16, writers: 4, sep, ..Options::default() };
        let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
        let ids: Vec<ArrayId> =
            (0..3).map(|k| rec.declare(&format!("a{k}"), xla::S32, &[]).unwrap()).collect();
        let rows = 600u32;
        for r in 0..rows {
            for (k, &id) in ids.iter().enumerate() {
                let v = r * 10 + u32::try_from(k).unwrap();
                rec.append(id, &v.to_le_bytes(), r.into(), 0, 0).unwrap();
            }
            if r % 3 == 2 {
                assert!(rec.flush(Duration::from_secs(60)).unwrap(), "{codec:?} {sep}");
            }
        }
        rec.close().unwrap();
        for (k, _) in ids.iter().enumerate() {
            let dir = root.join(format!("a{k}"));
            assert_eq!(json_at(&dir)["shape"], json!([rows]));
            let mut got = Vec::new();
            for c in 0..rows.div_ceil(4) {
                let name = if sep == '.' { format!("c.{c}") } else { format!("c/{c}") };
                let bytes = fs::read(dir.join(name)).unwrap();
                let bytes = match codec {
                    Codec::Raw => bytes,
                    Codec::Zstd(_) | Codec::Blosc(_) => zstd::decode_all(&bytes[..]).unwrap(),
                };
                got.extend_from_slice(&bytes);
            }
            let want: Vec<u8> =
                (0..rows).flat_map(|r| (r * 10 + u32::try_from(k).unwrap()).to_le_bytes()).collect();
            assert_eq!(&got[..want.len()], &want[..], "{codec:?} {sep} a{k}");
            let tmp = fs::read_dir(&dir)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp"))
                .count();
            assert_eq!(tmp, 0, "no temporary file is left");
        }
        let _ = fs::remove_dir_all(&root);
    }
}

#[test]
fn an_open_store_is_locked_and_a_refused_open_changes_nothing() {
    let root = temp_root("locked");
    let first = create_new(&root).unwrap();
    let x = first.declare("x", xla::S32, &[2]).unwrap();
    first.append(x, &int_row(1), 0, 0, 0).unwrap();
    assert!(first.flush(Duration::from_secs(30)).unwrap());
    for mode in [Mode::Overwrite, Mode::Create] {
        let Err(e) = Recorder::create(&root, mode, Options::default(), Arc::new(Counter::default())) else {
            panic!("a second open of an open store must fail")
        };
        assert!(matches!(e, RecordError::Io { errno: Some(libc::EBUSY), .. }), "{e}");
        assert!(e.to_string().contains(&format!("pid {}", std::process::id())), "{e}");
    }
    assert_eq!(json_at(&root.join("x"))["shape"], json!([1, 2]), "the first store is intact");
    first.close().unwrap();
    Recorder::create(&root, Mode::Overwrite, Options::default(), Arc::new(Counter::default()))
        .unwrap()
        .close()
        .unwrap();
    assert!(!root.join("x").exists());
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn names_that_would_make_too_long_paths_are_refused_before_creating() {
    let mut root = std::env::temp_dir().join(format!("hostfeed_rec_long_{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let top = root.clone();
    for _ in 0..19 {
        root.push("d".repeat(200));
    }
    let rec = create_new(&root).unwrap();
    let name = ["n".repeat(150), "n".repeat(150)].join("/");
    let e = rec.declare(&name, xla::F32, &[3]).unwrap_err();
    assert!(matches!(e, RecordError::Invalid(_)) && e.to_string().contains("4096"), "{e}");
    assert!(!root.join("n".repeat(150)).exists());
    rec.close().unwrap();
    let _ = fs::remove_dir_all(&top);
}

#[test]
fn many_names_are_indexed() {
    let root = temp_root("many");
    let rec = create_new(&root).unwrap();
    for k in 0..200 {
        assert_eq!(rec.declare(&format!("g{}/n{k}", k % 7), xla::F32, &[]).unwrap(), k);
    }
    assert_eq!(rec.declare("g3/n3", xla::F32, &[]).unwrap(), 3);
    assert!(rec.declare("g3", xla::F32, &[]).unwrap_err().to_string().contains("clashes with \"g3/"));
    assert!(rec
        .declare("g3/n3/z", xla::F32, &[])
        .unwrap_err()
        .to_string()
        .contains("clashes with \"g3/n3\""));
    rec.close().unwrap();
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn declarations_clash_with_another_shape_dtype_or_group() {
    let root = temp_root("clash");
    let rec = create_new(&root).unwrap();
    let a = rec.declare("l/h", xla::F32, &[3]).unwrap();
    assert_eq!(rec.declare("l/h", xla::F32, &[3]).unwrap(), a);
    let e = rec.declare("l/h", xla::F32, &[4]).unwrap_err().to_string();
    assert!(e.contains("first recorded as float32 [3], now as float32 [4]"), "{e}");
    assert!(rec.declare("l/h", xla::BF16, &[3]).is_err());
    assert!(rec.declare("l", xla::F32, &[3]).is_err());
    assert!(rec.declare("l/h/z", xla::F32, &[3]).is_err());
    assert!(rec.declare("l/h.step", xla::F32, &[3]).is_err());
    assert!(matches!(rec.declare("q", xla::U4, &[3]), Err(RecordError::Dtype(_))));
    rec.close().unwrap();
    assert!(matches!(rec.declare("m", xla::F32, &[]), Err(RecordError::Closed(_))));
    // The path now holds a recording: creating again fails, overwriting works.
    let again = create_new(&root);
    assert!(matches!(again, Err(RecordError::Io { errno: Some(libc::EEXIST), .. })));
    let over =
        Recorder::create(&root, Mode::Overwrite, Options::default(), Arc::new(Counter::default())).unwrap();
    over.close().unwrap();
    assert!(!root.join("l").exists());
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn overwrite_refuses_what_is_not_a_recording() {
    let root = temp_root("not_a_recording");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("precious.txt"), b"keep").unwrap();
    let r = Recorder::create(&root, Mode::Overwrite, Options::default(), Arc::new(Counter::default()));
    assert!(r.is_err());
    assert!(root.join("precious.txt").exists());
    let _ = fs::remove_dir_all(&root);
}

fn message(consumer_id: i64, values: &[i32], step: i32, device: i32) -> Message {
    let ops = [
        Operand { dtype: xla::S32, data: values.as_ptr().cast(), dims: &[2] },
        Operand { dtype: xla::S32, data: std::ptr::from_ref(&step).cast(), dims: &[] },
    ];
    // SAFETY: both operands point at live locals of the described sizes.
    unsafe { gather(consumer_id, 0, device, ops.iter().copied()) }.unwrap()
}

#[test]
fn a_sink_routes_messages_without_copying_and_releases_after_writing() {
    let root = temp_root("sink");
    let budget = Arc::new(Counter::default());
    let opts = Options { chunk_bytes: 8 * 4, ..Options::default() };
    let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
    let x = rec.declare("x", xla::S32, &[2]).unwrap();
    let sink = Sink::new(&rec, &[Some(x), None], Some(1), r#"[["batch", {"batch_dims": [0]}]]"#, 1).unwrap();
    assert_eq!(sink.transforms(), 1);
    for i in 0..6 {
        let msg = message(7, &[i, -i], 10 * i, 1);
        budget.charge(100);
        sink.route(msg, 100);
    }
    // A full chunk (4 rows) goes to the writer by itself; 2 rows wait for a flush.
    assert!(rec.flush(Duration::from_secs(30)).unwrap());
    assert_eq!(budget.held.load(Ordering::SeqCst), 0);
    let got = read_raw_rows(&root.join("x"), 6, 8, 4);
    let want: Vec<u8> = (0..6).flat_map(|i: i32| [i, -i]).flat_map(i32::to_le_bytes).collect();
    assert_eq!(got, want);
    let meta = json_at(&root.join("x"));
    assert_eq!(meta["attributes"]["hostfeed"]["transforms"][1], json!([["batch", {"batch_dims": [0]}]]));
    let steps = fs::read(root.join("x.step/c/0")).unwrap();
    assert_eq!(i64::from_le_bytes(steps[40..48].try_into().unwrap()), 50);
    let tr = fs::read(root.join("x.transforms/c/0")).unwrap();
    assert_eq!(&tr[..4], &[1, 0, 1, 0]);
    rec.close().unwrap();
    // Rows after close are dropped, released and noted.
    budget.charge(100);
    sink.route(message(7, &[1, 1], 0, 0), 100);
    assert_eq!(budget.held.load(Ordering::SeqCst), 0);
    assert_eq!(lock(&budget.notes).len(), 1);
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn partial_chunks_are_spilled_when_producers_wait_and_writers_idle() {
    let root = temp_root("pressure");
    let budget = Arc::new(Counter::default());
    let opts = Options { chunk_bytes: 1 << 20, ..Options::default() };
    let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
    let x = rec.declare("x", xla::U8, &[1000]).unwrap(); // 256 rows per chunk (bound / 4)
    rec.append(x, &[7u8; 1000], 0, 0, 0).unwrap();
    assert!(budget.held.load(Ordering::SeqCst) >= 1000, "the pending row holds its bytes");
    budget.waiting.store(true, Ordering::SeqCst);
    // The ticker notices and writes the partial chunk; no flush is involved.
    let deadline = Instant::now() + Duration::from_secs(30);
    while budget.held.load(Ordering::SeqCst) != 0 {
        assert!(Instant::now() < deadline, "the pending row was never written");
        std::thread::yield_now();
    }
    assert!(rec.stats().spills >= 1);
    rec.close().unwrap();
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn write_errors_are_reported_once_and_later_rows_dropped() {
    let root = temp_root("errors");
    let budget = Arc::new(Counter::default());
    let opts = Options { chunk_bytes: 8, ..Options::default() };
    let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
    let x = rec.declare("x", xla::S32, &[2]).unwrap();
    // A file where the chunk directory must go: every chunk write fails.
    fs::write(root.join("x/c"), b"in the way").unwrap();
    rec.append(x, &int_row(1), 0, 0, 0).unwrap();
    let e = rec.flush(Duration::from_secs(30)).unwrap_err();
    assert!(matches!(e, RecordError::Io { .. }), "{e}");
    assert!(e.to_string().contains("recording \"x\""), "{e}");
    rec.append(x, &int_row(2), 0, 0, 0).unwrap();
    let e = rec.flush(Duration::from_secs(30)).unwrap_err();
    // The same error type every time (a later flush is no ValueError), naming the array.
    assert!(matches!(e, RecordError::Io { errno: Some(_), .. }), "{e}");
    assert!(e.to_string().contains("recording \"x\": 1 more row(s) were dropped"), "{e}");
    assert!(rec.flush(Duration::from_secs(30)).unwrap());
    rec.close().unwrap();
    assert_eq!(budget.held.load(Ordering::SeqCst), 0);
    assert_eq!(json_at(&root.join("x"))["shape"], json!([0, 2]), "nothing is announced");
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn vectored_writes_cover_many_and_empty_buffers() {
    let root = temp_root("vectored");
    fs::create_dir_all(&root).unwrap();
    let path = root.join("f");
    let rows: Vec<Vec<u8>> =
        (0..2500u32).map(|i| if i % 7 == 0 { Vec::new() } else { i.to_le_bytes().to_vec() }).collect();
    let slices: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
    let f = OpenOptions::new().write(true).create(true).truncate(false).open(&path).unwrap();
    write_all_vectored_at(&f, &slices, 3).unwrap();
    let got = fs::read(&path).unwrap();
    assert_eq!(&got[..3], &[0, 0, 0]);
    assert_eq!(got[3..], rows.concat());
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn jobs_of_one_chunk_run_in_order() {
    let mut p = PoolState::default();
    let a = Arc::new(ArrayHandle {
        meta_chunk_rows: META_CHUNK_ROWS,
        meta_codec: Codec::Raw,
        id: 0,
        name: "a".into(),
        dir: PathBuf::new(),
        group_dir: PathBuf::new(),
        leaf: "a".into(),
        spec: meta_specs("a", crate::record::arrays::META_CHUNK_ROWS, Codec::Raw).next().unwrap().1,
        state: Mutex::new(ArrayState::new()),
    });
    let job = |chunk, first_row| Job {
        array: Arc::clone(&a),
        chunk,
        first_row,
        rows: Vec::new(),
        partial: false,
        disk_prefix: 0,
    };
    for j in [job(0, 0), job(0, 3), job(1, 10)] {
        p.push(j);
    }
    assert_eq!(p.next_job().map(|j| j.first_row), Some(0));
    // Chunk 0 is being written: its second job waits, chunk 1 goes ahead.
    assert_eq!(p.next_job().map(|j| j.first_row), Some(10));
    assert!(p.next_job().is_none());
    p.finish((0, 0));
    assert_eq!(p.next_job().map(|j| j.first_row), Some(3));
}

/// A parted record message: `[group, part]`, then the part's slice and the step.
fn part_message(part: i32, values: &[i32], step: i32, device: i32) -> Message {
    let meta = [0i32, part];
    let ops = [
        Operand { dtype: xla::S32, data: meta.as_ptr().cast(), dims: &[2] },
        Operand { dtype: xla::S32, data: values.as_ptr().cast(), dims: &[1, 2] },
        Operand { dtype: xla::S32, data: std::ptr::from_ref(&step).cast(), dims: &[] },
    ];
    // SAFETY: every operand points at a live local of the described size.
    unsafe { gather(7, 0, device, ops.iter().copied()) }.unwrap()
}

#[test]
fn parted_arrays_write_each_part_in_its_own_chunks_and_announce_what_all_parts_have() {
    let root = temp_root("parted");
    let budget = Arc::new(Counter::default());
    // 8-byte slices, 2 rows a chunk; announced only as the test says (a store of one process
    // has its live cycles announce what every part has).
    let opts = Options { chunk_bytes: 16, commit_interval: Duration::MAX, ..Options::default() };
    let rec = Recorder::create(&root, Mode::Create, opts, budget.clone()).unwrap();
    let ids = rec.declare_parted("g/h", xla::S32, &[1, 2], 2, true).unwrap();
    assert_eq!(ids.len(), 2);
    assert_eq!(rec.declare_parted("g/h", xla::S32, &[1, 2], 2, true).unwrap(), ids);
    let e = rec.declare_parted("g/h", xla::S32, &[1, 2], 4, true).unwrap_err().to_string();
    assert!(e.contains("sharding"), "{e}");
    let e = rec.declare("g/h", xla::S32, &[2, 2]).unwrap_err().to_string();
    assert!(e.contains("first recorded"), "{e}");
    assert_eq!(json_at(&root.join("g/h"))["shape"], json!([0, 2, 2]));
    let sink = Sink::parted(&rec, "g/h", Some(2), "[]").unwrap();
    // Part 1 runs ahead of part 0: only the rows both parts have are announced.
    for r in 0..3 {
        budget.charge(100);
        sink.route(part_message(1, &[10 * r + 1, 10 * r + 2], r, 5), 100);
    }
    budget.charge(100);
    sink.route(part_message(0, &[0, 1], 0, 4), 100);
    assert!(rec.flush(Duration::from_secs(30)).unwrap());
    assert_eq!(rec.parted_rows("g/h").unwrap(), vec![1, 3]);
    assert_eq!(json_at(&root.join("g/h"))["shape"], json!([0, 2, 2]), "nothing announced yet");
    rec.commit_parted("g/h", 1).unwrap();
    let meta = json_at(&root.join("g/h"));
    assert_eq!(meta["shape"], json!([1, 2, 2]));
    assert_eq!(meta["chunk_grid"]["configuration"]["chunk_shape"], json!([2, 1, 2]));
    assert_eq!(json_at(&root.join("g/h.step"))["shape"], json!([1]));
    // Part p's rows are in chunks c/k/p/0, in the bytes one writer of that part writes.
    let part1 = fs::read(root.join("g/h/c/1/1/0")).unwrap();
    assert_eq!(&part1[..8], &[21, 0, 0, 0, 22, 0, 0, 0]);
    let part0 = fs::read(root.join("g/h/c/0/0/0")).unwrap();
    assert_eq!(&part0[..8], &[0, 0, 0, 0, 1, 0, 0, 0]);
    let device = fs::read(root.join("g/h.device/c/0")).unwrap();
    assert_eq!(&device[..4], &[4, 0, 0, 0], "part 0 writes the row metadata");
    rec.close().unwrap();
    assert_eq!(budget.held.load(Ordering::SeqCst), 0);
    fs::remove_dir_all(&root).unwrap();
}

/// Tracer of the test below: the writes it saw (name, chunk, bytes, writer thread's name).
struct Seen(Mutex<Vec<(String, u64, usize, String)>>);

impl crate::record::trace::WriteTracer for &'static Seen {
    fn traced(&self, name: &str, chunk: u64, bytes: usize, write: &mut (dyn FnMut() + Send)) {
        write();
        let thread = std::thread::current().name().unwrap_or("").to_string();
        lock(&self.0).push((name.to_string(), chunk, bytes, thread));
    }
}

#[test]
fn writes_go_through_the_tracer_only_while_tracing() {
    use crate::record::trace::{install_write_tracer, set_write_tracing};
    static SEEN: Seen = Seen(Mutex::new(Vec::new()));
    // The only test that installs one (other tests' writes may pass through it while it
    // traces: it runs them, and they have other names).
    assert!(install_write_tracer(Box::new(&SEEN)));
    let root = temp_root("traced");
    let opts = Options { chunk_bytes: 16, writers: 2, ..Options::default() };
    let rec = Recorder::create(&root, Mode::Create, opts, Arc::new(Counter::default())).unwrap();
    let id = rec.declare("traced/x", xla::S32, &[2]).unwrap(); // 8-byte rows, 2 per chunk
    let mine = |seen: &[(String, u64, usize, String)]| {
        let mut v: Vec<_> = seen.iter().filter(|s| s.0 == "traced/x").cloned().collect();
        v.sort();
        v
    };
    for r in 0..2u32 {
        rec.append(id, &int_row(r), r.into(), 0, 0).unwrap();
    }
    assert!(rec.flush(Duration::from_secs(30)).unwrap());
    assert_eq!(mine(&lock(&SEEN.0)), vec![], "not tracing: no write is seen");
    set_write_tracing(true);
    for r in 2..7u32 {
        rec.append(id, &int_row(r), r.into(), 0, 0).unwrap();
    }
    assert!(rec.flush(Duration::from_secs(30)).unwrap());
    set_write_tracing(false);
    let w = |chunk, bytes| ("traced/x".to_string(), chunk, bytes, String::new());
    let got: Vec<_> = mine(&lock(&SEEN.0))
        .into_iter()
        .map(|(n, c, b, t)| {
            assert!(t.starts_with("hostfeed-writer-"), "{t}");
            (n, c, b, String::new())
        })
        .collect();
    // Chunks 1 and 2 full, chunk 3 partial (row 6) at the flush.
    assert_eq!(got, vec![w(1, 16), w(2, 16), w(3, 8)]);
    rec.append(id, &int_row(7), 7, 0, 0).unwrap();
    rec.close().unwrap();
    assert_eq!(mine(&lock(&SEEN.0)).len(), 3, "after the trace: no more");
    let want: Vec<u8> = (0..8).flat_map(int_row).collect();
    assert_eq!(read_raw_rows(&root.join("traced/x"), 8, 8, 2), want, "traced writes wrote every row");
    let _ = fs::remove_dir_all(&root);
}

mod stores;
