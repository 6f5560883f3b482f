//! Decoding AdmissionReviews and encoding the answers: the only place that knows the wire format.

use std::{borrow::Cow, collections::BTreeMap};

use bytes::Bytes;
use json_patch::Patch;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::core::{
    DynamicObject, Status,
    admission::{AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND, Operation},
};
use serde::{Deserialize, Deserializer, Serialize, de::DeserializeOwned, de::IgnoredAny};
use serde_json::value::RawValue;

use crate::decision::{Decision, Verdict};

/// Why a body is not an AdmissionReview holdfast can answer. Each maps to an HTTP status: the
/// API server never sends these, so whoever does gets a plain error rather than a review.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("request body is not valid JSON for an AdmissionReview: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error("unsupported {field} {found:?}: holdfast speaks {META_API_VERSION_V1} {META_KIND}")]
    WrongType { field: &'static str, found: String },
    #[error("AdmissionReview has no request")]
    MissingRequest,
    #[error("AdmissionReview request has no uid")]
    MissingUid,
}

/// A request's object (or oldObject) that is valid JSON but not the shape a rule reads. Says
/// where, not what: serde's own message quotes the offending value, and the object's contents
/// stay out of logs and warnings.
#[derive(Debug, thiserror::Error)]
#[error(
    "AdmissionReview request.{field} cannot be read: not the shape of a Kubernetes object (column {column})"
)]
pub struct ObjectError {
    field: &'static str,
    column: usize,
}

/// What holdfast reads of an `admission.k8s.io/v1` AdmissionRequest, borrowed from the body:
/// the envelope decoded, the objects kept as raw JSON until a rule decodes the part it reads.
/// Most of a review is its objects, and the rules read little of them (stamp-owners and the
/// guard only the metadata); `userInfo`, `options`, the `request*` fields and the versions are
/// never read, so never decoded. Strings are copied only when the JSON escapes something.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    #[serde(borrow)]
    pub uid: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Kind<'a>,
    #[serde(borrow)]
    pub resource: Resource<'a>,
    #[serde(default, borrow, deserialize_with = "optional")]
    pub sub_resource: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub name: Cow<'a, str>,
    #[serde(default, borrow, deserialize_with = "optional")]
    pub namespace: Option<Cow<'a, str>>,
    pub operation: Operation,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default, borrow)]
    object: Option<&'a RawValue>,
    #[serde(default, borrow)]
    old_object: Option<&'a RawValue>,
}

/// The request's `kind`: the object's kind (its group and version are not read).
#[derive(Debug, Deserialize)]
pub struct Kind<'a> {
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
}

/// The request's `resource`: group and plural name, what the rules route on.
#[derive(Debug, Deserialize)]
pub struct Resource<'a> {
    #[serde(borrow)]
    pub group: Cow<'a, str>,
    #[serde(borrow)]
    pub resource: Cow<'a, str>,
}

/// An optional string, borrowed like the others (serde's own `Option<Cow>` always copies).
fn optional<'de: 'a, 'a, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Borrowed<'a>>::deserialize(deserializer)?.map(|Borrowed(text)| text))
}

impl Request<'_> {
    /// The object as `T`: [`Object`] for its metadata (and spec), `serde_json::Value` for all of it.
    pub fn object<T: DeserializeOwned>(&self) -> Result<Option<T>, ObjectError> {
        read(self.object, "object")
    }

    /// The object before an UPDATE or DELETE, as `T`.
    pub fn old_object<T: DeserializeOwned>(&self) -> Result<Option<T>, ObjectError> {
        read(self.old_object, "oldObject")
    }
}

fn read<T: DeserializeOwned>(raw: Option<&RawValue>, field: &'static str) -> Result<Option<T>, ObjectError> {
    raw.map(|raw| serde_json::from_str(raw.get()))
        .transpose()
        .map_err(|e| ObjectError {
            field,
            column: e.column(),
        })
}

/// An object as the rules read it: its metadata and, when `S` asks for it, its spec (by default
/// skipped unread). The metadata leaves out `managedFields`, which no rule reads and which can be
/// most of a review's bytes.
#[derive(Debug, Deserialize)]
pub struct Object<S = IgnoredAny> {
    #[serde(default, deserialize_with = "metadata")]
    pub metadata: ObjectMeta,
    #[serde(default = "absent")]
    pub spec: Option<S>,
}

