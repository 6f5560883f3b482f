//! Issue 35: cert-manager CA renewal swapped the trust anchor without overlap. cert-manager's CA
//! injector writes one CA into the webhook configurations' `caBundle`: the `ca.crt` of the
//! serving certificate's Secret, which changes only when the leaf is re-issued, at the same moment
//! as the leaf, while the webhook pods reload the leaf on their own schedule (`--tls-poll-seconds`)
//! and the API server its webhook clients on its own. With a new CA key at every CA renewal
//! (`rotationPolicy: Always`), a leaf of the new CA met a `caBundle` of the old one (or the
//! reverse) in that window. With the CA's key kept (`rotationPolicy: Never`), the renewed CA has
//! the same subject and key: each CA certificate, old or new, verifies every leaf either issued,
//! so the order of the swaps no longer matters.
//!
//! Here the CA of `components/cert-manager` is renewed the way its Certificate says
//! (key kept or not), and rustls's verifier is asked about each leaf under each `caBundle`.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use holdfast_certs::{CaOptions, CertificateAuthority, ServingOptions, ring_provider, root_store};
use holdfast_manifest_checks::{
    load::{load_kustomization, manifests},
    yaml::{at, find, of_kind, text},
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::{
    client::{WebPkiServerVerifier, danger::ServerCertVerifier},
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
};
use serde_yaml::Value;

const DNS: &str = "holdfast-webhook.holdfast-system.svc";

/// The CA renewed as cert-manager renews a self-signed CA Certificate: same subject, a new key
/// unless `keep_key`.
fn renew(ca: &CertificateAuthority, common_name: &str, keep_key: bool) -> Result<CertificateAuthority> {
    let key = if keep_key {
        KeyPair::from_pem(ca.key_pem())?
    } else {
        KeyPair::generate()?
    };
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let renewed = CertifiedIssuer::self_signed(params, key)?;
    Ok(CertificateAuthority::from_pem(
        &renewed.pem(),
        &renewed.key().serialize_pem(),
    )?)
}

/// Whether a `caBundle` of `bundle` lets the API server trust `leaf_pem` for the Service name.
fn trusted(bundle: &CertificateAuthority, leaf_pem: &str) -> Result<bool> {
    let roots = Arc::new(root_store(bundle.cert_pem())?);
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, ring_provider()).build()?;
    let leaf = CertificateDer::from_pem_slice(leaf_pem.as_bytes())?;
    let name = ServerName::try_from(DNS.to_owned())?;
    Ok(verifier
        .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
        .is_ok())
}

/// Hours of a cert-manager duration written as `NNNh`.
fn hours(value: &str) -> Result<u64> {
    value
        .strip_suffix('h')
        .and_then(|h| h.parse().ok())
        .with_context(|| format!("{value:?} is not NNNh"))
}

/// Every leaf, before and after a CA renewal, is trusted under every `caBundle` of the window.
fn overlap_holds(keep_key: bool, common_name: &str) -> Result<Vec<String>> {
    let old_ca = CertificateAuthority::generate(&CaOptions::default())?;
    let old_ca = renew(&old_ca, common_name, true)?; // the subject the manifest gives
    let new_ca = renew(&old_ca, common_name, keep_key)?;
    let opts = ServingOptions::for_service("holdfast-webhook", "holdfast-system");
    let old_leaf = old_ca.issue_serving(&opts)?;
    let new_leaf = new_ca.issue_serving(&opts)?;
    let mut failures = Vec::new();
    for (bundle, bundle_name) in [(&old_ca, "the old CA"), (&new_ca, "the renewed CA")] {
        for (leaf, leaf_name) in [(&old_leaf, "the old leaf"), (&new_leaf, "the new leaf")] {
            if !trusted(bundle, &leaf.cert_pem)? {
                failures.push(format!("a caBundle of {bundle_name} does not trust {leaf_name}"));
            }
        }
    }
    Ok(failures)
}

fn the_ca(objects: &[Value]) -> Result<&Value> {
    let leaf = find(objects, "Certificate", "holdfast-webhook")?;
    let issuer = find(objects, "Issuer", text(leaf, "spec.issuerRef.name"))?;
    let secret = text(issuer, "spec.ca.secretName");
    of_kind(objects, "Certificate")
        .into_iter()
        .find(|c| text(c, "spec.secretName") == secret)
        .context("no CA Certificate")
}

#[test]
fn a_cert_manager_ca_renewal_keeps_every_leaf_trusted_through_the_swap() -> Result<()> {
    let objects = load_kustomization(&manifests().join("components/cert-manager"))?;
    let ca = the_ca(&objects)?;
    let policy = text(ca, "spec.privateKey.rotationPolicy");
    ensure!(
        policy == "Never",
        "the CA Certificate's privateKey.rotationPolicy is {policy:?}: a renewal changes the trust anchor"
    );
    let failures = overlap_holds(policy == "Never", text(ca, "spec.commonName"))?;
    ensure!(failures.is_empty(), "{failures:?}");

    // The old CA outlives every leaf it issued: it is renewed (renewBefore) earlier than a leaf
    // lives (duration), so a leaf issued just before the renewal is re-issued by the renewed CA
    // while the old CA is still valid.
    let leaf = find(&objects, "Certificate", "holdfast-webhook")?;
    let (ca_before, leaf_life, leaf_before) = (
        hours(text(ca, "spec.renewBefore"))?,
        hours(text(leaf, "spec.duration"))?,
        hours(text(leaf, "spec.renewBefore"))?,
    );
    ensure!(
        ca_before > leaf_life && leaf_before < leaf_life,
        "the CA is renewed {ca_before} h before its expiry, a leaf lives {leaf_life} h (renewed {leaf_before} h before)"
    );
    ensure!(
        at(leaf, "spec.privateKey.rotationPolicy").and_then(Value::as_str) == Some("Always"),
        "the leaf's key is not rotated"
    );
    Ok(())
}

/// The check can fail: with a new CA key at renewal, the leaves of the old CA and of the new
/// one are not trusted across the swap.
#[test]
fn a_ca_renewed_with_a_new_key_breaks_trust_across_the_swap() -> Result<()> {
    let failures = overlap_holds(false, "holdfast-webhook-ca")?;
    ensure!(
        failures
            .iter()
            .any(|f| f.contains("old CA does not trust the new leaf"))
            && failures
                .iter()
                .any(|f| f.contains("renewed CA does not trust the old leaf")),
        "{failures:?}"
    );
    Ok(())
}
