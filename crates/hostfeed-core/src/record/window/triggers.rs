//! The triggers a window fired (or was told of by another process), and the document that
//! lists them: the `triggers` list in the store's root attributes (`hostfeed.triggers`),
//! each with the steps it kept of every windowed array, so that a reader can tell a window
//! written whole from one cut short (a process killed mid-write: the rows announced are
//! whole, the steps a trigger lists but no array holds are reported missing).
//!
//! No I/O, no Python.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

/// What fired a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A non-finite value in a recorded row.
    NonFinite,
    /// A host predicate on a watched value (`Recorder.watch`).
    Watch,
    /// `Recorder.keep(reason)`.
    Keep,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::NonFinite => "nonfinite",
            Kind::Watch => "watch",
            Kind::Keep => "keep",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "nonfinite" => Kind::NonFinite,
            "watch" => Kind::Watch,
            "keep" => Kind::Keep,
            _ => return None,
        })
    }
}

/// One trigger: what fired it, the steps its window covers, and what this process kept.
#[derive(Debug, Clone)]
pub(crate) struct Trigger {
    /// `"PROCESS:N"`: the process that fired it and its count there (one id for every
    /// process of a `jax.distributed` run).
    pub(crate) uid: String,
    pub(crate) kind: Kind,
    /// The step it fired at.
    pub(crate) step: i64,
    /// The steps it writes, `first..=last`.
    pub(crate) first: i64,
    pub(crate) last: i64,
    pub(crate) reason: String,
    /// The array (or watched name) that fired it; none for `keep`.
    pub(crate) name: Option<String>,
    /// The process that fired it.
    pub(crate) process: u32,
    /// Wall-clock time it fired (UNIX ns).
    pub(crate) time_ns: i64,
    /// More about it (a non-finite value: `value`, `element`).
    pub(crate) extra: Map<String, Value>,
    /// Steps of each windowed array of this process routed to the store for it.
    pub(crate) kept: BTreeMap<String, BTreeSet<i64>>,
    /// What the other processes kept (their `kept` and whether they are `written`), as
    /// published (a shared store's leader writes them into its document).
    pub(crate) others: BTreeMap<u32, Value>,
    /// No more rows will come for its steps (a later step arrived, or the recorder closed).
    pub(crate) closed: bool,
    /// Every row it routed is announced in the store.
    pub(crate) written: bool,
}

