//! Manifest and index bodies (and JSON error bodies) a registry sends.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_registry::fuzzing::manifest(data);
});
