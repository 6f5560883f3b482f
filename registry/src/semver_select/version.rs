//! Semantic versions exactly as `github.com/carvel-dev/semver/v4` (v4.0.0, the blang/semver fork
//! vendir uses) parses and orders them.
//!
//! Differences from plain SemVer 2.0 that matter for picking "the highest tag":
//! - parsing is strict `X.Y.Z[-pre][+build]` (no leading zeros in X/Y/Z or numeric prerelease
//!   identifiers, identifiers `[0-9A-Za-z-]+`);
//! - **build metadata takes part in ordering** (vendir issue #76): after the prerelease, a
//!   version without build metadata is lower than one with it, and build identifiers compare
//!   like prerelease identifiers (numeric < alphanumeric, shorter list lower). So
//!   `1.0.0 < 1.0.0+1 < 1.0.0+2 < 1.0.0+ab1 < 1.0.0+ab1.foo < 1.0.0+z1`, and `=1.0.0` does not
//!   match `1.0.0+build` in a constraint.
//!
//! vendir ≥ 0.45 ships a later fork revision with "stability-aware" prerelease ordering
//! heuristics; kapp-controller ≤ v0.53 ships vendir 0.41 with the v4.0.0 rules mirrored here.

use std::{cmp::Ordering, fmt};

/// A parsed version; equality and order follow carvel semver v4 (`Compare`).
#[derive(Debug, Clone)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    pub pre: Vec<Identifier>,
    pub build: Vec<Identifier>,
}

/// One dot-separated prerelease or build identifier.
#[derive(Debug, Clone)]
pub struct Identifier {
    text: String,
    numeric: Option<u64>,
}

/// Which of the three version numbers failed to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Major,
    Minor,
    Patch,
}

/// Which kind of identifier failed to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentifierKind {
    PreRelease,
    BuildMeta,
}

/// Parse errors, worded like the Go library's so messages match vendir's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("Version string empty")]
    Empty,
    #[error("No Major.Minor.Patch elements found")]
    MissingParts,
    #[error("Invalid character(s) found in {part} number {value:?}")]
    InvalidNumberCharacters { part: Part, value: String },
    #[error("{} number must not contain leading zeroes {value:?}", part.capitalized())]
    LeadingZeroes { part: Part, value: String },
    #[error("strconv.ParseUint: parsing {value:?}: {reason}")]
    Number { value: String, reason: &'static str },
    #[error("{kind} is empty")]
    EmptyIdentifier { kind: IdentifierKind },
    #[error("Invalid numeric {kind} {value:?}: value out of range")]
    IdentifierOutOfRange { kind: IdentifierKind, value: String },
    #[error("Invalid character(s) found in {kind} {value:?}")]
    InvalidIdentifierCharacters { kind: IdentifierKind, value: String },
    #[error("Numeric PreRelease version must not contain leading zeroes {value:?}")]
    PrereleaseLeadingZeroes { value: String },
}

impl Part {
    fn capitalized(self) -> &'static str {
        match self {
            Part::Major => "Major",
            Part::Minor => "Minor",
            Part::Patch => "Patch",
        }
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::Major => "major",
            Part::Minor => "minor",
            Part::Patch => "patch",
        })
    }
}

impl fmt::Display for IdentifierKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdentifierKind::PreRelease => "PreRelease",
            IdentifierKind::BuildMeta => "BuildMeta",
        })
    }
}

impl Identifier {
    /// The identifier as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn parse(s: &str, kind: IdentifierKind) -> Result<Self, VersionError> {
        if s.is_empty() {
            return Err(VersionError::EmptyIdentifier { kind });
        }
        if s.chars().all(|c| c.is_ascii_digit()) {
            let value = s.parse::<u64>().map_err(|_| VersionError::IdentifierOutOfRange {
                kind,
                value: s.to_owned(),
            })?;
            if kind == IdentifierKind::PreRelease && has_leading_zeroes(s) {
                return Err(VersionError::PrereleaseLeadingZeroes { value: s.to_owned() });
            }
            return Ok(Self {
                text: s.to_owned(),
                numeric: Some(value),
            });
        }
        if s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Ok(Self {
                text: s.to_owned(),
                numeric: None,
            });
        }
        Err(VersionError::InvalidIdentifierCharacters {
            kind,
            value: s.to_owned(),
        })
    }
}

