//! Issuing the self-managed CA and the webhook's serving certificates (rcgen 0.14).
//!
//! Defaults and why:
//! - **CA: 5 years** ([`DEFAULT_CA_VALIDITY`]). The CA's certificate is copied into every webhook
//!   configuration's `caBundle`, so rotating it is the expensive step (publish new CA, wait, then
//!   switch leaves); doing that every ~3 years (renewed at 2/3, see
//!   [`crate::rotation::DEFAULT_RENEW_AT_FRACTION`]) keeps it rare, while staying well below the
//!   10-year CAs that tend to be forgotten until they expire.
//! - **Serving leaf: 90 days** ([`DEFAULT_SERVING_VALIDITY`]), renewed after 60 days. Short enough
//!   that a leaked key is useful only briefly, long enough that a controller outage of weeks
//!   does not take the webhook down; cert-manager uses the same 90-day default.
//! - **Backdating by 5 minutes** ([`BACKDATE`]): `notBefore` is set slightly in the past so an API
//!   server whose clock lags ours does not reject a fresh certificate as "not yet valid".
//! - **A leaf never outlives its CA**: its `notAfter` is clamped to the CA's. That is what makes
//!   [`crate::rotation::prune_expired`] safe: once a CA has expired, every leaf it signed has too.
//! - Keys are **ECDSA P-256** (rcgen's default): small, fast, accepted by every Kubernetes client.

use std::{collections::BTreeMap, fmt, net::IpAddr};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::{
    CertError,
    pem::{certs_from_pem, der_to_pem, private_key_from_pem, validity_of_der, with_x509},
    resolver::fingerprint,
    rotation::Validity,
};

/// Common name of the self-managed CA.
pub const CA_COMMON_NAME: &str = "holdfast-ca";
/// Default CA lifetime: 5 years (see the module docs).
pub const DEFAULT_CA_VALIDITY: Duration = Duration::days(5 * 365);
/// Default serving certificate lifetime: 90 days (see the module docs).
pub const DEFAULT_SERVING_VALIDITY: Duration = Duration::days(90);
/// How far `notBefore` is set in the past, to tolerate clock skew with the API server.
pub const BACKDATE: Duration = Duration::minutes(5);

/// Secret data key of the CA certificate (also what cert-manager writes into serving Secrets).
pub const SECRET_CA_CERT: &str = "ca.crt";
/// Secret data key of the CA private key.
pub const SECRET_CA_KEY: &str = "ca.key";
/// Secret data key of the serving certificate chain (`kubernetes.io/tls`).
pub const SECRET_TLS_CERT: &str = "tls.crt";
/// Secret data key of the serving private key (`kubernetes.io/tls`).
pub const SECRET_TLS_KEY: &str = "tls.key";

/// The CN must fit X.509's 64-character upper bound; longer names only go into the SANs.
const MAX_COMMON_NAME_LEN: usize = 64;

/// How to issue a CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaOptions {
    /// Subject common name; [`CA_COMMON_NAME`] by default.
    pub common_name: String,
    /// Lifetime from now; [`DEFAULT_CA_VALIDITY`] by default.
    pub validity: Duration,
}

impl Default for CaOptions {
    fn default() -> Self {
        Self {
            common_name: CA_COMMON_NAME.to_owned(),
            validity: DEFAULT_CA_VALIDITY,
        }
    }
}

/// What a serving certificate is valid for, and for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServingOptions {
    /// DNS subject alternative names, e.g. from [`service_dns_names`].
    pub dns_names: Vec<String>,
    /// IP subject alternative names, e.g. `127.0.0.1` when the API server calls a local URL.
    pub ip_addresses: Vec<IpAddr>,
    /// Lifetime from now (clamped to the CA's `notAfter`); [`DEFAULT_SERVING_VALIDITY`] by default.
    pub validity: Duration,
}

impl ServingOptions {
    /// The names the API server uses to reach `service` in `namespace` (see [`service_dns_names`]).
    pub fn for_service(service: &str, namespace: &str) -> Self {
        Self {
            dns_names: service_dns_names(service, namespace),
            ip_addresses: Vec::new(),
            validity: DEFAULT_SERVING_VALIDITY,
        }
    }

