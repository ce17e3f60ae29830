//! Where a pass stands in its index (a keyset cursor on the index key: `replay_deadline` for
//! tombstoning, `expired_at` for purging), and the key ranges behind the cursor that may still
//! hold rows to come back to. Pure logic: the SQL is in [`super::sql`].
//!
//! A batch starts at the largest key the previous batch picked (inclusive: several rows can share
//! a key, and the ones already done no longer match the partial index's predicate). It never
//! starts from the beginning again, so the index entries that earlier batches of the run left
//! dead (they stay until vacuum) are stepped over at most once per run.

use chrono::{DateTime, TimeDelta, Utc};

/// An index key (both indexes are on `timestamptz` columns).
pub type Key = DateTime<Utc>;

/// A closed range of index keys; `from: None` starts at the beginning of the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRange {
    /// First key, inclusive; `None` = from the beginning.
    pub from: Option<Key>,
    /// Last key, inclusive.
    pub to: Key,
}

/// What one batch statement reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchRows {
    /// Rows the batch picked from the index.
    pub picked: u64,
    /// Rows it changed (tombstoned or purged) after locking and re-checking them.
    pub changed: u64,
    /// The largest key picked; `None` when nothing was picked.
    pub last: Option<Key>,
    /// Due rows it passed over because another session held them (`SKIP LOCKED` statements).
    pub passed_over: u64,
}

/// Whether a pass goes on after a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Run another batch from the new cursor.
    Continue,
    /// The batch found nothing: the pass is over.
    Exhausted,
}

/// The result of [`Pass::advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advance {
    /// Whether the pass goes on.
    pub step: Step,
    /// A range behind the new cursor where rows may remain (passed over, or picked but not
    /// changed), to retry later in the run or to count in the backlog.
    pub revisit: Option<KeyRange>,
}

/// One pass over a key range, batch by batch.
#[derive(Debug, Clone)]
pub struct Pass {
    range: KeyRange,
    cursor: Option<Key>,
}

impl Pass {
    /// A pass over `range`, starting at its beginning.
    pub fn new(range: KeyRange) -> Self {
        Self {
            range,
            cursor: range.from,
        }
    }

    /// Where the next batch starts (inclusive).
    pub fn cursor(&self) -> Option<Key> {
        self.cursor
    }

    /// Where the pass ends (inclusive).
    pub fn to(&self) -> Key {
        self.range.to
    }

    /// The part of the range not yet walked.
    pub fn remaining(&self) -> KeyRange {
        KeyRange {
            from: self.cursor,
            to: self.range.to,
        }
    }

    /// Moves the cursor after a committed batch.
    pub fn advance(&mut self, rows: BatchRows) -> Advance {
        let Some(last) = rows.last else {
            // Nothing picked: the pass is over. Rows passed over lie anywhere in what was left.
            return Advance {
                step: Step::Exhausted,
                revisit: (rows.passed_over > 0).then(|| self.remaining()),
            };
        };
        let walked = KeyRange {
            from: self.cursor,
            to: last,
        };
        // The same rows picked again at the same key with nothing changed: something keeps
        // changing them under us. Step strictly past that key (timestamps have microsecond
        // resolution) so the pass always ends; the key is revisited at the end of the run.
        let stuck = rows.changed == 0 && self.cursor == Some(last);
        let left_rows = rows.passed_over > 0 || rows.changed < rows.picked || stuck;
        if stuck {
            match last.checked_add_signed(TimeDelta::microseconds(1)) {
                Some(next) => self.cursor = Some(next),
                None => {
                    return Advance {
                        step: Step::Exhausted,
                        revisit: Some(walked),
                    }
                }
            }
        } else {
            self.cursor = Some(last);
        }
        Advance {
            step: Step::Continue,
            revisit: left_rows.then_some(walked),
        }
    }
}

/// Key ranges that may still hold rows, kept sorted and merged.
#[derive(Debug, Clone, Default)]
pub struct Revisit {
    ranges: Vec<KeyRange>,
}

impl Revisit {
    /// Adds a range, merging it with any it overlaps.
    pub fn add(&mut self, range: KeyRange) {
        self.ranges.push(range);
        // `None` (the beginning of the index) sorts first, as it should.
        self.ranges.sort_by_key(|r| r.from);
        let mut merged: Vec<KeyRange> = Vec::with_capacity(self.ranges.len());
        for r in self.ranges.drain(..) {
            match merged.last_mut() {
                Some(prev) if r.from.is_none_or(|from| from <= prev.to) => {
                    prev.to = prev.to.max(r.to);
                }
                _ => merged.push(r),
            }
        }
        self.ranges = merged;
    }