impl Ord for Identifier {
    /// Numeric identifiers compare numerically and sort before alphanumeric ones, which
    /// compare byte-wise.
    fn cmp(&self, other: &Self) -> Ordering {
        match (self.numeric, other.numeric) {
            (Some(a), Some(b)) => a.cmp(&b),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => self.text.as_bytes().cmp(other.text.as_bytes()),
        }
    }
}

impl PartialOrd for Identifier {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Identifier {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Identifier {}

impl Version {
    /// Strict parse (carvel semver `Parse`).
    pub fn parse(s: &str) -> Result<Self, VersionError> {
        if s.is_empty() {
            return Err(VersionError::Empty);
        }
        let mut parts = s.splitn(3, '.');
        let (Some(major), Some(minor), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(VersionError::MissingParts);
        };
        let major = parse_number(major, Part::Major)?;
        let minor = parse_number(minor, Part::Minor)?;
        let (rest, build) = match rest.split_once('+') {
            Some((rest, build)) => (rest, Some(build)),
            None => (rest, None),
        };
        let (patch, pre) = match rest.split_once('-') {
            Some((patch, pre)) => (patch, Some(pre)),
            None => (rest, None),
        };
        let patch = parse_number(patch, Part::Patch)?;
        let pre = pre
            .map(|p| {
                p.split('.')
                    .map(|i| Identifier::parse(i, IdentifierKind::PreRelease))
                    .collect()
            })
            .transpose()?
            .unwrap_or_default();
        let build = build
            .map(|b| {
                b.split('.')
                    .map(|i| Identifier::parse(i, IdentifierKind::BuildMeta))
                    .collect()
            })
            .transpose()?
            .unwrap_or_default();
        Ok(Self {
            major,
            minor,
            patch,
            pre,
            build,
        })
    }

    /// vendir's "relaxed" parse: one leading `v` is stripped, then strict.
    pub fn parse_relaxed(s: &str) -> Result<Self, VersionError> {
        Self::parse(s.strip_prefix('v').unwrap_or(s))
    }

    /// Whether the version has prerelease identifiers.
    pub fn is_prerelease(&self) -> bool {
        !self.pre.is_empty()
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| compare_pre(&self.pre, &other.pre))
            .then_with(|| compare_build(&self.build, &other.build))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        let join = |ids: &[Identifier]| ids.iter().map(Identifier::as_str).collect::<Vec<_>>().join(".");
        if !self.pre.is_empty() {
            write!(f, "-{}", join(&self.pre))?;
        }
        if !self.build.is_empty() {
            write!(f, "+{}", join(&self.build))?;
        }
        Ok(())
    }
}

/// A release is higher than any of its prereleases; otherwise element-wise, then longer wins.
fn compare_pre(a: &[Identifier], b: &[Identifier]) -> Ordering {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.cmp(b),
    }
}

/// No build metadata is lower than some; otherwise element-wise, then longer wins.
fn compare_build(a: &[Identifier], b: &[Identifier]) -> Ordering {
    // Slice ordering already puts the empty slice first and a prefix before its extension.
    a.cmp(b)
}

fn parse_number(s: &str, part: Part) -> Result<u64, VersionError> {
    if !s.chars().all(|c| c.is_ascii_digit()) {
        return Err(VersionError::InvalidNumberCharacters {
            part,
            value: s.to_owned(),
        });
    }
    if has_leading_zeroes(s) {
        return Err(VersionError::LeadingZeroes {
            part,
            value: s.to_owned(),
        });
    }
    s.parse::<u64>().map_err(|_| VersionError::Number {
        value: s.to_owned(),
        reason: if s.is_empty() {
            "invalid syntax"
        } else {
            "value out of range"
        },
    })
}

