//! How the tests report: a clean check shows nothing, a failing one every problem at once; a
//! mutated copy must cause the problem its check is for.

/// Panics with every problem, one a line, unless there are none.
pub fn assert_clean(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

/// Panics unless a problem mentions `needle`.
pub fn expect_caught(what: &str, problems: Vec<String>, needle: &str) {
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "{what}: expected a problem mentioning {needle:?}, got {problems:?}"
    );
}
