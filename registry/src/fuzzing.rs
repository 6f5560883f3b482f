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

/// What a registry sends beside manifests, as the resolver reads it: `data` as a tag list
/// page (the version tags kept, at most 16 of them), as a `Link` header followed from a tag
/// list URL, as a `Retry-After` value, and as a token service's JSON answer. Panics if a kept
/// tag is not a version or more were kept than allowed.
pub fn registry_responses(data: &[u8]) {
    const MAX_KEPT: usize = 16;
    let mut kept = Vec::new();
    let _ = crate::tag_list::read_version_tags(data, &mut kept, MAX_KEPT);
    assert!(kept.len() <= MAX_KEPT, "{} tags kept", kept.len());
    for tag in &kept {
        assert!(
            crate::semver_select::version::Version::parse_relaxed(tag).is_ok(),
            "kept {tag:?}"
        );
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(value) = http::HeaderValue::from_str(text) {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::LINK, value);
            if let Ok(current) = url::Url::parse("https://registry.example/v2/team/app/tags/list?n=100") {
                let _ = crate::resolve::next_link(&headers, &current);
            }
        }
        let _ = crate::retry_after::parse_retry_after(text, std::time::SystemTime::UNIX_EPOCH);
    }
    if let Ok(response) = serde_json::from_slice::<crate::auth::TokenResponse>(data) {
        let _ = response.into_token();
    }
}
