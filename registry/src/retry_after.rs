//! `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date.

use std::time::{Duration, SystemTime};

/// How long to wait according to a `Retry-After` value, relative to `now`; `None` if the value
/// is not valid. A date in the past means "no wait".
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    /// 2015-10-21T07:28:00Z
    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480)
    }

    #[rstest]
    #[case("120", Some(120))]
    #[case(" 0 ", Some(0))]
    #[case("Wed, 21 Oct 2015 07:28:30 GMT", Some(30))] // IMF-fixdate
    #[case("Wednesday, 21-Oct-15 07:29:00 GMT", Some(60))] // RFC 850
    #[case("Wed Oct 21 07:30:00 2015", Some(120))] // asctime
    #[case("Wed, 21 Oct 2015 07:00:00 GMT", Some(0))] // in the past
    #[case("-5", None)]
    #[case("1.5", None)]
    #[case("soon", None)]
    #[case("", None)]
    #[case("99999999999999999999999", None)]
    fn parses(#[case] value: &str, #[case] expected: Option<u64>) {
        assert_eq!(parse_retry_after(value, now()), expected.map(Duration::from_secs));
    }
}