impl Trigger {
    /// The description of a trigger in the store and in Python: `step`, `reason`, `name`
    /// (null for `keep`), `kind`, `process`, `time_ns`, `first_step`, `last_step`,
    /// `uid`, `state` (`"writing"`, `"written"`), `kept` (array -> steps), and the extra
    /// fields.
    pub(crate) fn describe(&self) -> Value {
        let mut kept: BTreeMap<String, Vec<i64>> =
            self.kept.iter().map(|(name, steps)| (name.clone(), steps.iter().copied().collect())).collect();
        let mut written = self.written;
        for other in self.others.values() {
            if let Some(map) = other["kept"].as_object() {
                for (name, steps) in map {
                    let steps = steps.as_array().map(|s| s.iter().filter_map(Value::as_i64).collect());
                    kept.insert(name.clone(), steps.unwrap_or_default());
                }
            }
            written &= other["written"].as_bool().unwrap_or(false);
        }
        let mut doc = json!({
            "uid": self.uid,
            "step": self.step,
            "reason": self.reason,
            "name": self.name,
            "kind": self.kind.name(),
            "process": self.process,
            "time_ns": self.time_ns,
            "first_step": self.first,
            "last_step": self.last,
            "state": if written { "written" } else { "writing" },
            "kept": kept,
        });
        if let Some(map) = doc.as_object_mut() {
            for (k, v) in &self.extra {
                map.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        doc
    }

    /// What this process kept for it, for the other processes (a shared store's leader).
    pub(crate) fn own_part(&self) -> Value {
        let kept: BTreeMap<&String, Vec<i64>> =
            self.kept.iter().map(|(name, steps)| (name, steps.iter().copied().collect())).collect();
        json!({"kept": kept, "written": self.written})
    }

    /// A trigger from its description (another process's, published), with nothing kept
    /// here yet.
    pub(crate) fn from_description(doc: &Value) -> Option<Trigger> {
        let extra = doc
            .as_object()?
            .iter()
            .filter(|(k, _)| matches!(k.as_str(), "value" | "element" | "index"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Some(Trigger {
            uid: doc["uid"].as_str()?.to_string(),
            kind: Kind::parse(doc["kind"].as_str()?)?,
            step: doc["step"].as_i64()?,
            first: doc["first_step"].as_i64()?,
            last: doc["last_step"].as_i64()?,
            reason: doc["reason"].as_str()?.to_string(),
            name: doc["name"].as_str().map(str::to_string),
            process: u32::try_from(doc["process"].as_u64()?).ok()?,
            time_ns: doc["time_ns"].as_i64().unwrap_or(0),
            extra,
            kept: BTreeMap::new(),
            others: BTreeMap::new(),
            closed: false,
            written: false,
        })
    }
}

/// The root group's attributes with `triggers` (the earlier recording's, when appended to,
/// then this recorder's) as `hostfeed.triggers`.
pub(crate) fn root_attributes(base: &Value, earlier: &[Value], triggers: &[Trigger]) -> Value {
    let mut attrs = base.clone();
    let list: Vec<Value> = earlier.iter().cloned().chain(triggers.iter().map(Trigger::describe)).collect();
    if let Some(hostfeed) = attrs.get_mut("hostfeed").and_then(Value::as_object_mut) {
        hostfeed.insert("triggers".into(), Value::Array(list));
    }
    attrs
}

/// The triggers of an earlier recording (its root attributes), those at or before
/// `resume_after_step` when one is given (the later ones' rows are dropped).
pub(crate) fn earlier_triggers(attrs: &Value, resume_after_step: Option<i64>) -> Vec<Value> {
    attrs["hostfeed"]["triggers"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter(|t| resume_after_step.is_none_or(|s| t["step"].as_i64().is_some_and(|step| step <= s)))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger() -> Trigger {
        Trigger {
            uid: "1:0".into(),
            kind: Kind::NonFinite,
            step: 10,
            first: 7,
            last: 11,
            reason: "non-finite value nan in \"h\" at step 10".into(),
            name: Some("h".into()),
            process: 1,
            time_ns: 5,
            extra: [("value".to_string(), json!("nan"))].into_iter().collect(),
            kept: [("h".to_string(), [7, 8, 9, 10].into_iter().collect())].into_iter().collect(),
            others: BTreeMap::new(),
            closed: false,
            written: false,
        }
    }

    #[test]
    fn a_description_round_trips_and_merges_other_processes() {
        let mut t = trigger();
        let doc = t.describe();
        assert_eq!(doc["kept"]["h"], json!([7, 8, 9, 10]));
        assert_eq!(doc["state"], "writing");
        assert_eq!(doc["value"], "nan");
        let back = Trigger::from_description(&doc).unwrap();
        assert_eq!((back.uid.as_str(), back.step, back.first, back.last), ("1:0", 10, 7, 11));
        assert!(back.kept.is_empty());
        t.written = true;
        t.others.insert(0, json!({"kept": {"g": [8, 9]}, "written": false}));
        let doc = t.describe();
        assert_eq!(doc["kept"]["g"], json!([8, 9]));
        assert_eq!(doc["state"], "writing", "written only when every process wrote");
    }

    #[test]
    fn earlier_triggers_after_the_resumed_step_are_dropped() {
        let attrs = json!({"hostfeed": {"triggers": [{"step": 3}, {"step": 9}]}});
        assert_eq!(earlier_triggers(&attrs, None).len(), 2);
        assert_eq!(earlier_triggers(&attrs, Some(5)), vec![json!({"step": 3})]);
        let root = root_attributes(&json!({"hostfeed": {"format": "x"}}), &[json!({"step": 3})], &[trigger()]);
        assert_eq!(root["hostfeed"]["triggers"].as_array().unwrap().len(), 2);
        assert_eq!(root["hostfeed"]["format"], "x");
    }
}
