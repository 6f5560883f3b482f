//! Digest verification of streamed content: sha256 and length of exactly what went through.

use sha2::{Digest as _, Sha256};

use crate::digest::Digest;

/// Why streamed content is not what its descriptor says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("{expected}: more than the {size} bytes the descriptor declares")]
    TooLong { expected: Digest, size: u64 },
    #[error("{expected}: {actual} bytes, the descriptor declares {size}")]
    Size {
        expected: Digest,
        size: u64,
        actual: u64,
    },
    #[error("content hashes to {actual}, expected {expected}")]
    Digest { expected: Digest, actual: Digest },
}

/// Hashes content as it streams and checks it against the expected digest and size.
#[derive(Clone)]
pub struct DigestCheck {
    expected: Digest,
    size: Option<u64>,
    hasher: Sha256,
    seen: u64,
}

impl DigestCheck {
    /// `size`: the descriptor's size, if known (a stream longer than it fails at once).
    pub fn new(expected: Digest, size: Option<u64>) -> Self {
        Self {
            expected,
            size,
            hasher: Sha256::new(),
            seen: 0,
        }
    }

    /// Adds a chunk; fails as soon as the content is longer than declared.
    pub fn update(&mut self, chunk: &[u8]) -> Result<(), VerifyError> {
        self.seen += chunk.len() as u64;
        if let Some(size) = self.size
            && self.seen > size
        {
            return Err(VerifyError::TooLong {
                expected: self.expected.clone(),
                size,
            });
        }
        self.hasher.update(chunk);
        Ok(())
    }

    /// Bytes seen so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Checks length and digest of everything seen.
    pub fn finish(self) -> Result<(), VerifyError> {
        if let Some(size) = self.size
            && self.seen != size
        {
            return Err(VerifyError::Size {
                expected: self.expected,
                size,
                actual: self.seen,
            });
        }
        let hex = hex::encode(self.hasher.finalize());
        if hex == self.expected.hex() {
            return Ok(());
        }
        // 64 lowercase hex characters always parse.
        let actual = Digest::parse(&format!("sha256:{hex}")).unwrap_or_else(|_| self.expected.clone());
        Err(VerifyError::Digest {
            expected: self.expected,
            actual,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(content: &[u8], size: Option<u64>, chunk: usize) -> Result<(), VerifyError> {
        let mut check = DigestCheck::new(Digest::sha256_of(b"hello, mirror"), size);
        for piece in content.chunks(chunk.max(1)) {
            check.update(piece)?;
        }
        assert_eq!(check.seen(), content.len() as u64);
        check.finish()
    }

    #[test]
    fn accepts_the_right_content_in_any_chunking() {
        for chunk in [1, 3, 13, 64] {
            assert_eq!(check(b"hello, mirror", Some(13), chunk), Ok(()));
            assert_eq!(check(b"hello, mirror", None, chunk), Ok(()));
        }
    }

    #[test]
    fn rejects_other_content_of_the_same_size() {
        let error = check(b"hello, mirroR", Some(13), 4).unwrap_err();
        let VerifyError::Digest { expected, actual } = error else {
            panic!("{error:?}")
        };
        assert_eq!(expected, Digest::sha256_of(b"hello, mirror"));
        assert_eq!(actual, Digest::sha256_of(b"hello, mirroR"));
    }

    #[test]
    fn rejects_wrong_lengths() {
        assert!(matches!(
            check(b"hello, mirror!", Some(13), 5),
            Err(VerifyError::TooLong { size: 13, .. })
        ));
        assert!(matches!(
            check(b"hello, mirro", Some(13), 5),
            Err(VerifyError::Size {
                size: 13,
                actual: 12,
                ..
            })
        ));
        // A truncated stream with no declared size still fails on the digest.
        assert!(matches!(
            check(b"hello, mirro", None, 5),
            Err(VerifyError::Digest { .. })
        ));
    }
}
