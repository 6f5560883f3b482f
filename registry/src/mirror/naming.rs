//! Where mirrored content lives: `<mirror>/<prefix>/<source host>/<source repository>`.
//!
//! The source host becomes one repository path component: lowercased, with the port joined by
//! `_` (`127.0.0.1:5000` → `127.0.0.1_5000`; DNS names have no `_`, so host and port cannot be
//! confused with another host) and IPv6 literals spelled `ipv6-<groups joined by ->`. Docker Hub
//! is `index.docker.io` with its `library/` namespace, as ggcr contacts it. Everything is copied
//! by digest, so two sources that would map to the same repository could only ever share content
//! that is byte for byte the same. A name that is not a valid repository (too long, say) is an
//! error, never a shortened or altered name.

use crate::{digest::Digest, reference::Reference};

/// Why a mirror location or a mirror repository name is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamingError {
    #[error("mirror registry {registry:?} is not a registry host[:port] ({reason})")]
    Registry { registry: String, reason: String },
    #[error("mirror repository prefix {prefix:?} is not a valid repository path ({reason})")]
    Prefix { prefix: String, reason: String },
    #[error("{source_name} cannot be mirrored as {name:?}: {reason}")]
    Repository {
        source_name: String,
        name: String,
        reason: String,
    },
}

/// A cache registry and the repository prefix mirrored content goes under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorLocation {
    registry: String,
    prefix: String,
}

impl MirrorLocation {
    /// `registry` is `host[:port]` (a name ggcr reads as a registry: with a `.` or a `:`);
    /// `prefix` may be empty or a `/`-separated repository path (surrounding `/` are ignored).
    pub fn new(registry: &str, prefix: &str) -> Result<Self, NamingError> {
        let prefix = prefix.trim_matches('/').to_owned();
        // A prefix is the start of a repository path: probe it with one more component.
        let probe = if prefix.is_empty() {
            format!("{registry}/x0")
        } else {
            format!("{registry}/{prefix}/x0")
        };
        let parsed = Reference::parse(&probe).map_err(|e| {
            if prefix.is_empty() || Reference::parse(&format!("{registry}/x0")).is_err() {
                NamingError::Registry {
                    registry: registry.to_owned(),
                    reason: e.to_string(),
                }
            } else {
                NamingError::Prefix {
                    prefix: prefix.clone(),
                    reason: e.to_string(),
                }
            }
        })?;
        if parsed.registry_as_written() != Some(registry) || parsed.is_docker_hub() {
            return Err(NamingError::Registry {
                registry: registry.to_owned(),
                reason: "a registry name needs a '.' or a ':' (e.g. cache.example.com or 127.0.0.1:5000)"
                    .into(),
            });
        }
        Ok(Self {
            registry: registry.to_owned(),
            prefix,
        })
    }

    /// The mirror's `host[:port]`.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository prefix (no leading or trailing `/`; may be empty).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The mirror repository (path on the mirror, without the host) for `source`'s repository.
    pub fn repository_for(&self, source: &Reference) -> Result<String, NamingError> {
        let host = host_component(source.registry());
        let mut name = String::new();
        if !self.prefix.is_empty() {
            name.push_str(&self.prefix);
            name.push('/');
        }
        name.push_str(&host);
        name.push('/');
        name.push_str(&source.repository());
        // Validate by parsing, exactly as a client of the mirror will.
        let full = format!("{}/{name}", self.registry);
        match Reference::parse(&full) {
            Ok(parsed) if parsed.repository() == name && parsed.registry() == self.registry => Ok(name),
            Ok(_) => Err(NamingError::Repository {
                source_name: source.name(),
                name,
                reason: "does not parse back to the same repository".into(),
            }),
            Err(e) => Err(NamingError::Repository {
                source_name: source.name(),
                name,
                reason: e.to_string(),
            }),
        }
    }

    /// The mirror repository for `source` as a reference without tag or digest.
    pub fn repository_reference(&self, source: &Reference) -> Result<Reference, NamingError> {
        let repository = self.repository_for(source)?;
        let full = format!("{}/{repository}", self.registry);
        Reference::parse(&full).map_err(|e| NamingError::Repository {
            source_name: source.name(),
            name: repository,
            reason: e.to_string(),
        })
    }

    /// `<mirror>/<prefix>/<host>/<repository>@<digest>`: where `source`'s content at `digest`
    /// is once mirrored.
    pub fn pinned_for(&self, source: &Reference, digest: &Digest) -> Result<String, NamingError> {
        Ok(format!(
            "{}/{}@{digest}",
            self.registry,
            self.repository_for(source)?
        ))
    }

