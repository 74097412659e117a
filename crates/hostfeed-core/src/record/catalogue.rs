//! The catalogue: the arrays a recorder knows. Their handles by id, their names and the
//! groups the names imply (so that a clash is found in constant time), the names that
//! cannot be recorded to (arrays of a store appended to that the recorder cannot go on
//! writing), the parted arrays, the transforms table the rows index, and what the rows of
//! an array summarize.
//!
//! The catalogue does no I/O: a declaration's checks of the name run here, under the
//! catalogue's locks, and the recorder lays the array out and writes its documents from
//! inside them (the closures given to [`Catalogue::declare`] and
//! [`Catalogue::declare_parted`]), so that two declarations of one name never both create
//! it.
//!
//! Lock order: the arrays, then the names, then the parted arrays; the transforms table
//! and the summaries are taken alone (or under those: a declaration writes the array's
//! attributes while it holds them).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::{json, Value};

use crate::error::RecordError;
use crate::host::sync::lock;
use crate::record::arrays::ArrayHandle;
use crate::record::common::{as_u64, as_usize, read_lock, write_lock, ArrayId};
use crate::record::zarr::{DType, ROW_METADATA};

/// Declared array names and every group they imply.
#[derive(Default)]
struct NameIndex {
    arrays: HashMap<String, ArrayId>,
    groups: HashSet<String>,
    /// Arrays of a store appended to that this recorder cannot go on writing, and why.
    frozen: HashMap<String, String>,
}

impl NameIndex {
    /// Refuses a record under the name of an array that cannot be appended to.
    fn refuse_frozen(&self, name: &str) -> Result<(), RecordError> {
        match self.frozen.get(name) {
            Some(why) => Err(RecordError::Invalid(format!(
                "cannot append to {name:?} in this store: {why}; record under another name"
            ))),
            None => Ok(()),
        }
    }

    /// Records `name` as array `id`, and the groups above it.
    fn insert(&mut self, name: &str, id: ArrayId) {
        self.arrays.insert(name.to_string(), id);
        self.groups.extend(prefixes(name).into_iter().map(str::to_string));
    }
}

/// The groups above `name`, outermost first (`"a/b/c"`: `"a"`, `"a/b"`).
fn prefixes(name: &str) -> Vec<&str> {
    name.match_indices('/').map(|(i, _)| &name[..i]).collect()
}

/// See the module documentation.
pub(crate) struct Catalogue {
    /// Every array's handle; an array's id is its place here (arrays are only added).
    arrays: RwLock<Vec<Arc<ArrayHandle>>>,
    /// Declared names (and the groups they imply), for clash checks in constant time.
    names: Mutex<NameIndex>,
    /// Parted arrays (`recorder/parts.rs`): name -> the id of each part's handle.
    parted: Mutex<HashMap<String, Vec<ArrayId>>>,
    /// Distinct transforms descriptions (JSON) of the rows; rows store the index.
    transforms: Mutex<Vec<String>>,
    /// What the rows of an array summarize (`hostfeed.reduce` in its attributes: the
    /// statistics' names, a histogram's edges), by array name.
    summaries: Mutex<HashMap<String, Value>>,
    /// The names of the axes of an array's rows (`hostfeed.axes` in its attributes: a
    /// named array's, as `hostfeed.capture` records it), by array name.
    axes: Mutex<HashMap<String, Value>>,
}

impl Catalogue {
    /// A catalogue of no array, whose transforms table holds the description of rows
    /// recorded under no transform (index 0).
    pub(crate) fn new() -> Self {
        Catalogue {
            arrays: RwLock::new(Vec::new()),
            names: Mutex::new(NameIndex::default()),
            parted: Mutex::new(HashMap::new()),
            transforms: Mutex::new(vec!["[]".to_string()]),
            summaries: Mutex::new(HashMap::new()),
            axes: Mutex::new(HashMap::new()),
        }
    }

