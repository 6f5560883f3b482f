//! Registry credentials from a fetch spec's `secretRef` Secret, read the way vendir reads them
//! (`pkg/vendir/config/dockerconfigjson.go`, `fetch/image/imgpkg.go#authEnv`) and matched to a
//! registry the way imgpkg's env keychain matches them.
//!
//! Accepted Secret shapes:
//! - type `kubernetes.io/dockerconfigjson`: only `.dockerconfigjson` is read; `auths` is a map
//!   keyed by host or URL (`https://index.docker.io/v1/`, `quay.io/org`, `*.corp.com`) with
//!   `username`/`password`, or `auth` = base64 `user:pass` (used only when `password` is
//!   empty, as vendir does), and `identitytoken` (read here, ignored by vendir);
//! - any other type with a `hostname` key: `hostname`, `username`, `password`, `token`
//!   (a registry bearer token) and `identity-token`;
//! - any other type without `hostname`: `username`, `password`, `token`, used for every registry.
//!
//! Any other key is an error, worded as vendir's: `Unknown secret field 'x' in secret 'y'`.
//!
//! Matching (imgpkg): a key is a host (with optional port and path prefix; `/v1/`, `/v2/` are
//! ignored); host labels may use `*`/`?` globs; the port must be equal; the key's path must be a
//! prefix of the repository path; the most specific key (reverse lexical order) wins. Docker Hub
//! keys (`docker.io`, `index.docker.io`, `registry-1.docker.io`, any scheme, `/v1/`) all mean
//! `index.docker.io`, which is where references to Docker Hub resolve.

use std::{collections::BTreeMap, fmt};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::reference::{DOCKER_HUB, Reference};

const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
const DOCKER_HUB_ALIASES: &[&str] = &["docker.io", "index.docker.io", "registry-1.docker.io"];

/// Credentials for one registry. `Debug` never shows secrets.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    username: String,
    password: String,
    identity_token: Option<String>,
    registry_token: Option<String>,
}

/// All credentials of one Secret, ready to be matched to a reference.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// From a Secret without `hostname`: applies to every registry.
    default: Option<AuthConfig>,
    /// Most specific key first.
    hosts: Vec<HostEntry>,
}

#[derive(Clone, PartialEq, Eq)]
struct HostEntry {
    /// `host[:port][/path]`, as imgpkg normalises it (Docker Hub aliases folded).
    key: String,
    host: String,
    port: String,
    path: String,
    auth: AuthConfig,
}

/// Why a Secret cannot be used as registry credentials. Never contains secret values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    #[error("Unknown secret field '{field}' in secret '{secret}'")]
    UnknownField { secret: String, field: String },
    #[error("secret '{secret}' of type {DOCKER_CONFIG_JSON_TYPE} has no '{DOCKER_CONFIG_JSON_KEY}' key")]
    MissingDockerConfigJson { secret: String },
    #[error("secret '{secret}': parsing {DOCKER_CONFIG_JSON_KEY}: {detail}")]
    InvalidDockerConfigJson { secret: String, detail: String },
    #[error("secret '{secret}': Decoding auth field: {detail}")]
    InvalidAuthField { secret: String, detail: String },
    #[error("secret '{secret}': Expected auth field to have 'username:password' format, but did not")]
    AuthFieldFormat { secret: String },
    #[error("secret '{secret}': field '{field}' is not valid UTF-8")]
    NotUtf8 { secret: String, field: String },
}

