//! When to renew, and how to rotate the CA without breaking clients. Pure functions: the caller
//! supplies `now`, so every edge case is unit-testable and the controller decides when to act.
//!
//! CA rotation, in order (the `caBundle` may hold several CAs concatenated):
//! 1. when the current CA [`needs_renewal`], generate a new one and publish
//!    [`add_to_bundle`]`(published_bundle, &new_ca, now)` into every webhook configuration;
//! 2. only after the API servers have that bundle, sign the next serving leaf with the new CA
//!    (check with [`verify_chain`] against the published bundle before swapping it in);
//! 3. old CAs stay in the bundle until they expire, and [`prune_expired`] drops them. Because a
//!    leaf never outlives its CA (see [`crate::issue`]), nothing still served needs an expired CA.

use std::{sync::Arc, time::Duration as StdDuration};

use rustls::{
    client::{WebPkiServerVerifier, danger::ServerCertVerifier},
    pki_types::{ServerName, UnixTime},
};
use time::OffsetDateTime;

use crate::{
    CertError, CertificateAuthority,
    pem::{certs_from_pem, der_to_pem, validity_of_der},
    trust::{ring_provider, root_store},
};

/// Renew once 2/3 of the lifetime has passed (cert-manager's default): a 90-day leaf is renewed
/// after 60 days, leaving 30 days to notice and fix a failing renewal before it expires.
pub const DEFAULT_RENEW_AT_FRACTION: f64 = 2.0 / 3.0;

/// A certificate's validity period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// Not valid before this instant.
    pub not_before: OffsetDateTime,
    /// Not valid after this instant.
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// The validity of the first `CERTIFICATE` in `pem` (the leaf, for a chain).
    pub fn from_pem(pem: &str) -> Result<Self, CertError> {
        const WHAT: &str = "certificate";
        let certs = certs_from_pem(pem, WHAT)?;
        let der = certs.first().ok_or(CertError::NoCertificate { what: WHAT })?;
        let (not_before, not_after) = validity_of_der(der, WHAT)?;
        Ok(Self {
            not_before,
            not_after,
        })
    }

    /// See [`needs_renewal`].
    pub fn needs_renewal(&self, now: OffsetDateTime, renew_at_fraction: f64) -> bool {
        needs_renewal(self.not_before, self.not_after, now, renew_at_fraction)
    }

    /// See [`renewal_time`].
    pub fn renewal_time(&self, renew_at_fraction: f64) -> OffsetDateTime {
        renewal_time(self.not_before, self.not_after, renew_at_fraction)
    }

    /// True once `now` is past `notAfter` (X.509 validity is inclusive of `notAfter`).
    pub fn is_expired(&self, now: OffsetDateTime) -> bool {
        now > self.not_after
    }
}

/// The instant at which a certificate should be renewed:
/// `not_before + renew_at_fraction × (not_after − not_before)`.
///
/// `renew_at_fraction` is clamped to `[0, 1]`; NaN means [`DEFAULT_RENEW_AT_FRACTION`], so a
/// bad configuration value can neither panic nor make us re-issue in a loop.
pub fn renewal_time(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    renew_at_fraction: f64,
) -> OffsetDateTime {
    if not_after <= not_before {
        return not_before;
    }
    let fraction = if renew_at_fraction.is_nan() {
        DEFAULT_RENEW_AT_FRACTION
    } else {
        renew_at_fraction.clamp(0.0, 1.0)
    };
    // Within [0, lifetime], so the multiplication and the addition cannot overflow.
    not_before + (not_after - not_before) * fraction
}

/// Whether a certificate valid from `not_before` to `not_after` should be renewed at `now`.
///
/// True when `now` has reached [`renewal_time`], and also when the certificate is not valid
/// yet (`now < not_before`: our clock moved back or someone issued it in the future; a
/// replacement is backdated, so this cannot loop) or its period is empty or inverted.
pub fn needs_renewal(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    now: OffsetDateTime,
    renew_at_fraction: f64,
) -> bool {
    if not_after <= not_before || now < not_before {
        return true;
    }
    now >= renewal_time(not_before, not_after, renew_at_fraction)
}

/// The PEM `caBundle` trusting all of `cas` (in order, duplicates removed).
pub fn ca_bundle(cas: &[&CertificateAuthority]) -> String {
    let mut out = String::new();
    for ca in cas {
        let pem = ca.cert_pem().trim_end();
        if !out.contains(pem) {
            out.push_str(pem);
            out.push('\n');
        }
    }
    out
}

/// The validity of every certificate in a PEM bundle, in order.
pub fn bundle_validities(bundle_pem: &str) -> Result<Vec<Validity>, CertError> {
    certs_from_pem(bundle_pem, "caBundle")?
        .iter()
        .map(|der| {
            validity_of_der(der, "caBundle").map(|(not_before, not_after)| Validity {
                not_before,
                not_after,
            })
        })
        .collect()
}

