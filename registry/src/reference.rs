//! OCI image references, parsed the way go-containerregistry's `name.ParseReference` parses them.
//!
//! vendir and imgpkg (and so kapp-controller) parse `image.url` / `imgpkgBundle.image` with
//! go-containerregistry (ggcr). A pin is only correct if it names exactly the repository that
//! vendir would have pulled, so the registry detection and Docker Hub defaults below copy ggcr:
//!
//! - The first `/`-separated component is the registry iff it contains `.` or `:`. A bare
//!   `localhost/app` is therefore **Docker Hub** `index.docker.io/localhost/app` in ggcr (unlike
//!   Docker's own parser, which treats `localhost` as a host); `localhost:5000/app` is a registry.
//! - No registry, `docker.io` and `index.docker.io` all mean Docker Hub, contacted as
//!   `index.docker.io`; a single-component Docker Hub repository gets the `library/` prefix.
//! - The tag is the text after the last `:` when that text contains no `/`; it defaults to
//!   `latest` only when neither tag nor digest is given.
//! - `repo:tag@sha256:…` is a digest reference; the tag is kept for display but does not take
//!   part in what is fetched (ggcr drops it the same way).
//!
//! Where ggcr is lenient about text no registry would accept, this parser is stricter and says
//! why (each case has its own [`ReferenceError`]): the digest must be `sha256:` + 64 lowercase
//! hex (ggcr only checks the character set and length), repository path components must follow
//! the distribution grammar (`[a-z0-9]+` joined by `.`, `_`, `__` or runs of `-`), a tag must
//! not start with `.` or `-`, an empty tag (`app:`) is an error rather than `latest`, and the
//! registry must be `host[:port]` or `[ipv6][:port]`. Rejecting such a reference only means it
//! is left unpinned; it never changes what an accepted reference points at.
//!
//! ## Pinned form
//!
//! [`Reference::pinned`] keeps the registry and repository **as the user wrote them** and
//! replaces the tag with the digest: `ubuntu:22.04` → `ubuntu@sha256:…`,
//! `docker.io/bitnami/nginx:1` → `docker.io/bitnami/nginx@sha256:…`. Why not the normalised
//! `index.docker.io/library/ubuntu@sha256:…`:
//!
//! - ggcr (vendir/imgpkg) parses both to the same repository, so vendir fetches the same bytes
//!   and kapp-controller treats both as cacheable digest references;
//! - the object changes by the smallest possible diff (only the `:tag` part), which is what
//!   people reviewing `kubectl diff`, kapp or Argo CD output expect, and registry allowlists or
//!   relocation rules written against the user's spelling keep matching;
//! - it round-trips: parsing the pinned string yields the same registry/repository spelling, so
//!   re-pinning is idempotent and "is this already pinned?" is a plain parse.
//!
//! The tag is dropped rather than kept as `repo:tag@sha256:…`: ggcr ignores it anyway, the
//! design records the original reference in an annotation, and `repo@sha256:…` is the form the
//! kapp-controller cache documentation and e2e tests use.

use std::{fmt, net::Ipv6Addr, str::FromStr};

use crate::digest::{Digest, DigestError};

/// The host go-containerregistry contacts for Docker Hub.
pub const DOCKER_HUB: &str = "index.docker.io";
/// The short name of Docker Hub that ggcr rewrites to [`DOCKER_HUB`].
const DOCKER_HUB_ALIAS: &str = "docker.io";
/// Implicit namespace of single-component Docker Hub repositories.
const DOCKER_HUB_NAMESPACE: &str = "library";
/// The tag used when a reference has neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";

const MIN_REPOSITORY_LEN: usize = 2;
const MAX_REPOSITORY_LEN: usize = 255;
const MAX_TAG_LEN: usize = 127;

/// A parsed image reference; keeps the user's spelling and offers the normalised view.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// As written; `None` means Docker Hub by default.
    registry: Option<String>,
    /// As written, without the implicit `library/`.
    repository: String,
    /// As written; `None` when absent (even if `latest` is implied).
    tag: Option<String>,
    digest: Option<Digest>,
}