fn has_leading_zeroes(s: &str) -> bool {
    s.len() > 1 && s.starts_with('0')
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[rstest]
    #[case("1.2.3")]
    #[case("0.0.1-alpha.preview+123.456")]
    #[case("1.2.3-alpha.b-eta+123.b-uild")]
    #[case("1.2.3+123.b-uild")]
    #[case("18446744073709551615.0.0")]
    fn parses_and_displays(#[case] s: &str) {
        assert_eq!(v(s).to_string(), s);
    }

    #[rstest]
    #[case("", VersionError::Empty)]
    #[case("1.2", VersionError::MissingParts)]
    #[case("1..", VersionError::Number { value: "".into(), reason: "invalid syntax" })]
    #[case("a.b.c", VersionError::InvalidNumberCharacters { part: Part::Major, value: "a".into() })]
    #[case("1.1.a", VersionError::InvalidNumberCharacters { part: Part::Patch, value: "a".into() })]
    #[case("01.1.1", VersionError::LeadingZeroes { part: Part::Major, value: "01".into() })]
    #[case("1.01.1", VersionError::LeadingZeroes { part: Part::Minor, value: "01".into() })]
    #[case("1.1.01", VersionError::LeadingZeroes { part: Part::Patch, value: "01".into() })]
    #[case("1.1.1-01", VersionError::PrereleaseLeadingZeroes { value: "01".into() })]
    #[case("1.1.1-beta.001", VersionError::PrereleaseLeadingZeroes { value: "001".into() })]
    #[case(
        "20000000000000000000.1.1",
        VersionError::Number { value: "20000000000000000000".into(), reason: "value out of range" }
    )]
    #[case(
        "1.1.1-20000000000000000000",
        VersionError::IdentifierOutOfRange {
            kind: IdentifierKind::PreRelease,
            value: "20000000000000000000".into(),
        }
    )]
    #[case(
        "0.0.0-!",
        VersionError::InvalidIdentifierCharacters { kind: IdentifierKind::PreRelease, value: "!".into() }
    )]
    #[case("0.0.0-.alpha", VersionError::EmptyIdentifier { kind: IdentifierKind::PreRelease })]
    #[case("0.0.0-alpha+", VersionError::EmptyIdentifier { kind: IdentifierKind::BuildMeta })]
    #[case("1.1.+123", VersionError::Number { value: "".into(), reason: "invalid syntax" })]
    #[case("-1.1.1", VersionError::InvalidNumberCharacters { part: Part::Major, value: "-1".into() })]
    #[case("v1.2.3", VersionError::InvalidNumberCharacters { part: Part::Major, value: "v1".into() })]
    fn rejects(#[case] s: &str, #[case] expected: VersionError) {
        assert_eq!(Version::parse(s).unwrap_err(), expected);
    }

    #[test]
    fn build_metadata_with_leading_zero_is_allowed() {
        assert_eq!(v("1.0.0+001").build[0].as_str(), "001");
    }

    #[test]
    fn relaxed_strips_one_v() {
        assert_eq!(Version::parse_relaxed("v1.2.3").unwrap(), v("1.2.3"));
        assert!(Version::parse_relaxed("vv1.2.3").is_err());
        assert!(Version::parse_relaxed("V1.2.3").is_err());
    }

    #[rstest]
    // SemVer spec §11 examples.
    #[case("1.0.0", "2.0.0")]
    #[case("2.0.0", "2.1.0")]
    #[case("2.1.0", "2.1.1")]
    #[case("1.0.0-alpha", "1.0.0")]
    #[case("1.0.0-alpha", "1.0.0-alpha.1")]
    #[case("1.0.0-alpha.1", "1.0.0-alpha.beta")]
    #[case("1.0.0-alpha.beta", "1.0.0-beta")]
    #[case("1.0.0-beta", "1.0.0-beta.2")]
    #[case("1.0.0-beta.2", "1.0.0-beta.11")]
    #[case("1.0.0-beta.11", "1.0.0-rc.1")]
    #[case("1.0.0-rc.1", "1.0.0")]
    // carvel fork: build metadata orders too.
    #[case("1.0.0", "1.0.0+1")]
    #[case("1.0.0+1.2", "1.0.0+1.2.3")]
    #[case("1.0.0+1", "1.0.0+a")]
    #[case("1.0.0+1", "1.0.0+2")]
    #[case("1.0.0+ab1", "1.0.0+ab1.foo")]
    #[case("1.0.0+ab1.foo", "1.0.0+z1")]
    #[case("1.0.0-2+2", "1.0.0-3+1")]
    #[case("2.0.0-10", "2.0.0-10+meta.10")]
    fn orders(#[case] lower: &str, #[case] higher: &str) {
        assert!(v(lower) < v(higher), "{lower} < {higher}");
        assert!(v(higher) > v(lower), "{higher} > {lower}");
    }

    #[test]
    fn equal_ignores_only_spelling_of_numbers() {
        assert_eq!(v("1.0.0+a"), v("1.0.0+a"));
        assert_eq!(v("1.0.0+01"), v("1.0.0+1"));
        assert_ne!(v("1.0.0"), v("1.0.0+1"));
    }
}
