//! Its own test binary (= its own process), so no rustls crypto provider is installed here:
//! building a resolver must then fail with an error instead of reqwest's panic.

use holdfast_registry::{Resolver, ResolverBuildError, ResolverConfig};

#[test]
fn resolver_without_crypto_provider_is_an_error() {
    assert!(matches!(
        Resolver::new(ResolverConfig::default()),
        Err(ResolverBuildError::NoCryptoProvider)
    ));
}
