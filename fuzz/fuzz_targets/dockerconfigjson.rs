//! `secretRef` Secrets as vendir reads them: `.dockerconfigjson`, or the plain fields. No
//! message about a Secret may quote a value it holds (registry host names, its keys, may be
//! named).
#![no_main]

use holdfast_registry::Credentials;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Every string value in `value` into `values`, and every object key into `keys`.
fn strings<'a>(value: &'a Value, values: &mut Vec<&'a str>, keys: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => values.push(s),
        Value::Array(items) => items.iter().for_each(|v| strings(v, values, keys)),
        Value::Object(map) => {
            keys.extend(map.keys().map(String::as_str));
            map.values().for_each(|v| strings(v, values, keys));
        }
        _ => {}
    }
}

/// Every fixed text of the credential errors (`holdfast_registry::CredentialsError`).
const OWN_TEXT: &str = "secret 's': parsing .dockerconfigjson: top level is not a JSON object; \
    'auths' is not a JSON object; auths entry is not a JSON object: 'username' 'password' \
    'identitytoken' 'auth' is not a string; Decoding auth field: not valid base64; Expected auth \
    field to have 'username:password' format, but did not; field 'auth' is not valid UTF-8; \
    of type kubernetes.io/dockerconfigjson has no '.dockerconfigjson' key";

fuzz_target!(|data: &[u8]| {
    let docker = Credentials::from_secret(
        "s",
        Some("kubernetes.io/dockerconfigjson"),
        [(".dockerconfigjson", data)],
    );
    if let (Err(error), Ok(json)) = (&docker, serde_json::from_slice::<Value>(data)) {
        let message = error.to_string();
        let (mut values, mut keys) = (Vec::new(), Vec::new());
        strings(&json, &mut values, &mut keys);
        // A value may be part of a key (a host name, which messages name, escaped as Rust's
        // Debug does) or of the messages' own text.
        let named = |v: &str| {
            keys.iter().any(|k| k.contains(v) || format!("{k:?}").contains(v)) || OWN_TEXT.contains(v)
        };
        for value in values.into_iter().filter(|v| v.len() >= 6 && !named(v)) {
            assert!(
                !message.contains(value),
                "the error quotes a value of the Secret: {message}"
            );
        }
    }
    let plain = Credentials::from_secret("s", None, [("username", data), ("password", data)]);
    if let (Err(error), Ok(text)) = (&plain, std::str::from_utf8(data))
        && text.len() >= 6
    {
        assert!(
            !error.to_string().contains(text),
            "the error quotes the Secret: {error}"
        );
    }
});
