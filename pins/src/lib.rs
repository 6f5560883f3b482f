//! Pin fetch refs: rewrites the OCI references in Carvel kapp-controller fetch specs from tags to
//! digests (`repo@sha256:…`), so kapp-controller serves them from its digest-keyed cache instead
//! of asking the registry on every sync (kapp-controller ≥ v0.43 caches what it fetched by digest).
//!
//! The planning and patching in this module are **pure**: no I/O, no async. The registry work in
//! between is [`resolve`]'s (the crate's I/O edge, over the shared digest cache), called by the
//! admission handler and the controller's pinners:
//!
//! 1. [`ObjectPlan::new`] reads the object's pin policy, finds its [`FetchSite`]s and says per
//!    site what to do ([`Step`]): nothing, resolve a tag, list tags and select one, reuse a
//!    recorded pin, or nothing because the site is invalid (with a warning).
//! 2. The caller resolves: [`Need::Tag`] → digest of that tag; [`Need::Select`] → list the
//!    repository's tags, pick one with `holdfast_registry::select_tag`, then the digest of
//!    `repo.with_tag(tag)`. Credentials come from the site's `secretRef` (same namespace; its
//!    [`FetchSite::upstream_secret`]: the user's Secret where holdfast had written the mirror
//!    pull Secret over it).
//! 3. [`pin_patch`] turns the resolutions into JSON-patch operations and warnings. Call it even
//!    when nothing was resolved: it also drops annotation entries that are no longer in place.
//!
//! Objects being deleted (`metadata.deletionTimestamp` set) are never patched: a new digest
//! would only bump the generation of an object on its way out (the UPDATEs that remove
//! finalizers pass through unchanged).
//!
//! # Objects and fields
//!
//! | kind ([`PinnedKind`]) | group / resource | fetch entries |
//! |---|---|---|
//! | App | `kappctrl.k14s.io` / `apps` | list `spec.fetch[]` |
//! | PackageRepository | `packaging.carvel.dev` / `packagerepositories` | one object `spec.fetch` |
//! | Package | `data.packaging.carvel.dev` / `packages` | list `spec.template.spec.fetch[]` |
//!
//! In each entry, `image.url` and `imgpkgBundle.image` are pinned (note the asymmetry: the image
//! source calls its reference `url`, the bundle source `image`). `git`, `http`, `helmChart` and
//! `inline` entries are never touched, nor is any reference that already has a digest
//! (`repo@sha256:…` or `repo:tag@sha256:…`), whoever wrote it.
//!
//! The pinned string keeps the user's spelling of registry and repository and replaces the tag
//! (`nginx:1.25` → `nginx@sha256:…`, see `holdfast_registry::reference`). Where the ref came from
//! a `tagSelection`, the `tagSelection` is **removed**: vendir appends `":" + selected tag` to
//! the URL, which breaks a digest reference (vendir's `tagSelection`).
//!
//! # Per-object controls: `holdfast.dev/pin`
//!
//! One key, [`PIN_KEY`] = `holdfast.dev/pin`, with three values ([`PinPolicy`]):
//!
//! - `follow` (**default**): the tag keeps its meaning. The webhook pins to the digest the tag
//!   has now; the controller re-resolves tracked tags and re-pins when a tag moves. This is what
//!   the user asked for by writing a tag (kapp-controller itself would pick up a moved tag on its
//!   next sync), only served from a cache and with one registry check per unique tag. Making
//!   `freeze` the default would silently stop moved tags from ever deploying.
//! - `freeze`: the digest stays until the user changes the reference (or its `tagSelection`).
//!   On UPDATE the webhook reuses the digest recorded for the same pointer and the same original
//!   (so PKGI re-deriving an App, `kubectl apply` re-sending the tag, or a server-side apply
//!   dropping our annotation do not move the pin); the controller never re-pins it.
//! - `disabled`: opt-out. The rule returns no operations and the controller leaves the object
//!   alone.
//!
//! It is read from the object's **labels**, so the webhook configuration can skip opted-out
//! objects with an `objectSelector` (`holdfast.dev/pin NotIn [disabled]`) and the controller can
//! list `freeze`/`follow` objects by label selector. The same key is also accepted as an
//! annotation (the label wins when both are set and differ, with a warning). Any other value —
//! including an empty one — means the default, `follow`, with a warning that names the allowed
//! values. Values are case-sensitive (`Freeze` is unknown), as label selectors are.
//!
//! # The annotation `holdfast.dev/original-refs`
//!
//! [`ORIGINAL_REFS_ANNOTATION`] records every pin holdfast put in place, as a JSON object keyed by
//! the JSON pointer of the ref field:
//!
//! ```json
//! {"/spec/fetch/0/image/url":{"digest":"sha256:…","ref":"registry.corp.com/team/app-config:v1.2.0"},
//!  "/spec/fetch/1/imgpkgBundle/image":{"digest":"sha256:…","ref":"registry.corp.com/team/app-bundle",
//!   "tag":"1.4.2","tagSelection":{"semver":{"constraints":">=1.0.0 <2.0.0"}}}}
//! ```
//!
//! - `ref`: the reference exactly as the user wrote it; `tagSelection`: the user's
//!   `tagSelection` JSON, verbatim, if there was one; `tag`: the tag the selection chose;
//!   `digest`: the digest holdfast pinned to. `ref` pinned to `digest` is what the field holds;
//!   `mirror`, when set, is the mirror repository holdfast pinned to instead (the content was
//!   copied there, see `holdfast_registry::mirror`): then the field holds `mirror@digest`.
//!   `secretRef` and `pullSecret`, when set: the source's `secretRef.name` was the user's
//!   `secretRef` and now names the mirror pull Secret `pullSecret` (see [`mirror_scope`]). A
//!   reference the user changes while its source still names `pullSecret` is resolved with,
//!   and given back, `secretRef` (unless pinned to a private mirror copy again), since the
//!   entry goes with the pin ([`FetchSite::upstream_secret`]).
//! - An entry is kept only while it is **in place**: the field still holds `ref`'s repository
//!   pinned to `digest`. So an entry re-pinned now is overwritten with what the user wrote now;
//!   an entry whose field the user replaced (by their own digest, another tag, or by removing
//!   the fetch entry) is dropped, and the controller never re-pins a digest the user wrote
//!   themselves. Whoever re-pins (the controller for `follow`) must update `digest` (and `tag`)
//!   in the same update — [`pin_patch`] does that.
//! - Serialised compactly with keys sorted at every level, and only rewritten when its content
//!   changes, so the same input gives the same bytes (no generation or resourceVersion churn).
//!
//! # Idempotency and reinvocation
//!
//! An object whose refs are digests with in-place entries gets no operations, so a
//! reinvocation after another webhook, or a second `kubectl apply` of the same file, changes
//! nothing. An UPDATE that brings the tag back (a list replaced by a JSON merge patch, PKGI
//! re-deriving an App) gets the same digest if the resolver (or, for `freeze`, the record)
//! gives the same digest, and then the annotation is left byte-for-byte as it was.

