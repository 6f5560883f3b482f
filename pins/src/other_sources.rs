//! The fetch sources holdfast does not pin (`http`, `git`, `helmChart`), described for the
//! policy: where each fetches from (so an allowlist of registries covers them too) and whether
//! what it fetches is fixed by its spec (so a namespace that requires digests can tell).
//! `inline` fetches nothing and is neither.

use serde_json::Value;
use url::Url;

use crate::sites::{PinnedKind, fetch_entries};

/// One non-OCI fetch source of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherSource {
    /// The field for people, e.g. `spec.fetch[1].git.url`.
    pub field: String,
    /// `http`, `git` or `helmChart`.
    pub source: &'static str,
    /// The location as written.
    pub url: String,
    /// `host[:port]/path` of `url`, compared with the policy's `registry/prefix` entries;
    /// `None` when `url` has no host holdfast can read (then no allowlist admits it).
    pub location: Option<String>,
    /// Whether the spec fixes the content: an `http` source with its `sha256`, a `git` source at
    /// a full commit id. A `helmChart` never is (a chart version is a tag).
    pub fixed: bool,
}

/// The `http`, `git` and `helmChart` sources of `object`, in document order.
pub fn other_sources(kind: PinnedKind, object: &Value) -> Vec<OtherSource> {
    let mut sources = Vec::new();
    for (_, field, entry) in fetch_entries(kind, object) {
        let text = |source: &Value, key: &str| source.get(key).and_then(Value::as_str).map(str::to_owned);
        if let Some(http) = entry.get("http").filter(|v| v.is_object())
            && let Some(url) = text(http, "url")
        {
            sources.push(OtherSource {
                field: format!("{field}.http.url"),
                source: "http",
                location: location(&url),
                fixed: text(http, "sha256").is_some_and(|sha| is_hex(&sha, 64)),
                url,
            });
        }
        if let Some(git) = entry.get("git").filter(|v| v.is_object())
            && let Some(url) = text(git, "url")
        {
            sources.push(OtherSource {
                field: format!("{field}.git.url"),
                source: "git",
                location: location(&url),
                fixed: text(git, "ref").is_some_and(|r| is_hex(&r, 40) || is_hex(&r, 64)),
                url,
            });
        }
        if let Some(chart) = entry.get("helmChart").filter(|v| v.is_object())
            && let Some(url) = chart.get("repository").and_then(|r| text(r, "url"))
        {
            sources.push(OtherSource {
                field: format!("{field}.helmChart.repository.url"),
                source: "helmChart",
                location: location(&url),
                fixed: false,
                url,
            });
        }
    }
    sources
}

fn is_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `host[:port]/path` of a URL (`https://`, `http://`, `oci://`, `ssh://`, `git://`), or of
/// git's scp-like `user@host:path`; lower-cased host, no trailing slash.
fn location(url: &str) -> Option<String> {
    let (host, path) = match Url::parse(url) {
        Ok(parsed) if parsed.host_str().is_some() => {
            let host = parsed.host_str()?.to_ascii_lowercase();
            let host = match parsed.port() {
                Some(port) => format!("{host}:{port}"),
                None => host,
            };
            (host, parsed.path().to_owned())
        }
        // scp-like git: `git@github.com:org/repo.git` (no scheme, a colon before the path).
        _ if !url.contains("://") => {
            let (authority, path) = url.split_once(':')?;
            let host = authority.rsplit('@').next()?.to_ascii_lowercase();
            if host.is_empty() || host.contains('/') {
                return None;
            }
            (host, format!("/{path}"))
        }
        _ => return None,
    };
    let path = path.trim_end_matches('/');
    Some(format!("{host}{path}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn app(fetch: Value) -> Value {
        json!({"spec": {"fetch": fetch}})
    }

    #[test]
    fn each_source_says_where_it_fetches_and_whether_it_is_fixed() {
        let sha = "a".repeat(64);
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let object = app(json!([
            {"inline": {"paths": {"a.yml": "x"}}},
            {"image": {"url": "registry.corp.com/app:1"}},
            {"http": {"url": "https://files.corp.com/config.tgz", "sha256": sha}},
            {"http": {"url": "http://files.corp.com:8080/c.tgz"}},
            {"git": {"url": "https://github.com/org/repo", "ref": commit}},
            {"git": {"url": "git@GitHub.com:org/repo.git", "ref": "origin/main"}},
            {"helmChart": {"name": "app", "repository": {"url": "oci://registry.corp.com/charts/"}}},
        ]));
        let got: Vec<_> = other_sources(PinnedKind::App, &object)
            .into_iter()
            .map(|s| (s.field, s.source, s.location, s.fixed))
            .collect();
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(
            got,
            [
                (
                    "spec.fetch[2].http.url".into(),
                    "http",
                    some("files.corp.com/config.tgz"),
                    true
                ),
                (
                    "spec.fetch[3].http.url".into(),
                    "http",
                    some("files.corp.com:8080/c.tgz"),
                    false
                ),
                (
                    "spec.fetch[4].git.url".into(),
                    "git",
                    some("github.com/org/repo"),
                    true
                ),
                (
                    "spec.fetch[5].git.url".into(),
                    "git",
                    some("github.com/org/repo.git"),
                    false
                ),
                (
                    "spec.fetch[6].helmChart.repository.url".into(),
                    "helmChart",
                    some("registry.corp.com/charts"),
                    false
                ),
            ]
        );
    }

    #[test]
    fn a_package_repository_has_one_entry_and_a_package_its_template() {
        let repository = json!({"spec": {"fetch": {"git": {"url": "https://git.corp.com/repo"}}}});
        let package =
            json!({"spec": {"template": {"spec": {"fetch": [{"http": {"url": "https://f.corp.com/x"}}]}}}});
        assert_eq!(
            other_sources(PinnedKind::PackageRepository, &repository)[0].field,
            "spec.fetch.git.url"
        );
        assert_eq!(
            other_sources(PinnedKind::Package, &package)[0].field,
            "spec.template.spec.fetch[0].http.url"
        );
    }

    #[test]
    fn urls_without_a_readable_host_have_no_location() {
        for url in ["", "not a url", "file:///etc/passwd", "https://", ":path"] {
            let object = app(json!([{"http": {"url": url}}]));
            assert_eq!(
                other_sources(PinnedKind::App, &object)[0].location,
                None,
                "{url:?}"
            );
        }
    }
}