/// Why a string is not a usable image reference. One variant per malformed case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("image reference is empty")]
    Empty,
    #[error(
        "image reference must not contain a URL scheme (http:// or https://): {0}; \
         plain HTTP registries are configured on the resolver"
    )]
    UrlScheme(String),
    #[error("image reference {0:?} has more than one '@'; a digest reference has exactly one")]
    MultipleDigestSeparators(String),
    #[error("invalid digest in image reference {reference:?}: {source}")]
    InvalidDigest {
        reference: String,
        #[source]
        source: DigestError,
    },
    #[error("image reference {0:?} ends its name with ':' but has no tag after it")]
    EmptyTag(String),
    #[error("tag {tag:?} is {len} characters long; at most 127 are allowed")]
    TagTooLong { tag: String, len: usize },
    #[error("tag {tag:?} contains {ch:?}; only letters, digits, '_', '.' and '-' are allowed")]
    InvalidTagCharacter { tag: String, ch: char },
    #[error("tag {tag:?} must start with a letter, a digit or '_'")]
    TagStartsWithSeparator { tag: String },
    #[error("invalid registry {registry:?}: {reason}")]
    InvalidRegistry { registry: String, reason: &'static str },
    #[error("a repository name must be specified")]
    EmptyRepository,
    #[error("repository {repository:?} must be lowercase (found {ch:?})")]
    UppercaseRepository { repository: String, ch: char },
    #[error(
        "repository {repository:?} contains {ch:?}; only lowercase letters, digits, \
         '_', '-', '.' and '/' are allowed"
    )]
    InvalidRepositoryCharacter { repository: String, ch: char },
    #[error("repository {repository:?} is {len} characters long; it must have 2 to 255")]
    RepositoryLength { repository: String, len: usize },
    #[error("repository {repository:?} has an empty path component (leading, trailing or double '/')")]
    EmptyPathComponent { repository: String },
    #[error("repository path component {component:?} must start and end with a lowercase letter or digit")]
    ComponentBoundary { component: String },
    #[error(
        "repository path component {component:?} has the separator {separator:?}; \
         allowed are '.', '_', '__' or a run of '-'"
    )]
    InvalidSeparator { component: String, separator: String },
}

impl Reference {
    /// Parses a reference (see the module docs for the rules).
    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        if s.is_empty() {
            return Err(ReferenceError::Empty);
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Err(ReferenceError::UrlScheme(s.to_owned()));
        }
        let (name, digest) = match s.split_once('@') {
            None => (s, None),
            Some((_, rest)) if rest.contains('@') => {
                return Err(ReferenceError::MultipleDigestSeparators(s.to_owned()));
            }
            Some((base, digest)) => {
                let digest = Digest::parse(digest).map_err(|source| ReferenceError::InvalidDigest {
                    reference: s.to_owned(),
                    source,
                })?;
                (base, Some(digest))
            }
        };
        // ggcr: the text after the last ':' is a tag unless it contains '/' (then the ':' was
        // a registry port).
        let (path, tag) = match name.rsplit_once(':') {
            Some((base, tag)) if !tag.contains('/') => {
                if tag.is_empty() {
                    return Err(ReferenceError::EmptyTag(s.to_owned()));
                }
                validate_tag(tag)?;
                (base, Some(tag.to_owned()))
            }
            _ => (name, None),
        };
        let (registry, repository) = split_registry(path);
        if let Some(registry) = registry {
            validate_registry(registry)?;
        }
        let reference = Self {
            registry: registry.map(str::to_owned),
            repository: repository.to_owned(),
            tag,
            digest,
        };
        validate_repository(&reference.repository, reference.is_docker_hub())?;
        Ok(reference)
    }

    /// The host to contact: the registry as written, with Docker Hub (implicit, `docker.io`)
    /// normalised to `index.docker.io` as ggcr does.
    pub fn registry(&self) -> &str {
        match self.registry.as_deref() {
            None | Some(DOCKER_HUB_ALIAS) => DOCKER_HUB,
            Some(registry) => registry,
        }
    }

    /// The registry exactly as written, `None` if the user left it implicit.
    pub fn registry_as_written(&self) -> Option<&str> {
        self.registry.as_deref()
    }

    /// Whether this reference points at Docker Hub.
    pub fn is_docker_hub(&self) -> bool {
        self.registry() == DOCKER_HUB
    }

    /// The repository path used on the wire (`library/` added for single-component Docker
    /// Hub names).
    pub fn repository(&self) -> String {
        if self.is_docker_hub() && !self.repository.contains('/') {
            format!("{DOCKER_HUB_NAMESPACE}/{}", self.repository)
        } else {
            self.repository.clone()
        }
    }

    /// The repository path exactly as written.
    pub fn repository_as_written(&self) -> &str {
        &self.repository
    }

    /// The tag as written, if any.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest, if the reference is pinned.
    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// Whether the reference already names a digest (and so must never be rewritten).
    pub fn is_pinned(&self) -> bool {
        self.digest.is_some()
    }

    /// What is fetched: the digest if present, else the tag, else `latest` (ggcr's
    /// `Identifier()`).
    pub fn identifier(&self) -> &str {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => digest.as_str(),
            (None, Some(tag)) => tag,
            (None, None) => DEFAULT_TAG,
        }
    }

    /// `registry/repository` in normalised form (ggcr's `Repository.Name()`), e.g.
    /// `index.docker.io/library/ubuntu`. Two references with equal names are the same repository.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry(), self.repository())
    }

    /// Fully normalised form (ggcr's `Name()`): `name:tag` or `name@digest`.
    pub fn normalized(&self) -> String {
        match &self.digest {
            Some(digest) => format!("{}@{digest}", self.name()),
            None => format!("{}:{}", self.name(), self.identifier()),
        }
    }

    /// The pinned form `[registry/]repository@sha256:…`, keeping the user's spelling of the
    /// registry and repository and dropping the tag (see the module docs for why).
    pub fn pinned(&self, digest: &Digest) -> String {
        let mut out = self.written_name();
        out.push('@');
        out.push_str(digest.as_str());
        out
    }

    /// The same repository with `tag` and no digest, e.g. for a tag chosen by `tagSelection`
    /// (vendir appends `":" + tag` to the URL).
    pub fn with_tag(&self, tag: &str) -> Result<Self, ReferenceError> {
        if tag.is_empty() {
            return Err(ReferenceError::EmptyTag(format!("{}:", self.written_name())));
        }
        validate_tag(tag)?;
        Ok(Self {
            tag: Some(tag.to_owned()),
            digest: None,
            ..self.clone()
        })
    }

    fn written_name(&self) -> String {
        match &self.registry {
            Some(registry) => format!("{registry}/{}", self.repository),
            None => self.repository.clone(),
        }
    }
}