    /// The handle of array `id`.
    pub(crate) fn get(&self, id: ArrayId) -> Option<Arc<ArrayHandle>> {
        read_lock(&self.arrays).get(id).cloned()
    }

    /// The handles of the arrays `ids` that exist.
    pub(crate) fn handles(&self, ids: &[ArrayId]) -> Vec<Arc<ArrayHandle>> {
        let arrays = read_lock(&self.arrays);
        ids.iter().filter_map(|&id| arrays.get(id).cloned()).collect()
    }

    /// Every array's handle, by id.
    pub(crate) fn all(&self) -> Vec<Arc<ArrayHandle>> {
        read_lock(&self.arrays).clone()
    }

    /// Rows received, over all arrays.
    pub(crate) fn rows_received(&self) -> u64 {
        read_lock(&self.arrays).iter().map(|a| lock(&a.state).received).sum()
    }

    /// Rows received by array `name` (those it held when resumed included), the most of
    /// its parts' for a parted array; `None` if no array has that name.
    pub(crate) fn rows_received_by(&self, name: &str) -> Option<u64> {
        self.rows_received_and(name, |_| 0)
    }

    /// [`rows_received_by`](Self::rows_received_by), each array (part) counting `more`
    /// of its id besides (rows a window took in its place).
    pub(crate) fn rows_received_and(&self, name: &str, more: impl Fn(ArrayId) -> u64) -> Option<u64> {
        read_lock(&self.arrays)
            .iter()
            .filter(|a| a.name == name)
            .map(|a| lock(&a.state).received + more(a.id))
            .max()
    }

    /// Declares array `name` with rows of `row_shape` and `dtype`: checks the name against
    /// the arrays known, then `create` makes the array (its layout and documents) given its
    /// id. Declaring the same name again with the same shape and dtype returns the same id
    /// (and creates nothing).
    ///
    /// # Errors
    /// A name that cannot be recorded to, a clash with an earlier declaration (another
    /// shape or dtype, or an array where a group is needed or the reverse), or `create`'s.
    pub(crate) fn declare(
        &self,
        name: &str,
        dtype: DType,
        row_shape: &[u64],
        create: impl FnOnce(ArrayId) -> Result<ArrayHandle, RecordError>,
    ) -> Result<ArrayId, RecordError> {
        let mut arrays = write_lock(&self.arrays);
        let mut names = lock(&self.names);
        names.refuse_frozen(name)?;
        if let Some(&id) = names.arrays.get(name) {
            let a = &arrays[id];
            if a.spec.dtype == dtype && a.spec.row_shape == row_shape {
                return Ok(a.id);
            }
            return Err(RecordError::Invalid(format!(
                "record name {name:?} was first recorded as {} {:?}, now as {} {:?}; a name keeps \
                 one dtype and row shape: pad the value to one shape (a batch size that changes \
                 between steps), record a summary of it (reduce=\"stats\" or a Histogram), or \
                 use a name per shape",
                a.spec.dtype.name, a.spec.row_shape, dtype.name, row_shape
            )));
        }
        let clash = |other: &str| {
            Err(RecordError::Invalid(format!(
                "record name {name:?} clashes with {other:?}: a name cannot be both an array and a \
                 group"
            )))
        };
        if names.groups.contains(name) {
            let other =
                arrays.iter().find(|a| a.name.starts_with(&format!("{name}/"))).map_or("", |a| &a.name);
            return clash(other);
        }
        if let Some(p) = prefixes(name).iter().find(|p| names.arrays.contains_key(**p)) {
            return clash(p);
        }
        let handle = Arc::new(create(arrays.len())?);
        arrays.push(Arc::clone(&handle));
        names.insert(name, handle.id);
        Ok(handle.id)
    }

