//! The registry auth protocol pieces: `WWW-Authenticate` challenges, token responses, and a
//! token cache so one token serves many resolutions until it expires.
//!
//! Flow (driven by the resolver): send the request (with a cached token if there is one); on
//! `401` read the challenge: `Bearer realm=…,service=…,scope=…` → get a token from the realm
//! (anonymously, with Basic credentials, or by exchanging an identity token) and retry;
//! `Basic` → retry with Basic credentials. Tokens are cached per (registry, repository,
//! credential) until shortly before `expires_in` (default 60 s per the distribution spec).

use std::{
    collections::HashMap,
    fmt,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use serde::Deserialize;
use tokio::time::Instant;

/// Distribution token spec: "if omitted, the token should be assumed valid for 60 seconds".
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(60);
/// Stop using a token this long before it expires (at most; 10 % of short lifetimes).
const MAX_EXPIRY_MARGIN: Duration = Duration::from_secs(30);
/// Above this many entries, expired ones are swept on insert.
const SWEEP_THRESHOLD: usize = 1024;

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
    Basic,
}

/// A token service's answer (docker token spec; OAuth2 servers use `access_token`).
#[derive(Deserialize)]
pub(crate) struct TokenResponse {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

impl TokenResponse {
    /// `token`, else `access_token`; empty strings count as absent.
    pub(crate) fn into_token(self) -> Option<(Token, Duration)> {
        let lifetime = self
            .expires_in
            .map_or(DEFAULT_TOKEN_LIFETIME, Duration::from_secs);
        self.token
            .filter(|t| !t.is_empty())
            .or(self.access_token.filter(|t| !t.is_empty()))
            .map(|t| (Token(t), lifetime))
    }
}

impl fmt::Debug for TokenResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenResponse")
            .field("expires_in", &self.expires_in)
            .finish_non_exhaustive()
    }
}

/// A bearer token; `Debug` redacts it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(String);

impl Token {
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Picks the challenge to answer from all `WWW-Authenticate` values: Bearer first, then Basic.
pub(crate) fn pick_challenge<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<Challenge> {
    let challenges: Vec<Challenge> = values.into_iter().flat_map(parse_challenges).collect();
    challenges
        .iter()
        .find(|c| matches!(c, Challenge::Bearer { .. }))
        .or_else(|| challenges.first())
        .cloned()
}

/// Parses one header value, which may hold several challenges (RFC 9110 §11.6.1).
fn parse_challenges(value: &str) -> Vec<Challenge> {
    let mut challenges = Vec::new();
    let mut current: Option<(String, HashMap<String, String>)> = None;
    let mut rest = value;
    // Separators are the token delimiters below, all of them: trimming fewer (only ' ' and '\t')
    // left other whitespace (a vertical tab) in front of an empty token forever (found by fuzzing).
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        if rest.is_empty() {
            break;
        }
        let token_len = rest
            .find(|c: char| c == '=' || c == ',' || c.is_whitespace())
            .unwrap_or(rest.len());
        let (token, after) = rest.split_at(token_len);
        let after_ws = after.trim_start_matches(char::is_whitespace);
        if let Some(value_part) = after_ws.strip_prefix('=').filter(|_| current.is_some()) {
            let value_part = value_part.trim_start_matches(char::is_whitespace);
            let (param, remaining) = parse_param_value(value_part);
            if let Some((_, params)) = current.as_mut() {
                params.insert(token.to_ascii_lowercase(), param);
            }
            rest = remaining;
        } else {
            // A new auth-scheme (or token68, which registries do not use).
            if let Some(done) = current.take() {
                challenges.extend(to_challenge(done));
            }
            current = Some((token.to_owned(), HashMap::new()));
            rest = after;
        }
    }
    if let Some(done) = current {
        challenges.extend(to_challenge(done));
    }
    challenges
}

/// A quoted-string (with `\` escapes) or a token; returns the value and what follows.
fn parse_param_value(s: &str) -> (String, &str) {
    if let Some(quoted) = s.strip_prefix('"') {
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(escaped);
                    }
                }
                '"' => return (value, &quoted[i + 1..]),
                c => value.push(c),
            }
        }
        (value, "")
    } else {
        let end = s.find(|c: char| c == ',' || c.is_whitespace()).unwrap_or(s.len());
        (s[..end].to_owned(), &s[end..])
    }
}

fn to_challenge((scheme, mut params): (String, HashMap<String, String>)) -> Option<Challenge> {
    if scheme.eq_ignore_ascii_case("bearer") {
        let realm = params.remove("realm")?;
        Some(Challenge::Bearer {
            realm,
            service: params.remove("service"),
            scope: params.remove("scope"),
        })
    } else if scheme.eq_ignore_ascii_case("basic") {
        Some(Challenge::Basic)
    } else {
        None
    }
}