    /// Adds an IP SAN (for `clientConfig.url: https://127.0.0.1:PORT/...` in local tests).
    #[must_use]
    pub fn with_ip(mut self, ip: IpAddr) -> Self {
        self.ip_addresses.push(ip);
        self
    }

    /// Adds a DNS SAN.
    #[must_use]
    pub fn with_dns_name(mut self, name: impl Into<String>) -> Self {
        self.dns_names.push(name.into());
        self
    }

    /// Overrides the lifetime.
    #[must_use]
    pub fn with_validity(mut self, validity: Duration) -> Self {
        self.validity = validity;
        self
    }
}

/// `<svc>.<ns>.svc` (what the API server dials for a `service` clientConfig) and
/// `<svc>.<ns>.svc.cluster.local` (what in-cluster clients using the search path may verify).
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// A CA certificate and its private key, as PEM. Constructed only through [`Self::generate`] or
/// the validating [`Self::from_pem`], so the pair is always consistent and really a CA.
#[derive(Clone, PartialEq, Eq)]
pub struct CertificateAuthority {
    cert_pem: String,
    key_pem: String,
    validity: Validity,
}

impl CertificateAuthority {
    /// Issues a new self-signed CA valid from now.
    pub fn generate(opts: &CaOptions) -> Result<Self, CertError> {
        Self::generate_at(opts, OffsetDateTime::now_utc())
    }

    /// Issues a new self-signed CA valid from `now` (minus [`BACKDATE`]); `now` is explicit for tests.
    ///
    /// ECDSA P-256, `basicConstraints: cA=TRUE, pathLen=0` (it may only sign leaves, so a leaked
    /// leaf key can never mint certificates), key usages `keyCertSign` + `cRLSign`.
    pub fn generate_at(opts: &CaOptions, now: OffsetDateTime) -> Result<Self, CertError> {
        if opts.validity <= Duration::ZERO {
            return Err(CertError::InvalidValidity { what: "CA" });
        }
        let now = whole_seconds(now);
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, opts.common_name.as_str());
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = now - BACKDATE;
        params.not_after = now + opts.validity;
        let validity = Validity {
            not_before: params.not_before,
            not_after: params.not_after,
        };

