//! Date-times of IBM's APIs (VPC `created_at`, Power `creationDate`). Both are `date-time` in the
//! API definitions and IBM's Go SDKs read them with go-openapi's `strfmt.DateTime`, which takes
//! RFC 3339 and also a date-time without offset (as UTC): the response examples of the VPC API
//! definition are written that way (`"created_at": "2019-01-01T12:00:00"`).

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;

/// The instant `text` names, `None` when it is not a date-time.
pub fn parse(text: &str) -> Option<Timestamp> {
    if let Ok(at) = text.parse::<Timestamp>() {
        return Some(at);
    }
    let local = text.parse::<DateTime>().ok()?;
    local.to_zoned(TimeZone::UTC).ok().map(|at| at.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn rfc3339_and_offsetless_date_times_are_read() {
        assert_eq!(
            parse("2025-03-31T12:24:40.000Z"),
            Some(at("2025-03-31T12:24:40Z"))
        );
        assert_eq!(
            parse("2025-03-31T14:24:40+02:00"),
            Some(at("2025-03-31T12:24:40Z"))
        );
        assert_eq!(
            parse("2019-01-01T12:00:00"),
            Some(at("2019-01-01T12:00:00Z"))
        );
        assert_eq!(parse("yesterday"), None);
        assert_eq!(parse(""), None);
    }
}