    /// Declares parted array `name`: `count` parts whose rows are `part_shape` slices of
    /// `dtype`. After the name's checks, `create` makes the parts' handles given the first
    /// one's id (the others follow it), which join the arrays, then `finish` writes what the
    /// array needs on the store given the first part. Declaring it again alike returns the
    /// same ids (and creates nothing).
    ///
    /// # Errors
    /// As [`Catalogue::declare`], and `create`'s or `finish`'s.
    pub(crate) fn declare_parted(
        &self,
        name: &str,
        dtype: DType,
        part_shape: &[u64],
        count: u64,
        create: impl FnOnce(ArrayId) -> Result<Vec<ArrayHandle>, RecordError>,
        finish: impl FnOnce(&ArrayHandle) -> Result<(), RecordError>,
    ) -> Result<Vec<ArrayId>, RecordError> {
        let mut arrays = write_lock(&self.arrays);
        let mut names = lock(&self.names);
        names.refuse_frozen(name)?;
        let mut parted = lock(&self.parted);
        let mut global = part_shape.to_vec();
        global[0] *= count;
        if let Some(ids) = parted.get(name) {
            let a = &arrays[ids[0]];
            if a.spec.dtype == dtype && a.spec.row_shape == part_shape && ids.len() == as_usize(count) {
                return Ok(ids.clone());
            }
            let mut was = a.spec.row_shape.clone();
            was[0] *= as_u64(ids.len());
            return Err(RecordError::Invalid(format!(
                "record name {name:?} was first recorded as {} {was:?} in {} part(s), now as {} \
                 {global:?} in {count}; a name keeps one dtype, shape and sharding: use another name",
                a.spec.dtype.name,
                ids.len(),
                dtype.name
            )));
        }
        if names.arrays.contains_key(name) || names.groups.contains(name) {
            return Err(RecordError::Invalid(format!(
                "record name {name:?} is already recorded, with another layout (per device or \
                 unsharded); a sharded value needs a name of its own"
            )));
        }
        if let Some(p) = prefixes(name).iter().find(|p| names.arrays.contains_key(**p)) {
            return Err(RecordError::Invalid(format!(
                "record name {name:?} clashes with {p:?}: a name cannot be both an array and a group"
            )));
        }
        let mut ids = Vec::new();
        for handle in create(arrays.len())? {
            ids.push(handle.id);
            arrays.push(Arc::new(handle));
        }
        finish(&arrays[ids[0]])?;
        names.insert(name, ids[0]);
        parted.insert(name.to_string(), ids.clone());
        Ok(ids)
    }

    /// The handle of each part of parted array `name`.
    ///
    /// # Errors
    /// An unknown name.
    pub(crate) fn parts(&self, name: &str) -> Result<Vec<Arc<ArrayHandle>>, RecordError> {
        let ids = lock(&self.parted)
            .get(name)
            .cloned()
            .ok_or_else(|| RecordError::Invalid(format!("no parted array {name:?}")))?;
        let arrays = read_lock(&self.arrays);
        Ok(ids.iter().map(|&i| Arc::clone(&arrays[i])).collect())
    }

    /// Names of the parted arrays, in declaration order.
    pub(crate) fn parted_names(&self) -> Vec<String> {
        let parted = lock(&self.parted);
        let mut v: Vec<(ArrayId, String)> = parted.iter().map(|(n, ids)| (ids[0], n.clone())).collect();
        v.sort();
        v.into_iter().map(|(_, n)| n).collect()
    }

    /// Refuses records under `name` from now on, saying `why` (an array of a store appended
    /// to that this recorder cannot go on writing); its groups stay groups.
    pub(crate) fn freeze(&self, name: String, why: String) {
        let mut names = lock(&self.names);
        names.groups.extend(prefixes(&name).into_iter().map(str::to_string));
        names.frozen.insert(name, why);
    }

    /// Adds an array found in a store appended to, which `make` makes given its id.
    pub(crate) fn adopt(&self, make: impl FnOnce(ArrayId) -> ArrayHandle) {
        let mut arrays = write_lock(&self.arrays);
        let mut names = lock(&self.names);
        let handle = Arc::new(make(arrays.len()));
        names.insert(&handle.name, handle.id);
        arrays.push(handle);
    }

