//! Property tests: no input makes the decoder or the response builder panic.

// Helpers outside #[test] fns are not covered by clippy.toml's allow-unwrap-in-tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use holdfast_webhook::{decision::Verdict, review};
use proptest::prelude::*;
use serde_json::{Value, json};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = review::decode(&Bytes::from(bytes));
    }

    #[test]
    fn arbitrary_requests_decode_or_fail_cleanly(request in arb_json(), object in arb_json()) {
        let mut v = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request});
        if v["request"].is_object() {
            v["request"]["object"] = object;
        }
        if let Ok(req) = review::decode(&Bytes::from(serde_json::to_vec(&v).unwrap())) {
            let out = serde_json::to_value(review::respond(&req, Verdict::allow())).unwrap();
            prop_assert_eq!(&out["response"]["uid"], &json!(req.uid));
        }
    }
}
