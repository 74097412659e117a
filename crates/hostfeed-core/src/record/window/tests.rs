//! The window's tests: through a recorder on a temporary directory, rows given as bytes.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::ffi::c_api::dtype as xla;
use crate::record::common::{Budget, Mode, Options};
use crate::record::recorder::Recorder;
use crate::record::window::WindowOptions;

/// A budget that counts what is charged.
#[derive(Default)]
struct Counter {
    held: AtomicUsize,
}

impl Budget for Counter {
    fn charge(&self, bytes: usize) {
        self.held.fetch_add(bytes, Ordering::SeqCst);
    }
    fn release(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::SeqCst);
    }
    fn bound(&self) -> usize {
        1 << 30
    }
    fn producers_waiting(&self) -> bool {
        false
    }
    fn note(&self, _text: String) {}
}

fn root(tag: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("hostfeed_window_{tag}_{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    root
}

fn options(steps: usize, bytes: usize, after: u64, nonfinite: bool) -> WindowOptions {
    WindowOptions { steps, bytes, after, nonfinite, process: 0, writes_doc: true }
}

fn open(root: &Path, mode: Mode, window: WindowOptions, budget: Arc<Counter>) -> Arc<Recorder> {
    let rec = Recorder::create(root, mode, Options::default(), budget).unwrap();
    rec.configure_window(window, None).unwrap();
    rec
}

fn json_at(dir: &Path) -> Value {
    serde_json::from_slice(&fs::read(dir.join("zarr.json")).unwrap()).unwrap()
}

/// The steps of the rows announced in array `name`.
fn steps(root: &Path, name: &str) -> Vec<i64> {
    let dir = root.join(format!("{name}.step"));
    let n = usize::try_from(json_at(&dir)["shape"][0].as_u64().unwrap()).unwrap();
    if n == 0 {
        return Vec::new();
    }
    let bytes = fs::read(dir.join("c/0")).unwrap();
    bytes.chunks(8).take(n).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The float32 values of the rows announced in array `name` (rows of `width` values).
fn values(root: &Path, name: &str, width: usize) -> Vec<f32> {
    let dir = root.join(name);
    let n = usize::try_from(json_at(&dir)["shape"][0].as_u64().unwrap()).unwrap();
    let bytes = fs::read(dir.join("c/0/0")).unwrap();
    bytes.chunks(4).take(n * width).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn row(v: f32, width: usize) -> Vec<u8> {
    (0..width).flat_map(|_| v.to_le_bytes()).collect()
}

fn triggers(root: &Path) -> Vec<Value> {
    json_at(root)["attributes"]["hostfeed"]["triggers"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_trigger_writes_the_window_and_the_steps_after_once() {
    let root = root("write");
    let budget = Arc::new(Counter::default());
    let rec = open(&root, Mode::Create, options(4, 1 << 20, 2, false), budget.clone());
    let h = rec.declare("h", xla::F32, &[3]).unwrap();
    let always = rec.declare("loss", xla::F32, &[]).unwrap();
    rec.window_array(h, true, None).unwrap();
    rec.window_array(always, false, None).unwrap();
    for s in 0..20i64 {
        #[allow(clippy::cast_precision_loss)]
        let v = s as f32;
        rec.append(h, &row(v, 3), s, 0, 0).unwrap();
        rec.append(always, &v.to_le_bytes(), s, 0, 0).unwrap();
        if s == 9 {
            rec.fire_trigger("watch", 9, "loss spiked", Some("loss")).unwrap();
        }
        if s == 10 {
            // Overlaps the first: steps 7..=12, of which 6..=11 were written already.
            rec.fire_trigger("watch", 10, "again", Some("loss")).unwrap();
        }
    }
    assert_eq!(rec.window_held()["steps"], json!(4));
    assert!(rec.flush(Duration::from_secs(30)).unwrap());
    assert_eq!(budget.held.load(Ordering::SeqCst), 0, "the kept rows are not charged to the queue");
    assert_eq!(steps(&root, "h"), (6..=12).collect::<Vec<_>>(), "6..9, 10, 11 (after), 12 (after)");
    assert_eq!(steps(&root, "loss"), (0..20).collect::<Vec<_>>());
    #[allow(clippy::cast_precision_loss)]
    let want: Vec<f32> = (6..=12).flat_map(|s| [s as f32; 3]).collect();
    assert_eq!(values(&root, "h", 3), want);
    rec.close().unwrap();
    let listed = triggers(&root);
    assert_eq!(listed.len(), 2);
    assert_eq!((listed[0]["step"].as_i64(), listed[0]["first_step"].as_i64()), (Some(9), Some(6)));
    assert_eq!(listed[0]["last_step"], json!(11));
    assert_eq!(listed[0]["kept"]["h"], json!([6, 7, 8, 9, 10, 11]));
    assert_eq!(listed[1]["kept"]["h"], json!([12]), "a row is written once, for one trigger");
    assert!(listed.iter().all(|t| t["state"] == "written" && t["kind"] == "watch"));
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn the_byte_bound_evicts_old_steps_and_refuses_a_step_larger_than_it() {
    let root = root("bytes");
    let budget = Arc::new(Counter::default());
    // 1 KiB rows (kept in copies: Python's rows): 1024 + 128 bytes each, 3 fit in 3500.
    let rec = open(&root, Mode::Create, options(100, 3500, 0, false), budget);
    let h = rec.declare("h", xla::F32, &[256]).unwrap();
    rec.window_array(h, true, None).unwrap();
    for s in 0..10i64 {
        #[allow(clippy::cast_precision_loss)]
        rec.append(h, &row(s as f32, 256), s, 0, 0).unwrap();
    }
    assert_eq!(rec.window_held()["steps"], json!(3));
    assert_eq!(rec.window_held()["bytes"], json!(3 * (1024 + 128)));
    rec.fire_trigger("keep", -1, "by hand", None).unwrap();
    assert!(rec.flush(Duration::from_secs(30)).unwrap());
    assert_eq!(steps(&root, "h"), vec![7, 8, 9]);
    // Four rows of one step take more than the bound: the fourth is refused, reported.
    for _ in 0..3 {
        rec.append(h, &row(0.0, 256), 20, 0, 0).unwrap();
    }
    rec.append(h, &row(0.0, 256), 20, 0, 0).unwrap();
    let err = rec.flush(Duration::from_secs(30)).unwrap_err().to_string();
    assert!(err.contains("step 20") && err.contains("window_bytes=3500"), "{err}");
    assert!(rec.window_array(h, true, None).is_ok());
    let big = rec.declare("big", xla::F32, &[1024]).unwrap();
    let refused = rec.window_array(big, true, None).unwrap_err().to_string();
    assert!(refused.contains("does not fit in window_bytes=3500"), "{refused}");
    rec.close().unwrap();
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn the_first_non_finite_value_fires_once_naming_the_array() {
    let root = root("nonfinite");
    let rec = open(&root, Mode::Create, options(2, 1 << 20, 0, true), Arc::new(Counter::default()));
    let h = rec.declare("h", xla::F32, &[3]).unwrap();
    let stats = rec.declare("h.stats", xla::F32, &[4]).unwrap();
    rec.window_array(h, true, None).unwrap();
    // Column 3 counts NaNs; column 1 (a mean over no value) may be NaN without a trigger.
    rec.window_array(stats, false, Some((4, vec![3]))).unwrap();
    for s in 0..6i64 {
        rec.append(stats, &[0.0f32, f32::NAN, 0.0, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(), s, 0, 0)
            .unwrap();
        let mut values = [1.0f32; 3];
        if s >= 4 {
            values[2] = f32::NAN;
        }
        rec.append(h, &values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(), s, 0, 0).unwrap();
    }
    assert_eq!(rec.trigger_count(), 1, "once: the later NaNs fire nothing");
    let fired: Value = serde_json::from_str(&rec.take_triggers()[0]).unwrap();
    assert_eq!(fired["name"], "h");
    assert_eq!(fired["step"], 4);
    assert_eq!(fired["value"], "nan");
    assert_eq!(fired["element"], 2);
    assert!(fired["reason"].as_str().unwrap().contains("non-finite value nan in \"h\" at step 4"));
    assert!(rec.take_triggers().is_empty(), "taken once");
    // A summary whose counting column is not zero fires too (a new recorder: armed again).
    rec.close().unwrap();
    let rec = open(&root, Mode::Overwrite, options(2, 1 << 20, 0, true), Arc::new(Counter::default()));
    let stats = rec.declare("h.stats", xla::F32, &[4]).unwrap();
    rec.window_array(stats, false, Some((4, vec![3]))).unwrap();
    rec.append(stats, &[3.0f32, 1.0, 0.0, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(), 7, 0, 0).unwrap();
    let fired: Value = serde_json::from_str(&rec.take_triggers()[0]).unwrap();
    assert_eq!((fired["name"].as_str(), fired["step"].as_i64()), (Some("h.stats"), Some(7)));
    rec.close().unwrap();
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn another_process_trigger_writes_the_same_steps_here_once() {
    let root = root("remote");
    let rec = open(&root, Mode::Create, options(3, 1 << 20, 1, false), Arc::new(Counter::default()));
    let h = rec.declare("h", xla::F32, &[]).unwrap();
    rec.window_array(h, true, None).unwrap();
    for s in 0..5i64 {
        rec.append(h, &1.0f32.to_le_bytes(), s, 0, 0).unwrap();
    }
    let theirs = json!({"uid": "1:0", "kind": "nonfinite", "step": 3, "first_step": 1, "last_step": 4,
                        "reason": "non-finite value inf in \"g\" at step 3", "name": "g", "process": 1,
                        "time_ns": 1, "value": "inf"});
    assert!(rec.apply_remote_trigger(&theirs.to_string()).unwrap());
    assert!(!rec.apply_remote_trigger(&theirs.to_string()).unwrap(), "known already");
    rec.merge_trigger_part("1:0", 1, &json!({"kept": {"g": [1, 2, 3, 4]}, "written": true}).to_string()).unwrap();
    rec.close().unwrap();
    assert_eq!(steps(&root, "h"), vec![2, 3, 4], "step 1 left the ring of 3 steps before");
    let listed = triggers(&root);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["kept"], json!({"g": [1, 2, 3, 4], "h": [2, 3, 4]}));
    assert_eq!((listed[0]["process"].as_u64(), listed[0]["state"].as_str()), (Some(1), Some("written")));
    assert_eq!(listed[0]["value"], "inf");
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn appending_keeps_the_earlier_triggers() {
    let root = root("append");
    let rec = open(&root, Mode::Create, options(2, 1 << 20, 0, false), Arc::new(Counter::default()));
    rec.fire_trigger("keep", 0, "first run", None).unwrap();
    rec.close().unwrap();
    let rec = Recorder::create(&root, Mode::Append { resume_after_step: None }, Options::default(),
                               Arc::new(Counter::default()))
        .unwrap();
    rec.configure_window(options(2, 1 << 20, 0, false), None).unwrap();
    assert!(rec.configure_window(options(2, 1 << 20, 0, false), None).is_err(), "one window");
    rec.fire_trigger("keep", 0, "second run", None).unwrap();
    let all: Vec<Value> = serde_json::from_str(&rec.triggers()).unwrap();
    assert_eq!(all.iter().map(|t| t["reason"].as_str().unwrap()).collect::<Vec<_>>(), ["first run", "second run"]);
    rec.close().unwrap();
    assert_eq!(triggers(&root).len(), 2);
    assert_eq!(json_at(&root)["attributes"]["hostfeed"]["format"], "hostfeed-recording");
    let _ = fs::remove_dir_all(&root);
}
