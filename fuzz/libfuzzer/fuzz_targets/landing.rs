#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| trapvec_fuzz::landing::run(data));
