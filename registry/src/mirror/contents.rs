//! What a copy in the mirror holds below it, read back from the mirror: retention must not
//! delete a manifest that a copy still in use needs (see [`Copier::contents`]).

use http::{Method, StatusCode};

use super::{
    Copier, CopyError, IMAGES_LOCK_PATH, Job, LockError, MANIFEST_MEDIA_TYPES, ManifestDoc, Read, Want,
    is_bundle_config, parse_images_lock,
};
use crate::{Digest, Reference};

impl Copier {
    /// The manifests `location` (a copy in this mirror) holds in its own repository, as
    /// [`Copier::copy`] put them there: an index's manifests, the images of a bundle's
    /// ImagesLock, and theirs in turn. A manifest the mirror does not have holds nothing.
    pub async fn contents(&self, location: &Reference) -> Result<Vec<Digest>, CopyError> {
        let digest = location
            .digest()
            .ok_or_else(|| CopyError::NotPinned(location.to_string()))?;
        let mirror = Reference::parse(&location.name()).map_err(|e| CopyError::Manifest {
            location: location.to_string(),
            detail: e.to_string(),
        })?;
        let job = Job {
            copier: self,
            credentials: &self.mirror_credentials,
            mirror,
            report: Default::default(),
            visited: Default::default(),
        };
        let mut found: Vec<Digest> = Vec::new();
        let mut pending = vec![(digest.clone(), 0)];
        while let Some((digest, depth)) = pending.pop() {
            if depth > self.config.max_depth {
                return Err(CopyError::TooDeep {
                    location: format!("{}@{digest}", location.name()),
                    max: self.config.max_depth,
                });
            }
            for child in job.children(&digest).await? {
                if !found.contains(&child) {
                    found.push(child.clone());
                    pending.push((child, depth + 1));
                }
            }
        }
        Ok(found)
    }
}

impl Job<'_> {
    /// The manifests directly below the mirror's manifest `digest` (none when it is absent).
    async fn children(&self, digest: &Digest) -> Result<Vec<Digest>, CopyError> {
        let location = || format!("{}@{digest}", self.mirror.name());
        let target = self.target();
        let url = target
            .url(&format!("manifests/{digest}"))
            .map_err(CopyError::Mirror)?;
        let accept = MANIFEST_MEDIA_TYPES.join(", ");
        let read = Read::UpTo(self.copier.config.max_manifest_bytes);
        let got = self
            .resolver()
            .send(&target, self.request(Method::GET, &url, &accept, read))
            .await
            .map_err(CopyError::Mirror)?;
        if got.status == StatusCode::NOT_FOUND {
            return Ok(Vec::new());
        }
        if !got.status.is_success() {
            return Err(CopyError::Mirror(target.status_error(
                got.status,
                digest.as_str(),
                &got.body,
            )));
        }
        let doc: ManifestDoc = serde_json::from_slice(&got.body).map_err(|e| CopyError::Manifest {
            location: location(),
            detail: e.to_string(),
        })?;
        if let Some(manifests) = doc.manifests {
            return Ok(manifests.into_iter().map(|m| m.digest).collect());
        }
        // Only a bundle holds more; a config too large to have been copied is no bundle's.
        let Some(config) = doc
            .config
            .filter(|c| c.size <= self.copier.config.max_config_bytes)
        else {
            return Ok(Vec::new());
        };
        let config = self.read_back(&target, &config, Want::Bytes).await?;
        if !config.as_deref().is_some_and(is_bundle_config) {
            return Ok(Vec::new());
        }
        // As the copy does: the last layer that holds an ImagesLock is the bundle's.
        let mut lock = None;
        for layer in doc.layers.unwrap_or_default() {
            if !layer.is_foreign()
                && let Some(found) = self.read_back(&target, &layer, Want::Lock).await?
            {
                lock = Some(found);
            }
        }
        let bundle_error = |error| CopyError::Bundle {
            location: location(),
            error,
        };
        let lock = lock
            .ok_or_else(|| bundle_error(LockError::Layer(format!("no {IMAGES_LOCK_PATH} in its layers"))))?;
        let images = parse_images_lock(&lock).map_err(bundle_error)?;
        Ok(images.iter().filter_map(|i| i.digest().cloned()).collect())
    }
}