/// `bundle_pem` without the certificates that have expired at `now`.
///
/// Errors (rather than silently dropping) if any block does not parse, so a corrupted bundle is
/// noticed instead of being "pruned" down to nothing. The output is re-encoded canonically.
/// May return an empty string if every CA has expired.
pub fn prune_expired(bundle_pem: &str, now: OffsetDateTime) -> Result<String, CertError> {
    let mut out = String::new();
    for der in certs_from_pem(bundle_pem, "caBundle")? {
        let (not_before, not_after) = validity_of_der(&der, "caBundle")?;
        if !(Validity {
            not_before,
            not_after,
        })
        .is_expired(now)
        {
            out.push_str(&der_to_pem(&der));
        }
    }
    Ok(out)
}

/// The rotation step: `bundle_pem` pruned of expired CAs, with `ca` appended if not yet present.
/// An empty `bundle_pem` (nothing published yet) gives a bundle of just `ca`.
pub fn add_to_bundle(
    bundle_pem: &str,
    ca: &CertificateAuthority,
    now: OffsetDateTime,
) -> Result<String, CertError> {
    let mut out = if bundle_pem.trim().is_empty() {
        String::new()
    } else {
        prune_expired(bundle_pem, now)?
    };
    let existing = if out.is_empty() {
        Vec::new()
    } else {
        certs_from_pem(&out, "caBundle")?
    };
    for der in certs_from_pem(ca.cert_pem(), "CA certificate")? {
        if !existing.contains(&der) {
            out.push_str(&der_to_pem(&der));
        }
    }
    Ok(out)
}

