//! What a registry sends besides manifests: a tag list page (only version tags kept, within the
//! bound), a pagination `Link` header, a `Retry-After` value and a token service's JSON answer.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_registry::fuzzing::registry_responses(data);
});
