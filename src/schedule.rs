//! Cleanup schedules: crontab(5) expressions (optionally with a leading seconds field) and their
//! fire times, always in UTC.
//!
//! The meaning is crontab's, not Quartz's: day-of-week counts from Sunday = 0 (7 is Sunday too),
//! and when both day-of-month and day-of-week are restricted a day matching *either* fires
//! (`0 3 1 * 1` runs at 03:00 on the 1st of every month and on every Monday).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// A parse failure, with the expression and the parser's reason.
#[derive(Debug, thiserror::Error)]
#[error("invalid cron expression {expression:?}: {reason}")]
pub struct ScheduleError {
    expression: String,
    reason: String,
}

/// A validated schedule. Cheap to clone; compares by its source text.
#[derive(Clone)]
pub struct Schedule {
    expression: String,
    cron: Cron,
}

impl Schedule {
    /// Parses a 5-field crontab expression, a 6-field one whose first field is seconds, or one of
    /// the `@hourly`/`@daily`/`@weekly`/`@monthly`/`@yearly` nicknames.
    pub fn parse(expression: &str) -> Result<Self, ScheduleError> {
        let fields = expression.split_whitespace().count();
        let nickname = expression.trim_start().starts_with('@');
        if !nickname && !(5..=6).contains(&fields) {
            return Err(ScheduleError {
                expression: expression.to_owned(),
                reason: format!(
                    "expected 5 fields (minute hour day-of-month month day-of-week) \
                     or 6 with a leading seconds field, found {fields}"
                ),
            });
        }
        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            // crontab(5): restricted day-of-month OR restricted day-of-week.
            .dom_and_dow(false)
            .alternative_weekdays(false)
            .build();
        let cron = parser.parse(expression).map_err(|e| ScheduleError {
            expression: expression.to_owned(),
            reason: e.to_string(),
        })?;
        // A pattern that never fires (e.g. 30 February) would park the scheduler forever.
        if cron.find_next_occurrence(&Utc::now(), false).is_err() {
            return Err(ScheduleError {
                expression: expression.to_owned(),
                reason: "it never fires".to_owned(),
            });
        }
        Ok(Self {
            expression: expression.to_owned(),
            cron,
        })
    }

    /// The first fire time strictly after `after`, or `None` if the schedule has no more.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.find_next_occurrence(&after, false).ok()
    }

    /// The next `count` fire times strictly after `after`.
    pub fn upcoming(&self, after: DateTime<Utc>, count: usize) -> Vec<DateTime<Utc>> {
        let mut times = Vec::with_capacity(count);
        let mut cursor = after;
        while times.len() < count {
            match self.next_after(cursor) {
                Some(next) => {
                    times.push(next);
                    cursor = next;
                }
                None => break,
            }
        }
        times
    }

    /// The expression as written in the configuration.
    pub fn expression(&self) -> &str {
        &self.expression
    }
}

impl FromStr for Schedule {
    type Err = ScheduleError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Schedule").field(&self.expression).finish()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expression)
    }
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.expression == other.expression
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, TimeZone, Timelike, Weekday};

    fn at(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).single().unwrap()
    }

    #[test]
    fn day_of_week_one_is_monday_as_in_crontab() {
        // 2026-12-02 is a Wednesday.
        let s = Schedule::parse("0 3 * * 1").unwrap();
        let next = s.next_after(at(2026, 12, 2, 12, 0)).unwrap();
        assert_eq!(next, at(2026, 12, 7, 3, 0));
        assert_eq!(next.weekday(), Weekday::Mon);
    }

    #[test]
    fn sunday_is_zero_and_seven() {
        for expr in ["0 3 * * 0", "0 3 * * 7", "0 3 * * sun", "0 3 * * SUN"] {
            let next = Schedule::parse(expr)
                .unwrap()
                .next_after(at(2026, 12, 2, 12, 0))
                .unwrap();
            assert_eq!(next.weekday(), Weekday::Sun, "{expr}");
            assert_eq!(next, at(2026, 12, 6, 3, 0), "{expr}");
        }
    }

    #[test]
    fn weekday_range_one_to_five_is_monday_to_friday() {
        let s = Schedule::parse("30 6 * * 1-5").unwrap();
        let days: Vec<Weekday> = s
            .upcoming(at(2026, 12, 5, 0, 0), 5) // from a Saturday
            .iter()
            .map(|t| t.weekday())
            .collect();
        assert_eq!(
            days,
            [
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed,
                Weekday::Thu,
                Weekday::Fri
            ]
        );
    }

    #[test]
    fn restricted_day_of_month_and_day_of_week_are_ored() {
        // 1st of the month OR any Monday.
        let s = Schedule::parse("0 0 1 * 1").unwrap();
        let fires = s.upcoming(at(2026, 11, 29, 0, 0), 3);
        assert_eq!(
            fires,
            [
                at(2026, 11, 30, 0, 0),
                at(2026, 12, 1, 0, 0),
                at(2026, 12, 7, 0, 0)
            ]
        );
    }

    #[test]
    fn every_five_minutes_and_seconds_form() {
        let s = Schedule::parse("*/5 * * * *").unwrap();
        let fires = s.upcoming(at(2026, 12, 2, 12, 1), 2);
        assert_eq!(fires, [at(2026, 12, 2, 12, 5), at(2026, 12, 2, 12, 10)]);

        let s = Schedule::parse("*/2 * * * * *").unwrap();
        let fires = s.upcoming(at(2026, 12, 2, 12, 1), 2);
        assert_eq!(fires[0].second(), 2);
        assert_eq!(fires[1].second(), 4);
    }

    #[test]
    fn nicknames() {
        let s = Schedule::parse("@daily").unwrap();
        assert_eq!(
            s.next_after(at(2026, 12, 2, 12, 0)).unwrap(),
            at(2026, 12, 3, 0, 0)
        );
    }

    #[test]
    fn rejects_garbage_wrong_field_counts_and_impossible_dates() {
        for bad in [
            "",
            "every five minutes",
            "* * * *",
            "0 0 0 1 1 * 2030",
            "61 * * * *",
            "* * * * 8",
            "0 0 30 2 *",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
