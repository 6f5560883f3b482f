//! imgpkg bundles: the config label that marks one, the `.imgpkg/images.yml` ImagesLock inside
//! its layer, and a scanner that finds that file in a layer (tar, or gzip-compressed tar) as the
//! layer streams past, without holding the layer.

use std::io::Write;

use flate2::write::GzDecoder;
use serde::Deserialize;

use crate::reference::Reference;

/// The config label imgpkg sets on bundles.
pub const BUNDLE_LABEL: &str = "dev.carvel.imgpkg.bundle";
/// Where imgpkg keeps the ImagesLock in a bundle.
pub const IMAGES_LOCK_PATH: &str = ".imgpkg/images.yml";
const LOCK_API_VERSION: &str = "imgpkg.carvel.dev/v1alpha1";
const LOCK_KIND: &str = "ImagesLock";
const BLOCK: usize = 512;
/// Largest PAX header or GNU long name read.
const MAX_META: u64 = 64 * 1024;

/// Why a bundle's ImagesLock cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    #[error("{IMAGES_LOCK_PATH} is not valid YAML: {0}")]
    Yaml(String),
    #[error(
        "{IMAGES_LOCK_PATH} has apiVersion {api_version:?} and kind {kind:?}, expected {LOCK_API_VERSION} {LOCK_KIND}"
    )]
    Kind { api_version: String, kind: String },
    #[error("{IMAGES_LOCK_PATH} lists {image:?}, which is not an image reference: {reason}")]
    Image { image: String, reason: String },
    #[error("{IMAGES_LOCK_PATH} lists {0:?}, which is not pinned to a digest")]
    NotPinned(String),
    #[error("{IMAGES_LOCK_PATH} is larger than {0} bytes")]
    TooLarge(u64),
    #[error("reading the bundle layer: {0}")]
    Layer(String),
}

/// Whether an image config (JSON) carries the imgpkg bundle label.
pub fn is_bundle_config(config: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Config {
        #[serde(default)]
        config: Option<Inner>,
    }
    #[derive(Deserialize)]
    struct Inner {
        #[serde(default, rename = "Labels")]
        labels: Option<std::collections::BTreeMap<String, String>>,
    }
    serde_json::from_slice::<Config>(config)
        .ok()
        .and_then(|c| c.config)
        .and_then(|c| c.labels)
        .is_some_and(|labels| labels.contains_key(BUNDLE_LABEL))
}

/// The images an ImagesLock lists (`images[].image`), each a digest reference.
pub fn parse_images_lock(yaml: &[u8]) -> Result<Vec<Reference>, LockError> {
    #[derive(Deserialize)]
    struct Lock {
        #[serde(rename = "apiVersion", default)]
        api_version: String,
        #[serde(default)]
        kind: String,
        #[serde(default)]
        images: Option<Vec<Locked>>,
    }
    #[derive(Deserialize)]
    struct Locked {
        image: String,
    }
    let lock: Lock = serde_yaml::from_slice(yaml).map_err(|e| LockError::Yaml(e.to_string()))?;
    if lock.api_version != LOCK_API_VERSION || lock.kind != LOCK_KIND {
        return Err(LockError::Kind {
            api_version: lock.api_version,
            kind: lock.kind,
        });
    }
    lock.images
        .unwrap_or_default()
        .into_iter()
        .map(|locked| {
            let reference = Reference::parse(&locked.image).map_err(|e| LockError::Image {
                image: locked.image.clone(),
                reason: e.to_string(),
            })?;
            if reference.is_pinned() {
                Ok(reference)
            } else {
                Err(LockError::NotPinned(locked.image))
            }
        })
        .collect()
}

/// Finds `.imgpkg/images.yml` in a layer fed to it chunk by chunk; gzip is detected from the
/// first bytes. Holds at most one tar header, the file itself (bounded) and the inflater state.
pub struct LockScanner {
    stage: Stage,
}

enum Stage {
    /// Fewer than two bytes seen: not yet known whether it is gzip.
    Sniff(Vec<u8>, TarScan),
    Plain(TarScan),
    Gzip(Box<GzDecoder<TarScan>>),
    Failed(String),
}

impl LockScanner {
    /// `limit`: the largest ImagesLock accepted.
    pub fn new(limit: u64) -> Self {
        Self {
            stage: Stage::Sniff(Vec::new(), TarScan::new(limit)),
        }
    }

