//! Small OCI images and imgpkg-style bundles, built in memory and pushed to a registry with the
//! OCI distribution API: enough to give tags real digests, and to move a tag to new content.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use reqwest::{StatusCode, header};
use serde_json::json;
use sha2::{Digest as _, Sha256};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// The config label imgpkg sets on bundles.
pub const IMGPKG_BUNDLE_LABEL: &str = "dev.carvel.imgpkg.bundle";

#[derive(Debug, Clone)]
pub struct Blob {
    pub media_type: &'static str,
    pub digest: String,
    pub bytes: Vec<u8>,
}

impl Blob {
    fn new(media_type: &'static str, bytes: Vec<u8>) -> Self {
        Self {
            media_type,
            digest: sha256_digest(&bytes),
            bytes,
        }
    }

    fn descriptor(&self) -> serde_json::Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.bytes.len()})
    }
}

/// A single-platform image: one uncompressed tar layer with the given files.
#[derive(Debug, Clone)]
pub struct Image {
    pub config: Blob,
    pub layer: Blob,
    pub manifest: Blob,
}

impl Image {
    /// Same files, same digest: the tar is written with fixed metadata.
    pub fn with_files(files: &[(&str, &[u8])]) -> Result<Self> {
        Self::build(files, BTreeMap::new())
    }

    /// An imgpkg bundle: the bundle label, the given files, and `.imgpkg/images.yml` locking
    /// `images` (digest references).
    pub fn bundle(files: &[(&str, &[u8])], images: &[String]) -> Result<Self> {
        let lock = images_lock_yaml(images);
        let mut all: Vec<(&str, &[u8])> = files.to_vec();
        all.push((".imgpkg/images.yml", lock.as_bytes()));
        Self::build(
            &all,
            [(IMGPKG_BUNDLE_LABEL.to_string(), "true".to_string())].into(),
        )
    }

    fn build(files: &[(&str, &[u8])], labels: BTreeMap<String, String>) -> Result<Self> {
        let layer = Blob::new(OCI_LAYER_TAR, tar_of(files)?);
        let config = json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": labels},
            "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
        });
        let config = Blob::new(OCI_CONFIG, serde_json::to_vec(&config)?);
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config.descriptor(),
            "layers": [layer.descriptor()],
        });
        let manifest = Blob::new(OCI_MANIFEST, serde_json::to_vec(&manifest)?);
        Ok(Self {
            config,
            layer,
            manifest,
        })
    }

    pub fn digest(&self) -> &str {
        &self.manifest.digest
    }
}

/// A single-platform image of several uncompressed layers (a layer's diff ID is its digest) with
/// a full config — labels, environment, exposed ports — as the Cloud Native Buildpacks images
/// kpack reads are (lifecycle, stack build and run images, buildpackages) and the app images a
/// build exports. Same content, same digest.
#[derive(Debug, Clone, Default)]
pub struct LayeredImage {
    layers: Vec<Blob>,
    labels: BTreeMap<String, String>,
    env: Vec<String>,
    exposed_ports: Vec<String>,
}

impl LayeredImage {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a layer with these files.
    pub fn layer(mut self, files: &[(&str, &[u8])]) -> Result<Self> {
        self.layers.push(Blob::new(OCI_LAYER_TAR, tar_of(files)?));
        Ok(self)
    }

    /// The diff ID of the last layer appended (labels of CNB images name their layers by it).
    pub fn last_diff_id(&self) -> Option<&str> {
        self.layers.last().map(|l| l.digest.as_str())
    }

    pub fn label(mut self, key: &str, value: impl Into<String>) -> Self {
        self.labels.insert(key.to_string(), value.into());
        self
    }

    /// A label whose value is JSON, as CNB metadata labels are.
    pub fn json_label(self, key: &str, value: &serde_json::Value) -> Result<Self> {
        Ok(self.label(key, serde_json::to_string(value)?))
    }

    /// An environment variable of the image config (`NAME=value`).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push(format!("{name}={value}"));
        self
    }

    /// A port of the image config (`8080/tcp`).
    pub fn exposed_port(mut self, port: &str) -> Self {
        self.exposed_ports.push(port.to_string());
        self
    }

    fn config(&self) -> Result<Blob> {
        let ports: serde_json::Map<String, serde_json::Value> = self
            .exposed_ports
            .iter()
            .map(|p| (p.clone(), json!({})))
            .collect();
        let diff_ids: Vec<&str> = self.layers.iter().map(|l| l.digest.as_str()).collect();
        let config = json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": self.labels, "Env": self.env, "ExposedPorts": ports},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        Ok(Blob::new(OCI_CONFIG, serde_json::to_vec(&config)?))
    }

    /// Pushes the layers, config and manifest under `tag`; returns the manifest digest.
    pub async fn push(&self, registry: &str, repository: &str, tag: &str) -> Result<String> {
        let http = Http::new(registry, None);
        let config = self.config()?;
        for blob in self.layers.iter().chain([&config]) {
            push_blob(&http, repository, blob).await?;
        }
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config.descriptor(),
            "layers": self.layers.iter().map(Blob::descriptor).collect::<Vec<_>>(),
        });
        let manifest = Blob::new(OCI_MANIFEST, serde_json::to_vec(&manifest)?);
        put_manifest(&http, repository, tag, &manifest).await
    }
}

