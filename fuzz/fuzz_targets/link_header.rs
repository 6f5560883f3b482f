//! A pagination `Link` header, followed from a tag list URL.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_registry::fuzzing::link_header(data);
});
