//! Resolver behaviour against the in-process fake registry (see `support/mod.rs` for why a fake).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests

mod support;

use std::time::{Duration, Instant};

use holdfast_registry::{AuthConfig, Credentials, ResolveError, resolve::MANIFEST_MEDIA_TYPES};
use http::Method;
use support::{
    ALICE, FakeRegistry, IDENTITY_TOKEN, PAGED_TAGS, STATIC_TOKEN, UNSERVED_DIGEST, expected_digest,
    reference, resolver_for,
};

fn alice(registry: &FakeRegistry) -> Credentials {
    let json = format!(
        r#"{{"auths":{{"{}":{{"username":"{}","password":"{}"}}}}}}"#,
        registry.host(),
        ALICE.0,
        ALICE.1
    );
    Credentials::from_secret(
        "regcred",
        Some("kubernetes.io/dockerconfigjson"),
        [(".dockerconfigjson", json)],
    )
    .unwrap()
}

#[tokio::test]
async fn head_reads_docker_content_digest_of_the_index() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let digest = resolver
        .resolve_digest(&reference(&registry, "plain/app:v1"), &Credentials::anonymous())
        .await
        .unwrap();
    assert_eq!(
        digest,
        expected_digest("plain/app"),
        "the multi-arch index digest, not a platform manifest"
    );

    let requests = registry.requests();
    assert_eq!(requests.len(), 1, "one HEAD, no GET: {requests:?}");
    assert_eq!(requests[0].method, Method::HEAD);
    assert_eq!(requests[0].path, "/v2/plain/app/manifests/v1");
    let accept = requests[0].accept.clone().unwrap();
    for media_type in MANIFEST_MEDIA_TYPES {
        assert!(accept.contains(media_type), "{accept}");
    }
    assert_eq!(requests[0].authorization, None);
}

#[tokio::test]
async fn missing_digest_header_falls_back_to_get_and_hashes_the_body() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let digest = resolver
        .resolve_digest(
            &reference(&registry, "nodigest/app:v1"),
            &Credentials::anonymous(),
        )
        .await
        .unwrap();
    assert_eq!(digest, expected_digest("nodigest/app"));
    let methods: Vec<Method> = registry.requests().into_iter().map(|r| r.method).collect();
    assert_eq!(methods, [Method::HEAD, Method::GET]);
}

#[tokio::test]
async fn head_not_allowed_falls_back_to_get() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let digest = resolver
        .resolve_digest(
            &reference(&registry, "headless/app:v1"),
            &Credentials::anonymous(),
        )
        .await
        .unwrap();
    assert_eq!(digest, expected_digest("headless/app"));
    assert_eq!(registry.requests().len(), 2);
}

#[tokio::test]
async fn redirects_are_followed() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let digest = resolver
        .resolve_digest(&reference(&registry, "moved/app:v1"), &Credentials::anonymous())
        .await
        .unwrap();
    assert_eq!(digest, expected_digest("plain/app"));
    let paths: Vec<String> = registry.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        ["/v2/moved/app/manifests/v1", "/v2/plain/app/manifests/v1"]
    );
}

#[tokio::test]
async fn digest_references_need_no_request() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let pinned = expected_digest("plain/app");
    let r = reference(&registry, &format!("plain/app:v1@{pinned}"));
    assert_eq!(
        resolver
            .resolve_digest(&r, &Credentials::anonymous())
            .await
            .unwrap(),
        pinned
    );
    assert!(registry.requests().is_empty());
}

#[tokio::test]
async fn bearer_challenge_gets_a_scoped_token_with_credentials_and_reuses_it() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let credentials = alice(&registry);

    let digest = resolver
        .resolve_digest(&reference(&registry, "bearer/app:v1"), &credentials)
        .await
        .unwrap();
    assert_eq!(digest, expected_digest("bearer/app"));
    let requests = registry.requests();
    assert_eq!(requests.len(), 3, "challenge, token, retry: {requests:?}");
    assert_eq!(
        (requests[0].method.clone(), requests[0].authorization.clone()),
        (Method::HEAD, None)
    );

    let token_request = &requests[1];
    assert_eq!(
        (token_request.method.clone(), token_request.path.as_str()),
        (Method::GET, "/token")
    );
    let query = token_request.query_pairs();
    assert!(
        query.contains(&("service".into(), "fake-registry".into())),
        "{query:?}"
    );
    assert!(
        query.contains(&("scope".into(), "repository:bearer/app:pull".into())),
        "{query:?}"
    );
    assert_eq!(
        query.iter().filter(|(k, _)| k == "scope").count(),
        1,
        "same scope not sent twice"
    );
    let basic = token_request.authorization.clone().unwrap();
    assert!(basic.starts_with("Basic "), "credentials go to the token service");

    assert_eq!(requests[2].authorization.as_deref(), Some("Bearer alice-token"));

    // Second resolution (another tag of the same repository): the cached token is sent up front.
    resolver
        .resolve_digest(&reference(&registry, "bearer/app:v2"), &credentials)
        .await
        .unwrap();
    let requests = registry.requests();
    assert_eq!(requests.len(), 4, "{requests:?}");
    assert_eq!(requests[3].authorization.as_deref(), Some("Bearer alice-token"));
    assert_eq!(registry.count("/token"), 1, "token reused");

    // A clone shares the token cache.
    resolver
        .clone()
        .resolve_digest(&reference(&registry, "bearer/app:v1"), &credentials)
        .await
        .unwrap();
    assert_eq!(registry.count("/token"), 1);
}