/// Verifies, as a TLS client would (webpki, ring), that `chain_pem` (leaf first) is valid for
/// `server_name` (a DNS name or an IP address) at `now` when trusting `bundle_pem`.
///
/// Use before serving a new leaf: it catches "signed by a CA the API server does not trust yet".
pub fn verify_chain(
    bundle_pem: &str,
    chain_pem: &str,
    server_name: &str,
    now: OffsetDateTime,
) -> Result<(), CertError> {
    let verifier =
        WebPkiServerVerifier::builder_with_provider(Arc::new(root_store(bundle_pem)?), ring_provider())
            .build()
            .map_err(|e| CertError::TlsConfig(rustls::Error::General(e.to_string())))?;
    let chain = certs_from_pem(chain_pem, "serving certificate")?;
    let (leaf, intermediates) = chain.split_first().ok_or(CertError::NoCertificate {
        what: "serving certificate",
    })?;
    let name = ServerName::try_from(server_name.to_owned())
        .map_err(|_| CertError::InvalidServerName(server_name.to_owned()))?;
    let secs = u64::try_from(now.unix_timestamp()).unwrap_or(0);
    verifier
        .verify_server_cert(
            leaf,
            intermediates,
            &name,
            &[],
            UnixTime::since_unix_epoch(StdDuration::from_secs(secs)),
        )
        .map(|_| ())
        .map_err(|source| CertError::Verify {
            server_name: server_name.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use time::Duration;

    use super::*;
    use crate::{CaOptions, ServingOptions};

    fn t(s: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + Duration::days(20_000) + Duration::seconds(s)
    }

    #[test]
    fn needs_renewal_edges() {
        let (nb, na) = (t(0), t(90));
        let f = DEFAULT_RENEW_AT_FRACTION;
        assert!(!needs_renewal(nb, na, t(0), f), "fresh");
        assert!(!needs_renewal(nb, na, t(59), f), "just before 2/3");
        assert!(needs_renewal(nb, na, t(60), f), "exactly at 2/3");
        assert!(needs_renewal(nb, na, t(89), f));
        assert!(needs_renewal(nb, na, t(90), f), "at notAfter");
        assert!(needs_renewal(nb, na, t(1000), f), "long expired");
        assert!(needs_renewal(nb, na, t(-1), f), "not yet valid");
        assert!(needs_renewal(nb, nb, t(0), f), "empty period");
        assert!(needs_renewal(na, nb, t(45), f), "inverted period");
    }

    #[test]
    fn needs_renewal_fraction_is_clamped_and_nan_safe() {
        let (nb, na) = (t(0), t(90));
        assert!(needs_renewal(nb, na, t(0), 0.0), "0 means always");
        assert!(needs_renewal(nb, na, t(0), -3.0), "negative clamps to 0");
        assert!(!needs_renewal(nb, na, t(89), 1.0), "1 means at expiry");
        assert!(!needs_renewal(nb, na, t(89), 7.0), "above 1 clamps to 1");
        assert!(needs_renewal(nb, na, t(90), 1.0));
        assert!(!needs_renewal(nb, na, t(59), f64::NAN), "NaN uses the default");
        assert!(needs_renewal(nb, na, t(60), f64::NAN));
        assert!(!needs_renewal(nb, na, t(44), 0.5));
        assert!(needs_renewal(nb, na, t(45), 0.5));
        assert_eq!(renewal_time(nb, na, f64::INFINITY), na);
    }

    #[test]
    fn renewal_time_of_the_defaults_is_day_60() {
        let nb = t(0);
        let v = Validity {
            not_before: nb,
            not_after: nb + crate::DEFAULT_SERVING_VALIDITY,
        };
        assert_eq!(v.renewal_time(DEFAULT_RENEW_AT_FRACTION), nb + Duration::days(60));
    }

    #[test]
    fn bundle_with_two_cas_verifies_leaves_of_both() {
        let old = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let new = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let opts = ServingOptions::for_service("holdfast-webhook", "holdfast");
        let leaf_old = old.issue_serving(&opts).unwrap();
        let leaf_new = new.issue_serving(&opts).unwrap();
        let bundle = ca_bundle(&[&old, &new]);
        assert_eq!(bundle_validities(&bundle).unwrap().len(), 2);
        let now = OffsetDateTime::now_utc();
        for leaf in [&leaf_old, &leaf_new] {
            verify_chain(&bundle, &leaf.cert_pem, "holdfast-webhook.holdfast.svc", now).unwrap();
        }
        // Either CA alone only verifies its own leaf (same subject name, different key).
        assert!(
            verify_chain(
                old.cert_pem(),
                &leaf_new.cert_pem,
                "holdfast-webhook.holdfast.svc",
                now
            )
            .is_err()
        );
        assert!(
            verify_chain(
                new.cert_pem(),
                &leaf_old.cert_pem,
                "holdfast-webhook.holdfast.svc",
                now
            )
            .is_err()
        );
    }

    #[test]
    fn ca_bundle_deduplicates() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        assert_eq!(ca_bundle(&[&ca, &ca]), ca_bundle(&[&ca]));
        assert_eq!(bundle_validities(&ca_bundle(&[&ca, &ca])).unwrap().len(), 1);
        assert_eq!(ca_bundle(&[]), "");
    }

    /// A one-day CA issued three days before `now`.
    fn expired_ca(now: OffsetDateTime) -> CertificateAuthority {
        let opts = CaOptions {
            validity: Duration::days(1),
            ..CaOptions::default()
        };
        CertificateAuthority::generate_at(&opts, now - Duration::days(3)).unwrap()
    }

    #[test]
    fn pruning_drops_the_expired_ca() {
        let now = OffsetDateTime::now_utc();
        let expired = expired_ca(now);
        let current = CertificateAuthority::generate_at(&CaOptions::default(), now).unwrap();
        let bundle = ca_bundle(&[&expired, &current]);
        let pruned = prune_expired(&bundle, now).unwrap();
        let left = certs_from_pem(&pruned, "test").unwrap();
        assert_eq!(left, certs_from_pem(current.cert_pem(), "test").unwrap());
        // Pruning is idempotent, and a fully expired bundle prunes to empty.
        assert_eq!(prune_expired(&pruned, now).unwrap(), pruned);
        assert_eq!(prune_expired(expired.cert_pem(), now).unwrap(), "");
        assert!(prune_expired("garbage", now).is_err());
    }

    #[test]
    fn add_to_bundle_rotates() {
        let now = OffsetDateTime::now_utc();
        let expired = expired_ca(now);
        let old =
            CertificateAuthority::generate_at(&CaOptions::default(), now - Duration::days(400)).unwrap();
        let new = CertificateAuthority::generate_at(&CaOptions::default(), now).unwrap();

        let first = add_to_bundle("", &old, now).unwrap();
        assert_eq!(bundle_validities(&first).unwrap(), vec![old.validity()]);
        let published = ca_bundle(&[&expired, &old]);
        let rotated = add_to_bundle(&published, &new, now).unwrap();
        assert_eq!(
            bundle_validities(&rotated).unwrap(),
            vec![old.validity(), new.validity()]
        );
        // Re-running the step changes nothing (safe to retry after a failed patch).
        assert_eq!(add_to_bundle(&rotated, &new, now).unwrap(), rotated);
    }

    #[test]
    fn verify_chain_checks_time() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let leaf = ca.issue_serving(&ServingOptions::for_service("s", "n")).unwrap();
        let bundle = ca_bundle(&[&ca]);
        verify_chain(
            &bundle,
            &leaf.cert_pem,
            "s.n.svc",
            leaf.not_before + Duration::days(1),
        )
        .unwrap();
        let late = leaf.not_after + Duration::days(1);
        assert!(matches!(
            verify_chain(&bundle, &leaf.cert_pem, "s.n.svc", late),
            Err(CertError::Verify { .. })
        ));
        assert!(matches!(
            verify_chain(&bundle, &leaf.cert_pem, "not a name", late),
            Err(CertError::InvalidServerName(_))
        ));
    }

    #[test]
    fn validity_from_pem_reads_the_leaf() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let leaf = ca.issue_serving(&ServingOptions::for_service("s", "n")).unwrap();
        let chain = format!("{}{}", leaf.cert_pem, ca.cert_pem());
        assert_eq!(Validity::from_pem(&chain).unwrap(), leaf.validity());
        assert!(!leaf.validity().is_expired(leaf.not_after));
        assert!(leaf.validity().is_expired(leaf.not_after + Duration::seconds(1)));
    }
}
