//! Content digests (`sha256:<64 lowercase hex>`), the only thing holdfast ever pins to.
//!
//! Only sha256 is accepted: it is what registries return in `Docker-Content-Digest` and what
//! go-containerregistry (used by vendir/imgpkg) accepts in a reference. Anything else is
//! rejected early with a specific error rather than written into a fetch spec.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

const ALGORITHM: &str = "sha256";
const HEX_LEN: usize = 64;

/// A validated `sha256:<64 lowercase hex>` digest.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

/// Why a string is not a digest holdfast can pin to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("digest {0:?} has no algorithm prefix (expected \"sha256:<64 hex characters>\")")]
    MissingAlgorithm(String),
    #[error("digest algorithm {algorithm:?} is not supported (only sha256)")]
    UnsupportedAlgorithm { algorithm: String },
    #[error("sha256 digest must have 64 hex characters, got {len}")]
    InvalidLength { len: usize },
    #[error("sha256 digest must be lowercase hex, found {found:?}")]
    InvalidHex { found: char },
}

impl Digest {
    /// Parses and validates `sha256:<64 lowercase hex>`.
    pub fn parse(s: &str) -> Result<Self, DigestError> {
        let Some((algorithm, hex)) = s.split_once(':') else {
            return Err(DigestError::MissingAlgorithm(s.to_owned()));
        };
        if algorithm != ALGORITHM {
            return Err(DigestError::UnsupportedAlgorithm {
                algorithm: algorithm.to_owned(),
            });
        }
        if let Some(found) = hex.chars().find(|c| !matches!(c, '0'..='9' | 'a'..='f')) {
            return Err(DigestError::InvalidHex { found });
        }
        if hex.len() != HEX_LEN {
            return Err(DigestError::InvalidLength { len: hex.len() });
        }
        Ok(Self(s.to_owned()))
    }

    /// The digest of `bytes`, as a registry computes it for a manifest body.
    pub fn sha256_of(bytes: &[u8]) -> Self {
        Self(format!("{ALGORITHM}:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 64 hex characters after `sha256:`.
    pub fn hex(&self) -> &str {
        &self.0[ALGORITHM.len() + 1..]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.0)
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_sha256() {
        let d = Digest::parse(&format!("sha256:{HEX}")).unwrap();
        assert_eq!(d.hex(), HEX);
        assert_eq!(d.to_string(), format!("sha256:{HEX}"));
    }

    #[rstest]
    #[case::no_prefix(HEX, DigestError::MissingAlgorithm(HEX.to_owned()))]
    #[case::sha512("sha512:abcd", DigestError::UnsupportedAlgorithm { algorithm: "sha512".into() })]
    #[case::uppercase_algorithm(
        "SHA256:abcd",
        DigestError::UnsupportedAlgorithm { algorithm: "SHA256".into() }
    )]
    #[case::short("sha256:abcd", DigestError::InvalidLength { len: 4 })]
    #[case::uppercase_hex("sha256:ABCD", DigestError::InvalidHex { found: 'A' })]
    #[case::not_hex("sha256:xyz", DigestError::InvalidHex { found: 'x' })]
    #[case::empty("sha256:", DigestError::InvalidLength { len: 0 })]
    fn rejects(#[case] input: &str, #[case] expected: DigestError) {
        assert_eq!(Digest::parse(input), Err(expected));
    }

    #[test]
    fn sha256_of_matches_known_value() {
        // sha256("") is a well-known constant.
        assert_eq!(
            Digest::sha256_of(b"").as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn serde_round_trip_validates() {
        let d = Digest::sha256_of(b"x");
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        assert!(serde_json::from_str::<Digest>("\"sha256:nope\"").is_err());
    }
}
