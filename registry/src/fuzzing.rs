//! Entry points for the fuzz targets (`fuzz/`, feature `fuzzing`) into parsers that are not
//! public API: each runs a parser the way holdfast runs it on what a registry sends.

/// `WWW-Authenticate` values, as [`crate::auth`] picks the challenge to answer.
pub fn www_authenticate<'a>(values: impl IntoIterator<Item = &'a str>) -> bool {
    crate::auth::pick_challenge(values).is_some()
}

/// A manifest or index body, as the mirror copier decodes it: its children, its config and
/// layers; and a registry's JSON error body, as errors quote it.
pub fn manifest(body: &[u8]) -> bool {
    let _ = crate::resolve::registry_error(&bytes::Bytes::copy_from_slice(body));
    serde_json::from_slice::<crate::mirror::ManifestDoc>(body).is_ok()
}

/// How many version tags [`tag_list_json`] lets a page keep.
const MAX_KEPT: usize = 16;

/// `data` as one tag list page, as the resolver reads it: only tags that parse as versions are
/// kept, at most [`MAX_KEPT`] in all. Panics if a kept tag is not a version, if more were kept
/// than allowed, or if a page that failed left more than the bound behind.
pub fn tag_list_json(data: &[u8]) {
    let mut kept = Vec::new();
    let _ = crate::tag_list::read_version_tags(data, &mut kept, MAX_KEPT);
    assert!(kept.len() <= MAX_KEPT, "{} tags kept", kept.len());
    for tag in &kept {
        assert!(
            crate::semver_select::version::Version::parse_relaxed(tag).is_ok(),
            "kept {tag:?}"
        );
    }
}

/// `data` as a pagination `Link` header followed from a tag list URL. The resolver follows only
/// a next page of the same origin (`resolve::same_origin`; anything else fails the listing):
/// panics if one it would follow is not an https URL of the registry's host. (The first oracle
/// asked that every next page be a base URL; `<htxst:>` is none, and is refused as another
/// origin: that input is in the corpus, `other-scheme`.)
pub fn link_header(data: &[u8]) {
    let Ok(value) = http::HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::LINK, value);
    let current = url::Url::parse("https://registry.example/v2/team/app/tags/list?n=100").expect("a URL");
    if let Some(next) = crate::resolve::next_link(&headers, &current) {
        if crate::resolve::same_origin(&next, &current) {
            assert!(
                !next.cannot_be_a_base()
                    && next.scheme() == "https"
                    && next.host_str() == Some("registry.example"),
                "next page {next}"
            );
        }
    }
}

/// `data` as a `Retry-After` value. Panics if delay-seconds (digits only) are not read as
/// exactly that many seconds.
pub fn retry_after(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = crate::retry_after::parse_retry_after(text, std::time::SystemTime::UNIX_EPOCH);
    let trimmed = text.trim();
    if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        assert_eq!(
            parsed,
            trimmed.parse::<u64>().ok().map(std::time::Duration::from_secs),
            "{trimmed:?}"
        );
    }
}

/// `data` as a token service's JSON answer. Panics if an accepted token is empty.
pub fn token_json(data: &[u8]) {
    if let Ok(response) = serde_json::from_slice::<crate::auth::TokenResponse>(data) {
        if let Some((token, _lifetime)) = response.into_token() {
            assert!(!token.expose().is_empty(), "empty token accepted");
        }
    }
}