#[tokio::test]
async fn tokens_are_not_shared_across_credentials() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    resolver
        .resolve_digest(&reference(&registry, "anon-bearer/app:v1"), &alice(&registry))
        .await
        .unwrap();
    resolver
        .resolve_digest(
            &reference(&registry, "anon-bearer/app:v1"),
            &Credentials::anonymous(),
        )
        .await
        .unwrap();
    let tokens: Vec<Option<String>> = registry
        .requests()
        .into_iter()
        .filter(|r| r.path == "/token")
        .map(|r| r.authorization)
        .collect();
    assert_eq!(tokens.len(), 2);
    assert!(
        tokens[0].is_some() && tokens[1].is_none(),
        "anonymous token fetched without credentials"
    );
}

#[tokio::test]
async fn anonymous_bearer_token() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let digest = resolver
        .resolve_digest(
            &reference(&registry, "anon-bearer/app:v1"),
            &Credentials::anonymous(),
        )
        .await
        .unwrap();
    assert_eq!(digest, expected_digest("anon-bearer/app"));
    let requests = registry.requests();
    assert_eq!(requests[1].path, "/token");
    assert_eq!(requests[1].authorization, None);
    assert_eq!(requests[2].authorization.as_deref(), Some("Bearer anon-token"));
}

#[tokio::test]
async fn anonymous_token_that_is_not_enough_is_unauthorized() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let err = resolver
        .resolve_digest(&reference(&registry, "bearer/app:v1"), &Credentials::anonymous())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ResolveError::Unauthorized { status: 401, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("anonymous access was denied"), "{err}");
    assert_eq!(
        registry.requests().len(),
        3,
        "one challenge answered, then give up"
    );
}

#[tokio::test]
async fn wrong_credentials_are_rejected_by_the_token_service() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let credentials =
        Credentials::anonymous().with_host(&registry.host(), AuthConfig::basic("alice", "wrong"));
    let err = resolver
        .resolve_digest(&reference(&registry, "bearer/app:v1"), &credentials)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ResolveError::Unauthorized { status: 401, .. }),
        "{err:?}"
    );
    let shown = format!("{err} {err:?}");
    assert!(
        !shown.contains("wrong") && !shown.contains("alice"),
        "no credentials in errors: {shown}"
    );
    assert_eq!(
        (err.registry(), err.repository()),
        (registry.host().as_str(), "bearer/app")
    );
}

#[tokio::test]
async fn expired_tokens_are_fetched_again() {
    let registry = FakeRegistry::start().await;
    registry.set_token_ttl(1);
    let resolver = resolver_for(&registry, |_| {});
    let credentials = alice(&registry);
    let r = reference(&registry, "bearer/app:v1");
    resolver.resolve_digest(&r, &credentials).await.unwrap();
    resolver.resolve_digest(&r, &credentials).await.unwrap();
    assert_eq!(registry.count("/token"), 1, "still valid");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    resolver.resolve_digest(&r, &credentials).await.unwrap();
    assert_eq!(registry.count("/token"), 2, "expired after expires_in");
}

#[tokio::test]
async fn identity_token_is_exchanged_with_a_refresh_token_grant() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let json = format!(
        r#"{{"auths":{{"{}":{{"identitytoken":"{IDENTITY_TOKEN}"}}}}}}"#,
        registry.host()
    );
    let credentials = Credentials::from_secret(
        "regcred",
        Some("kubernetes.io/dockerconfigjson"),
        [(".dockerconfigjson", json)],
    )
    .unwrap();
    let digest = resolver
        .resolve_digest(&reference(&registry, "bearer/app:v1"), &credentials)
        .await
        .unwrap();
    assert_eq!(digest, expected_digest("bearer/app"));
    let token_request = registry
        .requests()
        .into_iter()
        .find(|r| r.path == "/token")
        .unwrap();
    assert_eq!(token_request.method, Method::POST);
    let form = token_request.body_pairs();
    for pair in [
        ("grant_type", "refresh_token"),
        ("refresh_token", IDENTITY_TOKEN),
        ("service", "fake-registry"),
        ("scope", "repository:bearer/app:pull"),
    ] {
        assert!(form.contains(&(pair.0.into(), pair.1.into())), "{form:?}");
    }
}