        let key = KeyPair::generate().map_err(CertError::KeyGeneration)?;
        let issuer = CertifiedIssuer::self_signed(params, key)
            .map_err(|source| CertError::Sign { what: "CA", source })?;
        Ok(Self {
            cert_pem: der_to_pem(issuer.der()),
            key_pem: issuer.key().serialize_pem(),
            validity,
        })
    }

    /// Loads a stored CA (e.g. from a Secret) so leaves can be re-issued from it. Only the first
    /// certificate of `cert_pem` is used.
    ///
    /// Checks that the certificate is a CA and that the key belongs to it, so a mixed-up Secret
    /// fails here rather than producing leaves that no client accepts. The key must be PKCS#8
    /// (what [`Self::generate`] writes).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        const WHAT: &str = "CA certificate";
        let certs = certs_from_pem(cert_pem, WHAT)?;
        let der = certs.first().ok_or(CertError::NoCertificate { what: WHAT })?;
        let (is_ca, spki) = with_x509(der, WHAT, |c| (c.is_ca(), c.public_key().raw.to_vec()))?;
        if !is_ca {
            return Err(CertError::NotACa);
        }
        let key =
            KeyPair::from_pem(key_pem).map_err(|source| CertError::PrivateKey { what: "CA", source })?;
        if key.subject_public_key_info() != spki {
            return Err(CertError::KeyMismatch { what: "CA" });
        }
        let (not_before, not_after) = validity_of_der(der, WHAT)?;
        // Fail now, not at the next renewal, if rcgen cannot use it as an issuer.
        Issuer::from_ca_cert_der(der, key).map_err(CertError::CaIssuer)?;
        Ok(Self {
            cert_pem: der_to_pem(der),
            key_pem: key_pem.to_owned(),
            validity: Validity {
                not_before,
                not_after,
            },
        })
    }

    /// Loads a CA from Secret data (keys [`SECRET_CA_CERT`], [`SECRET_CA_KEY`]).
    ///
    /// Takes any `(key, bytes)` pairs so this crate needs no Kubernetes types: with k8s-openapi,
    /// pass `secret.data.iter().flatten().map(|(k, v)| (k, &v.0))`.
    pub fn from_secret_data<K, V>(data: impl IntoIterator<Item = (K, V)>) -> Result<Self, CertError>
    where
        K: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let [cert, key] = secret_fields(data, [SECRET_CA_CERT, SECRET_CA_KEY])?;
        Self::from_pem(&cert, &key)
    }

    /// Secret data for this CA: [`SECRET_CA_CERT`] and [`SECRET_CA_KEY`] as PEM strings.
    pub fn to_secret_data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (SECRET_CA_CERT.to_owned(), self.cert_pem.clone()),
            (SECRET_CA_KEY.to_owned(), self.key_pem.clone()),
        ])
    }

    /// The CA certificate (public; what goes into a `caBundle`).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, PKCS#8 PEM. Secret: never log it.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The CA certificate's validity period.
    pub fn validity(&self) -> Validity {
        self.validity
    }

    /// SHA-256 of the CA certificate's DER, lowercase hex (to identify a CA in logs).
    pub fn fingerprint(&self) -> Result<String, CertError> {
        let certs = certs_from_pem(&self.cert_pem, "CA certificate")?;
        Ok(certs.first().map(|c| fingerprint(c)).unwrap_or_default())
    }

    /// Issues a serving certificate valid from now.
    pub fn issue_serving(&self, opts: &ServingOptions) -> Result<ServingCert, CertError> {
        self.issue_serving_at(opts, OffsetDateTime::now_utc())
    }

    /// Issues a serving certificate valid from `now` (minus [`BACKDATE`]) for the given names.
    ///
    /// Fresh ECDSA P-256 key every time (no key reuse across renewals), extended key usage
    /// `serverAuth`, key usage `digitalSignature`, and an authority key identifier so clients
    /// can pick the right CA while two CAs with the same name share a `caBundle` during rotation.
    pub fn issue_serving_at(
        &self,
        opts: &ServingOptions,
        now: OffsetDateTime,
    ) -> Result<ServingCert, CertError> {
        if opts.validity <= Duration::ZERO {
            return Err(CertError::InvalidValidity { what: "serving" });
        }
        if opts.dns_names.is_empty() && opts.ip_addresses.is_empty() {
            return Err(CertError::NoSubjectAltNames);
        }
        let now = whole_seconds(now);
        let not_before = now - BACKDATE;
        let not_after = (now + opts.validity).min(self.validity.not_after);
        if not_after <= not_before.max(now) {
            return Err(CertError::CaExpired {
                not_after: self.validity.not_after,
            });
        }

        let mut params = CertificateParams::default();
        let mut sans = Vec::with_capacity(opts.dns_names.len() + opts.ip_addresses.len());
        for name in &opts.dns_names {
            // rcgen only checks for IA5 (ASCII); webpki's parser rejects what no client would match.
            let invalid = || CertError::InvalidName { name: name.clone() };
            rustls::pki_types::DnsName::try_from(name.as_str()).map_err(|_| invalid())?;
            let dns = name.clone().try_into().map_err(|_| invalid())?;
            sans.push(SanType::DnsName(dns));
        }
        sans.extend(opts.ip_addresses.iter().copied().map(SanType::IpAddress));
        params.subject_alt_names = sans;
        let cn = opts
            .dns_names
            .first()
            .cloned()
            .or_else(|| opts.ip_addresses.first().map(IpAddr::to_string))
            .filter(|cn| cn.len() <= MAX_COMMON_NAME_LEN)
            .unwrap_or_else(|| "holdfast-serving".to_owned());
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before;
        params.not_after = not_after;

        let ca_key = KeyPair::from_pem(&self.key_pem)
            .map_err(|source| CertError::PrivateKey { what: "CA", source })?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key).map_err(CertError::CaIssuer)?;
        let key = KeyPair::generate().map_err(CertError::KeyGeneration)?;
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(|source| CertError::Sign {
                what: "serving",
                source,
            })?;
        Ok(ServingCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_before,
            not_after,
        })
    }
}

/// Redacts the key: this type ends up in `tracing` fields and panic messages.
impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("validity", &self.validity)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// A serving certificate chain (leaf first) and its private key, as PEM, with the leaf's
/// validity so renewal can be decided without re-parsing.
#[derive(Clone, PartialEq, Eq)]
pub struct ServingCert {
    /// Leaf certificate, optionally followed by intermediates (cert-manager writes chains).
    pub cert_pem: String,
    /// Private key (PKCS#8, SEC1 or PKCS#1 PEM). Secret: never log it.
    pub key_pem: String,
    /// The leaf's `notBefore`.
    pub not_before: OffsetDateTime,
    /// The leaf's `notAfter`.
    pub not_after: OffsetDateTime,
}

