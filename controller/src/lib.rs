//! holdfast's reconcilers.
//!
//! - [`pinning`]: pins App, PackageRepository and Package fetch references admitted unpinned
//!   (webhook down, registry down) and moves `follow` pins when their tags move;
//!   [`cached_fetch`] says when such a move cannot reach a bundle kapp-controller has cached.
//! - [`refresher`]: asks the registry once per unique tag (the digest cache's keys) that the
//!   watched objects name, on an interval, then has the objects naming a tag that moved
//!   reconciled from the refreshed cache; deletes the entries no object names.
//! - [`entry_status`]: the `DigestCacheEntry` objects' status (conditions, observed digest,
//!   objects naming it), and the refreshes asked for with their annotation, run beside the
//!   refresher;
//! - [`publisher`]: the digest cache published as the pinning policies' parameters
//!   (`ClusterDigestPins`, `DigestPins`), so the API server pins cached tags without the webhook;
//! - [`finalizer`]: the fast finalizer: deletes an app's kpack Image as soon as the app (or its
//!   last BuildWorkload, or its namespace) is being deleted, and the pods of terminating Builds;
//!   [`deletable`] is the one table of what it may delete and when.
//! - [`mirror`]: copies the content of pinned digests into a cache registry (the mirror),
//!   records each copy on its cache entry and has objects re-pinned to the copy;
//!   [`mirror::references`] says which copies objects reference, [`mirror::retention`]
//!   deletes the others after a grace period.
//! - [`watched`]: the one watch per pinned kind (and of the namespaces) that the pinners and the
//!   mirror share for a leader's term, keeping each object as a [`stored::Stored`].
//! - [`term`]: a leader's term: the pinner, the watches and every loop above, built once;
//!   [`run`]: the digest cache, the election ([`leader`]) and a term while this replica leads,
//!   as the binary runs them.
//! - [`metrics`] and [`admin`]: what the controller reports on its admin port (`/healthz`,
//!   `/readyz`, `/metrics`; the port itself is `holdfast_runtime::admin`'s, as the webhook's).
//!
//! Built on `holdfast-cache` (the digest cache and its `DigestCacheEntry` store), `holdfast-pins`
//! and `holdfast-registry`; its flags and log lines are `holdfast-runtime`'s.

pub mod admin;
mod backoff;
pub mod cached_fetch;
pub mod deletable;
pub mod entry_status;
pub mod finalizer;
#[cfg(test)]
mod fixtures;
pub mod leader;
pub mod metrics;
pub mod mirror;
pub mod pinning;
pub mod publisher;
pub mod refresher;
pub mod run;
mod shutdown;
mod stored;
pub mod term;
mod watched;
