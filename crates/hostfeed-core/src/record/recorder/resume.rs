//! Appending to an existing recording ([`Mode::Append`]): at open, every array the store
//! holds is adopted, to go on after its last announced row; with `resume_after_step`, the
//! rows from the first one whose step is greater than it are dropped first.
//!
//! What an adopted array keeps from the store: its dtype, row shape, chunking, codec, key
//! separator and the chunking of its per-row metadata (a later declaration must match the
//! dtype and row shape, or it is the usual clash error); its record numbers go on after
//! the largest in the store, and the transforms table after the store's. Dropping rows
//! announces fewer rows (data array first, then its metadata arrays, which so never hold
//! fewer rows than it); the bytes past the new end are overwritten by the rows recorded
//! next. Arrays recorded from sharded values in parts are kept as they are but cannot be
//! appended to yet (a record under their name is refused, saying so).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use serde_json::{json, Value};

use crate::error::RecordError;
use crate::record::arrays::{meta_specs, ArrayHandle, ArrayState};
use crate::record::commit::read_meta_chunk;
use crate::record::common::{as_u64, as_usize, Mode};
use crate::record::recorder::Recorder;
use crate::record::store::io_error;
use crate::record::zarr::{self, ArraySpec, Codec, DType};

/// An array found in the store: its name, directory and `zarr.json`.
struct Found {
    name: String,
    dir: PathBuf,
    doc: Value,
}

fn corrupt(dir: &Path, what: &str) -> RecordError {
    RecordError::Io {
        errno: Some(libc::EINVAL),
        message: format!("cannot append to the array at {}: {what}", dir.display()),
    }
}

fn u64s(v: &Value) -> Option<Vec<u64>> {
    v.as_array()?.iter().map(Value::as_u64).collect()
}

/// An array's layout from its `zarr.json`: `Ok(Err(why))` for one this recorder cannot
/// append to.
fn spec_of(f: &Found) -> Result<Result<(ArraySpec, u64), String>, RecordError> {
    let doc = &f.doc;
    let shape = u64s(&doc["shape"]).filter(|s| !s.is_empty()).ok_or_else(|| corrupt(&f.dir, "no shape"))?;
    let chunk = u64s(&doc["chunk_grid"]["configuration"]["chunk_shape"])
        .filter(|c| c.len() == shape.len() && c[0] > 0)
        .ok_or_else(|| corrupt(&f.dir, "no regular chunk grid"))?;
    let name = doc["data_type"].as_str().unwrap_or("");
    let dtype = DType::from_name(name).ok_or_else(|| corrupt(&f.dir, &format!("data type {name:?}")))?;
    let row_shape = shape[1..].to_vec();
    if chunk[1..].iter().zip(&row_shape).any(|(c, d)| *c != (*d).max(1)) {
        return Ok(Err("it was recorded from a sharded value in parts, which cannot be appended to yet".into()));
    }
    let mut codecs = &doc["codecs"];
    let mut inner_rows = None;
    if codecs[0]["name"] == json!("sharding_indexed") {
        let config = &codecs[0]["configuration"];
        let inner = u64s(&config["chunk_shape"]).filter(|c| c.len() == shape.len() && c[0] > 0);
        let ours = json!([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]);
        match inner {
            Some(c) if config["index_codecs"] == ours && config["index_location"] == json!("end") && chunk[0] % c[0] == 0 => {
                inner_rows = Some(c[0]);
            }
            _ => return Ok(Err("its shards are laid out otherwise than hostfeed writes them".into())),
        }
        codecs = &config["codecs"];
    }
    if let Some(other) = codecs.as_array().into_iter().flatten().find(|c| !matches!(c["name"].as_str(), Some("bytes" | "zstd"))) {
        return Ok(Err(format!("its codec {:?} is not one hostfeed writes", other["name"].as_str())));
    }
    let codec = codec_of(codecs);
    let sep = match doc["chunk_key_encoding"]["configuration"]["separator"].as_str() {
        Some(".") => '.',
        _ => '/',
    };
    let dim_names = doc["dimension_names"]
        .as_array()
        .map_or_else(|| vec![None; shape.len()], |a| a.iter().map(|v| v.as_str().map(str::to_string)).collect());
    let spec = ArraySpec { dtype, row_shape, chunk_rows: chunk[0], codec, dim_names, sep, part: None, inner_rows };
    Ok(Ok((spec, shape[0])))
}