    /// Feeds the next chunk of the layer.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.found() {
            return;
        }
        let stage = std::mem::replace(&mut self.stage, Stage::Failed(String::new()));
        self.stage = match stage {
            Stage::Sniff(mut head, scan) => {
                head.extend_from_slice(chunk);
                if head.len() < 2 {
                    Stage::Sniff(head, scan)
                } else if head[..2] == [0x1f, 0x8b] {
                    write_all(Stage::Gzip(Box::new(GzDecoder::new(scan))), &head)
                } else {
                    write_all(Stage::Plain(scan), &head)
                }
            }
            other => write_all(other, chunk),
        };
    }

    /// Whether the ImagesLock was found (the rest of the layer need not be fed).
    pub fn found(&self) -> bool {
        match &self.stage {
            Stage::Plain(scan) => scan.found.is_some(),
            Stage::Gzip(decoder) => decoder.get_ref().found.is_some(),
            Stage::Sniff(..) | Stage::Failed(_) => false,
        }
    }

    /// The ImagesLock's bytes, `Ok(None)` if the layer has none.
    pub fn finish(self) -> Result<Option<Vec<u8>>, LockError> {
        match self.stage {
            Stage::Sniff(head, mut scan) => {
                scan.push(&head);
                scan.take_result()
            }
            Stage::Plain(mut scan) => scan.take_result(),
            Stage::Gzip(mut decoder) => {
                if decoder.get_ref().found.is_none() {
                    decoder
                        .try_finish()
                        .map_err(|e| LockError::Layer(format!("gzip: {e}")))?;
                }
                decoder.get_mut().take_result()
            }
            Stage::Failed(reason) => Err(LockError::Layer(reason)),
        }
    }
}

fn write_all(stage: Stage, bytes: &[u8]) -> Stage {
    match stage {
        Stage::Plain(mut scan) => {
            scan.push(bytes);
            Stage::Plain(scan)
        }
        Stage::Gzip(mut decoder) => match decoder.write_all(bytes) {
            Ok(()) => Stage::Gzip(decoder),
            Err(e) => Stage::Failed(format!("gzip: {e}")),
        },
        other => other,
    }
}

/// A push parser of tar (ustar, GNU long names, PAX `path`) that captures one file.
struct TarScan {
    limit: u64,
    header: Vec<u8>,
    state: TarState,
    /// Path set by a preceding GNU `L` or PAX `x` entry.
    next_path: Option<String>,
    found: Option<Vec<u8>>,
    error: Option<LockError>,
}

enum TarState {
    Header,
    /// `remaining` data bytes (then `padding`), captured for `Capture::…`.
    Data {
        remaining: u64,
        padding: u64,
        capture: Capture,
        bytes: Vec<u8>,
    },
    Padding(u64),
    End,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Capture {
    Skip,
    Lock,
    LongName,
    Pax,
}

impl TarScan {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            header: Vec::with_capacity(BLOCK),
            state: TarState::Header,
            next_path: None,
            found: None,
            error: None,
        }
    }

    /// What was found; an archive cut off inside an entry is an error (not "no lock").
    fn take_result(&mut self) -> Result<Option<Vec<u8>>, LockError> {
        if let Some(found) = self.found.take() {
            return Ok(Some(found));
        }
        if let Some(error) = self.error.take() {
            return Err(error);
        }
        match &self.state {
            TarState::End => Ok(None),
            TarState::Header if self.header.is_empty() => Ok(None),
            _ => Err(LockError::Layer("the layer ends inside a tar entry".into())),
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.found.is_none() && self.error.is_none() {
            match &mut self.state {
                TarState::End => return,
                TarState::Header => {
                    let take = (BLOCK - self.header.len()).min(bytes.len());
                    self.header.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if self.header.len() == BLOCK {
                        let header = std::mem::take(&mut self.header);
                        self.on_header(&header);
                    }
                }
                TarState::Data {
                    remaining,
                    padding,
                    capture,
                    bytes: captured,
                } => {
                    let take = (*remaining).min(bytes.len() as u64) as usize;
                    if *capture != Capture::Skip {
                        captured.extend_from_slice(&bytes[..take]);
                    }
                    bytes = &bytes[take..];
                    *remaining -= take as u64;
                    if *remaining == 0 {
                        let (capture, captured, padding) = (*capture, std::mem::take(captured), *padding);
                        self.state = TarState::Padding(padding);
                        self.on_data(capture, captured);
                    }
                }
                TarState::Padding(left) => {
                    let take = (*left).min(bytes.len() as u64);
                    bytes = &bytes[take as usize..];
                    *left -= take;
                    if *left == 0 {
                        self.state = TarState::Header;
                    }
                }
            }
        }
    }

    fn on_header(&mut self, header: &[u8]) {
        if header.iter().all(|b| *b == 0) {
            self.state = TarState::End;
            return;
        }
        let size = match parse_size(&header[124..136]) {
            Some(size) => size,
            None => {
                self.error = Some(LockError::Layer("a tar header has an invalid size".into()));
                return;
            }
        };
        let kind = header[156];
        let path = self.next_path.take().unwrap_or_else(|| header_path(header));
        let capture = match kind {
            b'L' => Capture::LongName,
            b'x' => Capture::Pax,
            b'0' | 0 | b'7' if normalize(&path) == IMAGES_LOCK_PATH => Capture::Lock,
            _ => Capture::Skip,
        };
        let limit = if capture == Capture::Lock {
            self.limit
        } else {
            MAX_META
        };
        if capture != Capture::Skip && size > limit {
            if capture == Capture::Lock {
                self.error = Some(LockError::TooLarge(self.limit));
                return;
            }
            self.error = Some(LockError::Layer(
                "a tar long name or PAX header is too large".into(),
            ));
            return;
        }
        let padding = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
        if size == 0 {
            self.state = TarState::Header;
            self.on_data(capture, Vec::new());
        } else {
            self.state = TarState::Data {
                remaining: size,
                padding,
                capture,
                bytes: Vec::new(),
            };
        }
    }

    fn on_data(&mut self, capture: Capture, bytes: Vec<u8>) {
        match capture {
            Capture::Skip => {}
            Capture::Lock => self.found = Some(bytes),
            Capture::LongName => {
                let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
                self.next_path = Some(String::from_utf8_lossy(&bytes[..end]).into_owned());
            }
            Capture::Pax => self.next_path = pax_path(&bytes),
        }
    }
}