/// The config of the image `reference` names (`repo@sha256:…` or `repo:tag`) in `registry`,
/// through its manifest (the first entry of an index).
pub async fn fetch_config(registry: &str, repository: &str, reference: &str) -> Result<serde_json::Value> {
    let (_, bytes) = fetch_raw(registry, repository, "manifests", reference).await?;
    let mut manifest: serde_json::Value = serde_json::from_slice(&bytes)?;
    if let Some(first) = manifest["manifests"].get(0) {
        let digest = first["digest"]
            .as_str()
            .context("index entry without digest")?
            .to_owned();
        let (_, bytes) = fetch_raw(registry, repository, "manifests", &digest).await?;
        manifest = serde_json::from_slice(&bytes)?;
    }
    let config = manifest["config"]["digest"]
        .as_str()
        .with_context(|| format!("{repository}@{reference}: manifest without config"))?;
    let (_, bytes) = fetch_raw(registry, repository, "blobs", config).await?;
    Ok(serde_json::from_slice(&bytes)?)
}

/// The `.imgpkg/images.yml` imgpkg writes into a bundle.
pub fn images_lock_yaml(images: &[String]) -> String {
    let mut out = String::from("apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\nimages:\n");
    for image in images {
        out.push_str(&format!(
            "- image: {image}\n  annotations:\n    kbld.carvel.dev/id: {image}\n"
        ));
    }
    out
}

/// Pushes an image's blobs and manifest under `tag`; returns the manifest digest the registry reports.
pub async fn push(registry: &str, repository: &str, tag: &str, image: &Image) -> Result<String> {
    push_as(registry, None, repository, tag, image).await
}

/// [`push`] to a registry that requires basic auth with `(user, password)`.
pub async fn push_as(
    registry: &str,
    user: Option<(&str, &str)>,
    repository: &str,
    tag: &str,
    image: &Image,
) -> Result<String> {
    let http = Http::new(registry, user);
    for blob in [&image.config, &image.layer] {
        push_blob(&http, repository, blob).await?;
    }
    put_manifest(&http, repository, tag, &image.manifest).await
}

/// A client for one registry, with the basic-auth user it must send, if any.
struct Http<'a> {
    client: reqwest::Client,
    base: String,
    user: Option<(&'a str, &'a str)>,
}

impl<'a> Http<'a> {
    fn new(registry: &str, user: Option<(&'a str, &'a str)>) -> Self {
        Self {
            client: reqwest::Client::new(),
            base: format!("http://{registry}"),
            user,
        }
    }

    fn request(&self, method: reqwest::Method, url: String) -> reqwest::RequestBuilder {
        let request = self.client.request(method, url);
        match self.user {
            Some((user, password)) => request.basic_auth(user, Some(password)),
            None => request,
        }
    }
}

/// Pushes several platform images and an OCI index over them under `tag`; returns the index digest.
pub async fn push_index(
    registry: &str,
    repository: &str,
    tag: &str,
    platforms: &[(&str, &Image)],
) -> Result<String> {
    let http = Http::new(registry, None);
    let mut manifests = Vec::new();
    for (arch, image) in platforms {
        for blob in [&image.config, &image.layer] {
            push_blob(&http, repository, blob).await?;
        }
        put_manifest(&http, repository, &image.manifest.digest, &image.manifest).await?;
        let mut descriptor = image.manifest.descriptor();
        descriptor["platform"] = json!({"architecture": arch, "os": "linux"});
        manifests.push(descriptor);
    }
    let index = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests});
    let index = Blob::new(OCI_INDEX, serde_json::to_vec(&index)?);
    put_manifest(&http, repository, tag, &index).await
}

/// Moves `tag` to new content (pushes `image` over it); returns the new digest.
pub async fn retag(registry: &str, repository: &str, tag: &str, image: &Image) -> Result<String> {
    push(registry, repository, tag, image).await
}