    /// Whether `reference` already points into this mirror's prefix.
    pub fn contains(&self, reference: &Reference) -> bool {
        reference.registry() == self.registry
            && (self.prefix.is_empty()
                || reference
                    .repository()
                    .strip_prefix(&self.prefix)
                    .is_some_and(|rest| rest.starts_with('/')))
    }
}

/// The source registry as one repository path component (see the module docs).
pub fn host_component(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    if let Some(rest) = host.strip_prefix('[') {
        let (address, port) = match rest.split_once(']') {
            Some((address, port)) => (address, port.strip_prefix(':')),
            None => (rest, None),
        };
        let mut out = format!("ipv6-{}", address.replace(':', "-"));
        if out.ends_with('-') {
            out.push('0');
        }
        if let Some(port) = port {
            out.push('_');
            out.push_str(port);
        }
        return out;
    }
    match host.rsplit_once(':') {
        Some((name, port)) => format!("{name}_{port}"),
        None => host,
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[rstest]
    #[case("127.0.0.1:5000", "127.0.0.1_5000")]
    #[case("Registry.Example.COM", "registry.example.com")]
    #[case("ghcr.io", "ghcr.io")]
    #[case("my-registry.local:443", "my-registry.local_443")]
    #[case("[::1]:5000", "ipv6---1_5000")]
    #[case("[fe80::1]", "ipv6-fe80--1")]
    #[case("[fe80::]", "ipv6-fe80--0")]
    fn host_components(#[case] host: &str, #[case] expected: &str) {
        assert_eq!(host_component(host), expected);
    }

    #[rstest]
    #[case(
        "127.0.0.1:5000/apps/web@",
        "cache.local:5000",
        "mirror",
        "mirror/127.0.0.1_5000/apps/web"
    )]
    #[case("ubuntu@", "cache.local", "a/b/", "a/b/index.docker.io/library/ubuntu")]
    #[case(
        "docker.io/bitnami/nginx@",
        "cache.local",
        "",
        "index.docker.io/bitnami/nginx"
    )]
    #[case("ghcr.io/org/team/app@", "10.0.0.1:5000", "/m/", "m/ghcr.io/org/team/app")]
    #[case("[::1]:5000/x/y@", "cache.local", "p", "p/ipv6---1_5000/x/y")]
    fn mirror_repositories(
        #[case] source: &str,
        #[case] mirror: &str,
        #[case] prefix: &str,
        #[case] expected: &str,
    ) {
        let source = Reference::parse(&format!("{source}{D}")).unwrap();
        let location = MirrorLocation::new(mirror, prefix).unwrap();
        assert_eq!(location.repository_for(&source).unwrap(), expected);
        let digest = Digest::parse(D).unwrap();
        let pinned = location.pinned_for(&source, &digest).unwrap();
        assert_eq!(pinned, format!("{mirror}/{expected}@{D}"));
        let parsed = Reference::parse(&pinned).unwrap();
        assert_eq!(parsed.registry(), mirror);
        assert_eq!(parsed.repository(), expected);
        assert!(location.contains(&parsed));
        assert!(!location.contains(&source));
        assert_eq!(
            location.repository_reference(&source).unwrap().to_string(),
            format!("{mirror}/{expected}")
        );
    }

    #[test]
    fn prefix_must_match_whole_components() {
        let location = MirrorLocation::new("cache.local", "mirror").unwrap();
        let other = Reference::parse("cache.local/mirrored/x/y").unwrap();
        assert!(!location.contains(&other));
        let empty = MirrorLocation::new("cache.local", "").unwrap();
        assert!(empty.contains(&other));
    }

    #[rstest]
    #[case("localhost", "")]
    #[case("cache", "m")]
    #[case("https://cache.local", "m")]
    #[case("cache.local:port", "")]
    fn rejects_registries(#[case] registry: &str, #[case] prefix: &str) {
        assert!(matches!(
            MirrorLocation::new(registry, prefix),
            Err(NamingError::Registry { .. })
        ));
    }

    #[rstest]
    #[case("Upper")]
    #[case("a//b")]
    #[case("a/-b")]
    fn rejects_prefixes(#[case] prefix: &str) {
        assert!(matches!(
            MirrorLocation::new("cache.local", prefix),
            Err(NamingError::Prefix { .. })
        ));
    }

    #[test]
    fn too_long_is_an_error_not_a_shortened_name() {
        let long = "a".repeat(250);
        let source = Reference::parse(&format!("ghcr.io/{long}@{D}")).unwrap();
        let location = MirrorLocation::new("cache.local", "mirror").unwrap();
        let error = location.repository_for(&source).unwrap_err();
        assert!(matches!(error, NamingError::Repository { .. }), "{error:?}");
        assert!(error.to_string().contains("ghcr.io/"), "{error}");
    }
}