fn absent<S>() -> Option<S> {
    None
}

/// The fields of `ObjectMeta` a rule may read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    finalizers: Option<Vec<String>>,
    deletion_timestamp: Option<Time>,
    generation: Option<i64>,
}

fn metadata<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let m = Metadata::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: m.name,
        generate_name: m.generate_name,
        namespace: m.namespace,
        uid: m.uid,
        labels: m.labels,
        annotations: m.annotations,
        owner_references: m.owner_references,
        finalizers: m.finalizers,
        deletion_timestamp: m.deletion_timestamp,
        generation: m.generation,
        ..ObjectMeta::default()
    })
}

/// The envelope: `apiVersion`, `kind`, `request` (a `response` is not read).
#[derive(Debug, Deserialize)]
struct Review<'a> {
    #[serde(rename = "apiVersion", borrow)]
    api_version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    request: Option<Request<'a>>,
}

/// Parses a review body into its request.
pub fn decode(body: &Bytes) -> Result<Request<'_>, ReviewError> {
    // One UTF-8 check of the whole body, then a reader that trusts it: reading bytes, serde_json
    // re-validates every string it meets, a good part of the decoding work for a review's many
    // short strings. A body that is not UTF-8 goes the byte way, for the same error as before.
    let review: Review = match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(body),
    }
    .map_err(ReviewError::Malformed)?;
    if review.api_version != META_API_VERSION_V1 {
        return Err(ReviewError::WrongType {
            field: "apiVersion",
            found: review.api_version.into_owned(),
        });
    }
    if review.kind != META_KIND {
        return Err(ReviewError::WrongType {
            field: "kind",
            found: review.kind.into_owned(),
        });
    }
    let request = review.request.ok_or(ReviewError::MissingRequest)?;
    if request.uid.is_empty() {
        return Err(ReviewError::MissingUid);
    }
    Ok(request)
}

/// The response to `request` carrying `verdict`.
pub fn respond(request: &Request<'_>, verdict: Verdict) -> AdmissionReview<DynamicObject> {
    response(request, verdict).into_review()
}

/// [`respond`]'s review as the JSON body sent back, written straight from the response: the same
/// bytes without building the review around it (which copies the type fields again, then
/// serialises through `#[serde(flatten)]`'s map machinery).
pub fn encode(request: &Request<'_>, verdict: Verdict) -> Result<Vec<u8>, serde_json::Error> {
    let response = response(request, verdict);
    let mut body = Vec::with_capacity(256);
    serde_json::to_writer(
        &mut body,
        &Envelope {
            api_version: &response.types.api_version,
            kind: &response.types.kind,
            response: &response,
        },
    )?;
    Ok(body)
}

/// `AdmissionReview`'s wire form with a response and no request: its flattened type fields first,
/// then `response` (`request` is skipped when absent).
#[derive(Serialize)]
struct Envelope<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    response: &'a AdmissionResponse,
}

