//! Writes `vgpu_mmio` seed inputs made from recorded traces into `corpus/vgpu_mmio/`:
//! `cargo +stable run --release --bin seed_corpus -- ../tests/traces/*/*.mmiotrace.xz`
//! (see docs/fuzzing.md and `gpuvm_fuzz::seeds`).

use std::path::{Path, PathBuf};

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if args.is_empty() {
        eprintln!("usage: seed_corpus TRACE...  (writes corpus/vgpu_mmio/trace-*)");
        std::process::exit(2);
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/vgpu_mmio");
    std::fs::create_dir_all(&out).expect("creating corpus/vgpu_mmio");
    for path in args {
        let trace = match gpuvm_trace::format::read_file(&path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{}: {e}", path.display());
                std::process::exit(1);
            }
        };
        let (bytes, ops) = gpuvm_fuzz::seeds::vgpu_mmio_seed(&trace);
        let file = out.join(format!("trace-{}", gpuvm_fuzz::seeds::trace_name(&path)));
        std::fs::write(&file, &bytes).expect("writing a seed");
        println!(
            "{} -> {} ({} ops, {} bytes)",
            path.display(),
            file.display(),
            ops.len(),
            bytes.len()
        );
    }
    // Checkpoint seeds: the tails of the traces in ../tests/traces, started from a snapshot of
    // their prefix (gpuvm_fuzz::vgpu_mmio, "Checkpoint starts").
    let cuts = gpuvm_fuzz::vgpu_mmio::Rig::new().checkpoint_cuts();
    for (i, c) in gpuvm_fuzz::seeds::checkpoint_plan().iter().enumerate() {
        let Some(cut) = cuts[i] else {
            println!(
                "checkpoint {i} ({}): no cut near {} could be snapshotted (a channel with an operation on the GPU); no seed",
                c.name, c.cut
            );
            continue;
        };
        let file = out.join(format!("ckpt-{}", c.name));
        let bytes = c.seed(i, cut);
        std::fs::write(&file, &bytes).expect("writing a seed");
        println!(
            "checkpoint {i} (cut at {cut} of {} ops) -> {} ({} bytes)",
            c.ops.len(),
            file.display(),
            bytes.len()
        );
    }
}
