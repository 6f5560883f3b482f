//! A registry on TLS with a private CA (an on-prem Harbor behind a corporate CA): without the
//! CA the resolver fails with a certificate error that says so and sends nothing; with it the
//! tag resolves; and the CA can be given, or replaced, while the resolver runs.

#![allow(clippy::unwrap_used)] // test helpers

mod support;

use holdfast_registry::{Credentials, ExtraRoots, ResolveError, ResolverBuildError};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use support::{FakeRegistry, expected_digest, reference, resolver_for};

/// A registry serving a certificate for 127.0.0.1 issued by a CA of its own; that CA's PEM.
async fn registry_with_private_ca() -> (FakeRegistry, String) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "corp registry CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let registry = FakeRegistry::start_tls(leaf.pem(), key.serialize_pem()).await;
    (registry, ca.pem())
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_certificate_error_naming_the_reason() {
    let (registry, _) = registry_with_private_ca().await;
    let resolver = resolver_for(&registry, |c| c.insecure_registries.clear());
    let err = resolver
        .resolve_digest(&reference(&registry, "plain/app:v1"), &Credentials::anonymous())
        .await
        .unwrap_err();
    let ResolveError::Certificate { detail, .. } = &err else {
        panic!("not a certificate error: {err:?}");
    };
    assert!(detail.contains("UnknownIssuer"), "{detail}");
    assert_eq!(err.kind(), "certificate");
    assert!(err.to_string().contains("--registry-ca-file"), "{err}");
    // Pins already held keep being served while the bundle is fixed.
    assert!(err.is_transient());
    assert!(
        registry.requests().is_empty(),
        "no request got past the handshake"
    );
}

#[tokio::test]
async fn the_private_ca_given_the_tag_resolves_over_https() {
    let (registry, ca) = registry_with_private_ca().await;
    let resolver = resolver_for(&registry, |c| {
        c.insecure_registries.clear();
        c.extra_roots = ExtraRoots::from_pem(&[ca.as_bytes()]).unwrap();
    });
    let digest = resolver
        .resolve_digest(&reference(&registry, "plain/app:v1"), &Credentials::anonymous())
        .await
        .unwrap();
    assert_eq!(digest, expected_digest("plain/app"));
}

#[tokio::test]
async fn roots_replaced_while_running_apply_to_the_next_request_and_a_bad_bundle_changes_nothing() {
    let (registry, ca) = registry_with_private_ca().await;
    let roots = ExtraRoots::default();
    let resolver = resolver_for(&registry, |c| {
        c.insecure_registries.clear();
        c.extra_roots = roots.clone();
    });
    // A resolver built later from the same configuration (the controller's next term) shares them.
    let later = resolver_for(&registry, |c| {
        c.insecure_registries.clear();
        c.extra_roots = roots.clone();
    });
    let app = reference(&registry, "plain/app:v1");
    let anonymous = Credentials::anonymous();
    assert!(matches!(
        resolver.resolve_digest(&app, &anonymous).await,
        Err(ResolveError::Certificate { .. })
    ));

    for bad in [&b"not a certificate"[..], b""] {
        let replaced = roots.replace(&[bad]);
        assert!(
            matches!(replaced, Err(ResolverBuildError::Certificate(_))),
            "{replaced:?}"
        );
    }
    assert_eq!(roots.generation(), 0, "a bad bundle replaced nothing");
    assert!(matches!(
        resolver.resolve_digest(&app, &anonymous).await,
        Err(ResolveError::Certificate { .. })
    ));

    assert_eq!(roots.replace(&[ca.as_bytes()]).unwrap(), 1);
    for resolver in [&resolver, &later] {
        assert_eq!(
            resolver.resolve_digest(&app, &anonymous).await.unwrap(),
            expected_digest("plain/app")
        );
    }

    // Another CA only: this registry is untrusted again, on a new connection.
    let (_, other) = registry_with_private_ca().await;
    roots.replace(&[other.as_bytes()]).unwrap();
    assert!(matches!(
        resolver
            .resolve_digest(&reference(&registry, "plain/app:v2"), &anonymous)
            .await,
        Err(ResolveError::Certificate { .. })
    ));
}