/// What the registry answers to `HEAD /v2/<repo>/manifests/<reference>`, as a client pinning would see it.
pub async fn head_digest(registry: &str, repository: &str, reference: &str) -> Result<Option<String>> {
    let url = format!("http://{registry}/v2/{repository}/manifests/{reference}");
    let rsp = reqwest::Client::new()
        .head(&url)
        .header(header::ACCEPT, format!("{OCI_INDEX}, {OCI_MANIFEST}"))
        .send()
        .await?;
    if rsp.status() == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !rsp.status().is_success() {
        bail!("HEAD {url}: {}", rsp.status());
    }
    let digest = rsp
        .headers()
        .get("docker-content-digest")
        .context("no Docker-Content-Digest")?;
    Ok(Some(digest.to_str()?.to_string()))
}

async fn push_blob(http: &Http<'_>, repository: &str, blob: &Blob) -> Result<()> {
    let base = &http.base;
    let exists = http
        .request(
            reqwest::Method::HEAD,
            format!("{base}/v2/{repository}/blobs/{}", blob.digest),
        )
        .send()
        .await?;
    if exists.status().is_success() {
        return Ok(());
    }
    let location = start_upload(http, repository).await?;
    let separator = if location.contains('?') { '&' } else { '?' };
    let done = http
        .request(
            reqwest::Method::PUT,
            format!("{location}{separator}digest={}", blob.digest),
        )
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .body(blob.bytes.clone())
        .send()
        .await?;
    if done.status() != StatusCode::CREATED {
        bail!(
            "uploading blob {} to {repository}: {}",
            blob.digest,
            done.status()
        );
    }
    Ok(())
}

async fn put_manifest(http: &Http<'_>, repository: &str, reference: &str, manifest: &Blob) -> Result<String> {
    let rsp = http
        .request(
            reqwest::Method::PUT,
            format!("{}/v2/{repository}/manifests/{reference}", http.base),
        )
        .header(header::CONTENT_TYPE, manifest.media_type)
        .body(manifest.bytes.clone())
        .send()
        .await?;
    if rsp.status() != StatusCode::CREATED {
        bail!(
            "putting manifest {repository}:{reference}: {} {}",
            rsp.status(),
            rsp.text().await.unwrap_or_default()
        );
    }
    let digest = rsp
        .headers()
        .get("docker-content-digest")
        .context("manifest PUT without Docker-Content-Digest")?
        .to_str()?
        .to_string();
    if digest != manifest.digest {
        bail!(
            "registry stored {repository}:{reference} as {digest}, expected {}",
            manifest.digest
        );
    }
    Ok(digest)
}

fn tar_of(files: &[(&str, &[u8])]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, contents) in files {
        builder
            .append_data(&mut file_header(contents.len() as u64), path, *contents)
            .with_context(|| format!("adding {path}"))?;
    }
    Ok(builder.into_inner()?)
}

/// A regular file's tar header with fixed metadata (same files, same digest).
fn file_header(size: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header
}

/// Bytes free on the file system of `path` (from `df`), to check before writing big test images.
pub fn free_disk_bytes(path: &std::path::Path) -> Result<u64> {
    let out = std::process::Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()?;
    String::from_utf8(out.stdout)?
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .context("cannot read free disk space from df")
}

pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A blob pushed from a file by [`push_blob_file`].
#[derive(Debug, Clone)]
pub struct PushedBlob {
    pub media_type: &'static str,
    pub digest: String,
    pub size: u64,
}

impl PushedBlob {
    fn descriptor(&self) -> serde_json::Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.size})
    }
}

/// Writes a tar to `path`: `random_bytes` of incompressible data (from `/dev/urandom`) as
/// `data/random.bin`, then `files`. Streams: memory does not grow with `random_bytes`.
pub fn write_random_tar(path: &std::path::Path, random_bytes: u64, files: &[(&str, &[u8])]) -> Result<()> {
    use std::io::Read as _;
    let out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut builder = tar::Builder::new(out);
    let random = std::fs::File::open("/dev/urandom")?.take(random_bytes);
    builder.append_data(&mut file_header(random_bytes), "data/random.bin", random)?;
    for (name, contents) in files {
        builder.append_data(&mut file_header(contents.len() as u64), name, *contents)?;
    }
    builder
        .into_inner()?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    Ok(())
}