    /// Removes and returns every range.
    pub fn take(&mut self) -> Vec<KeyRange> {
        std::mem::take(&mut self.ranges)
    }

    /// The ranges.
    pub fn ranges(&self) -> &[KeyRange] {
        &self.ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(s: i64) -> Key {
        Utc.timestamp_opt(1_800_000_000 + s, 0).single().unwrap()
    }

    fn rows(picked: u64, changed: u64, last: Option<i64>, passed_over: u64) -> BatchRows {
        BatchRows {
            picked,
            changed,
            last: last.map(at),
            passed_over,
        }
    }

    #[test]
    fn cursor_follows_the_last_key_picked_and_a_clean_pass_leaves_nothing() {
        let mut pass = Pass::new(KeyRange {
            from: None,
            to: at(100),
        });
        assert_eq!(pass.cursor(), None);
        let a = pass.advance(rows(10, 10, Some(5), 0));
        assert_eq!(
            a,
            Advance {
                step: Step::Continue,
                revisit: None
            }
        );
        assert_eq!(pass.cursor(), Some(at(5)));
        let a = pass.advance(rows(10, 10, Some(9), 0));
        assert_eq!(a.revisit, None);
        assert_eq!(pass.cursor(), Some(at(9)));
        let a = pass.advance(rows(0, 0, None, 0));
        assert_eq!(
            a,
            Advance {
                step: Step::Exhausted,
                revisit: None
            }
        );
        assert_eq!(
            pass.remaining(),
            KeyRange {
                from: Some(at(9)),
                to: at(100)
            }
        );
    }

    #[test]
    fn rows_passed_over_or_not_changed_leave_the_walked_range_to_revisit() {
        let mut pass = Pass::new(KeyRange {
            from: Some(at(1)),
            to: at(100),
        });
        let a = pass.advance(rows(9, 9, Some(7), 1));
        assert_eq!(
            a.revisit,
            Some(KeyRange {
                from: Some(at(1)),
                to: at(7)
            })
        );
        let a = pass.advance(rows(10, 8, Some(12), 0));
        assert_eq!(
            a.revisit,
            Some(KeyRange {
                from: Some(at(7)),
                to: at(12)
            })
        );
        assert_eq!(a.step, Step::Continue);
        // Nothing picked but rows passed over: they are somewhere in what is left.
        let a = pass.advance(rows(0, 0, None, 2));
        assert_eq!(a.step, Step::Exhausted);
        assert_eq!(
            a.revisit,
            Some(KeyRange {
                from: Some(at(12)),
                to: at(100)
            })
        );
    }

    #[test]
    fn a_pass_stuck_on_one_key_steps_strictly_past_it() {
        let mut pass = Pass::new(KeyRange {
            from: None,
            to: at(100),
        });
        pass.advance(rows(3, 0, Some(4), 0));
        assert_eq!(pass.cursor(), Some(at(4)));
        // Same key again, nothing changed: step one microsecond past it and remember it.
        let a = pass.advance(rows(3, 0, Some(4), 0));
        assert_eq!(a.step, Step::Continue);
        assert_eq!(
            a.revisit,
            Some(KeyRange {
                from: Some(at(4)),
                to: at(4)
            })
        );
        assert_eq!(
            pass.cursor(),
            Some(at(4) + TimeDelta::microseconds(1)),
            "cursor moved strictly past the stuck key"
        );
        // Progress at the same key (some rows changed) is not being stuck.
        let mut pass = Pass::new(KeyRange {
            from: Some(at(4)),
            to: at(100),
        });
        pass.advance(rows(3, 2, Some(4), 0));
        assert_eq!(pass.cursor(), Some(at(4)));
    }

    #[test]
    fn revisit_ranges_merge_when_they_overlap_or_touch() {
        let mut r = Revisit::default();
        assert!(r.ranges().is_empty());
        r.add(KeyRange {
            from: Some(at(10)),
            to: at(20),
        });
        r.add(KeyRange {
            from: Some(at(20)),
            to: at(30),
        });
        r.add(KeyRange {
            from: Some(at(50)),
            to: at(60),
        });
        assert_eq!(
            r.ranges(),
            [
                KeyRange {
                    from: Some(at(10)),
                    to: at(30)
                },
                KeyRange {
                    from: Some(at(50)),
                    to: at(60)
                }
            ]
        );
        // A range from the beginning swallows everything up to its end.
        r.add(KeyRange {
            from: None,
            to: at(55),
        });
        assert_eq!(
            r.ranges(),
            [KeyRange {
                from: None,
                to: at(60)
            }]
        );
        assert_eq!(r.take().len(), 1);
        assert!(r.ranges().is_empty());
    }
}
