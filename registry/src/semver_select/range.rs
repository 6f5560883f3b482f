//! Version constraints in the range syntax of `github.com/carvel-dev/semver/v4` (`ParseRange`),
//! which is what vendir's `tagSelection.semver.constraints` uses.
//!
//! Grammar, as implemented by the Go code (ported step by step, quirks included, so the same
//! constraint selects the same tag as vendir):
//! - space-separated comparators are ANDed; `||` separates ORed groups; no brackets;
//! - operators `>`, `>=`, `<`, `<=`, `=`, `==`, `!=`, `!`, and none (meaning `=`); spaces after
//!   an operator are tolerated (`>= 1.0.0`);
//! - versions are strict semver (no `v`, no short `1.2`), compared with the build-metadata-aware
//!   order of [`Version`];
//! - wildcards: a comparator containing `x` is rewritten before parsing: `1.2.x` → `>=1.2.0-0
//!   <1.3.0-0`, `1.x` → `>=1.0.0-0 <2.0.0-0`, `>1.x` → `>=2.0.0-0`, `<=1.2.x` → `<1.3.0-0`,
//!   `!=1.x` → `<1.0.0-0 >=2.0.0-0` (ANDed, so it matches nothing: a Go quirk we keep), and
//!   `1.x.x` → `>=1.0.0-0 <1.1.0-0` (the Go code treats it as a patch wildcard). `*`, `~` and
//!   `^` ranges are not supported.
//! - a token of a single character is silently dropped by the Go tokenizer (`1 || 2` has no
//!   versions left and fails); kept as is.
//!
//! One deliberate difference: an empty group between two `||` makes the Go code call a nil
//! function (a panic when evaluated); here it is [`RangeError::EmptyAlternative`].

use std::cmp::Ordering;

use super::version::{Version, VersionError};

/// A parsed constraint: OR of ANDs of comparators.
#[derive(Debug, Clone)]
pub struct Range {
    alternatives: Vec<Vec<Comparator>>,
}

#[derive(Debug, Clone)]
struct Comparator {
    op: Op,
    version: Version,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

/// Constraint parse errors, worded like the Go library's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("First element in range is '||'")]
    FirstIsOr,
    #[error("Last element in range is '||'")]
    LastIsOr,
    #[error("Empty range between two '||'")]
    EmptyAlternative,
    #[error("Could not get version from string: {0:?}")]
    NoVersion(String),
    #[error("Could not parse Range {part:?}: Could not parse comparator {op:?} in {part:?}")]
    Comparator { part: String, op: String },
    #[error("Could not parse Range {part:?}: Could not parse version {version:?} in {part:?}: {source}")]
    Version {
        part: String,
        version: String,
        #[source]
        source: VersionError,
    },
}

impl Range {
    /// Parses a constraint string (carvel semver `ParseRange`).
    pub fn parse(s: &str) -> Result<Self, RangeError> {
        let tokens = split_and_trim(s);
        let groups = split_or_parts(&tokens)?;
        let mut alternatives = Vec::with_capacity(groups.len());
        for group in expand_wildcards(&groups)? {
            if group.is_empty() {
                return Err(RangeError::EmptyAlternative);
            }
            let mut comparators = Vec::with_capacity(group.len());
            for part in &group {
                let (op, version) = split_comparator_version(part)?;
                let op = parse_op(op).ok_or_else(|| RangeError::Comparator {
                    part: part.clone(),
                    op: op.to_owned(),
                })?;
                let version = Version::parse(version).map_err(|source| RangeError::Version {
                    part: part.clone(),
                    version: version.to_owned(),
                    source,
                })?;
                comparators.push(Comparator { op, version });
            }
            alternatives.push(comparators);
        }
        Ok(Self { alternatives })
    }

    /// Whether `version` satisfies the constraint.
    pub fn matches(&self, version: &Version) -> bool {
        self.alternatives
            .iter()
            .any(|group| group.iter().all(|c| c.matches(version)))
    }
}

impl Comparator {
    fn matches(&self, version: &Version) -> bool {
        let ord = version.cmp(&self.version);
        match self.op {
            Op::Eq => ord == Ordering::Equal,
            Op::Ne => ord != Ordering::Equal,
            Op::Gt => ord == Ordering::Greater,
            Op::Ge => ord != Ordering::Less,
            Op::Lt => ord == Ordering::Less,
            Op::Le => ord != Ordering::Greater,
        }
    }
}

fn parse_op(op: &str) -> Option<Op> {
    Some(match op {
        "" | "=" | "==" => Op::Eq,
        ">" => Op::Gt,
        ">=" => Op::Ge,
        "<" => Op::Lt,
        "<=" => Op::Le,
        "!" | "!=" => Op::Ne,
        _ => return None,
    })
}

