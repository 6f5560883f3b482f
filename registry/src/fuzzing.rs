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
