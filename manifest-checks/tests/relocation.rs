//! Issue 35: a kustomize `namespace:` override silently disabled the controller's fence (its CEL
//! named `holdfast-system`) and the webhooks' self-exclusion (their namespaceSelectors name it).
//! Overlays with `namespace: other` of the base and of every component are rendered by `kubectl
//! kustomize` and held to [`check_relocated`]; cert-manager's names need the replacements
//! README.md shows, which are taken from README.md itself. Skipped without `kubectl` on the PATH.

use anyhow::{Context, Result};
use holdfast_manifest_checks::{
    fence::FENCE,
    load::{copy_dir, kubectl, manifests, read, render, repo, subdirectories},
    relocation::check_relocated,
    report::{assert_clean, expect_caught},
    yaml::{at_mut, find_mut},
};
use serde_yaml::Value;

const NAMESPACE: &str = "other";

/// The replacements README.md gives for cert-manager under a namespace override: the YAML block
/// that starts with this comment.
const README_MARK: &str = "# holdfast: cert-manager names for a namespace override";

fn readme_replacements() -> Result<String> {
    let readme = read(&repo().join("README.md"))?;
    let start = readme
        .find(README_MARK)
        .context("README.md has no replacements block")?;
    let block = &readme[start..];
    let end = block.find("```").context("the block does not end")?;
    Ok(block[..end].to_owned())
}

/// `kubectl kustomize` of an overlay of a copy of manifests/: `namespace: other`, the base,
/// `components`, and `extra` appended to the kustomization.
fn relocated(components: &[&str], extra: &str) -> Result<Option<Vec<Value>>> {
    let Some(kubectl) = kubectl() else {
        eprintln!("skipped: no kubectl on the PATH");
        return Ok(None);
    };
    let scratch = tempfile::tempdir()?;
    copy_dir(&manifests(), &scratch.path().join("manifests"))?;
    let listed: String = components
        .iter()
        .map(|c| format!("  - manifests/components/{c}\n"))
        .collect();
    std::fs::write(
        scratch.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: {NAMESPACE}\nresources:\n  - manifests/base\ncomponents:\n{listed}{extra}"
        ),
    )?;
    render(&kubectl, scratch.path()).map(Some)
}

#[test]
fn a_namespace_override_keeps_the_fence_and_the_self_exclusion() -> Result<()> {
    let Some(base) = relocated(&[], "")? else {
        return Ok(());
    };
    assert_clean(
        "the base in another namespace",
        &check_relocated(&base, NAMESPACE),
    );
    for component in subdirectories(&manifests().join("components"))? {
        if component == "cert-manager" {
            continue;
        }
        let Some(objects) = relocated(&[&component], "")? else {
            return Ok(());
        };
        assert_clean(
            &format!("components/{component} in another namespace"),
            &check_relocated(&objects, NAMESPACE),
        );
    }
    Ok(())
}

#[test]
fn with_cert_manager_a_namespace_override_needs_the_readme_replacements() -> Result<()> {
    let Some(without) = relocated(&["cert-manager"], "")? else {
        return Ok(());
    };
    let problems = check_relocated(&without, NAMESPACE);
    expect_caught(
        "cert-manager's dnsNames",
        problems.clone(),
        "Certificate other/holdfast-webhook: .spec.dnsNames.0",
    );
    expect_caught("cert-manager's inject-ca-from", problems, "inject-ca-from");
    let Some(with) = relocated(&["cert-manager"], &readme_replacements()?)? else {
        return Ok(());
    };
    assert_clean(
        "cert-manager with README's replacements",
        &check_relocated(&with, NAMESPACE),
    );
    Ok(())
}

/// What the check catches: the fence and the Namespace as they were before issue 35.
#[test]
fn what_a_namespace_override_breaks_is_caught() -> Result<()> {
    let Some(mut objects) = relocated(&[], "")? else {
        return Ok(());
    };
    let policy = find_mut(&mut objects, "ValidatingAdmissionPolicy", FENCE)?;
    *at_mut(policy, "spec.matchConditions.0.expression")? = Value::from(
        "request.userInfo.username == 'system:serviceaccount:holdfast-system:holdfast-controller'",
    );
    let problems = check_relocated(&objects, NAMESPACE);
    expect_caught(
        "the fence naming holdfast-system",
        problems.clone(),
        "does not match the controller's ServiceAccount other/",
    );
    expect_caught(
        "a string naming holdfast-system",
        problems,
        "names holdfast-system",
    );

    let Some(mut objects) = relocated(&[], "")? else {
        return Ok(());
    };
    for namespace in of_kind_mut(&mut objects, "Namespace") {
        if let Some(labels) = namespace
            .get_mut("metadata")
            .and_then(|m| m.get_mut("labels"))
            .and_then(Value::as_mapping_mut)
        {
            labels.remove("holdfast.dev/ignore");
        }
    }
    expect_caught(
        "a Namespace without the opt-out label",
        check_relocated(&objects, NAMESPACE),
        "serves holdfast's own namespace other",
    );
    Ok(())
}

fn of_kind_mut<'a>(objects: &'a mut [Value], wanted: &str) -> Vec<&'a mut Value> {
    objects
        .iter_mut()
        .filter(|o| o.get("kind").and_then(Value::as_str) == Some(wanted))
        .collect()
}
