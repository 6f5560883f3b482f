//! `WWW-Authenticate` challenges a registry answers with: one value per line.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    holdfast_registry::fuzzing::www_authenticate(text.split('\n'));
});