pub mod mirror_scope;
mod original_refs;
pub mod other_sources;
mod patch;
mod policy;
pub mod policy_params;
pub mod repin;
pub mod resolve;
mod sites;
#[cfg(test)]
mod tests;

use holdfast_registry::{Reference, ReferenceError, VersionSelection};
use serde_json::Value;

pub use mirror_scope::{Copying, MirrorPins, NamespaceSelector};
pub use original_refs::{
    ORIGINAL_REFS_ANNOTATION, OriginalRef, OriginalRefs, OriginalRefsError, PLAIN_REFERENCE_PATTERN,
};
pub use patch::{PinOutcome, Resolution, pin_patch};
pub use policy::{PIN_KEY, PinPolicy, UnknownPinPolicy};
pub use resolve::{Pinner, SecretScoped};
pub use sites::{FetchSite, PinnedKind, SiteKind, fetch_entries, fetch_sites};

/// The rule's name in metrics and logs.
pub const NAME: &str = "pin-fetch-refs";

/// The largest `tagSelection` pinned, as canonical JSON (it becomes part of a cache key and of
/// a `DigestCacheEntry`); vendir's selections are a constraint and a few identifiers, far less.
pub const MAX_TAG_SELECTION_BYTES: usize = 1024;

/// What a site needs before it can be pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// The reference already names a digest: never touched.
    AlreadyPinned,
    /// Resolve this tag (the implicit `latest` when the reference has neither tag nor digest).
    Tag(Reference),
    /// List the tags of this repository (no tag, no digest), pick one with `select_tag`, then
    /// resolve `repository.with_tag(selected)`.
    Select(Reference, VersionSelection),
}

/// Why a site cannot be pinned. The webhook leaves such a site as it is and warns; a validating
/// policy may deny it later. Messages name the field as `kubectl explain` does.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SiteError {
    #[error("{field}: {reference:?} is not a valid image reference: {source}; left unpinned")]
    InvalidReference {
        field: String,
        reference: String,
        #[source]
        source: ReferenceError,
    },
    #[error(
        "{field}: {reference:?} has the tag {tag:?} and there is also a tagSelection; vendir appends \
         \":<selected tag>\" to the reference and the fetch fails: remove the tag or the \
         tagSelection; left unpinned"
    )]
    TagWithSelection {
        field: String,
        reference: String,
        tag: String,
    },
    #[error(
        "{field}: {reference:?} has a digest and there is also a tagSelection; vendir appends \
         \":<selected tag>\" to the reference and the fetch fails: remove the tagSelection \
         (to keep the digest) or the digest (to select a tag)"
    )]
    DigestWithSelection { field: String, reference: String },
    #[error("{field}: invalid tagSelection: {reason}; left unpinned")]
    InvalidTagSelection { field: String, reason: String },
    #[error("{field}: Unsupported version selection type (currently supported: semver); left unpinned")]
    UnsupportedSelection { field: String },
    #[error("{field}: the tagSelection is {len} bytes, more than holdfast pins ({max}); left unpinned")]
    SelectionTooLarge { field: String, len: usize, max: usize },
}