impl fmt::Display for Reference {
    /// The reference as written; `parse(display)` gives back an equal `Reference`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written_name())?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reference({self})")
    }
}

impl FromStr for Reference {
    type Err = ReferenceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// ggcr `NewRepository`: the first component is a registry iff it contains '.' or ':'.
fn split_registry(path: &str) -> (Option<&str>, &str) {
    match path.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) => (Some(first), rest),
        _ => (None, path),
    }
}

fn validate_tag(tag: &str) -> Result<(), ReferenceError> {
    if let Some(ch) = tag
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(ReferenceError::InvalidTagCharacter {
            tag: tag.to_owned(),
            ch,
        });
    }
    if tag.len() > MAX_TAG_LEN {
        return Err(ReferenceError::TagTooLong {
            tag: tag.to_owned(),
            len: tag.len(),
        });
    }
    if tag.starts_with(['.', '-']) {
        return Err(ReferenceError::TagStartsWithSeparator { tag: tag.to_owned() });
    }
    Ok(())
}

fn validate_registry(registry: &str) -> Result<(), ReferenceError> {
    let invalid = |reason| ReferenceError::InvalidRegistry {
        registry: registry.to_owned(),
        reason,
    };
    let port = if let Some(bracketed) = registry.strip_prefix('[') {
        let (address, rest) = bracketed
            .split_once(']')
            .ok_or_else(|| invalid("unterminated IPv6 literal"))?;
        address
            .parse::<Ipv6Addr>()
            .map_err(|_| invalid("not a valid IPv6 address"))?;
        match rest {
            "" => None,
            _ => Some(
                rest.strip_prefix(':')
                    .ok_or_else(|| invalid("unexpected text after IPv6 literal"))?,
            ),
        }
    } else {
        let (host, port) = match registry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        };
        if host.is_empty() {
            return Err(invalid("empty host"));
        }
        if port.is_some_and(|p| p.contains(':')) {
            return Err(invalid("IPv6 addresses must be written in brackets"));
        }
        if !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(invalid("host may only contain letters, digits, '.', '-' and '_'"));
        }
        port
    };
    if let Some(port) = port {
        let valid = !port.is_empty()
            && port.len() <= 5
            && port.chars().all(|c| c.is_ascii_digit())
            && port.parse::<u16>().is_ok();
        if !valid {
            return Err(invalid("port must be a number from 0 to 65535"));
        }
    }
    Ok(())
}

