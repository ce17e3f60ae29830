//! Where a stored record stands in its replay window, as the statement that read it judged it:
//! the one Rust reading of the window. The rule itself is the schema's,
//! `replay_window_open(deadline, instant)` (`schema/functions/internal/replay_window_open.sql`);
//! every endpoint statement asks it on its transaction's clock and returns the answer as the
//! columns `expired` and `past_deadline`, which [`RecordState::read`] turns into one value. What
//! a retry of an intent meets at such a record ([`RecordState::answer`]) is decided here too, once:
//! the endpoint's protocol and `tombstoned keys explain` both ask it.

use tokio_postgres::Row;

/// A stored record's place in its replay window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Inside its window: a retry of the same intent replays the stored answer.
    Replayable,
    /// Its window has closed, and the cleaner has not tombstoned it yet: answered like a
    /// tombstone ("expired"), never replayed.
    PastDeadline,
    /// A tombstone: the body is gone; the key, its fingerprint and its resource stay.
    Tombstone,
}

impl RecordState {
    /// The state from the two columns every endpoint statement returns: `expired` (the cleaner's
    /// mark) and `past_deadline` (`NOT replay_window_open(replay_deadline, now())`).
    pub fn of(expired: bool, past_deadline: bool) -> RecordState {
        match (expired, past_deadline) {
            (true, _) => RecordState::Tombstone,
            (false, true) => RecordState::PastDeadline,
            (false, false) => RecordState::Replayable,
        }
    }

    /// The state of the record `row` describes (its columns `expired` and `past_deadline`).
    pub fn read(row: &Row) -> Result<RecordState, tokio_postgres::Error> {
        Ok(RecordState::of(
            row.try_get("expired")?,
            row.try_get("past_deadline")?,
        ))
    }

    /// Whether its stored answer may be sent again.
    pub fn is_replayable(self) -> bool {
        self == RecordState::Replayable
    }

    /// What a retry meets at a record in this state: `same_intent` when its fingerprint is the
    /// record's. Key reuse is decided first, so a changed intent never learns anything of the
    /// stored one, before or after expiry; then the window.
    pub fn answer(self, same_intent: bool) -> RetryAnswer {
        if !same_intent {
            RetryAnswer::KeyReused
        } else if self.is_replayable() {
            RetryAnswer::Replay
        } else {
            RetryAnswer::Expired
        }
    }
}

/// What a retry with a stored record's key is answered (docs/protocol.md, "The outcomes a caller
/// can see"): the endpoint's 200 replay / 422 / 410, the SQL API's `replay` / `key_reused` /
/// `expired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryAnswer {
    /// The stored answer again.
    Replay,
    /// Refused: the key was used for another intent.
    KeyReused,
    /// Beyond the replay window: look up the business object; never a re-execution.
    Expired,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_live_record_inside_its_window_is_replayable() {
        assert_eq!(RecordState::of(false, false), RecordState::Replayable);
        assert_eq!(RecordState::of(false, true), RecordState::PastDeadline);
        // The cleaner tombstones only records past their deadline; a tombstone is one whatever
        // the clock says.
        assert_eq!(RecordState::of(true, true), RecordState::Tombstone);
        assert_eq!(RecordState::of(true, false), RecordState::Tombstone);
        assert!(RecordState::Replayable.is_replayable());
        assert!(!RecordState::PastDeadline.is_replayable());
        assert!(!RecordState::Tombstone.is_replayable());
    }

    #[test]
    fn key_reuse_is_decided_before_the_window() {
        for state in [
            RecordState::Replayable,
            RecordState::PastDeadline,
            RecordState::Tombstone,
        ] {
            assert_eq!(state.answer(false), RetryAnswer::KeyReused, "{state:?}");
        }
        assert_eq!(RecordState::Replayable.answer(true), RetryAnswer::Replay);
        assert_eq!(RecordState::PastDeadline.answer(true), RetryAnswer::Expired);
        assert_eq!(RecordState::Tombstone.answer(true), RetryAnswer::Expired);
    }
}