fn response(request: &Request<'_>, verdict: Verdict) -> AdmissionResponse {
    // `AdmissionResponse::from` wants kube's request type; this is the same allowed response
    // (v1 type fields, the request's uid, an empty status) from its public constructor.
    let mut response = AdmissionResponse::invalid("");
    response.uid = request.uid.clone().into_owned();
    response.allowed = true;
    response.result = Status::default();
    response = match verdict.decision {
        Decision::Allow => response,
        Decision::Patch(ops) if ops.is_empty() => response,
        Decision::Patch(ops) => match response.clone().with_patch(Patch(ops)) {
            Ok(patched) => patched,
            // Serialising a patch of JSON values cannot fail in practice; if it ever did, admit
            // unchanged (the controller pins later) rather than block the request.
            Err(e) => {
                tracing::error!(error = %e, "could not serialise a patch; admitting unchanged");
                response
            }
        },
        Decision::Deny(message) => response.deny(message),
    };
    if !verdict.warnings.is_empty() {
        response.warnings = Some(verdict.warnings);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use json_patch::{AddOperation, PatchOperation, jsonptr::PointerBuf};
    use serde_json::json;

    fn review_json(operation: &str, object: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "kpack.io", "version": "v1alpha2", "kind": "Image"},
                "resource": {"group": "kpack.io", "version": "v1alpha2", "resource": "images"},
                "name": "app", "namespace": "space",
                "operation": operation,
                "userInfo": {"username": "admin"},
                "object": object,
                "oldObject": null,
                "dryRun": false,
            }
        })
    }

    fn body(value: serde_json::Value) -> Bytes {
        Bytes::from(serde_json::to_vec(&value).unwrap())
    }

    fn image() -> serde_json::Value {
        json!({"apiVersion": "kpack.io/v1alpha2", "kind": "Image", "metadata": {"name": "app", "namespace": "space"}})
    }

    #[test]
    fn decodes_a_v1_review() {
        let text = body(review_json("CREATE", image()));
        let req = decode(&text).unwrap();
        assert_eq!(req.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(req.resource.resource, "images");
    }

    #[test]
    fn escaped_strings_decode_as_well_as_plain_ones() {
        // Borrowed from the body when possible; JSON escapes need a copy, and must still work.
        let text = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u\u0031","kind":{"group":"","version":"v1","kind":"P\u006fd"},"resource":{"group":"","version":"v1","resource":"pods"},"subResource":"st\u0061tus","name":"a\"b","namespace":"n\u0073","operation":"CREATE","object":null}}"#;
        let body = Bytes::from_static(text);
        let req = decode(&body).unwrap();
        assert_eq!(req.uid, "u1");
        assert_eq!(req.kind.kind, "Pod");
        assert_eq!(req.sub_resource.as_deref(), Some("status"));
        assert_eq!(req.name, "a\"b");
        assert_eq!(req.namespace.as_deref(), Some("ns"));
        assert!(req.object::<serde_json::Value>().unwrap().is_none());
    }

    #[test]
    fn rejects_malformed_json() {
        assert!(matches!(
            decode(&Bytes::from_static(b"{not json")),
            Err(ReviewError::Malformed(_))
        ));
    }

    #[test]
    fn rejects_v1beta1_and_other_kinds() {
        let mut v = review_json("CREATE", image());
        v["apiVersion"] = json!("admission.k8s.io/v1beta1");
        let err = decode(&body(v)).unwrap_err();
        assert!(err.to_string().contains("admission.k8s.io/v1beta1"), "{err}");
        let mut v = review_json("CREATE", image());
        v["kind"] = json!("TokenReview");
        assert!(matches!(
            decode(&body(v)),
            Err(ReviewError::WrongType { field: "kind", .. })
        ));
    }

    #[test]
    fn rejects_a_review_without_request_or_uid() {
        let mut v = review_json("CREATE", image());
        v.as_object_mut().unwrap().remove("request");
        assert!(matches!(decode(&body(v)), Err(ReviewError::MissingRequest)));
        let mut v = review_json("CREATE", image());
        v["request"]["uid"] = json!("");
        assert!(matches!(decode(&body(v)), Err(ReviewError::MissingUid)));
    }

    #[test]
    fn response_copies_uid_and_carries_patch_and_warnings() {
        let text = body(review_json("CREATE", image()));
        let req = decode(&text).unwrap();
        let op = PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "labels"]),
            value: json!({"a": "b"}),
        });
        let verdict = Verdict::from(Decision::Patch(vec![op])).with_warning("heads up");
        let out = serde_json::to_value(respond(&req, verdict)).unwrap();
        let rsp = &out["response"];
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(rsp["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(rsp["allowed"], true);
        assert_eq!(rsp["patchType"], "JSONPatch");
        assert_eq!(rsp["warnings"], json!(["heads up"]));
        // kube-core sends the patch bytes as a JSON array, which the API server's decoder accepts.
        let bytes: Vec<u8> = serde_json::from_value(rsp["patch"].clone()).unwrap();
        let patch: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            patch,
            json!([{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}])
        );
    }

    #[test]
    fn text_and_bytes_decode_alike() {
        // Valid UTF-8 is read as text, anything else as bytes: both must fail (or not) with the
        // same error serde_json gives for the bytes.
        let mut bad_utf8 = serde_json::to_vec(&review_json("CREATE", image())).unwrap();
        let at = bad_utf8.windows(3).position(|w| w == b"app").unwrap();
        bad_utf8[at] = 0xff;
        let bodies: [&[u8]; 5] = [
            b"{not json",
            b"{\"apiVersion\":",
            b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{\"uid\":7}}",
            b"\"\\ud800\"",
            &bad_utf8,
        ];
        for raw in bodies {
            let ours = decode(&Bytes::copy_from_slice(raw)).unwrap_err().to_string();
            let bytes_way = serde_json::from_slice::<Review>(raw).unwrap_err();
            assert_eq!(ours, ReviewError::Malformed(bytes_way).to_string());
        }
    }

    #[test]
    fn encode_writes_the_serialised_review() {
        let text = body(review_json("CREATE", image()));
        let req = decode(&text).unwrap();
        let op = || {
            PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "labels"]),
                value: json!({"a": "b"}),
            })
        };
        let verdicts = [
            Verdict::allow(),
            Decision::Patch(vec![]).into(),
            Decision::Patch(vec![op()]).into(),
            Verdict::from(Decision::Patch(vec![op()])).with_warning("heads up"),
            Decision::Deny("owner is terminating".into()).into(),
            Verdict::allow().with_warning("one").with_warning("two"),
        ];
        for verdict in verdicts {
            assert_eq!(
                encode(&req, verdict.clone()).unwrap(),
                serde_json::to_vec(&respond(&req, verdict)).unwrap()
            );
        }
    }

    #[test]
    fn responses_are_the_ones_kube_builds_from_its_own_request_type() {
        let body = body(review_json("CREATE", image()));
        let ours = decode(&body).unwrap();
        let review: AdmissionReview<DynamicObject> = serde_json::from_slice(&body).unwrap();
        let theirs: kube::core::admission::AdmissionRequest<DynamicObject> = review.try_into().unwrap();
        let allowed = AdmissionResponse::from(&theirs).into_review();
        assert_eq!(
            serde_json::to_value(respond(&ours, Verdict::allow())).unwrap(),
            serde_json::to_value(allowed).unwrap()
        );
        let denied = AdmissionResponse::from(&theirs).deny("no").into_review();
        assert_eq!(
            serde_json::to_value(respond(&ours, Decision::Deny("no".into()).into())).unwrap(),
            serde_json::to_value(denied).unwrap()
        );
    }

    #[test]
    fn objects_are_read_as_the_rule_asks_without_managed_fields() {
        let object = json!({
            "apiVersion": "kpack.io/v1alpha2", "kind": "Image",
            "metadata": {
                "name": "app", "labels": {"a": "b"}, "deletionTimestamp": "2026-11-30T10:00:00Z",
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u"}],
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {"tag": "registry.example/app"},
        });
        let text = body(review_json("UPDATE", object.clone()));
        let req = decode(&text).unwrap();
        let meta: Object = req.object().unwrap().unwrap();
        assert_eq!(meta.metadata.name.as_deref(), Some("app"));
        assert_eq!(meta.metadata.labels.unwrap()["a"], "b");
        assert_eq!(meta.metadata.owner_references.unwrap()[0].uid, "u");
        assert!(meta.metadata.deletion_timestamp.is_some());
        assert!(meta.metadata.managed_fields.is_none());
        let with_spec: Object<serde_json::Value> = req.object().unwrap().unwrap();
        assert_eq!(with_spec.spec, Some(json!({"tag": "registry.example/app"})));
        let whole: serde_json::Value = req.object().unwrap().unwrap();
        assert_eq!(whole, object);
        assert!(req.old_object::<serde_json::Value>().unwrap().is_none());
    }

    #[test]
    fn an_object_of_the_wrong_shape_is_an_error_naming_it() {
        let text = body(review_json("CREATE", json!({"metadata": 5})));
        let req = decode(&text).unwrap();
        let err = req.object::<Object>().unwrap_err().to_string();
        assert!(
            err.starts_with("AdmissionReview request.object cannot be read: "),
            "{err}"
        );
        // serde quotes the offending value; the error must not carry the object's contents.
        let text = body(review_json(
            "CREATE",
            json!({"metadata": {"labels": "leaky-value"}}),
        ));
        let req = decode(&text).unwrap();
        let err = req.object::<Object>().unwrap_err().to_string();
        assert!(!err.contains("leaky-value"), "{err}");
        assert!(err.contains("column"), "{err}");
    }

    #[test]
    fn deny_carries_the_message() {
        let text = body(review_json("CREATE", image()));
        let req = decode(&text).unwrap();
        let out = serde_json::to_value(respond(
            &req,
            Decision::Deny("owner is terminating".into()).into(),
        ))
        .unwrap();
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["message"], "owner is terminating");
        assert!(out["response"].get("patch").is_none());
    }
}