impl ServingCert {
    /// Parses a certificate chain + key pair (e.g. cert-manager's `tls.crt`/`tls.key`),
    /// taking the validity from the first (leaf) certificate.
    ///
    /// Only checks that both parse; whether the key matches is checked by rustls when the pair
    /// is loaded into [`crate::resolver::SwappableCert`].
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        const WHAT: &str = "serving certificate";
        let certs = certs_from_pem(cert_pem, WHAT)?;
        let leaf = certs.first().ok_or(CertError::NoCertificate { what: WHAT })?;
        let (not_before, not_after) = validity_of_der(leaf, WHAT)?;
        private_key_from_pem(key_pem, "serving private key")?;
        Ok(Self {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            not_before,
            not_after,
        })
    }

    /// Loads a serving certificate from `kubernetes.io/tls` Secret data ([`SECRET_TLS_CERT`],
    /// [`SECRET_TLS_KEY`]); see [`CertificateAuthority::from_secret_data`] for the input shape.
    pub fn from_secret_data<K, V>(data: impl IntoIterator<Item = (K, V)>) -> Result<Self, CertError>
    where
        K: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let [cert, key] = secret_fields(data, [SECRET_TLS_CERT, SECRET_TLS_KEY])?;
        Self::from_pem(&cert, &key)
    }

    /// `kubernetes.io/tls` Secret data: [`SECRET_TLS_CERT`] and [`SECRET_TLS_KEY`].
    pub fn to_secret_data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (SECRET_TLS_CERT.to_owned(), self.cert_pem.clone()),
            (SECRET_TLS_KEY.to_owned(), self.key_pem.clone()),
        ])
    }

    /// The leaf's validity period.
    pub fn validity(&self) -> Validity {
        Validity {
            not_before: self.not_before,
            not_after: self.not_after,
        }
    }

    /// SHA-256 of the leaf's DER, lowercase hex: the same value
    /// [`crate::resolver::SwappableCert::fingerprint`] reports once this is being served.
    pub fn fingerprint(&self) -> Result<String, CertError> {
        let certs = certs_from_pem(&self.cert_pem, "serving certificate")?;
        Ok(certs.first().map(|c| fingerprint(c)).unwrap_or_default())
    }
}

/// Redacts the key: this type ends up in `tracing` fields and panic messages.
impl fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServingCert")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The CA and the serving certificate it signed, stored together in one Secret (Mode B with
/// several replicas: one leader issues, every replica reads the same Secret).
///
/// Data keys: `ca.crt`, `ca.key`, `tls.crt`, `tls.key`. If the serving pods must not see the CA
/// key, mount the Secret with `items:` selecting only `tls.crt`/`tls.key`/`ca.crt`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSecret {
    /// The issuing CA (certificate and key).
    pub ca: CertificateAuthority,
    /// The serving certificate signed by `ca`.
    pub serving: ServingCert,
}

impl TlsSecret {
    /// Reads all four keys; see [`CertificateAuthority::from_secret_data`] for the input shape.
    pub fn from_secret_data<K, V>(data: impl IntoIterator<Item = (K, V)>) -> Result<Self, CertError>
    where
        K: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let [ca_cert, ca_key, tls_cert, tls_key] = secret_fields(
            data,
            [SECRET_CA_CERT, SECRET_CA_KEY, SECRET_TLS_CERT, SECRET_TLS_KEY],
        )?;
        Ok(Self {
            ca: CertificateAuthority::from_pem(&ca_cert, &ca_key)?,
            serving: ServingCert::from_pem(&tls_cert, &tls_key)?,
        })
    }

    /// All four keys as PEM strings (usable as a Secret's `stringData`, or `.into_bytes()` for `data`).
    pub fn to_secret_data(&self) -> BTreeMap<String, String> {
        let mut data = self.ca.to_secret_data();
        data.extend(self.serving.to_secret_data());
        data
    }
}

/// X.509 times have whole seconds; truncating first keeps the reported validity equal to what a
/// parser reads back from the certificate.
fn whole_seconds(t: OffsetDateTime) -> OffsetDateTime {
    t - Duration::nanoseconds(i64::from(t.nanosecond()))
}