/// The codec of a `codecs` list hostfeed wrote (`bytes`, then `zstd`, `blosc` or nothing).
fn codec_of(codecs: &Value) -> Codec {
    let level = |c: &Value, key: &str| c["configuration"][key].as_i64().and_then(|l| i32::try_from(l).ok()).unwrap_or(1);
    let found = |name: &str| codecs.as_array().into_iter().flatten().find(|c| c["name"] == json!(name));
    match (found("zstd"), found("blosc")) {
        (Some(c), _) => Codec::Zstd(level(c, "level")),
        (None, Some(c)) => Codec::Blosc(level(c, "clevel")),
        (None, None) => Codec::Raw,
    }
}

impl Recorder {
    /// Adopts the arrays of the store for appending (see the module documentation); does
    /// nothing unless `mode` appends.
    pub(super) fn adopt(&self, mode: Mode) -> Result<(), RecordError> {
        let Mode::Append { resume_after_step } = mode else { return Ok(()) };
        let mut found = Vec::new();
        self.find_arrays(&self.root, "", &mut found)?;
        let mut next_seq = 0u64;
        let mut table: Vec<String> = Vec::new();
        for f in found {
            let context = format!("appending to {:?}", f.name);
            let (spec, stored) = match spec_of(&f)? {
                Ok(s) => s,
                Err(why) => {
                    self.catalogue.freeze(f.name, why);
                    continue;
                }
            };
            let (group_dir, leaf) = match f.name.rsplit_once('/') {
                Some((_, leaf)) => (f.dir.parent().map(Path::to_path_buf).unwrap_or_default(), leaf.to_string()),
                None => (self.root.clone(), f.name.clone()),
            };
            let meta_dir = |suffix: &str| group_dir.join(format!("{leaf}.{suffix}"));
            let step_doc = self.doc(&meta_dir("step")).ok();
            let meta_chunk_rows = step_doc
                .as_ref()
                .and_then(|d| u64s(&d["chunk_grid"]["configuration"]["chunk_shape"]))
                .and_then(|c| c.first().copied())
                .filter(|&c| c > 0)
                .ok_or_else(|| corrupt(&f.dir, "its per-row metadata array .step is missing"))?;
            // The codec its document names: raw, zstd or Blosc, whichever release wrote it.
            let meta_codec = step_doc.as_ref().map_or(Codec::Raw, |d| codec_of(&d["codecs"]));
            let meta_spec = |suffix: &str| {
                meta_specs(&leaf, meta_chunk_rows, meta_codec).find(|(s, _)| *s == suffix).map(|(_, spec)| spec)
            };
            let (Some(step_spec), Some(seq_spec)) = (meta_spec("step"), meta_spec("seq")) else {
                unreachable!("step and seq are metadata arrays")
            };
            let rows = match resume_after_step {
                Some(step) => self.rows_through(&meta_dir("step"), &step_spec, stored, step)?,
                None => stored,
            };
            if rows < stored {
                self.truncate(&f, &group_dir, &leaf, rows).map_err(|e| e.context(&context))?;
            }
            if rows > 0 {
                let last = self.meta_value(&meta_dir("seq"), &seq_spec, rows - 1)?;
                next_seq = next_seq.max(u64::try_from(last).unwrap_or(0) + 1);
            }
            let transforms = f.doc["attributes"]["hostfeed"]["transforms"].as_array().cloned().unwrap_or_default();
            if transforms.len() > table.len() {
                table = transforms.iter().map(Value::to_string).collect();
            }
            if let Some(summary) = f.doc["attributes"]["hostfeed"].get("reduce").filter(|v| v.is_object()) {
                self.catalogue.adopt_summary(f.name.clone(), summary.clone());
            }
            if let Some(axes) = f.doc["attributes"]["hostfeed"].get("axes") {
                // An array of axis names, as written: kept, or dropped if it is not one.
                let _ = self.catalogue.describe_axes(&f.name, &axes.to_string());
            }
            self.catalogue.adopt(|id| ArrayHandle {
                id,
                name: f.name,
                dir: f.dir,
                group_dir,
                leaf,
                state: Mutex::new(ArrayState::resumed(rows, spec.chunk_rows)),
                spec,
                meta_chunk_rows,
                meta_codec,
            });
        }
        self.next_seq.fetch_max(next_seq, Ordering::Relaxed);
        self.catalogue.adopt_transforms(table);
        Ok(())
    }

