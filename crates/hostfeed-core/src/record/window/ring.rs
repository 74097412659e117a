//! The ring of a window: the rows of the last steps, grouped by step in the order the
//! steps first arrived, within a number of steps and a number of bytes. A row belongs to
//! its step's group (a late row of an older step joins that step's group); a new step's
//! group evicts the oldest group once there are more steps than the window keeps, and the
//! oldest groups go while the bytes exceed the bound.
//!
//! No I/O, no Python: the window calls it under its lock.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::record::arrays::{ArrayHandle, Row};

/// The rows of one step.
pub(crate) struct Group {
    pub(crate) step: i64,
    /// In arrival order, with what each counts against the bound.
    pub(crate) rows: Vec<(Arc<ArrayHandle>, Row, usize)>,
    pub(crate) bytes: usize,
}

/// A step's rows take more than the bound by themselves.
#[derive(Debug)]
pub(crate) struct TooLarge {
    /// The step.
    pub(crate) step: i64,
    /// What its rows would count, the refused row included.
    pub(crate) bytes: usize,
}

/// See the module documentation.
pub(crate) struct Ring {
    /// Steps kept (at most).
    steps: usize,
    /// Bytes kept (at most).
    bound: usize,
    groups: VecDeque<Group>,
    bytes: usize,
}

impl Ring {
    /// An empty ring of at most `steps` steps and `bound` bytes.
    pub(crate) fn new(steps: usize, bound: usize) -> Self {
        Ring { steps, bound, groups: VecDeque::new(), bytes: 0 }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Steps held.
    pub(crate) fn len(&self) -> usize {
        self.groups.len()
    }

    /// The lowest and highest step held.
    pub(crate) fn span(&self) -> Option<(i64, i64)> {
        let lo = self.groups.iter().map(|g| g.step).min()?;
        let hi = self.groups.iter().map(|g| g.step).max()?;
        Some((lo, hi))
    }

    /// Keeps `row` of `a` at `step`, counting `cost` bytes; returns the groups evicted
    /// (to be dropped by the caller, outside its lock). A row that cannot fit even with
    /// every other step evicted is refused (its step's group stays as it was).
    pub(crate) fn insert(
        &mut self,
        step: i64,
        a: Arc<ArrayHandle>,
        row: Row,
        cost: usize,
    ) -> Result<Vec<Group>, (TooLarge, Row)> {
        let at = self.groups.iter().rposition(|g| g.step == step).unwrap_or_else(|| {
            self.groups.push_back(Group { step, rows: Vec::new(), bytes: 0 });
            self.groups.len() - 1
        });
        let group_bytes = self.groups[at].bytes + cost;
        if group_bytes > self.bound {
            if self.groups[at].rows.is_empty() {
                self.groups.remove(at);
            }
            return Err((TooLarge { step, bytes: group_bytes }, row));
        }
        self.groups[at].rows.push((a, row, cost));
        self.groups[at].bytes = group_bytes;
        self.bytes += cost;
        // The oldest steps go first: a late row of an old step that tips the bytes over
        // the bound goes with its step.
        let mut evicted = Vec::new();
        while (self.groups.len() > self.steps || self.bytes > self.bound) && self.groups.len() > 1 {
            let g = self.groups.pop_front().unwrap_or_else(|| unreachable!("two groups or more"));
            self.bytes -= g.bytes;
            evicted.push(g);
        }
        Ok(evicted)
    }

    /// Takes the groups of the steps in `lo..=hi`, in step order (rows of one step in
    /// arrival order).
    pub(crate) fn take_range(&mut self, lo: i64, hi: i64) -> Vec<Group> {
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(self.groups.len());
        for g in self.groups.drain(..) {
            if (lo..=hi).contains(&g.step) {
                taken.push(g);
            } else {
                kept.push_back(g);
            }
        }
        self.groups = kept;
        self.bytes = self.groups.iter().map(|g| g.bytes).sum();
        taken.sort_by_key(|g| g.step);
        taken
    }

    /// Every group, emptied out (closing).
    pub(crate) fn clear(&mut self) -> Vec<Group> {
        self.bytes = 0;
        self.groups.drain(..).collect()
    }
}