/// What the cache remembers about talking to one repository with one credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CachedAuth {
    Bearer(Token),
    /// The registry asked for Basic auth: send it up front next time.
    Basic,
}

/// Cache key: tokens are scoped by repository (`scope=repository:<repo>:pull`) and must never
/// cross credentials.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct AuthKey {
    pub(crate) registry: String,
    pub(crate) repository: String,
    pub(crate) credential: Option<[u8; 32]>,
}

impl fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthKey")
            .field("registry", &self.registry)
            .field("repository", &self.repository)
            .field("with_credentials", &self.credential.is_some())
            .finish()
    }
}

struct Entry {
    auth: CachedAuth,
    valid_until: Option<Instant>,
}

/// In-memory token cache shared by all resolutions of one resolver.
#[derive(Default)]
pub(crate) struct AuthCache {
    entries: Mutex<HashMap<AuthKey, Entry>>,
}

impl AuthCache {
    pub(crate) fn get(&self, key: &AuthKey) -> Option<CachedAuth> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match entries.get(key) {
            Some(entry) if entry.valid_until.is_none_or(|t| t > now) => Some(entry.auth.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Caches a bearer token until shortly before it expires (not at all if that is now).
    pub(crate) fn insert_bearer(&self, key: AuthKey, token: Token, lifetime: Duration) {
        let margin = (lifetime / 10).min(MAX_EXPIRY_MARGIN);
        let usable = lifetime.saturating_sub(margin);
        if usable.is_zero() {
            return;
        }
        self.insert(
            key,
            Entry {
                auth: CachedAuth::Bearer(token),
                valid_until: Some(Instant::now() + usable),
            },
        );
    }

    pub(crate) fn insert_basic(&self, key: AuthKey) {
        self.insert(
            key,
            Entry {
                auth: CachedAuth::Basic,
                valid_until: None,
            },
        );
    }

    pub(crate) fn invalidate(&self, key: &AuthKey) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }

    fn insert(&self, key: AuthKey, entry: Entry) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= SWEEP_THRESHOLD {
            let now = Instant::now();
            entries.retain(|_, e| e.valid_until.is_none_or(|t| t > now));
            // Still full (Basic schemes never expire; a tenant can name many repositories):
            // forget them all. What is forgotten costs one challenge round trip when next used.
            if entries.len() >= SWEEP_THRESHOLD {
                tracing::debug!(held = entries.len(), "auth cache full; cleared");
                entries.clear();
            }
        }
        entries.insert(key, entry);
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    /// Found by the `www_authenticate` fuzz target: a vertical tab (or any whitespace but ' '
    /// and '\t') before a token looped forever, so a registry's header hung the resolver.
    #[test]
    fn whitespace_of_any_kind_between_challenges_ends_the_parse() {
        for header in [
            "Bearer realm=x\u{b}\u{b}",
            "\u{b}Basic",
            "Basic\u{a0}realm=\"x\"",
            "\r\n=,\u{c}",
        ] {
            let _ = parse_challenges(header);
        }
        assert_eq!(
            parse_challenges("Basic realm=\"x\"\u{b}Bearer realm=\"https://r.example/t\""),
            [Challenge::Basic, bearer("https://r.example/t", None, None)]
        );
    }

    fn bearer(realm: &str, service: Option<&str>, scope: Option<&str>) -> Challenge {
        Challenge::Bearer {
            realm: realm.into(),
            service: service.map(Into::into),
            scope: scope.map(Into::into),
        }
    }

    #[rstest]
    #[case(
        r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/ubuntu:pull""#,
        Some(bearer("https://auth.docker.io/token", Some("registry.docker.io"), Some("repository:library/ubuntu:pull")))
    )]
    #[case(
        r#"bearer realm="https://r.io/t", service="r.io""#,
        Some(bearer("https://r.io/t", Some("r.io"), None))
    )]
    #[case(
        r#"Bearer realm=https://r.io/t,service=r.io"#,
        Some(bearer("https://r.io/t", Some("r.io"), None))
    )]
    #[case(
        r#"Bearer realm="https://r.io/t",scope="repository:a/b:pull,push""#,
        Some(bearer("https://r.io/t", None, Some("repository:a/b:pull,push")))
    )]
    #[case(r#"Bearer realm="a\"b""#, Some(bearer("a\"b", None, None)))]
    #[case(r#"Basic realm="Registry Realm""#, Some(Challenge::Basic))]
    #[case("Basic", Some(Challenge::Basic))]
    #[case(
        r#"Basic realm="x", Bearer realm="https://r.io/t""#,
        Some(bearer("https://r.io/t", None, None))
    )]
    #[case(r#"Negotiate abc"#, None)]
    #[case(r#"Bearer service="no realm""#, None)]
    #[case("", None)]
    fn parses_challenges(#[case] header: &str, #[case] expected: Option<Challenge>) {
        assert_eq!(pick_challenge([header]), expected);
    }

    #[test]
    fn bearer_wins_across_header_values() {
        assert_eq!(
            pick_challenge([r#"Basic realm="x""#, r#"Bearer realm="https://r.io/t""#]),
            Some(bearer("https://r.io/t", None, None))
        );
    }

    #[rstest]
    #[case(r#"{"token":"t","expires_in":300}"#, Some(("t", 300)))]
    #[case(r#"{"access_token":"a"}"#, Some(("a", 60)))]
    #[case(r#"{"token":"","access_token":"a","issued_at":"2024-01-01T00:00:00Z"}"#, Some(("a", 60)))]
    #[case(r#"{"token":"t","access_token":"a"}"#, Some(("t", 60)))]
    #[case(r#"{"expires_in":10}"#, None)]
    fn token_responses(#[case] body: &str, #[case] expected: Option<(&str, u64)>) {
        let parsed: TokenResponse = serde_json::from_str(body).unwrap();
        let got = parsed
            .into_token()
            .map(|(t, d)| (t.expose().to_owned(), d.as_secs()));
        assert_eq!(got, expected.map(|(t, s)| (t.to_owned(), s)));
    }

    #[test]
    fn debug_redacts_tokens() {
        let parsed: TokenResponse = serde_json::from_str(r#"{"token":"sekrit","expires_in":5}"#).unwrap();
        assert!(!format!("{parsed:?}").contains("sekrit"));
        let (token, _) = parsed.into_token().unwrap();
        assert!(!format!("{token:?} {:?}", CachedAuth::Bearer(token.clone())).contains("sekrit"));
        let key = AuthKey {
            registry: "r".into(),
            repository: "a".into(),
            credential: Some([7; 32]),
        };
        assert!(format!("{key:?}").contains("with_credentials: true"));
    }

    fn key(repository: &str) -> AuthKey {
        AuthKey {
            registry: "r.io".into(),
            repository: repository.into(),
            credential: None,
        }
    }

    /// SECURITY.md, "Resource bounds": a tenant naming many repositories (Basic schemes never
    /// expire) cannot grow the cache past its bound; expired tokens are swept before anything
    /// live is forgotten.
    #[tokio::test(start_paused = true)]
    async fn the_auth_cache_never_holds_more_than_its_bound() {
        let cache = AuthCache::default();
        let held = |cache: &AuthCache| cache.entries.lock().unwrap_or_else(PoisonError::into_inner).len();
        for i in 0..5 * SWEEP_THRESHOLD {
            cache.insert_basic(key(&format!("repo-{i}")));
            assert!(held(&cache) <= SWEEP_THRESHOLD, "{} entries held", held(&cache));
        }
        // Full of expired tokens and one live Basic entry: the sweep drops the expired ones only.
        let cache = AuthCache::default();
        cache.insert_basic(key("live"));
        for i in 1..SWEEP_THRESHOLD {
            cache.insert_bearer(
                key(&format!("short-{i}")),
                Token("t".into()),
                Duration::from_secs(10),
            );
        }
        assert_eq!(held(&cache), SWEEP_THRESHOLD);
        tokio::time::advance(Duration::from_secs(60)).await;
        cache.insert_basic(key("new"));
        assert_eq!(held(&cache), 2);
        assert_eq!(cache.get(&key("live")), Some(CachedAuth::Basic));
    }

    #[tokio::test(start_paused = true)]
    async fn cache_expires_before_the_token_does() {
        let cache = AuthCache::default();
        cache.insert_bearer(key("a"), Token("t".into()), Duration::from_secs(100));
        assert_eq!(cache.get(&key("a")), Some(CachedAuth::Bearer(Token("t".into()))));
        assert_eq!(cache.get(&key("b")), None, "scoped per repository");
        tokio::time::advance(Duration::from_secs(89)).await;
        assert!(cache.get(&key("a")).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(cache.get(&key("a")), None, "dropped 10 % before expiry");

        cache.insert_bearer(key("long"), Token("t".into()), Duration::from_secs(3600));
        tokio::time::advance(Duration::from_secs(3569)).await;
        assert!(cache.get(&key("long")).is_some());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(cache.get(&key("long")).is_none(), "margin capped at 30 s");

        cache.insert_bearer(key("zero"), Token("t".into()), Duration::ZERO);
        assert_eq!(cache.get(&key("zero")), None);

        cache.insert_basic(key("basic"));
        tokio::time::advance(Duration::from_secs(86_400)).await;
        assert_eq!(cache.get(&key("basic")), Some(CachedAuth::Basic));
        cache.invalidate(&key("basic"));
        assert_eq!(cache.get(&key("basic")), None);
    }
}