#[tokio::test]
async fn static_registry_token_is_sent_as_bearer() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let credentials = Credentials::from_secret(
        "tok",
        None,
        [("hostname", registry.host()), ("token", STATIC_TOKEN.to_owned())],
    )
    .unwrap();
    resolver
        .resolve_digest(&reference(&registry, "static/app:v1"), &credentials)
        .await
        .unwrap();
    let requests = registry.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].authorization, Some(format!("Bearer {STATIC_TOKEN}")));
}

#[tokio::test]
async fn basic_challenge_sends_basic_auth_and_remembers_it() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let credentials = alice(&registry);
    let r = reference(&registry, "basic/app:v1");
    assert_eq!(
        resolver.resolve_digest(&r, &credentials).await.unwrap(),
        expected_digest("basic/app")
    );
    let requests = registry.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].authorization, None);
    assert!(
        requests[1]
            .authorization
            .as_deref()
            .unwrap()
            .starts_with("Basic ")
    );

    resolver.resolve_digest(&r, &credentials).await.unwrap();
    let requests = registry.requests();
    assert_eq!(requests.len(), 3, "Basic sent up front the second time");
    assert!(
        requests[2]
            .authorization
            .as_deref()
            .unwrap()
            .starts_with("Basic ")
    );
}

#[tokio::test]
async fn basic_challenge_without_credentials_is_unauthorized() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let err = resolver
        .resolve_digest(&reference(&registry, "basic/app:v1"), &Credentials::anonymous())
        .await
        .unwrap_err();
    assert!(matches!(err, ResolveError::Unauthorized { .. }), "{err:?}");
    assert!(err.to_string().contains("Basic auth"), "{err}");
    assert_eq!(registry.requests().len(), 1);
}

#[tokio::test]
async fn unknown_tag_is_not_found() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let err = resolver
        .resolve_digest(&reference(&registry, "plain/app:v9"), &Credentials::anonymous())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ResolveError::NotFound {
            registry: registry.host(),
            repository: "plain/app".into(),
            reference: "v9".into()
        }
    );
    assert!(!err.is_transient());
}

#[tokio::test]
async fn server_errors_and_bad_digests_are_specific() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let err = resolver
        .resolve_digest(&reference(&registry, "broken/app:v1"), &Credentials::anonymous())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ResolveError::BadResponse { status: 500, .. }),
        "{err:?}"
    );
    // A HEAD answer has no body, so the registry's error message cannot be quoted.
    assert_eq!(
        err.to_string(),
        format!("{}/broken/app: unexpected HTTP 500", registry.host())
    );
    assert!(err.is_transient());

    let err = resolver
        .resolve_digest(
            &reference(&registry, "baddigest/app:v1"),
            &Credentials::anonymous(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ResolveError::InvalidDigest { .. }), "{err:?}");
}

#[tokio::test]
async fn rate_limit_window_fails_fast_without_a_request() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let r = reference(&registry, "ratelimited/app:v1");
    let err = resolver
        .resolve_digest(&r, &Credentials::anonymous())
        .await
        .unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(30)), "{err:?}");
    assert_eq!(registry.requests().len(), 1);

    let started = Instant::now();
    let again = resolver
        .resolve_digest(&r, &Credentials::anonymous())
        .await
        .unwrap_err();
    assert!(matches!(again, ResolveError::RateLimited { .. }), "{again:?}");
    let remaining = again.retry_after().unwrap();
    assert!(
        remaining <= Duration::from_secs(30) && remaining > Duration::from_secs(28),
        "{remaining:?}"
    );
    // The window is per host: other repositories on it wait too.
    let other = resolver
        .resolve_digest(&reference(&registry, "plain/app:v1"), &Credentials::anonymous())
        .await;
    assert!(
        matches!(other, Err(ResolveError::RateLimited { .. })),
        "{other:?}"
    );
    let tags = resolver
        .list_tags(&reference(&registry, "paged/app"), &Credentials::anonymous())
        .await;
    assert!(matches!(tags, Err(ResolveError::RateLimited { .. })), "{tags:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "failed fast, not after a timeout"
    );
    assert_eq!(registry.requests().len(), 1, "no request inside the window");
}

