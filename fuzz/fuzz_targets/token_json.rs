//! A token service's JSON answer (`token` / `access_token`, `expires_in`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_registry::fuzzing::token_json(data);
});
