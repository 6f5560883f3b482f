//! `kubectl holdfast unpin KIND/NAME|--all`: puts back the references holdfast pinned (as
//! recorded in `holdfast.dev/original-refs`) and opts the object out with the label
//! `holdfast.dev/pin=disabled`, so neither the webhook nor the controller pins it again. For
//! removing holdfast, or debugging with the tag as written. The update is guarded by the
//! object's resourceVersion.

use anyhow::{Context, Result, bail};
use holdfast_pins::{PinnedKind, repin};
use kube::{
    ResourceExt,
    api::{DynamicObject, Patch, PatchParams},
};

use crate::{
    Outcome,
    args::Unpin,
    cluster::Cluster,
    target::{self, display},
};

pub async fn run(cluster: &Cluster, args: &Unpin) -> Result<Outcome> {
    let mut objects: Vec<(PinnedKind, DynamicObject)> = Vec::new();
    match &args.target {
        Some(text) => {
            let Some(target) = target::parse(text)? else {
                bail!("{text:?}: give KIND/NAME, e.g. app/my-app");
            };
            let Some(namespace) = args.namespaces.one() else {
                bail!("-A goes with --all; give the object's namespace with -n");
            };
            objects.push((
                target.kind,
                cluster.get(target.kind, namespace, &target.name).await?,
            ));
        }
        None => {
            for kind in PinnedKind::ALL {
                for object in cluster.list(kind, args.namespaces.one()).await? {
                    objects.push((kind, object));
                }
            }
        }
    }
    let mut changed = 0;
    for (kind, object) in &objects {
        let name = format!(
            "{} -n {}",
            display(*kind, &object.name_any()),
            object.namespace().unwrap_or_default()
        );
        let stored = serde_json::to_value(object)?;
        let ops = repin::unpin(&stored);
        if ops.is_empty() {
            println!("{name}: already unpinned and opted out");
            continue;
        }
        let restored = holdfast_pins::OriginalRefs::from_object(&stored)
            .map(|r| r.in_place(&stored).count())
            .unwrap_or_default();
        cluster
            .api(*kind, object.namespace().as_deref())
            .patch(
                &object.name_any(),
                &PatchParams::default(),
                &Patch::<()>::Json(json_patch::Patch(ops)),
            )
            .await
            .with_context(|| format!("unpinning {name}"))?;
        changed += 1;
        println!("{name}: {restored} references restored as written, labelled holdfast.dev/pin=disabled");
    }
    if objects.is_empty() {
        println!("No App, PackageRepository or Package to unpin.");
    } else if changed > 0 {
        println!(
            "To pin again, remove the label (kubectl label KIND/NAME holdfast.dev/pin-): the controller pins it."
        );
    }
    Ok(Outcome::Fine)
}