#[tokio::test]
async fn retry_after_as_http_date() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let err = resolver
        .resolve_digest(
            &reference(&registry, "ratelimited-date/app:v1"),
            &Credentials::anonymous(),
        )
        .await
        .unwrap_err();
    let wait = err.retry_after().unwrap();
    assert!(
        wait > Duration::from_secs(115) && wait <= Duration::from_secs(120),
        "{wait:?}"
    );
}

#[tokio::test]
async fn rate_limit_window_is_capped() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |c| c.max_retry_after = Duration::from_secs(5));
    let err = resolver
        .resolve_digest(
            &reference(&registry, "ratelimited/app:v1"),
            &Credentials::anonymous(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.retry_after(), Some(Duration::from_secs(5)));
}

#[tokio::test]
async fn slow_response_trips_the_timeout() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |c| c.request_timeout = Duration::from_millis(300));
    let started = Instant::now();
    let err = resolver
        .resolve_digest(&reference(&registry, "slow/app:v1"), &Credentials::anonymous())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ResolveError::Timeout {
            registry: registry.host(),
            repository: "slow/app".into(),
            after: Duration::from_millis(300)
        }
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert!(err.is_transient());
}

#[tokio::test]
async fn per_host_concurrency_budget() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |c| {
        c.max_concurrent_per_host = 2;
        c.request_timeout = Duration::from_secs(3);
    });
    let r = reference(&registry, "concurrent/app:v1");
    let credentials = Credentials::anonymous();
    let calls = (0..6).map(|_| resolver.resolve_digest(&r, &credentials));
    let results = futures::future::join_all(calls).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(registry.requests().len(), 6);
    assert_eq!(
        registry.max_in_flight(),
        2,
        "never more than the budget in flight"
    );
}

#[tokio::test]
async fn waiting_for_a_slot_counts_against_the_timeout() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |c| {
        c.max_concurrent_per_host = 1;
        c.request_timeout = Duration::from_millis(500);
    });
    let slow = reference(&registry, "slow/app:v1");
    let credentials = Credentials::anonymous();
    let started = Instant::now();
    let results =
        futures::future::join_all((0..2).map(|_| resolver.resolve_digest(&slow, &credentials))).await;
    for result in &results {
        assert!(matches!(result, Err(ResolveError::Timeout { .. })), "{result:?}");
    }
    // Sequential full timeouts would take 600 ms; the wait for the slot is part of the 300 ms.
    assert!(
        started.elapsed() < Duration::from_millis(550),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn tag_list_follows_link_pagination() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |c| c.tag_page_size = Some(2));
    let tags = resolver
        .list_tags(&reference(&registry, "paged/app"), &Credentials::anonymous())
        .await
        .unwrap();
    assert_eq!(tags, version_tags());
    let queries: Vec<Option<String>> = registry.requests().into_iter().map(|r| r.query).collect();
    assert_eq!(
        queries,
        [
            Some("n=2".to_owned()),
            Some("n=2&last=v1.0.0".to_owned()),
            Some("n=2&last=v2.0.0".to_owned())
        ]
    );
}

/// SECURITY.md, "Fuzzing": a `Link` to a next page of another origin (another scheme, another
/// host, a scheme-relative URL) fails the listing; nothing is requested there.
#[tokio::test]
async fn a_tag_list_page_linking_to_another_origin_fails_the_listing() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    for (i, link) in support::OFFSITE_LINKS.iter().enumerate() {
        let tags = resolver
            .list_tags(
                &reference(&registry, &format!("offsite-{i}/app")),
                &Credentials::anonymous(),
            )
            .await;
        assert!(
            matches!(&tags, Err(ResolveError::Protocol { detail, .. }) if detail.contains("points to another host")),
            "{link}: {tags:?}"
        );
    }
    assert_eq!(
        registry.requests().len(),
        support::OFFSITE_LINKS.len(),
        "nothing requested elsewhere"
    );
}

#[tokio::test]
async fn tag_list_without_page_size_is_one_request() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let tags = resolver
        .list_tags(&reference(&registry, "paged/app"), &Credentials::anonymous())
        .await
        .unwrap();
    assert_eq!(tags, version_tags());
    assert_eq!(registry.requests().len(), 1);
}

/// The fake's paged tags that parse as versions: all a listing keeps (`latest` is dropped).
fn version_tags() -> Vec<&'static str> {
    PAGED_TAGS.into_iter().filter(|t| *t != "latest").collect()
}