fn validate_repository(repository: &str, docker_hub: bool) -> Result<(), ReferenceError> {
    if repository.is_empty() {
        return Err(ReferenceError::EmptyRepository);
    }
    for ch in repository.chars() {
        if ch.is_ascii_uppercase() {
            return Err(ReferenceError::UppercaseRepository {
                repository: repository.to_owned(),
                ch,
            });
        }
        if !(ch.is_ascii_lowercase() || ch.is_ascii_digit() || matches!(ch, '_' | '-' | '.' | '/')) {
            return Err(ReferenceError::InvalidRepositoryCharacter {
                repository: repository.to_owned(),
                ch,
            });
        }
    }
    // ggcr checks the length as written and again with the implicit `library/`.
    let effective_len = if docker_hub && !repository.contains('/') {
        repository.len() + DOCKER_HUB_NAMESPACE.len() + 1
    } else {
        repository.len()
    };
    if repository.len() < MIN_REPOSITORY_LEN {
        return Err(ReferenceError::RepositoryLength {
            repository: repository.to_owned(),
            len: repository.len(),
        });
    }
    if effective_len > MAX_REPOSITORY_LEN {
        return Err(ReferenceError::RepositoryLength {
            repository: repository.to_owned(),
            len: effective_len,
        });
    }
    for component in repository.split('/') {
        validate_component(repository, component)?;
    }
    Ok(())
}