/// What a site needs (see [`Need`]), or why it cannot be pinned.
pub fn plan(site: &FetchSite) -> Result<Need, SiteError> {
    let reference = Reference::parse(&site.reference).map_err(|source| SiteError::InvalidReference {
        field: site.field.clone(),
        reference: site.reference.clone(),
        source,
    })?;
    let Some(raw) = &site.tag_selection_json else {
        return Ok(if reference.is_pinned() {
            Need::AlreadyPinned
        } else {
            Need::Tag(reference)
        });
    };
    if reference.is_pinned() {
        return Err(SiteError::DigestWithSelection {
            field: site.field.clone(),
            reference: site.reference.clone(),
        });
    }
    if let Some(tag) = reference.tag() {
        return Err(SiteError::TagWithSelection {
            field: site.field.clone(),
            reference: site.reference.clone(),
            tag: tag.to_owned(),
        });
    }
    let selection = match &site.tag_selection {
        Some(selection) => selection.clone(),
        None => serde_json::from_value::<VersionSelection>(raw.clone()).map_err(|e| {
            SiteError::InvalidTagSelection {
                field: site.field.clone(),
                reason: e.to_string(),
            }
        })?,
    };
    if selection.semver.is_none() {
        return Err(SiteError::UnsupportedSelection {
            field: site.field.clone(),
        });
    }
    let len = serde_json::to_string(&selection).map_or(usize::MAX, |json| json.len());
    if len > MAX_TAG_SELECTION_BYTES {
        return Err(SiteError::SelectionTooLarge {
            field: site.field.clone(),
            len,
            max: MAX_TAG_SELECTION_BYTES,
        });
    }
    Ok(Need::Select(reference, selection))
}

/// What the caller does for one site.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Already a digest: nothing to do.
    Keep,
    /// Resolve, then pass the result to [`pin_patch`]. `fallback` is the pin recorded for this
    /// same original (in this object's annotation or the old object's): under `follow` it is
    /// better to keep it when resolution fails than to let the object go back to the tag.
    Resolve {
        need: Need,
        fallback: Option<Resolution>,
    },
    /// `freeze`: the recorded pin for this same original, to pass to [`pin_patch`] as is.
    Reuse(Resolution),
    /// Cannot be pinned; the error is also among the plan's warnings.
    Invalid(SiteError),
}

/// The pure first half of the rule for one object: its policy, its sites and a [`Step`] each.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectPlan {
    pub policy: PinPolicy,
    /// Empty when the policy is `disabled` or the object is being deleted.
    pub sites: Vec<FetchSite>,
    /// One per site, same order.
    pub steps: Vec<Step>,
    /// For the API server to pass on to the client: policy problems and invalid sites.
    pub warnings: Vec<String>,
}

impl ObjectPlan {
    /// Plans `object` (the request's object). `old_object` (the stored object of an UPDATE)
    /// contributes recorded pins, and the user's Secret behind a mirror pull Secret (see
    /// [`FetchSite::upstream_secret`]), when the new object lost or never had the annotation.
    pub fn new(kind: PinnedKind, object: &Value, old_object: Option<&Value>) -> Self {
        let (policy, mut warnings) = PinPolicy::from_object(object);
        if policy == PinPolicy::Disabled || is_terminating(object) {
            return Self {
                policy,
                sites: Vec::new(),
                steps: Vec::new(),
                warnings,
            };
        }
        let recorded = OriginalRefs::from_object(object).unwrap_or_default();
        let recorded_before = old_object
            .and_then(|old| OriginalRefs::from_object(old).ok())
            .unwrap_or_default();
        let mut sites = fetch_sites(kind, object);
        // A site the user edited after holdfast pinned it to a private mirror copy still names
        // the mirror pull Secret: it is resolved with, and given back, the user's Secret (a
        // pin in place, already a digest, keeps the pull Secret).
        for site in &mut sites {
            if !matches!(plan(site), Ok(Need::AlreadyPinned))
                && let Some(user) = recorded
                    .users_secret(site)
                    .or_else(|| recorded_before.users_secret(site))
            {
                site.upstream_secret = Some(user);
            }
        }
        let steps = sites
            .iter()
            .map(|site| {
                let need = match plan(site) {
                    Ok(Need::AlreadyPinned) => return Step::Keep,
                    Ok(need) => need,
                    Err(error) => {
                        warnings.push(error.to_string());
                        return Step::Invalid(error);
                    }
                };
                let previous = recorded
                    .recorded_pin(site)
                    .or_else(|| recorded_before.recorded_pin(site));
                match (policy, previous) {
                    (PinPolicy::Freeze, Some(previous)) => Step::Reuse(previous),
                    (_, fallback) => Step::Resolve { need, fallback },
                }
            })
            .collect();
        Self {
            policy,
            sites,
            steps,
            warnings,
        }
    }
}

/// Whether `object` is being deleted; such objects are never patched.
pub fn is_terminating(object: &Value) -> bool {
    object
        .get("metadata")
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|t| !t.is_null())
}
