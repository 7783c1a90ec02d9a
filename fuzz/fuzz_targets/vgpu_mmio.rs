#![no_main]
//! cargo-fuzz entry point; the logic is `gpuvm_fuzz::vgpu_mmio::run` (a plain function, so
//! `cargo +stable check` type-checks it). See docs/fuzzing.md.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gpuvm_fuzz::vgpu_mmio::run(data);
});