#[tokio::test]
async fn a_page_of_junk_tags_keeps_only_the_versions() {
    let registry = FakeRegistry::start().await;
    // A 4 MB page, built and parsed by debug builds of the fake and the resolver.
    let resolver = resolver_for(&registry, |c| c.request_timeout = Duration::from_secs(30));
    let tags = resolver
        .list_tags(&reference(&registry, "junk/app"), &Credentials::anonymous())
        .await
        .unwrap();
    assert_eq!(tags, ["1.0.0", "2.0.0"]);
}

#[tokio::test]
async fn tag_listings_stop_at_their_total_byte_bound() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |c| c.max_tag_list_total_bytes = 3 * 1024 * 1024);
    let err = resolver
        .list_tags(&reference(&registry, "endless/app"), &Credentials::anonymous())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ResolveError::Protocol { detail, .. } if detail == "tag list larger than 3145728 bytes in all"),
        "{err:?}"
    );
    assert_eq!(
        registry.requests().len(),
        3,
        "1 MiB pages: the third passes the bound"
    );
}

#[tokio::test]
async fn tag_listings_stop_at_their_version_bound() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |c| c.max_version_tags = 10);
    let err = resolver
        .list_tags(&reference(&registry, "versions/app"), &Credentials::anonymous())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ResolveError::Protocol { detail, .. } if detail == "the tag list has more than 10 tags that parse as versions"),
        "{err:?}"
    );
    let all = resolver_for(&registry, |c| c.max_version_tags = 20)
        .list_tags(&reference(&registry, "versions/app"), &Credentials::anonymous())
        .await
        .unwrap();
    assert_eq!(all.len(), 20);
}

#[tokio::test]
async fn tag_list_page_limit() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |c| {
        c.tag_page_size = Some(1);
        c.max_tag_pages = 3;
    });
    let err = resolver
        .list_tags(&reference(&registry, "paged/app"), &Credentials::anonymous())
        .await
        .unwrap_err();
    assert!(matches!(err, ResolveError::Protocol { .. }), "{err:?}");
    assert_eq!(registry.requests().len(), 3);
}

#[tokio::test]
async fn tags_of_unknown_repository_are_not_found() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let err = resolver
        .list_tags(&reference(&registry, "plain/app"), &Credentials::anonymous())
        .await
        .unwrap_err();
    assert!(matches!(err, ResolveError::NotFound { .. }), "{err:?}");
}

#[tokio::test]
async fn https_unless_configured_insecure() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |c| c.insecure_registries.clear());
    let err = resolver
        .resolve_digest(&reference(&registry, "plain/app:v1"), &Credentials::anonymous())
        .await
        .unwrap_err();
    // The fake speaks plain HTTP, so the TLS handshake fails.
    assert!(matches!(err, ResolveError::Transport { .. }), "{err:?}");
    assert!(registry.requests().is_empty(), "no plain-HTTP request was made");
}

/// A tag's digest is confirmed by asking for the manifest under that digest: a HEAD, or a GET
/// hashed where HEAD is not allowed; a digest named for a tag and not served is
/// `DigestNotServed`, transient (the pin held keeps answering), and says which digest.
#[tokio::test]
async fn a_digest_is_confirmed_served_by_its_own_manifest() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |_| {});
    let anonymous = Credentials::anonymous();
    for repository in ["plain/app", "headless/app"] {
        let tagged = reference(&registry, &format!("{repository}:v1"));
        let digest = resolver.resolve_digest(&tagged, &anonymous).await.unwrap();
        resolver
            .confirm_served(&tagged, &digest, &anonymous)
            .await
            .unwrap();
        let path = format!("/v2/{repository}/manifests/{digest}");
        assert!(registry.count(&path) >= 1, "{:?}", registry.requests());
    }

    let tagged = reference(&registry, "unserved/app:v1");
    let digest = resolver.resolve_digest(&tagged, &anonymous).await.unwrap();
    assert_eq!(digest.as_str(), UNSERVED_DIGEST);
    let error = resolver
        .confirm_served(&tagged, &digest, &anonymous)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ResolveError::DigestNotServed { tag, digest, .. } if tag == "v1" && digest == UNSERVED_DIGEST),
        "{error:?}"
    );
    assert!(error.is_transient());
    assert_eq!(error.kind(), "digest_not_served");
    assert!(error.to_string().contains(UNSERVED_DIGEST), "{error}");

    // A digest of another repository's manifest is not this one's.
    let other = expected_digest("plain/app");
    let error = resolver
        .confirm_served(&reference(&registry, "headless/app:v1"), &other, &anonymous)
        .await
        .unwrap_err();
    assert!(matches!(error, ResolveError::DigestNotServed { .. }), "{error:?}");
}