/// Picks `wanted` keys out of Secret data as UTF-8 strings, in the order asked.
fn secret_fields<K, V, const N: usize>(
    data: impl IntoIterator<Item = (K, V)>,
    wanted: [&'static str; N],
) -> Result<[String; N], CertError>
where
    K: AsRef<str>,
    V: AsRef<[u8]>,
{
    let mut found: [Option<String>; N] = std::array::from_fn(|_| None);
    for (k, v) in data {
        if let Some(i) = wanted.iter().position(|w| *w == k.as_ref()) {
            let text = std::str::from_utf8(v.as_ref()).map_err(|_| CertError::NotUtf8(wanted[i]))?;
            found[i] = Some(text.to_owned());
        }
    }
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for (i, slot) in found.into_iter().enumerate() {
        out[i] = slot.ok_or(CertError::MissingSecretKey(wanted[i]))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    #[test]
    fn ca_has_the_documented_shape() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let der = certs_from_pem(ca.cert_pem(), "test").unwrap().remove(0);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(cert.is_ca());
        let bc = cert.basic_constraints().unwrap().unwrap().value;
        assert_eq!(bc.path_len_constraint, Some(0));
        let ku = cert.key_usage().unwrap().unwrap().value;
        assert!(ku.key_cert_sign() && ku.crl_sign());
        let cn: Vec<_> = cert
            .subject()
            .iter_common_name()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(cn, ["holdfast-ca"]);
        // ECDSA P-256 (id-ecPublicKey + prime256v1).
        assert_eq!(
            cert.public_key().algorithm.algorithm.to_id_string(),
            "1.2.840.10045.2.1"
        );
        let lifetime = ca.validity().not_after - ca.validity().not_before;
        assert_eq!(lifetime, DEFAULT_CA_VALIDITY + BACKDATE);
    }

    #[test]
    fn leaf_has_sans_eku_and_is_clamped_to_the_ca() {
        let t0 = now();
        let ca = CertificateAuthority::generate_at(
            &CaOptions {
                validity: Duration::days(30),
                ..CaOptions::default()
            },
            t0,
        )
        .unwrap();
        let opts = ServingOptions::for_service("holdfast-webhook", "holdfast")
            .with_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let leaf = ca.issue_serving_at(&opts, t0).unwrap();
        // 90 days requested, but the CA ends after 30.
        assert_eq!(leaf.not_after, ca.validity().not_after);
        assert_eq!(leaf.not_before, whole_seconds(t0) - BACKDATE);

        let der = certs_from_pem(&leaf.cert_pem, "test").unwrap().remove(0);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(!cert.is_ca());
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth);
        let san = cert.subject_alternative_name().unwrap().unwrap().value;
        let names: Vec<String> = san.general_names.iter().map(|n| n.to_string()).collect();
        assert!(
            names.contains(&"DNSName(holdfast-webhook.holdfast.svc)".to_owned()),
            "{names:?}"
        );
        assert!(names.contains(&"DNSName(holdfast-webhook.holdfast.svc.cluster.local)".to_owned()));
        assert!(
            san.general_names
                .iter()
                .any(|n| matches!(n, x509_parser::extensions::GeneralName::IPAddress([127, 0, 0, 1]))),
            "{names:?}"
        );
        // Validity parsed back from the DER agrees with what we report.
        let (nb, na) = validity_of_der(&der, "test").unwrap();
        assert_eq!((nb, na), (leaf.not_before, leaf.not_after));
    }

    #[test]
    fn default_leaf_lifetime_is_90_days() {
        let t0 = now();
        let ca = CertificateAuthority::generate_at(&CaOptions::default(), t0).unwrap();
        let leaf = ca
            .issue_serving_at(&ServingOptions::for_service("s", "n"), t0)
            .unwrap();
        assert_eq!(leaf.not_after - whole_seconds(t0), DEFAULT_SERVING_VALIDITY);
    }

    #[test]
    fn each_leaf_gets_a_fresh_key() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let opts = ServingOptions::for_service("s", "n");
        let a = ca.issue_serving(&opts).unwrap();
        let b = ca.issue_serving(&opts).unwrap();
        assert_ne!(a.key_pem, b.key_pem);
        assert_ne!(a.fingerprint().unwrap(), b.fingerprint().unwrap());
    }

    #[test]
    fn ca_round_trips_through_secret_data_and_still_issues() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let data = ca.to_secret_data();
        assert_eq!(data.keys().collect::<Vec<_>>(), ["ca.crt", "ca.key"]);
        let loaded = CertificateAuthority::from_secret_data(&data).unwrap();
        assert_eq!(loaded, ca);
        loaded
            .issue_serving(&ServingOptions::for_service("s", "n"))
            .unwrap();
        // Byte values work too (what a Secret's `data` holds).
        let bytes: Vec<(&str, Vec<u8>)> = data
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone().into_bytes()))
            .collect();
        assert_eq!(CertificateAuthority::from_secret_data(bytes).unwrap(), ca);
    }

    #[test]
    fn tls_secret_round_trips_all_four_keys() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let serving = ca.issue_serving(&ServingOptions::for_service("s", "n")).unwrap();
        let secret = TlsSecret { ca, serving };
        let data = secret.to_secret_data();
        assert_eq!(
            data.keys().collect::<Vec<_>>(),
            ["ca.crt", "ca.key", "tls.crt", "tls.key"]
        );
        assert_eq!(TlsSecret::from_secret_data(&data).unwrap(), secret);
        assert_eq!(ServingCert::from_secret_data(&data).unwrap(), secret.serving);
    }

    #[test]
    fn secret_data_errors_are_specific() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let mut data = ca.to_secret_data();
        data.remove(SECRET_CA_KEY);
        assert!(matches!(
            CertificateAuthority::from_secret_data(&data),
            Err(CertError::MissingSecretKey("ca.key"))
        ));
        let bad = [("ca.crt", vec![0xff, 0xfe]), ("ca.key", b"x".to_vec())];
        assert!(matches!(
            CertificateAuthority::from_secret_data(bad),
            Err(CertError::NotUtf8("ca.crt"))
        ));
    }

    #[test]
    fn from_pem_rejects_a_leaf_or_a_foreign_key() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let other = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let leaf = ca.issue_serving(&ServingOptions::for_service("s", "n")).unwrap();
        assert!(matches!(
            CertificateAuthority::from_pem(&leaf.cert_pem, &leaf.key_pem),
            Err(CertError::NotACa)
        ));
        assert!(matches!(
            CertificateAuthority::from_pem(ca.cert_pem(), other.key_pem()),
            Err(CertError::KeyMismatch { what: "CA" })
        ));
    }

    #[test]
    fn invalid_requests_are_refused() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let none = ServingOptions {
            dns_names: vec![],
            ip_addresses: vec![],
            validity: Duration::days(1),
        };
        assert!(matches!(
            ca.issue_serving(&none),
            Err(CertError::NoSubjectAltNames)
        ));
        let zero = ServingOptions::for_service("s", "n").with_validity(Duration::ZERO);
        assert!(matches!(
            ca.issue_serving(&zero),
            Err(CertError::InvalidValidity { .. })
        ));
        let bad_name = ServingOptions::for_service("s", "n").with_dns_name("bad name with spaces");
        assert!(matches!(
            ca.issue_serving(&bad_name),
            Err(CertError::InvalidName { .. })
        ));
        let neg = CaOptions {
            validity: Duration::seconds(-1),
            ..CaOptions::default()
        };
        assert!(matches!(
            CertificateAuthority::generate(&neg),
            Err(CertError::InvalidValidity { what: "CA" })
        ));
    }

    #[test]
    fn an_expired_ca_issues_nothing() {
        let t0 = now() - Duration::days(10);
        let ca = CertificateAuthority::generate_at(
            &CaOptions {
                validity: Duration::days(1),
                ..CaOptions::default()
            },
            t0,
        )
        .unwrap();
        assert!(matches!(
            ca.issue_serving(&ServingOptions::for_service("s", "n")),
            Err(CertError::CaExpired { .. })
        ));
    }

    #[test]
    fn debug_output_never_contains_key_material() {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let leaf = ca.issue_serving(&ServingOptions::for_service("s", "n")).unwrap();
        for text in [format!("{ca:?}"), format!("{leaf:?}")] {
            assert!(!text.contains("PRIVATE KEY"), "{text}");
            assert!(text.contains("<redacted>"));
        }
    }
}
