//! A registry's tag list page, as the resolver reads it (only version tags kept, within the bound).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    holdfast_registry::fuzzing::tag_list_json(data);
});
