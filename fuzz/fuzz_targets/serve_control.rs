#![no_main]
//! cargo-fuzz entry point; the logic is `gpuvm_fuzz::serve_control::run`. See docs/fuzzing.md.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gpuvm_fuzz::serve_control::run(data);
});
