//! OCI references, tag to digest resolution, registry credentials and the digest cache.
//!
//! Knows nothing of Kubernetes admission: the webhook and the controller build on it.
