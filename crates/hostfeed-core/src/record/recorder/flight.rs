//! The recorder's flight recorder (`record/window`): configuring its window, saying which
//! arrays it keeps, firing triggers from Python (a watched value's predicate, `keep`,
//! another process's trigger), and the commits that write the triggers' document before
//! the rows they announce.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::Recorder;
use crate::error::RecordError;
use crate::record::common::ArrayId;
use crate::record::window::{Kind, Window, WindowOptions};
use crate::record::zarr;

impl Recorder {
    /// Gives the recorder a window (once): rows of arrays marked windowed
    /// ([`Recorder::window_array`]) are kept in memory, and triggers write them. With
    /// `resume_after_step` (a store appended to), the earlier recording's triggers after
    /// that step are dropped; the others stay listed.
    ///
    /// # Errors
    /// A second window; a closed recorder.
    pub fn configure_window(&self, opts: WindowOptions, resume_after_step: Option<i64>) -> Result<(), RecordError> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let attrs = self
            .store
            .get(&self.root.join("zarr.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .map(|doc| doc["attributes"].clone())
            .filter(Value::is_object)
            .unwrap_or_else(crate::record::backend::root::root_attributes);
        self.window
            .set(Window::new(opts, attrs, resume_after_step))
            .map_err(|_| RecordError::Invalid("this recorder already has a window".into()))
    }

    fn window(&self) -> Result<&Window, RecordError> {
        self.window.get().ok_or_else(|| {
            RecordError::Invalid(
                "this recorder has no window nor triggers (hostfeed.Recorder(..., window=N) or \
                 on_nonfinite=True)"
                    .into(),
            )
        })
    }

    /// Says how the window handles array `id`'s rows: kept in memory (`windowed`), and
    /// searched for non-finite values (a summary's: its `columns` of `width` counting
    /// them; else every value).
    ///
    /// # Errors
    /// No window; an unknown array; a windowed array when the window keeps no step, or
    /// whose row alone does not fit; summary columns of rows that are not float32.
    pub fn window_array(
        &self,
        id: ArrayId,
        windowed: bool,
        columns: Option<(usize, Vec<usize>)>,
    ) -> Result<(), RecordError> {
        let a = self.array(id).ok_or_else(|| RecordError::Invalid(format!("no array with id {id}")))?;
        self.window()?.set_traits(&a, windowed, columns)
    }

    /// Fires a trigger from Python: `kind` `"watch"` (a predicate on the watched array
    /// `name` at `step`) or `"keep"` (the window as it stands); returns its description
    /// (JSON).
    ///
    /// # Errors
    /// No window; an unknown kind; a closed recorder.
    pub fn fire_trigger(&self, kind: &str, step: i64, reason: &str, name: Option<&str>) -> Result<String, RecordError> {
        let window = self.window()?;
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let Some(kind @ (Kind::Watch | Kind::Keep)) = Kind::parse(kind) else {
            return Err(RecordError::Invalid(format!("no trigger of kind {kind:?} is fired from Python")));
        };
        let route = |a: &std::sync::Arc<crate::record::arrays::ArrayHandle>, row| self.store_row(a, row);
        let description =
            window.fire(kind, step, reason.to_string(), name.map(str::to_string), Map::new(), &route);
        Ok(description.to_string())
    }

    /// Applies another process's trigger (its description, JSON): this process writes its
    /// window for the same steps. Returns whether it was new.
    ///
    /// # Errors
    /// No window; text that is not a trigger's description.
    pub fn apply_remote_trigger(&self, description: &str) -> Result<bool, RecordError> {
        let window = self.window()?;
        let doc: Value = serde_json::from_str(description)
            .map_err(|e| RecordError::Invalid(format!("not a trigger's description ({e}): {description}")))?;
        let route = |a: &std::sync::Arc<crate::record::arrays::ArrayHandle>, row| self.store_row(a, row);
        Ok(window.apply_remote(&doc, &route))
    }

    /// Triggers fired or applied so far (0 without a window).
    #[must_use]
    pub fn trigger_count(&self) -> u64 {
        self.window.get().map_or(0, Window::count)
    }

    /// The descriptions (JSON) of the triggers not taken by this call before.
    #[must_use]
    pub fn take_triggers(&self) -> Vec<String> {
        self.window.get().map(Window::take_unseen).unwrap_or_default().iter().map(Value::to_string).collect()
    }

    /// The descriptions (JSON) of this process's triggers not taken by this call before,
    /// waiting up to `timeout` for one (the publisher of a shared store).
    #[must_use]
    pub fn take_unpublished_triggers(&self, timeout: Duration) -> Vec<String> {
        self.window.get().map(|w| w.take_unpublished(timeout)).unwrap_or_default().iter().map(Value::to_string).collect()
    }

    /// What this process kept for each trigger: `(uid, JSON)`.
    #[must_use]
    pub fn trigger_parts(&self) -> Vec<(String, String)> {
        self.window.get().map(Window::own_parts).unwrap_or_default().into_iter().map(|(u, v)| (u, v.to_string())).collect()
    }

    /// Merges what another process kept for trigger `uid` (JSON of
    /// [`Recorder::trigger_parts`]), for the document this process writes.
    ///
    /// # Errors
    /// Text that is not JSON.
    pub fn merge_trigger_part(&self, uid: &str, process: u32, part: &str) -> Result<(), RecordError> {
        let part: Value = serde_json::from_str(part).map_err(|e| RecordError::Invalid(format!("{e}: {part}")))?;
        if let Some(w) = self.window.get() {
            w.merge_part(uid, process, part);
        }
        Ok(())
    }

    /// Every trigger's description (JSON list): the earlier recording's, then this one's.
    #[must_use]
    pub fn triggers(&self) -> String {
        Value::Array(self.window.get().map(Window::describe_all).unwrap_or_default()).to_string()
    }

    /// The window's bytes and steps held now, and its bound.
    #[must_use]
    pub fn window_held(&self) -> Value {
        self.window.get().map_or(Value::Null, |w| {
            let (bytes, steps) = w.held();
            json!({"bytes": bytes, "steps": steps, "window_bytes": w.options().bytes})
        })
    }

    /// Announces the rows written so far (every array's: a flush's), within
    /// [`with_triggers`](Self::with_triggers).
    pub(super) fn commit_all(&self) {
        self.with_triggers(|| self.committer.commit_all(&*self.store, &self.catalogue, &self.failures));
    }

    /// Runs `announce` (commits that may announce rows); with a window, first writes the
    /// triggers' document if it changed, all under the window's document lock, so that no
    /// row routed for a trigger is announced before the trigger is listed.
    pub(super) fn with_triggers(&self, announce: impl FnOnce()) {
        let Some(window) = self.window.get() else {
            return announce();
        };
        let doc = window.doc_lock();
        if let Some(attrs) = window.document_if_changed(&doc) {
            if let Err(e) = zarr::write_json(&*self.store, &self.root, &zarr::group_metadata(&attrs)) {
                window.changed();
                self.failures.push(e.context("the triggers' document"));
            }
        }
        announce();
        drop(doc);
    }
}
