#![no_main]
//! cargo-fuzz entry point; the logic is `gpuvm_fuzz::snapshot_stream::run`. See docs/fuzzing.md.
//! With `GPUVM_FUZZ_SEEDS=DIR` set, the seeds (`snapshot_stream::seeds`) are first written to
//! DIR, before libFuzzer reads its corpus (pass DIR as the corpus).
libfuzzer_sys::fuzz_target!(
    init: {
        if let Some(dir) = std::env::var_os("GPUVM_FUZZ_SEEDS") {
            gpuvm_fuzz::snapshot_stream::write_seeds(std::path::Path::new(&dir));
        }
    },
    |data: &[u8]| {
        gpuvm_fuzz::snapshot_stream::run(data);
    }
);