/// Go `splitAndTrim`: split on spaces unless the previous non-space byte is `>`, `<` or `=`;
/// drop tokens shorter than two bytes (sic); remove the spaces inside tokens.
fn split_and_trim(s: &str) -> Vec<String> {
    let bytes = s.as_bytes();
    let mut result = Vec::new();
    let mut last = 0usize;
    let mut last_char = 0u8;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b' ' && !matches!(last_char, b'>' | b'<' | b'=') {
            if last + 1 < i {
                result.push(&s[last..i]);
            }
            last = i + 1;
        } else if b != b' ' {
            last_char = b;
        }
    }
    if last + 1 < bytes.len() {
        result.push(&s[last..]);
    }
    result.into_iter().map(|t| t.replace(' ', "")).collect()
}

/// Go `splitORParts`.
fn split_or_parts(tokens: &[String]) -> Result<Vec<Vec<String>>, RangeError> {
    let mut groups = Vec::new();
    let mut last = 0;
    for (i, token) in tokens.iter().enumerate() {
        if token == "||" {
            if i == 0 {
                return Err(RangeError::FirstIsOr);
            }
            groups.push(tokens[last..i].to_vec());
            last = i + 1;
        }
    }
    if last == tokens.len() {
        return Err(RangeError::LastIsOr);
    }
    groups.push(tokens[last..].to_vec());
    Ok(groups)
}