impl AuthConfig {
    /// Username and password (Basic auth, or the credentials for a token service).
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
            ..Self::default()
        }
    }

    /// A registry bearer token, sent as is (vendir `token`).
    pub fn registry_token(token: impl Into<String>) -> Self {
        Self {
            registry_token: Some(token.into()),
            ..Self::default()
        }
    }

    /// An OAuth2 refresh token exchanged at the token service (`identitytoken`).
    pub fn identity_token(token: impl Into<String>) -> Self {
        Self {
            identity_token: Some(token.into()),
            ..Self::default()
        }
    }

    /// No usable secret at all (e.g. an `auths` entry `{}`): behaves as anonymous.
    pub fn is_anonymous(&self) -> bool {
        !self.has_basic() && self.identity_token.is_none() && self.registry_token.is_none()
    }

    pub(crate) fn has_basic(&self) -> bool {
        !self.username.is_empty() || !self.password.is_empty()
    }

    pub(crate) fn username(&self) -> &str {
        &self.username
    }

    pub(crate) fn password(&self) -> &str {
        &self.password
    }

    pub(crate) fn identity_token_value(&self) -> Option<&str> {
        self.identity_token.as_deref().filter(|t| !t.is_empty())
    }

    pub(crate) fn registry_token_value(&self) -> Option<&str> {
        self.registry_token.as_deref().filter(|t| !t.is_empty())
    }

    /// A stable in-memory identity of the secret material, used to scope cached tokens so a
    /// token obtained with one credential is never used for another. Not for persistence: an
    /// unsalted hash of a weak password can be brute-forced.
    pub(crate) fn fingerprint(&self) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(b"holdfast-auth-config-v1");
        for field in [
            self.username.as_str(),
            self.password.as_str(),
            self.identity_token.as_deref().unwrap_or_default(),
            self.registry_token.as_deref().unwrap_or_default(),
        ] {
            hasher.update((field.len() as u64).to_le_bytes());
            hasher.update(field.as_bytes());
        }
        hasher.finalize().into()
    }
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.registry_token.is_some() {
            "registry-token"
        } else if self.identity_token.is_some() {
            "identity-token"
        } else if self.has_basic() {
            "basic"
        } else {
            "anonymous"
        };
        f.debug_struct("AuthConfig")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// No credentials: every registry is accessed anonymously.
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// Credentials that apply to every registry (a Secret without `hostname`).
    pub fn for_all_registries(auth: AuthConfig) -> Self {
        Self {
            default: Some(auth),
            hosts: Vec::new(),
        }
    }

    /// Adds credentials for `key` (a host, `host:port`, `host/path`, URL or `*.host` glob).
    pub fn with_host(mut self, key: &str, auth: AuthConfig) -> Self {
        self.hosts.push(HostEntry::new(key, auth));
        self.hosts.sort_by(|a, b| b.key.cmp(&a.key));
        self
    }

    /// Whether no credentials at all were configured.
    pub fn is_anonymous(&self) -> bool {
        self.default.is_none() && self.hosts.is_empty()
    }

    /// Reads a Secret's `type` and `data` the way vendir does.
    pub fn from_secret<K, V>(
        secret_name: &str,
        secret_type: Option<&str>,
        data: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, CredentialsError>
    where
        K: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let data: BTreeMap<String, Vec<u8>> = data
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_vec()))
            .collect();
        if secret_type == Some(DOCKER_CONFIG_JSON_TYPE) {
            return Self::from_docker_config_json(secret_name, &data);
        }
        let text = |field: &str| -> Result<Option<String>, CredentialsError> {
            data.get(field)
                .map(|v| {
                    String::from_utf8(v.clone()).map_err(|_| CredentialsError::NotUtf8 {
                        secret: secret_name.to_owned(),
                        field: field.to_owned(),
                    })
                })
                .transpose()
        };
        let unknown = |field: &str| CredentialsError::UnknownField {
            secret: secret_name.to_owned(),
            field: field.to_owned(),
        };
        let per_host = data.contains_key("hostname");
        let allowed: &[&str] = if per_host {
            &["hostname", "username", "password", "identity-token", "token"]
        } else {
            &["username", "password", "token"]
        };
        if let Some(field) = data.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(unknown(field));
        }
        let auth = AuthConfig {
            username: text("username")?.unwrap_or_default(),
            password: text("password")?.unwrap_or_default(),
            identity_token: text("identity-token")?,
            registry_token: text("token")?,
        };
        match text("hostname")? {
            Some(hostname) if per_host => Ok(Self::anonymous().with_host(&hostname, auth)),
            _ => Ok(Self::for_all_registries(auth)),
        }
    }

    fn from_docker_config_json(
        secret: &str,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Self, CredentialsError> {
        let invalid = |detail: String| CredentialsError::InvalidDockerConfigJson {
            secret: secret.to_owned(),
            detail,
        };
        let raw =
            data.get(DOCKER_CONFIG_JSON_KEY)
                .ok_or_else(|| CredentialsError::MissingDockerConfigJson {
                    secret: secret.to_owned(),
                })?;
        // serde_json's syntax errors name a position, never the content.
        let config: Value = serde_json::from_slice(raw).map_err(|e| invalid(e.to_string()))?;
        let Value::Object(config) = config else {
            return Err(invalid("top level is not a JSON object".into()));
        };
        let auths = match field_ci(&config, "auths") {
            None | Some(Value::Null) => return Ok(Self::anonymous()),
            Some(Value::Object(auths)) => auths,
            Some(_) => return Err(invalid("'auths' is not a JSON object".into())),
        };
        let mut credentials = Self::anonymous();
        for (host, entry) in auths {
            let entry = match entry {
                Value::Object(entry) => Some(entry),
                Value::Null => None,
                _ => return Err(invalid(format!("auths entry {host:?} is not a JSON object"))),
            };
            let string = |name: &str| -> Result<String, CredentialsError> {
                match entry.and_then(|e| field_ci(e, name)) {
                    None | Some(Value::Null) => Ok(String::new()),
                    Some(Value::String(s)) => Ok(s.clone()),
                    Some(_) => Err(invalid(format!("auths entry {host:?}: '{name}' is not a string"))),
                }
            };
            let mut auth = AuthConfig {
                username: string("username")?,
                password: string("password")?,
                identity_token: Some(string("identitytoken")?).filter(|t| !t.is_empty()),
                registry_token: None,
            };
            let encoded = string("auth")?;
            if auth.password.is_empty() && !encoded.is_empty() {
                // base64's own error names the offending byte and its offset: Secret material.
                let decoded =
                    STANDARD
                        .decode(encoded.as_bytes())
                        .map_err(|_| CredentialsError::InvalidAuthField {
                            secret: secret.to_owned(),
                            detail: "not valid base64".into(),
                        })?;
                let decoded = String::from_utf8(decoded).map_err(|_| CredentialsError::NotUtf8 {
                    secret: secret.to_owned(),
                    field: "auth".into(),
                })?;
                let (username, password) =
                    decoded
                        .split_once(':')
                        .ok_or_else(|| CredentialsError::AuthFieldFormat {
                            secret: secret.to_owned(),
                        })?;
                auth.username = username.to_owned();
                auth.password = password.to_owned();
            }
            credentials = credentials.with_host(host, auth);
        }
        Ok(credentials)
    }

    /// The credentials to use for `reference`, `None` for anonymous access.
    pub fn for_reference(&self, reference: &Reference) -> Option<&AuthConfig> {
        let repository_path = format!("/{}", reference.repository());
        let (host, port) = split_host_port(reference.registry());
        self.hosts
            .iter()
            .find(|entry| entry.matches(host, port, &repository_path))
            .map(|entry| &entry.auth)
            .or(self.default.as_ref())
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("default", &self.default)
            .field(
                "hosts",
                &self.hosts.iter().map(|h| (&h.key, &h.auth)).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl HostEntry {
    /// imgpkg `HOSTNAME`: add `https://` if there is no scheme, take host + path, treat
    /// `/v1/` and `/v2/` as the root.
    fn new(raw: &str, auth: AuthConfig) -> Self {
        let without_scheme = raw
            .strip_prefix("https://")
            .or_else(|| raw.strip_prefix("http://"))
            .unwrap_or(raw);
        let without_query = without_scheme.split(['?', '#']).next().unwrap_or_default();
        let (authority, path) = match without_query.find('/') {
            Some(i) => without_query.split_at(i),
            None => (without_query, ""),
        };
        let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
        let path = if path.starts_with("/v1/") || path.starts_with("/v2/") {
            &path[3..]
        } else {
            path
        };
        let path = if path == "/" { "" } else { path };
        let (host, port) = split_host_port(authority);
        let host = if port.is_empty() && DOCKER_HUB_ALIASES.contains(&host.to_ascii_lowercase().as_str()) {
            DOCKER_HUB.to_owned()
        } else {
            host.to_owned()
        };
        let key = match port {
            "" => format!("{host}{path}"),
            port => format!("{host}:{port}{path}"),
        };
        Self {
            key,
            host,
            port: port.to_owned(),
            path: path.to_owned(),
            auth,
        }
    }

    /// imgpkg `URLsMatch`: same port, same number of host labels, each label glob-matches
    /// case-insensitively, and the key path is a prefix of the repository path.
    fn matches(&self, host: &str, port: &str, repository_path: &str) -> bool {
        if self.port != port || !repository_path.starts_with(&self.path) {
            return false;
        }
        let pattern: Vec<&str> = self.host.split('.').collect();
        let target: Vec<&str> = host.split('.').collect();
        pattern.len() == target.len()
            && pattern
                .iter()
                .zip(&target)
                .all(|(p, t)| glob_match(&p.to_ascii_lowercase(), &t.to_ascii_lowercase()))
    }
}

/// Go `net.SplitHostPort` leniency: `host:port`, `[v6]:port`, else the whole string is the host.
fn split_host_port(authority: &str) -> (&str, &str) {
    if let Some(rest) = authority.strip_prefix('[') {
        if let Some((host, after)) = rest.split_once(']') {
            return (host, after.strip_prefix(':').unwrap_or_default());
        }
        return (authority, "");
    }
    match authority.split_once(':') {
        Some((host, port)) if !port.contains(':') => (host, port),
        _ => (authority, ""),
    }
}

/// `*` (any run) and `?` (any one character) globbing within one host label.
fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                backtrack = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match backtrack {
                Some((star, matched)) => {
                    pi = star + 1;
                    ti = matched + 1;
                    backtrack = Some((star, matched + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Go's `encoding/json` matches struct fields case-insensitively; prefer the exact key.
fn field_ci<'a>(object: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    object.get(name).or_else(|| {
        object
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn secret(pairs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    fn docker_config(json: &str) -> Result<Credentials, CredentialsError> {
        Credentials::from_secret(
            "regcred",
            Some(DOCKER_CONFIG_JSON_TYPE),
            secret(&[(".dockerconfigjson", json)]),
        )
    }

    fn lookup<'a>(credentials: &'a Credentials, reference: &str) -> Option<&'a AuthConfig> {
        credentials.for_reference(&Reference::parse(reference).unwrap())
    }

    #[test]
    fn username_password_secret_applies_everywhere() {
        let c = Credentials::from_secret("s", None, secret(&[("username", "u"), ("password", "p")])).unwrap();
        assert_eq!(lookup(&c, "ghcr.io/a/b"), Some(&AuthConfig::basic("u", "p")));
        assert_eq!(lookup(&c, "ubuntu"), Some(&AuthConfig::basic("u", "p")));
    }

    #[test]
    fn token_secret_is_a_registry_token() {
        let c = Credentials::from_secret("s", Some("Opaque"), secret(&[("token", "t")])).unwrap();
        assert_eq!(lookup(&c, "ghcr.io/a/b"), Some(&AuthConfig::registry_token("t")));
    }

    #[test]
    fn hostname_secret_applies_to_that_host_only() {
        let c = Credentials::from_secret(
            "s",
            None,
            secret(&[
                ("hostname", "registry.corp.com"),
                ("identity-token", "idt"),
                ("username", "u"),
            ]),
        )
        .unwrap();
        let auth = lookup(&c, "registry.corp.com/team/app").unwrap();
        assert_eq!(auth.identity_token_value(), Some("idt"));
        assert_eq!(lookup(&c, "ghcr.io/team/app"), None);
    }

    #[rstest]
    #[case::generic(&[("username", "u"), ("ca.crt", "x")], "ca.crt")]
    #[case::identity_token_needs_hostname(&[("identity-token", "x")], "identity-token")]
    #[case::dockerconfigjson_without_type(&[(".dockerconfigjson", "{}")], ".dockerconfigjson")]
    #[case::hostname_secret(&[("hostname", "h.io"), ("user", "u")], "user")]
    fn unknown_fields_are_rejected_like_vendir(#[case] pairs: &[(&str, &str)], #[case] field: &str) {
        let err = Credentials::from_secret("creds", None, secret(pairs)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("Unknown secret field '{field}' in secret 'creds'")
        );
    }

    #[test]
    fn dockerconfigjson_entries_by_host() {
        let c = docker_config(
            r#"{"auths":{
                "https://index.docker.io/v1/":{"username":"hub","password":"hp"},
                "registry.corp.com":{"auth":"dXNlcjpwYXNzd29yZA=="},
                "quay.io/coreos":{"username":"coreos","password":"c"},
                "quay.io":{"username":"quay","password":"q"},
                "*.gcr.io":{"username":"_json_key","password":"g"},
                "localhost:5000":{"username":"local","password":"l"},
                "id.example.com":{"identitytoken":"refresh"}
            }}"#,
        )
        .unwrap();
        assert_eq!(lookup(&c, "ubuntu"), Some(&AuthConfig::basic("hub", "hp")));
        assert_eq!(
            lookup(&c, "docker.io/bitnami/nginx"),
            Some(&AuthConfig::basic("hub", "hp"))
        );
        assert_eq!(
            lookup(&c, "registry.corp.com/x/y"),
            Some(&AuthConfig::basic("user", "password"))
        );
        assert_eq!(
            lookup(&c, "quay.io/coreos/etcd"),
            Some(&AuthConfig::basic("coreos", "c"))
        );
        assert_eq!(
            lookup(&c, "quay.io/other/app"),
            Some(&AuthConfig::basic("quay", "q"))
        );
        assert_eq!(
            lookup(&c, "eu.gcr.io/p/app"),
            Some(&AuthConfig::basic("_json_key", "g"))
        );
        assert_eq!(lookup(&c, "gcr.io/p/app"), None, "label counts differ");
        assert_eq!(
            lookup(&c, "localhost:5000/app"),
            Some(&AuthConfig::basic("local", "l"))
        );
        assert_eq!(lookup(&c, "localhost:5001/app"), None, "ports must be equal");
        assert_eq!(
            lookup(&c, "id.example.com/app").unwrap().identity_token_value(),
            Some("refresh")
        );
        assert_eq!(lookup(&c, "ghcr.io/app"), None);
    }

    #[rstest]
    #[case("docker.io")]
    #[case("index.docker.io")]
    #[case("registry-1.docker.io")]
    #[case("https://index.docker.io/v1/")]
    #[case("https://index.docker.io/v2/")]
    #[case("http://docker.io")]
    #[case("Docker.IO")]
    fn docker_hub_aliases(#[case] key: &str) {
        let c = docker_config(&format!(
            r#"{{"auths":{{"{key}":{{"username":"u","password":"p"}}}}}}"#
        ))
        .unwrap();
        assert_eq!(
            lookup(&c, "library/ubuntu:22.04"),
            Some(&AuthConfig::basic("u", "p"))
        );
        assert_eq!(lookup(&c, "ghcr.io/x/y"), None);
    }

    #[test]
    fn auth_field_is_used_only_without_password() {
        let c = docker_config(r#"{"auths":{"r.io":{"username":"user","password":"pass","auth":"invalid"}}}"#)
            .unwrap();
        assert_eq!(lookup(&c, "r.io/app"), Some(&AuthConfig::basic("user", "pass")));
        // vendir: the decoded auth overrides the username too; the password may contain ':'.
        let c =
            docker_config(r#"{"auths":{"r.io":{"username":"not","auth":"dXNlcjE6cGFzczpwYXNz"}}}"#).unwrap();
        assert_eq!(
            lookup(&c, "r.io/app"),
            Some(&AuthConfig::basic("user1", "pass:pass"))
        );
    }

    #[test]
    fn dockerconfigjson_errors() {
        assert_eq!(
            docker_config(r#"{"auths":{"r.io":{"auth":"invalid"}}}"#)
                .unwrap_err()
                .to_string(),
            "secret 'regcred': Decoding auth field: not valid base64"
        );
        assert_eq!(
            docker_config(r#"{"auths":{"r.io":{"auth":"Zm9v"}}}"#).unwrap_err(),
            CredentialsError::AuthFieldFormat {
                secret: "regcred".into()
            }
        );
        assert!(matches!(
            docker_config("not json"),
            Err(CredentialsError::InvalidDockerConfigJson { .. })
        ));
        assert!(matches!(
            docker_config(r#"{"auths":{"r.io":{"username":5}}}"#),
            Err(CredentialsError::InvalidDockerConfigJson { .. })
        ));
        let missing =
            Credentials::from_secret::<&str, &[u8]>("s", Some(DOCKER_CONFIG_JSON_TYPE), []).unwrap_err();
        assert_eq!(
            missing,
            CredentialsError::MissingDockerConfigJson { secret: "s".into() }
        );
    }

    /// Issue 15, item 6: base64's error ("Invalid symbol 35, offset 6.") went into logs,
    /// admission warnings and Events: a byte of the credentials and where it is.
    #[test]
    fn a_malformed_auth_field_is_reported_without_any_of_its_bytes() {
        for auth in ["dXNlcjpw#XNz", "dXNlcjpwYXNzZ", "dXNlcjpwYXNzZA=x"] {
            let message = docker_config(&format!(r#"{{"auths":{{"r.io":{{"auth":"{auth}"}}}}}}"#))
                .unwrap_err()
                .to_string();
            assert_eq!(message, "secret 'regcred': Decoding auth field: not valid base64");
        }
    }

    #[test]
    fn dockerconfigjson_tolerates_empty_shapes_and_case() {
        assert!(docker_config(r#"{"auths":{}}"#).unwrap().is_anonymous());
        assert!(docker_config(r#"{}"#).unwrap().is_anonymous());
        let c = docker_config(r#"{"Auths":{"r.io":{"Username":"u","PASSWORD":"p"},"empty.io":{}}}"#).unwrap();
        assert_eq!(lookup(&c, "r.io/app"), Some(&AuthConfig::basic("u", "p")));
        assert!(lookup(&c, "empty.io/app").unwrap().is_anonymous());
        // Other keys of a dockerconfigjson Secret are ignored, as in vendir.
        let c = Credentials::from_secret(
            "s",
            Some(DOCKER_CONFIG_JSON_TYPE),
            secret(&[(".dockerconfigjson", r#"{"auths":{}}"#), ("extra", "x")]),
        )
        .unwrap();
        assert!(c.is_anonymous());
    }

    #[test]
    fn debug_never_shows_secrets() {
        let c = docker_config(
            r#"{"auths":{"r.io":{"username":"alice","password":"hunter2","identitytoken":"idtok"}}}"#,
        )
        .unwrap()
        .with_host("t.io", AuthConfig::registry_token("tok-123"));
        let shown = format!("{c:?} {:?}", AuthConfig::basic("alice", "hunter2"));
        for secret in ["alice", "hunter2", "idtok", "tok-123"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("r.io") && shown.contains("basic"), "{shown}");
    }

    #[test]
    fn fingerprints_differ_per_secret() {
        assert_ne!(
            AuthConfig::basic("a", "b").fingerprint(),
            AuthConfig::basic("a", "c").fingerprint()
        );
        assert_ne!(
            AuthConfig::basic("ab", "").fingerprint(),
            AuthConfig::basic("a", "b").fingerprint()
        );
        assert_eq!(
            AuthConfig::basic("a", "b").fingerprint(),
            AuthConfig::basic("a", "b").fingerprint()
        );
    }

    #[rstest]
    #[case("*", "anything", true)]
    #[case("eu*", "europe", true)]
    #[case("e?", "eu", true)]
    #[case("e?", "eur", false)]
    #[case("*x*", "abc", false)]
    #[case("a*b*c", "aXXbYYc", true)]
    #[case("gcr", "gcr", true)]
    fn globs(#[case] pattern: &str, #[case] text: &str, #[case] expected: bool) {
        assert_eq!(glob_match(pattern, text), expected);
    }
}
