//! Reading holdfast's own metrics from an admin port, as the e2e suites and benchmarks check
//! them: the exposition text, and one series' value in it. A line lookup is all they need (the
//! exposition is holdfast's, one series per line), so no parser crate.

use std::{sync::LazyLock, time::Duration};

use anyhow::{Context, Result};

/// One client for every scrape (its connection pool), each request bounded: a hung admin port
/// fails the scrape rather than stalling its caller.
static HTTP: LazyLock<reqwest::Client> = LazyLock::new(reqwest::Client::new);
const TIMEOUT: Duration = Duration::from_secs(5);

/// The exposition text of the admin port at `admin` (`host:port`): an error for a failed
/// request, one past [`TIMEOUT`], or a status other than success.
pub async fn scrape(admin: &str) -> Result<String> {
    HTTP.get(format!("http://{admin}/metrics"))
        .timeout(TIMEOUT)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("GET http://{admin}/metrics"))?
        .text()
        .await
        .with_context(|| format!("reading http://{admin}/metrics"))
}

/// The value of the series `series` (its name and labels as exported, e.g.
/// `holdfast_controller_leader` or `x_total{kind="App"}`) in the exposition `text`; none when it
/// is absent or not a number.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.split_whitespace().next())
        .and_then(|value| value.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_found_by_its_whole_name_and_labels() {
        let text =
            "# TYPE a counter\na_total{kind=\"App\"} 3\na_total{kind=\"Package\"} 5\nab 7 1700000000\n";
        assert_eq!(value(text, "a_total{kind=\"Package\"}"), Some(5.0));
        // A name that is a prefix of another's does not match it; a timestamp is not the value.
        assert_eq!(value(text, "a"), None);
        assert_eq!(value(text, "ab"), Some(7.0));
        assert_eq!(value("x NaNish\n", "x"), None);
    }
}