    /// Takes what the rows of array `name` of a store appended to summarize, as its
    /// attributes say.
    pub(crate) fn adopt_summary(&self, name: String, summary: Value) {
        lock(&self.summaries).insert(name, summary);
    }

    /// Takes the transforms table of a store appended to, if it holds more descriptions
    /// than this one (the rows there index it).
    pub(crate) fn adopt_transforms(&self, table: Vec<String>) {
        let mut own = lock(&self.transforms);
        if table.len() > own.len() {
            *own = table;
        }
    }

    /// The data array's attributes: CF `coordinates` (so xarray shows the per-row metadata
    /// as coordinates along the row dimension) and hostfeed's description, with the
    /// transforms table the `.transforms` column indexes.
    pub(crate) fn attributes(&self, a: &ArrayHandle) -> Value {
        let coords: Vec<String> = ROW_METADATA.iter().map(|s| format!("{}.{s}", a.leaf)).collect();
        let transforms: Vec<Value> = lock(&self.transforms)
            .iter()
            .map(|t| serde_json::from_str(t).unwrap_or_else(|_| json!(t)))
            .collect();
        let mut hostfeed = json!({"name": a.name, "row_metadata": ROW_METADATA, "transforms": transforms});
        if let Some(summary) = lock(&self.summaries).get(&a.name) {
            hostfeed["reduce"] = summary.clone();
        }
        if let Some(axes) = lock(&self.axes).get(&a.name) {
            hostfeed["axes"] = axes.clone();
        }
        json!({"coordinates": coords.join(" "), "hostfeed": hostfeed})
    }

    /// Says what the rows of array `name` summarize, as
    /// [`Recorder::describe_summary`](crate::record::recorder::Recorder::describe_summary).
    ///
    /// # Errors
    /// Text that is not a JSON object; a name that already summarizes otherwise.
    pub(crate) fn describe_summary(&self, name: &str, summary: &str) -> Result<(), RecordError> {
        let value: Value = serde_json::from_str(summary).ok().filter(Value::is_object).ok_or_else(|| {
            RecordError::Invalid(format!("a summary must be a JSON object, got {summary:?}"))
        })?;
        let mut summaries = lock(&self.summaries);
        match summaries.get(name) {
            Some(known) if *known != value => Err(RecordError::Invalid(format!(
                "record name {name:?} holds {known}, not {value}: a name keeps one kind of summary; use \
                 another name"
            ))),
            _ => {
                summaries.insert(name.to_string(), value);
                Ok(())
            }
        }
    }

    /// Names the axes of array `name`'s rows, as
    /// [`Recorder::describe_axes`](crate::record::recorder::Recorder::describe_axes) (or
    /// as the attributes of a store appended to say); a later description replaces it.
    ///
    /// # Errors
    /// Text that is not a JSON array of strings and nulls.
    pub(crate) fn describe_axes(&self, name: &str, axes: &str) -> Result<(), RecordError> {
        let value: Value = serde_json::from_str(axes)
            .ok()
            .filter(|v: &Value| v.as_array().is_some_and(|a| a.iter().all(|x| x.is_string() || x.is_null())))
            .ok_or_else(|| RecordError::Invalid(format!("axis names must be a JSON array of strings, got {axes:?}")))?;
        lock(&self.axes).insert(name.to_string(), value);
        Ok(())
    }

    /// The index of a transforms description (JSON) in the table.
    pub(crate) fn transforms_index(&self, description: &str) -> i16 {
        let mut t = lock(&self.transforms);
        let i = t.iter().position(|x| x == description).unwrap_or_else(|| {
            t.push(description.to_string());
            t.len() - 1
        });
        i16::try_from(i).unwrap_or(i16::MAX)
    }
}
