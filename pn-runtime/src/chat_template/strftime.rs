//! `strftime_now(format)`: the current UTC time, formatted like Python's `strftime`, as
//! transformers offers it to templates (Llama-style templates print today's date).

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A UTC calendar time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DateTime {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: u32, // 0 = Monday
    yday: u32,    // 1..=366
}

impl DateTime {
    pub(crate) fn from_unix(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        let jan1 = days_from_civil(year, 1, 1);
        DateTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            // 1970-01-01 was a Thursday (3 when Monday is 0).
            weekday: (days + 3).rem_euclid(7) as u32,
            yday: (days - jan1 + 1) as u32,
        }
    }

    pub(crate) fn now() -> DateTime {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        DateTime::from_unix(secs)
    }

    /// Formats with the common `strftime` directives; unknown ones are kept as written.
    pub(crate) fn format(&self, fmt: &str) -> String {
        let mut out = String::new();
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            let month = MONTHS[self.month as usize - 1];
            let day = DAYS[self.weekday as usize];
            let h12 = if self.hour.is_multiple_of(12) {
                12
            } else {
                self.hour % 12
            };
            match d {
                'Y' => out.push_str(&self.year.to_string()),
                'y' => out.push_str(&format!("{:02}", self.year.rem_euclid(100))),
                'm' => out.push_str(&format!("{:02}", self.month)),
                'd' => out.push_str(&format!("{:02}", self.day)),
                'e' => out.push_str(&format!("{:2}", self.day)),
                'H' => out.push_str(&format!("{:02}", self.hour)),
                'I' => out.push_str(&format!("{h12:02}")),
                'M' => out.push_str(&format!("{:02}", self.minute)),
                'S' => out.push_str(&format!("{:02}", self.second)),
                'p' => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                'B' => out.push_str(month),
                'b' | 'h' => out.push_str(&month[..3]),
                'A' => out.push_str(day),
                'a' => out.push_str(&day[..3]),
                'j' => out.push_str(&format!("{:03}", self.yday)),
                'u' => out.push_str(&(self.weekday + 1).to_string()),
                'w' => out.push_str(&((self.weekday + 1) % 7).to_string()),
                'F' => out.push_str(&format!("{}-{:02}-{:02}", self.year, self.month, self.day)),
                'T' => out.push_str(&format!(
                    "{:02}:{:02}:{:02}",
                    self.hour, self.minute, self.second
                )),
                'Z' => out.push_str("UTC"),
                'z' => out.push_str("+0000"),
                '%' => out.push('%'),
                other => {
                    out.push('%');
                    out.push(other);
                }
            }
        }
        out
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    // Count in 400-year eras starting on 0000-03-01, so leap days fall at the end of a year.
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) to days since 1970-01-01.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        let t = DateTime::from_unix(0);
        assert_eq!(
            t.format("%Y-%m-%d %H:%M:%S %a %j"),
            "1970-01-01 00:00:00 Thu 001"
        );
        // 2024-02-29 12:34:56 UTC, a Thursday, day 60.
        let t = DateTime::from_unix(1_709_210_096);
        assert_eq!(
            t.format("%d %b %Y, %A %I%p %j %%"),
            "29 Feb 2024, Thursday 12PM 060 %"
        );
        assert_eq!(t.format("%B %e %q"), "February 29 %q");
        for days in [-1000, -1, 0, 59, 365, 11_016, 20_000, 100_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
