//! A `Retry-After` value (delay-seconds or an HTTP-date).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_registry::fuzzing::retry_after(data);
});