fn normalize(path: &str) -> &str {
    let mut path = path;
    loop {
        if let Some(rest) = path.strip_prefix("./") {
            path = rest;
        } else if let Some(rest) = path.strip_prefix('/') {
            path = rest;
        } else {
            return path;
        }
    }
}

fn cstr(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// `prefix/name` for ustar headers, `name` otherwise.
fn header_path(header: &[u8]) -> String {
    let name = cstr(&header[0..100]);
    if &header[257..262] == b"ustar" {
        let prefix = cstr(&header[345..500]);
        if !prefix.is_empty() {
            return format!("{prefix}/{name}");
        }
    }
    name
}

/// Octal (NUL/space padded), or base-256 when the high bit of the first byte is set.
fn parse_size(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut value: u64 = u64::from(field[0] & 0x7f);
        for b in &field[1..] {
            value = value.checked_mul(256)?.checked_add(u64::from(*b))?;
        }
        return Some(value);
    }
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

/// The `path` record of a PAX extended header (`<len> path=<value>\n` records).
fn pax_path(records: &[u8]) -> Option<String> {
    let mut rest = records;
    let mut path = None;
    while !rest.is_empty() {
        let space = rest.iter().position(|b| *b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
        if len <= space || len > rest.len() {
            return path;
        }
        let record = &rest[space + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(value) = record.strip_prefix(b"path=") {
            path = Some(String::from_utf8_lossy(value).into_owned());
        }
        rest = &rest[len..];
    }
    path
}

impl Write for TarScan {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use flate2::{Compression, write::GzEncoder};
    use rstest::rstest;

    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn lock_yaml() -> String {
        format!(
            "---\napiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\nimages:\n\
             - image: 127.0.0.1:5000/images/one@{D1}\n  annotations:\n    kbld.carvel.dev/id: 127.0.0.1:5000/images/one:1\n\
             - image: ghcr.io/org/two@{D2}\n"
        )
    }

    #[test]
    fn parses_an_images_lock() {
        let images = parse_images_lock(lock_yaml().as_bytes()).unwrap();
        let names: Vec<String> = images.iter().map(Reference::normalized).collect();
        assert_eq!(
            names,
            [
                format!("127.0.0.1:5000/images/one@{D1}"),
                format!("ghcr.io/org/two@{D2}")
            ]
        );
        let empty = "apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\n";
        assert_eq!(parse_images_lock(empty.as_bytes()).unwrap(), vec![]);
    }

    #[rstest]
    #[case("apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: BundleLock\n", "kind")]
    #[case("images: [", "yaml")]
    #[case(
        "apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\nimages:\n- image: ghcr.io/a/b:1\n",
        "not pinned"
    )]
    #[case(
        "apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\nimages:\n- image: 'ghcr.io/A B'\n",
        "reference"
    )]
    fn rejects_bad_locks(#[case] yaml: &str, #[case] what: &str) {
        let error = parse_images_lock(yaml.as_bytes()).unwrap_err();
        let matches = match what {
            "kind" => matches!(error, LockError::Kind { .. }),
            "yaml" => matches!(error, LockError::Yaml(_)),
            "not pinned" => matches!(error, LockError::NotPinned(_)),
            _ => matches!(error, LockError::Image { .. }),
        };
        assert!(matches, "{error:?}");
    }

    #[test]
    fn recognises_bundle_configs() {
        assert!(is_bundle_config(
            br#"{"config":{"Labels":{"dev.carvel.imgpkg.bundle":"true"}},"rootfs":{}}"#
        ));
        assert!(!is_bundle_config(br#"{"config":{"Labels":{"other":"x"}}}"#));
        assert!(!is_bundle_config(br#"{"config":{}}"#));
        assert!(!is_bundle_config(b"not json"));
    }

    fn tar(entries: &[(&str, &[u8])], long_names: bool) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, data) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            if long_names {
                // The tar crate writes a GNU long-name entry for paths over 100 bytes.
                builder.append_data(&mut header, path, *data).unwrap();
            } else {
                header.set_path(path).unwrap();
                header.set_cksum();
                builder.append(&header, *data).unwrap();
            }
        }
        builder.into_inner().unwrap()
    }

    fn pax_tar(path: &str, data: &[u8]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        builder
            .append_pax_extensions([("path", path.as_bytes())])
            .unwrap();
        let mut header = tar::Header::new_ustar();
        header.set_path("placeholder").unwrap();
        header.set_size(data.len() as u64);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        builder.append(&header, data).unwrap();
        builder.into_inner().unwrap()
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn scan(layer: &[u8], chunk: usize) -> Result<Option<Vec<u8>>, LockError> {
        let mut scanner = LockScanner::new(1024 * 1024);
        for piece in layer.chunks(chunk) {
            scanner.feed(piece);
        }
        scanner.finish()
    }

    #[test]
    fn finds_the_lock_in_plain_and_gzip_layers_in_any_chunking() {
        let lock = lock_yaml();
        let noise: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let layers = [
            tar(
                &[
                    ("config/app.yml", b"a: 1\n"),
                    (".imgpkg/images.yml", lock.as_bytes()),
                ],
                false,
            ),
            tar(
                &[("./big.bin", &noise), ("./.imgpkg/images.yml", lock.as_bytes())],
                false,
            ),
            tar(
                &[
                    (&format!("{}/x", "d".repeat(120)), b"x"),
                    (".imgpkg/images.yml", lock.as_bytes()),
                ],
                true,
            ),
            pax_tar(".imgpkg/images.yml", lock.as_bytes()),
        ];
        for layer in &layers {
            for compressed in [false, true] {
                let bytes = if compressed { gzip(layer) } else { layer.clone() };
                for chunk in [1, 511, 512, 4096, bytes.len()] {
                    let found = scan(&bytes, chunk).unwrap();
                    assert_eq!(
                        found.as_deref(),
                        Some(lock.as_bytes()),
                        "chunk {chunk}, gzip {compressed}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_layer_without_the_lock_or_with_a_similar_path_has_none() {
        let layer = tar(
            &[("a/.imgpkg/images.yml", b"x"), (".imgpkg/images.yaml", b"y")],
            false,
        );
        assert_eq!(scan(&layer, 100).unwrap(), None);
        assert_eq!(scan(&gzip(&layer), 100).unwrap(), None);
        assert_eq!(scan(b"", 1).unwrap(), None);
    }

    #[test]
    fn limits_and_corruption_are_errors() {
        let big = vec![b'a'; 2 * 1024 * 1024];
        let layer = tar(&[(".imgpkg/images.yml", &big)], false);
        assert_eq!(scan(&layer, 4096), Err(LockError::TooLarge(1024 * 1024)));
        let mut truncated_gzip = gzip(&tar(&[("x", &big)], false));
        truncated_gzip.truncate(100);
        assert!(matches!(scan(&truncated_gzip, 10), Err(LockError::Layer(_))));
    }
}
