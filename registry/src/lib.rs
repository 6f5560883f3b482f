//! OCI references, tag to digest resolution, registry credentials, and the mirror copier.
//!
//! Knows nothing of Kubernetes: the digest cache (`holdfast-cache`), the webhook and the
//! controller build on it.
//!
//! - [`reference`](mod@reference): parse image references exactly as vendir/imgpkg (go-containerregistry) do,
//!   and produce the pinned `repo@sha256:…` form.
//! - [`semver_select`]: vendir's `tagSelection.semver` (which tag vendir would pick).
//! - [`credentials`]: registry credentials from a `secretRef` Secret, as vendir reads them.
//! - [`resolve`]: the registry client: tag → digest, tag lists, auth, rate limits, budgets.
//! - [`tag_list`]: a tag list page read keeping only the tags that parse as versions, bounded.
//! - [`mirror`]: copies pinned content (and imgpkg bundles, relocated) into a cache registry.

mod auth;
pub mod credentials;
pub mod digest;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod host_gate;
pub mod mirror;
pub mod reference;
pub mod resolve;
mod retry_after;
mod roots;
pub mod semver_select;
pub mod tag_list;
mod text;

pub use credentials::{AuthConfig, Credentials, CredentialsError};
pub use digest::{Digest, DigestError};
pub use reference::{Reference, ReferenceError};
pub use resolve::{ResolveError, Resolver, ResolverBuildError, ResolverConfig};
pub use roots::ExtraRoots;
pub use semver_select::{Prereleases, SelectError, SemverSelection, VersionSelection, select_tag};
pub use text::truncated;