    /// The `zarr.json` of the node at `dir`.
    fn doc(&self, dir: &Path) -> Result<Value, RecordError> {
        let path = dir.join("zarr.json");
        let bytes = self.store.get(&path).map_err(|e| io_error("read", &path, &e))?;
        serde_json::from_slice(&bytes).map_err(|e| corrupt(dir, &format!("zarr.json is not JSON: {e}")))
    }

    /// Every hostfeed data array below group `dir` (named `prefix` + its path).
    fn find_arrays(&self, dir: &Path, prefix: &str, out: &mut Vec<Found>) -> Result<(), RecordError> {
        let entries = self.store.list(dir).map_err(|e| io_error("list", dir, &e))?;
        for child in entries {
            let Some(leaf) = child.file_name().and_then(|n| n.to_str()).map(str::to_string) else { continue };
            if leaf.starts_with('.') || leaf == "zarr.json" {
                continue;
            }
            // A node whose zarr.json is there but cannot be read as one refuses the open:
            // skipped, its name would be declared afresh and its chunks written over.
            let path = child.join("zarr.json");
            let doc = match self.store.get(&path) {
                Ok(bytes) => serde_json::from_slice::<Value>(&bytes)
                    .map_err(|e| corrupt(&child, &format!("its zarr.json is not JSON ({e}); restore it, or remove the array")))?,
                Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => continue,
                Err(e) => return Err(io_error("read", &path, &e)),
            };
            let name = format!("{prefix}{leaf}");
            match doc["node_type"].as_str() {
                Some("group") => self.find_arrays(&child, &format!("{name}/"), out)?,
                Some("array") if doc["attributes"]["hostfeed"]["name"].is_string() => {
                    out.push(Found { name, dir: child, doc });
                }
                // Another writer's array: left alone, and refused as a name to record to.
                Some("array") if !leaf.contains('.') => {
                    self.catalogue.freeze(name, "it is an array hostfeed did not write".into());
                }
                Some("array") => {}
                _ => return Err(corrupt(&child, "its zarr.json names no node type (\"group\" or \"array\")")),
            }
        }
        Ok(())
    }

    /// Value `row` of the 8-byte metadata array at `dir`, laid out as `spec` (a chunk not in
    /// the store reads as zeros, the fill value: an object store's chunk of zeros is not put).
    fn meta_value(&self, dir: &Path, spec: &ArraySpec, row: u64) -> Result<i64, RecordError> {
        let path = dir.join("c").join((row / spec.chunk_rows).to_string());
        let bytes = read_meta_chunk(&*self.store, spec, &path)?.unwrap_or_else(|| vec![0; spec.chunk_bytes()]);
        let at = as_usize(row % spec.chunk_rows) * 8;
        bytes
            .get(at..at + 8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .ok_or_else(|| corrupt(dir, "a metadata chunk is too short"))
    }

    /// How many of the first `rows` rows come before the first whose step (the `.step`
    /// array at `dir`, laid out as `spec`) is greater than `step`.
    fn rows_through(&self, dir: &Path, spec: &ArraySpec, rows: u64, step: i64) -> Result<u64, RecordError> {
        let chunk_rows = spec.chunk_rows;
        let mut k = 0;
        while k * chunk_rows < rows {
            let path = dir.join("c").join(k.to_string());
            let bytes = read_meta_chunk(&*self.store, spec, &path)?.unwrap_or_else(|| vec![0; spec.chunk_bytes()]);
            let n = as_usize((rows - k * chunk_rows).min(chunk_rows));
            let values = bytes.get(..n * 8).ok_or_else(|| corrupt(dir, "a metadata chunk is too short"))?;
            if let Some(i) = values.chunks(8).position(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) > step) {
                return Ok(k * chunk_rows + as_u64(i));
            }
            k += 1;
        }
        Ok(rows)
    }

    /// Announces only the first `rows` rows of an adopted array: the data array first, then
    /// its metadata arrays.
    fn truncate(&self, f: &Found, group_dir: &Path, leaf: &str, rows: u64) -> Result<(), RecordError> {
        let store = &*self.store;
        let mut doc = f.doc.clone();
        doc["shape"][0] = json!(rows);
        zarr::write_json(store, &f.dir, &doc)?;
        for suffix in zarr::ROW_METADATA {
            let dir = group_dir.join(format!("{leaf}.{suffix}"));
            let mut meta = self.doc(&dir)?;
            if meta["shape"][0].as_u64().is_some_and(|n| n > rows) {
                meta["shape"][0] = json!(rows);
                zarr::write_json(store, &dir, &meta)?;
            }
        }
        Ok(())
    }
}