/// Pushes a file as a blob of `repository`, streaming it (hashed first, then uploaded).
pub async fn push_blob_file(
    registry: &str,
    repository: &str,
    path: &std::path::Path,
    media_type: &'static str,
) -> Result<PushedBlob> {
    use tokio::io::AsyncReadExt as _;
    let (digest, size) = {
        use std::io::Read as _;
        let mut file = std::fs::File::open(path)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            size += n as u64;
        }
        (format!("sha256:{}", hex::encode(hasher.finalize())), size)
    };
    let http = Http::new(registry, None);
    let location = start_upload(&http, repository).await?;
    let file = tokio::fs::File::open(path).await?;
    let chunks = futures::stream::unfold(file, |mut file| async move {
        let mut buf = bytes::BytesMut::with_capacity(256 * 1024);
        match file.read_buf(&mut buf).await {
            Ok(0) => None,
            Ok(_) => Some((Ok::<_, std::io::Error>(buf.freeze()), file)),
            Err(e) => Some((Err(e), file)),
        }
    });
    let separator = if location.contains('?') { '&' } else { '?' };
    let done = http
        .request(
            reqwest::Method::PUT,
            format!("{location}{separator}digest={digest}"),
        )
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, size)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await?;
    if done.status() != StatusCode::CREATED {
        bail!("uploading {} to {repository}: {}", path.display(), done.status());
    }
    Ok(PushedBlob {
        media_type,
        digest,
        size,
    })
}

/// Pushes an image of layers already in `repository` (e.g. from [`push_blob_file`]): its config,
/// with `labels`, and its manifest under `tag`; returns the manifest digest.
pub async fn push_image_of_layers(
    registry: &str,
    repository: &str,
    tag: &str,
    layers: &[PushedBlob],
    labels: BTreeMap<String, String>,
) -> Result<String> {
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config = Blob::new(OCI_CONFIG, serde_json::to_vec(&config)?);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config.descriptor(),
        "layers": layers.iter().map(PushedBlob::descriptor).collect::<Vec<_>>(),
    });
    let manifest = Blob::new(OCI_MANIFEST, serde_json::to_vec(&manifest)?);
    let http = Http::new(registry, None);
    push_blob(&http, repository, &config).await?;
    put_manifest(&http, repository, tag, &manifest).await
}

/// `GET /v2/<repository>/<kind>/<digest>` (`kind`: `manifests` or `blobs`): the bytes exactly
/// as the registry serves them, and the `Content-Type`.
pub async fn fetch_raw(
    registry: &str,
    repository: &str,
    kind: &str,
    digest: &str,
) -> Result<(String, Vec<u8>)> {
    let url = format!("http://{registry}/v2/{repository}/{kind}/{digest}");
    let rsp = reqwest::Client::new()
        .get(&url)
        .header(
            header::ACCEPT,
            format!("{OCI_INDEX}, {OCI_MANIFEST}, application/vnd.docker.distribution.manifest.v2+json"),
        )
        .send()
        .await?;
    if !rsp.status().is_success() {
        bail!("GET {url}: {}", rsp.status());
    }
    let content_type = rsp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Ok((content_type, rsp.bytes().await?.to_vec()))
}

/// The manifest `digest` and every blob below it (through indexes), as the registry serves them.
pub async fn manifest_tree(
    registry: &str,
    repository: &str,
    digest: &str,
) -> Result<(Vec<String>, Vec<String>)> {
    let mut manifests = vec![digest.to_owned()];
    let mut blobs = Vec::new();
    let mut i = 0;
    while i < manifests.len() {
        let (_, bytes) = fetch_raw(registry, repository, "manifests", &manifests[i]).await?;
        let doc: serde_json::Value = serde_json::from_slice(&bytes)?;
        for child in doc["manifests"].as_array().into_iter().flatten() {
            manifests.push(
                child["digest"]
                    .as_str()
                    .context("index entry without digest")?
                    .to_owned(),
            );
        }
        let config = doc["config"]["digest"].as_str().map(str::to_owned);
        blobs.extend(config);
        for layer in doc["layers"].as_array().into_iter().flatten() {
            blobs.push(
                layer["digest"]
                    .as_str()
                    .context("layer without digest")?
                    .to_owned(),
            );
        }
        i += 1;
    }
    Ok((manifests, blobs))
}

async fn start_upload(http: &Http<'_>, repository: &str) -> Result<String> {
    let base = &http.base;
    let start = http
        .request(
            reqwest::Method::POST,
            format!("{base}/v2/{repository}/blobs/uploads/"),
        )
        .send()
        .await?;
    if start.status() != StatusCode::ACCEPTED {
        bail!("starting a blob upload to {repository}: {}", start.status());
    }
    let location = start
        .headers()
        .get(header::LOCATION)
        .context("upload without Location")?
        .to_str()?;
    Ok(if location.starts_with('/') {
        format!("{base}{location}")
    } else {
        location.to_string()
    })
}