/// Go `splitComparatorVersion`: the operator is everything before the first digit.
fn split_comparator_version(s: &str) -> Result<(&str, &str), RangeError> {
    let i = s
        .find(|c: char| c.is_ascii_digit())
        .ok_or_else(|| RangeError::NoVersion(s.to_owned()))?;
    Ok((s[..i].trim(), &s[i..]))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Wildcard {
    None,
    Major,
    Minor,
    Patch,
}

/// Go `getWildcardType`.
fn wildcard_type(version: &str) -> Wildcard {
    let parts: Vec<&str> = version.split('.').collect();
    if parts.last() != Some(&"x") {
        return Wildcard::None;
    }
    match parts.len() {
        1 => Wildcard::Major,
        2 => Wildcard::Minor,
        3 => Wildcard::Patch,
        _ => Wildcard::None,
    }
}

/// Go `createVersionFromWildcard`.
fn version_from_wildcard(version: &str) -> String {
    let flat = version.replacen(".x.x", ".x", 1).replacen(".x", ".0", 1);
    if flat.split('.').count() == 2 {
        format!("{flat}.0-0")
    } else {
        format!("{flat}-0")
    }
}

/// Go `incrementMajorVersion` / `incrementMinorVersion` (errors become an empty string, as the
/// Go caller discards them).
fn increment(version: &str, index: usize) -> String {
    let mut parts: Vec<String> = version.split('.').map(str::to_owned).collect();
    let Some(n) = parts.get(index).and_then(|p| p.parse::<i64>().ok()) else {
        return String::new();
    };
    parts[index] = n.wrapping_add(1).to_string();
    parts.join(".")
}

/// Go `expandWildcardVersion`, literally: any comparator containing `x` is rewritten.
fn expand_wildcards(groups: &[Vec<String>]) -> Result<Vec<Vec<String>>, RangeError> {
    let mut expanded = Vec::with_capacity(groups.len());
    for group in groups {
        let mut new_parts = Vec::with_capacity(group.len());
        for part in group {
            let mut part = part.clone();
            if part.contains('x') {
                let (op, version) = split_comparator_version(&part)?;
                let wildcard = wildcard_type(version);
                let flat = version_from_wildcard(version);
                let (result_op, increment_it) = match op {
                    ">" => (">=", true),
                    ">=" => (">=", false),
                    "<" => ("<", false),
                    "<=" => ("<", true),
                    "" | "=" | "==" => {
                        new_parts.push(format!(">={flat}"));
                        ("<", true)
                    }
                    "!=" | "!" => {
                        new_parts.push(format!("<{flat}"));
                        (">=", true)
                    }
                    _ => ("", false),
                };
                let result_version = if increment_it {
                    match wildcard {
                        Wildcard::Patch => increment(&flat, 1),
                        Wildcard::Minor => increment(&flat, 0),
                        Wildcard::Major | Wildcard::None => String::new(),
                    }
                } else {
                    flat
                };
                part = format!("{result_op}{result_version}");
            }
            new_parts.push(part);
        }
        expanded.push(new_parts);
    }
    Ok(expanded)
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn matches(range: &str, version: &str) -> bool {
        Range::parse(range)
            .unwrap()
            .matches(&Version::parse(version).unwrap())
    }

    #[rstest]
    #[case(">1.0.0 <2.0.0", "1.1.1", true)]
    #[case(">1.0.0 <2.0.0", "1.0.0", false)]
    #[case(">1.0.0 <2.0.0", "2.0.0", false)]
    #[case(">1.0.0 <2.0.0", "2.0.0-build.1", true)] // prereleases sort below their release
    #[case(">1.0.0 <2.0.0", "1.0.0-build.1", false)]
    #[case(">1.0.0 <3.0.0 !2.0.3-beta.2", "2.0.3-beta.2", false)]
    #[case(">1.0.0 <3.0.0 !2.0.3-beta.2", "2.0.3-beta.3", true)]
    #[case("<2.0.0 || >=3.0.0", "1.9.9", true)]
    #[case("<2.0.0 || >=3.0.0", "2.5.0", false)]
    #[case("<2.0.0 || >=3.0.0", "3.0.0", true)]
    #[case(">1.0.0 <2.0.0 || >3.0.0 !4.2.1", "4.2.1", false)]
    #[case(">1.0.0 <2.0.0 || >3.0.0 !4.2.1", "3.1.1", true)]
    #[case("1.2.3", "1.2.3", true)]
    #[case("=1.2.3", "1.2.3", true)]
    #[case("==1.2.3", "1.2.4", false)]
    #[case("!=1.2.3", "1.2.4", true)]
    #[case("!1.2.3", "1.2.3", false)]
    #[case(">= 1.0.0", "1.0.0", true)] // spaces after an operator are tolerated
    #[case(">=  1.0.0   <=  1.5.0", "1.5.0", true)]
    #[case("<=1.5.0", "1.5.1", false)]
    #[case("=1.0.0", "1.0.0+build", false)] // build metadata orders in the carvel fork
    #[case(">1.0.0+ab1.foo", "1.0.0+z1", true)]
    #[case(">1.0.0+ab1.foo", "1.0.0+ab1", false)]
    // wildcards
    #[case("1.2.x", "1.2.0", true)]
    #[case("1.2.x", "1.2.9", true)]
    #[case("1.2.x", "1.2.0-rc.1", true)] // expanded bound is 1.2.0-0
    #[case("1.2.x", "1.3.0", false)]
    #[case("1.x", "1.9.0", true)]
    #[case("1.x", "2.0.0", false)]
    #[case("1.x", "2.0.0-rc.1", false)] // the upper bound 2.0.0-0 excludes 2.0.0 prereleases
    #[case(">=1.x", "1.0.0", true)]
    #[case(">1.x", "1.9.9", false)]
    #[case(">1.x", "2.0.0", true)]
    #[case("<1.2.x", "1.1.9", true)]
    #[case("<1.2.x", "1.2.0", false)]
    #[case("<=1.2.x", "1.2.9", true)]
    #[case("<=1.2.x", "1.3.0", false)]
    #[case("!=1.x", "0.9.0", false)] // Go ANDs the two halves: nothing matches
    #[case("!=1.x", "3.0.0", false)]
    #[case("1.x.x", "1.0.5", true)]
    #[case("1.x.x", "1.1.0", false)] // Go treats `1.x.x` as a patch wildcard
    #[case("! 1.0.0", "1.0.0", true)] // Go drops the lone "!" token: this is "1.0.0"
    fn evaluates_like_go(#[case] range: &str, #[case] version: &str, #[case] expected: bool) {
        assert_eq!(matches(range, version), expected, "{range} vs {version}");
    }

    #[rstest]
    #[case("", RangeError::LastIsOr)]
    #[case(" ", RangeError::LastIsOr)]
    #[case("|| 1.0.0", RangeError::FirstIsOr)]
    #[case("1.0.0 ||", RangeError::LastIsOr)]
    #[case("1 || 2", RangeError::FirstIsOr)] // single-character tokens are dropped
    #[case("1.0.0 || || 2.0.0", RangeError::EmptyAlternative)]
    #[case(">=abc", RangeError::NoVersion(">=abc".into()))]
    #[case(">=x", RangeError::NoVersion(">=x".into()))]
    #[case("~1.2.3", RangeError::Comparator { part: "~1.2.3".into(), op: "~".into() })]
    #[case("^1.2.3", RangeError::Comparator { part: "^1.2.3".into(), op: "^".into() })]
    fn rejects(#[case] range: &str, #[case] expected: RangeError) {
        assert_eq!(Range::parse(range).unwrap_err(), expected);
    }

    #[test]
    fn version_errors_are_wrapped_like_go() {
        let err = Range::parse(">=1.2").unwrap_err();
        assert_eq!(
            err.to_string(),
            "Could not parse Range \">=1.2\": Could not parse version \"1.2\" in \">=1.2\": \
             No Major.Minor.Patch elements found"
        );
        // The operator is everything before the first digit, so a `v` ends up in it.
        assert!(matches!(
            Range::parse(">=v1.0.0"),
            Err(RangeError::Comparator { .. })
        ));
    }

    #[test]
    fn tokenizer_matches_go() {
        assert_eq!(split_and_trim(">= 1.0.0  <2.0.0"), vec![">=1.0.0", "<2.0.0"]);
        assert_eq!(
            split_and_trim("a  b"),
            Vec::<String>::new(),
            "single characters are dropped"
        );
        assert_eq!(
            split_and_trim("<2.0.0 || >=3.0.0"),
            vec!["<2.0.0", "||", ">=3.0.0"]
        );
    }

    #[test]
    fn wildcard_expansion_matches_go() {
        let groups = vec![vec!["1.2.x".to_owned(), "<=1.x".to_owned(), "!=1.2.x".to_owned()]];
        assert_eq!(
            expand_wildcards(&groups).unwrap(),
            vec![
                vec![">=1.2.0-0", "<1.3.0-0", "<2.0.0-0", "<1.2.0-0", ">=1.3.0-0"]
                    .into_iter()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            ]
        );
    }
}
