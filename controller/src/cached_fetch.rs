//! A re-pin that moves a bundle kapp-controller has already fetched to another location of the
//! same digest (to the mirror's copy, or back upstream) changes less than it says: vendir, which
//! kapp-controller runs for each App and PackageRepository, keeps a bundle pulled by digest in a
//! cache of that object's own (kept until the object is deleted or kapp-controller restarts),
//! keyed by the digest alone, when the bundle's images were in its own repository where it was
//! pulled (imgpkg's "relocated" bundle, as `imgpkg copy` leaves it, and every mirror copy). The
//! object's next sync is then served from that cache, with the ImagesLock pointing at the
//! images where they were, not where the new pin says. No reference holdfast can write changes
//! that key (every form of a digest reference has the same identifier), so the controller says
//! so: a `BundleLocationCached` Warning Event on the object and
//! `holdfast_controller_bundle_moves_cached_total`.

use holdfast_registry::Reference;
use kube::runtime::events::{Event, EventType};
use serde_json::Value;

/// A bundle reference a re-pin moves to another location of the digest it held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleMove {
    /// The JSON pointer of the reference.
    pub field: String,
    pub from: String,
    pub to: String,
    /// Whether the bundle was relocated where it was fetched from (`None`: not known).
    pub relocated_before: Option<bool>,
}

/// The bundle references `ops` move from one location of a digest to another in `stored`, an
/// object kapp-controller has fetched, whose earlier location may have been cached:
/// `relocated(from, to)` says whether the bundle was relocated at `from` (`Some(false)`: it
/// was not, so vendir did not cache it and the move is left out); `to` as written.
pub fn cached_moves(
    stored: &Value,
    ops: &[json_patch::PatchOperation],
    relocated: impl Fn(&Reference, &str) -> Option<bool>,
) -> Vec<BundleMove> {
    ops.iter()
        .filter_map(|op| match op {
            json_patch::PatchOperation::Replace(replace) => Some((replace.path.to_string(), &replace.value)),
            _ => None,
        })
        .filter(|(field, _)| field.ends_with("/imgpkgBundle/image"))
        .filter_map(|(field, to)| {
            let to = to.as_str()?;
            let from = stored.pointer(&field)?.as_str()?;
            let (from_ref, to_ref) = (Reference::parse(from).ok()?, Reference::parse(to).ok()?);
            let same_digest = from_ref.digest().is_some() && from_ref.digest() == to_ref.digest();
            let relocated_before = relocated(&from_ref, to);
            (same_digest && from != to && relocated_before != Some(false)).then(|| BundleMove {
                field,
                from: from.to_owned(),
                to: to.to_owned(),
                relocated_before,
            })
        })
        .collect()
}

/// The Warning Event for `moved` on an object of `kind`.
pub fn event(kind: &str, moved: &BundleMove) -> Event {
    let was = match moved.relocated_before {
        Some(true) => "had its images in its own repository there",
        _ => "may have had its images in its own repository there (imgpkg copy)",
    };
    let note = format!(
        "{} moved from {} to {}, the same digest. The bundle {was}: kapp-controller keeps such a bundle \
         in this {kind}'s fetch cache under its digest, so its syncs keep the images' earlier \
         locations until the {kind} is re-created or kapp-controller restarts",
        moved.field, moved.from, moved.to
    );
    Event {
        type_: EventType::Warning,
        reason: "BundleLocationCached".into(),
        note: Some(crate::pinning::truncate(note)),
        action: "Pin".into(),
        secondary: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn replace(path: &str, value: &str) -> json_patch::PatchOperation {
        serde_json::from_value(json!({"op": "replace", "path": path, "value": value})).unwrap()
    }

    fn stored() -> Value {
        json!({"spec": {"fetch": [
            {"imgpkgBundle": {"image": format!("up.example/bundles/app@{DIGEST}")}},
            {"image": {"url": format!("up.example/apps/web@{DIGEST}")}},
            {"imgpkgBundle": {"image": "up.example/bundles/other:1.0"}},
        ]}})
    }

    /// Only a bundle moved to another location of its digest, unless known not relocated there.
    #[test]
    fn a_bundle_moved_to_its_digests_copy_is_a_cached_move() {
        let mirror = format!("mirror.example/m/up.example/bundles/app@{DIGEST}");
        let ops = [
            replace("/spec/fetch/0/imgpkgBundle/image", &mirror),
            // An image: vendir keeps it by digest too, but it has no ImagesLock to be stale.
            replace(
                "/spec/fetch/1/image/url",
                &format!("mirror.example/m/up.example/apps/web@{DIGEST}"),
            ),
            // A tag pinned: nothing was cached under a digest.
            replace(
                "/spec/fetch/2/imgpkgBundle/image",
                &format!("up.example/bundles/other@{DIGEST}"),
            ),
        ];
        let unknown = cached_moves(&stored(), &ops, |_, _| None);
        assert_eq!(
            unknown,
            [BundleMove {
                field: "/spec/fetch/0/imgpkgBundle/image".into(),
                from: format!("up.example/bundles/app@{DIGEST}"),
                to: mirror.clone(),
                relocated_before: None,
            }]
        );
        assert_eq!(cached_moves(&stored(), &ops, |_, _| Some(true)).len(), 1);
        assert!(cached_moves(&stored(), &ops, |_, _| Some(false)).is_empty());
        // Another digest: a fetch of new content, nothing cached under it.
        let other = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
        let moved = [replace(
            "/spec/fetch/0/imgpkgBundle/image",
            &format!("mirror.example/m/up.example/bundles/app@{other}"),
        )];
        assert!(cached_moves(&stored(), &moved, |_, _| None).is_empty());
        let event = event("App", &unknown[0]);
        assert_eq!(
            (event.type_, event.reason.as_str()),
            (EventType::Warning, "BundleLocationCached")
        );
        assert!(
            event
                .note
                .is_some_and(|n| n.contains(&mirror) && n.contains("may have"))
        );
    }
}