/// distribution/reference: `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`.
fn validate_component(repository: &str, component: &str) -> Result<(), ReferenceError> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if component.is_empty() {
        return Err(ReferenceError::EmptyPathComponent {
            repository: repository.to_owned(),
        });
    }
    if !component.starts_with(alnum) || !component.ends_with(alnum) {
        return Err(ReferenceError::ComponentBoundary {
            component: component.to_owned(),
        });
    }
    for separator in component.split(alnum).filter(|s| !s.is_empty()) {
        let valid = matches!(separator, "." | "_" | "__") || separator.chars().all(|c| c == '-');
        if !valid {
            return Err(ReferenceError::InvalidSeparator {
                component: component.to_owned(),
                separator: separator.to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rstest::rstest;

    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn digest() -> Digest {
        Digest::parse(&format!("sha256:{HEX}")).unwrap()
    }

    #[rstest]
    // input, registry (normalised), repository (normalised), identifier
    #[case("ubuntu", DOCKER_HUB, "library/ubuntu", "latest")]
    #[case("ubuntu:22.04", DOCKER_HUB, "library/ubuntu", "22.04")]
    #[case("docker.io/ubuntu", DOCKER_HUB, "library/ubuntu", "latest")]
    #[case("index.docker.io/ubuntu:1", DOCKER_HUB, "library/ubuntu", "1")]
    #[case("bitnami/nginx:1.25", DOCKER_HUB, "bitnami/nginx", "1.25")]
    #[case("docker.io/bitnami/nginx", DOCKER_HUB, "bitnami/nginx", "latest")]
    #[case("ghcr.io/carvel-dev/app:v1.2.0", "ghcr.io", "carvel-dev/app", "v1.2.0")]
    #[case("ghcr.io/app", "ghcr.io", "app", "latest")] // no library/ outside Docker Hub
    #[case("localhost:5000/team/app:1", "localhost:5000", "team/app", "1")]
    #[case("127.0.0.1:5000/app", "127.0.0.1:5000", "app", "latest")]
    #[case("[::1]:5000/app:x", "[::1]:5000", "app", "x")]
    #[case("registry.corp.com/a/b/c/d:tag_1", "registry.corp.com", "a/b/c/d", "tag_1")]
    #[case("Registry.Corp.COM/app", "Registry.Corp.COM", "app", "latest")] // host case kept (ggcr)
    // ggcr: "localhost" without '.' or ':' is not a registry.
    #[case("localhost/app", DOCKER_HUB, "localhost/app", "latest")]
    // ggcr: "localhost:5000" alone is the Docker Hub repo "localhost" with tag 5000.
    #[case("localhost:5000", DOCKER_HUB, "library/localhost", "5000")]
    #[case("my_app/x__y/a-b--c.d", DOCKER_HUB, "my_app/x__y/a-b--c.d", "latest")]
    fn parses_like_ggcr(
        #[case] input: &str,
        #[case] registry: &str,
        #[case] repository: &str,
        #[case] identifier: &str,
    ) {
        let r = Reference::parse(input).unwrap();
        assert_eq!(r.registry(), registry);
        assert_eq!(r.repository(), repository);
        assert_eq!(r.identifier(), identifier);
        assert_eq!(r.to_string(), input);
        assert!(!r.is_pinned());
    }

    #[test]
    fn digest_and_combined_forms() {
        let d = digest();
        let r = Reference::parse(&format!("ubuntu@{d}")).unwrap();
        assert_eq!(r.digest(), Some(&d));
        assert_eq!(r.tag(), None);
        assert_eq!(r.identifier(), d.as_str());
        assert_eq!(r.normalized(), format!("index.docker.io/library/ubuntu@{d}"));

        let combined = Reference::parse(&format!("ghcr.io/org/app:v1@{d}")).unwrap();
        assert_eq!(combined.tag(), Some("v1"));
        assert_eq!(combined.digest(), Some(&d));
        assert_eq!(combined.identifier(), d.as_str(), "the digest wins, as in ggcr");
        assert!(combined.is_pinned());
        assert_eq!(combined.to_string(), format!("ghcr.io/org/app:v1@{d}"));

        let with_port = Reference::parse(&format!("localhost:5000/app@{d}")).unwrap();
        assert_eq!(with_port.registry(), "localhost:5000");
        assert_eq!(with_port.tag(), None);
    }

    #[test]
    fn normalized_and_name() {
        let r = Reference::parse("ubuntu").unwrap();
        assert_eq!(r.name(), "index.docker.io/library/ubuntu");
        assert_eq!(r.normalized(), "index.docker.io/library/ubuntu:latest");
        assert_eq!(r.registry_as_written(), None);
        assert_eq!(r.repository_as_written(), "ubuntu");
    }

    #[rstest]
    #[case("ubuntu:22.04", "ubuntu")]
    #[case("ubuntu", "ubuntu")]
    #[case("docker.io/library/ubuntu:1", "docker.io/library/ubuntu")]
    #[case("localhost:5000/team/app:1", "localhost:5000/team/app")]
    #[case(
        "ghcr.io/org/app:v1@sha256:1111111111111111111111111111111111111111111111111111111111111111",
        "ghcr.io/org/app"
    )]
    fn pinned_keeps_spelling_and_drops_tag(#[case] input: &str, #[case] written: &str) {
        let r = Reference::parse(input).unwrap();
        let d = digest();
        let pinned = r.pinned(&d);
        assert_eq!(pinned, format!("{written}@{d}"));
        let reparsed = Reference::parse(&pinned).unwrap();
        assert_eq!(reparsed.name(), r.name());
        assert_eq!(reparsed.digest(), Some(&d));
        assert_eq!(
            reparsed.pinned(&d),
            pinned,
            "pinning a pinned reference is idempotent"
        );
    }

    #[test]
    fn with_tag_replaces_tag_and_digest() {
        let r = Reference::parse("ghcr.io/org/bundle").unwrap();
        let tagged = r.with_tag("v1.2.0").unwrap();
        assert_eq!(tagged.to_string(), "ghcr.io/org/bundle:v1.2.0");
        assert!(matches!(
            r.with_tag("bad tag"),
            Err(ReferenceError::InvalidTagCharacter { ch: ' ', .. })
        ));
        assert!(matches!(r.with_tag(""), Err(ReferenceError::EmptyTag(_))));
    }

    fn err(input: &str) -> ReferenceError {
        Reference::parse(input).unwrap_err()
    }

    #[test]
    fn specific_errors() {
        assert_eq!(err(""), ReferenceError::Empty);
        assert!(matches!(err("https://ghcr.io/app"), ReferenceError::UrlScheme(_)));
        assert!(matches!(err("http://ghcr.io/app"), ReferenceError::UrlScheme(_)));
        assert!(matches!(
            err("app@sha256:a@b"),
            ReferenceError::MultipleDigestSeparators(_)
        ));
        assert!(matches!(
            err("app@sha256:abc"),
            ReferenceError::InvalidDigest {
                source: DigestError::InvalidLength { len: 3 },
                ..
            }
        ));
        assert!(matches!(
            err(&format!("app@sha512:{HEX}")),
            ReferenceError::InvalidDigest {
                source: DigestError::UnsupportedAlgorithm { .. },
                ..
            }
        ));
        assert!(matches!(
            err(&format!("app@sha256:{}", HEX.to_uppercase())),
            ReferenceError::InvalidDigest {
                source: DigestError::InvalidHex { .. },
                ..
            }
        ));
        assert!(matches!(err("app:"), ReferenceError::EmptyTag(_)));
        assert!(matches!(
            err("app:v1!"),
            ReferenceError::InvalidTagCharacter { ch: '!', .. }
        ));
        assert!(matches!(
            err("app:-rc"),
            ReferenceError::TagStartsWithSeparator { .. }
        ));
        assert!(matches!(
            err("app:.x"),
            ReferenceError::TagStartsWithSeparator { .. }
        ));
        assert!(matches!(
            err(&format!("app:{}", "a".repeat(128))),
            ReferenceError::TagTooLong { len: 128, .. }
        ));
        assert!(Reference::parse(&format!("app:{}", "a".repeat(127))).is_ok());
        assert!(matches!(err("ghcr.io/"), ReferenceError::EmptyRepository));
        assert!(matches!(err(":v1"), ReferenceError::EmptyRepository));
        assert!(matches!(
            err("ghcr.io/Org/app"),
            ReferenceError::UppercaseRepository { ch: 'O', .. }
        ));
        assert!(matches!(
            err("Ubuntu"),
            ReferenceError::UppercaseRepository { ch: 'U', .. }
        ));
        assert!(matches!(
            err("ghcr.io/org/a+b"),
            ReferenceError::InvalidRepositoryCharacter { ch: '+', .. }
        ));
        assert!(matches!(
            err("a:b:c"),
            ReferenceError::InvalidRepositoryCharacter { ch: ':', .. }
        ));
        assert!(matches!(
            err("ghcr.io/a"),
            ReferenceError::RepositoryLength { len: 1, .. }
        ));
        assert!(matches!(
            err("a"),
            ReferenceError::RepositoryLength { len: 1, .. }
        ));
        assert!(matches!(
            err(&format!("ghcr.io/{}", "a".repeat(256))),
            ReferenceError::RepositoryLength { len: 256, .. }
        ));
        // 250 characters is fine on ghcr.io but not on Docker Hub, where `library/` is added.
        assert!(Reference::parse(&format!("ghcr.io/{}", "a".repeat(250))).is_ok());
        assert!(matches!(
            err(&"a".repeat(250)),
            ReferenceError::RepositoryLength { len: 258, .. }
        ));
        assert!(matches!(
            err("ghcr.io/org//app"),
            ReferenceError::EmptyPathComponent { .. }
        ));
        assert!(matches!(
            err("ghcr.io/org/app/"),
            ReferenceError::EmptyPathComponent { .. }
        ));
        assert!(matches!(
            err("ghcr.io//app"),
            ReferenceError::EmptyPathComponent { .. }
        ));
        assert!(matches!(
            err("ghcr.io/org/-app"),
            ReferenceError::ComponentBoundary { .. }
        ));
        assert!(matches!(
            err("ghcr.io/org/app_"),
            ReferenceError::ComponentBoundary { .. }
        ));
        assert!(matches!(
            err("ghcr.io/org/a..b"),
            ReferenceError::InvalidSeparator { .. }
        ));
        assert!(matches!(
            err("ghcr.io/org/a___b"),
            ReferenceError::InvalidSeparator { .. }
        ));
        assert!(matches!(
            err("ghcr.io/org/a.-b"),
            ReferenceError::InvalidSeparator { .. }
        ));
        assert!(matches!(
            err("reg.io:abc/app"),
            ReferenceError::InvalidRegistry { .. }
        ));
        assert!(matches!(
            err("reg.io:/app"),
            ReferenceError::InvalidRegistry { .. }
        ));
        assert!(matches!(
            err("reg.io:99999/app"),
            ReferenceError::InvalidRegistry { .. }
        ));
        assert!(matches!(err("[::1/app"), ReferenceError::InvalidRegistry { .. }));
        assert!(matches!(
            err("[zz::1]:5000/app"),
            ReferenceError::InvalidRegistry { .. }
        ));
        assert!(matches!(
            err("::1:5000/app"),
            ReferenceError::InvalidRegistry { .. }
        ));
        assert!(matches!(
            err("user@reg.io/app"),
            ReferenceError::InvalidDigest { .. }
        ));
        assert!(matches!(
            err("re%g.io/app"),
            ReferenceError::InvalidRegistry { .. }
        ));
    }

    #[test]
    fn error_messages_name_the_problem() {
        assert_eq!(
            err("ghcr.io/Org/app").to_string(),
            "repository \"Org/app\" must be lowercase (found 'O')"
        );
        assert_eq!(
            err("ghcr.io/org/a..b").to_string(),
            "repository path component \"a..b\" has the separator \"..\"; allowed are '.', '_', '__' or a run of '-'"
        );
    }

    fn component() -> impl Strategy<Value = String> {
        "[a-z0-9]{1,4}((\\.|_|__|-{1,3})[a-z0-9]{1,4}){0,2}"
    }

    fn reference_string() -> impl Strategy<Value = String> {
        let registry = prop_oneof![
            Just(None),
            Just(Some("docker.io".to_owned())),
            Just(Some("index.docker.io".to_owned())),
            "[a-z][a-z0-9-]{0,6}(\\.[a-z0-9]{1,6}){1,2}(:[1-9][0-9]{0,3})?".prop_map(Some),
            "localhost:[1-9][0-9]{1,3}".prop_map(Some),
            "\\[::1\\](:[1-9][0-9]{0,3})?".prop_map(Some),
        ];
        let repository = prop::collection::vec(component(), 1..4).prop_map(|c| c.join("/"));
        let tag = prop::option::of("[A-Za-z0-9_][A-Za-z0-9_.-]{0,15}");
        let digest = prop::option::of("[0-9a-f]{64}");
        (registry, repository, tag, digest)
            .prop_filter(
                "ggcr needs at least 2 characters of repository",
                |(_, repo, _, _)| repo.len() >= 2,
            )
            // Without a registry, a first path component with a '.' *is* the registry (ggcr),
            // so the string would not be the reference the generator meant.
            .prop_filter(
                "a dotted first component is a registry",
                |(registry, repo, _, _)| {
                    registry.is_some() || repo.split_once('/').is_none_or(|(first, _)| !first.contains('.'))
                },
            )
            .prop_map(|(registry, repository, tag, digest)| {
                let mut s = registry.map(|r| format!("{r}/")).unwrap_or_default();
                s.push_str(&repository);
                if let Some(tag) = tag {
                    s.push(':');
                    s.push_str(&tag);
                }
                if let Some(hex) = digest {
                    s.push_str("@sha256:");
                    s.push_str(&hex);
                }
                s
            })
    }

    proptest! {
        #[test]
        fn valid_references_round_trip(s in reference_string()) {
            let parsed = Reference::parse(&s).unwrap();
            prop_assert_eq!(parsed.to_string(), s.clone());
            let reparsed = Reference::parse(&parsed.to_string()).unwrap();
            prop_assert_eq!(&reparsed, &parsed);
            prop_assert_eq!(reparsed.name(), parsed.name());
        }

        #[test]
        fn pinned_round_trips_to_the_same_repository(s in reference_string(), hex in "[0-9a-f]{64}") {
            let parsed = Reference::parse(&s).unwrap();
            let d = Digest::parse(&format!("sha256:{hex}")).unwrap();
            let pinned = Reference::parse(&parsed.pinned(&d)).unwrap();
            prop_assert_eq!(pinned.name(), parsed.name());
            prop_assert_eq!(pinned.digest(), Some(&d));
            prop_assert_eq!(pinned.tag(), None);
            prop_assert_eq!(pinned.to_string(), parsed.pinned(&d));
        }

        #[test]
        fn anything_accepted_round_trips(s in "[a-zA-Z0-9:/@._\\-\\[\\]]{0,40}") {
            if let Ok(parsed) = Reference::parse(&s) {
                prop_assert_eq!(parsed.to_string(), s);
                prop_assert_eq!(Reference::parse(&parsed.to_string()).unwrap(), parsed);
            }
        }
    }
}
