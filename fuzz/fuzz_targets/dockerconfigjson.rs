//! `secretRef` Secrets as vendir reads them: `.dockerconfigjson`, or the plain fields. No
//! message about a Secret may quote a value it holds (registry host names, its keys, may be
//! named).
#![no_main]

use holdfast_registry::Credentials;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Every string value in `value` (not the object keys).
fn strings<'a>(value: &'a Value, into: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => into.push(s),
        Value::Array(items) => items.iter().for_each(|v| strings(v, into)),
        Value::Object(map) => map.values().for_each(|v| strings(v, into)),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let docker = Credentials::from_secret(
        "s",
        Some("kubernetes.io/dockerconfigjson"),
        [(".dockerconfigjson", data)],
    );
    if let (Err(error), Ok(json)) = (&docker, serde_json::from_slice::<Value>(data)) {
        let message = error.to_string();
        let mut values = Vec::new();
        strings(&json, &mut values);
        for value in values.into_iter().filter(|v| v.len() >= 6) {
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
