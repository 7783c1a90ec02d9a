//! The bodies of gpuvm's cargo-fuzz targets, as plain functions over `&[u8]` so that
//! `cargo +stable check` / `cargo +stable test` in `fuzz/` build them without libFuzzer.
//! Each `run` panics exactly when it found something (a panic inside gpuvm, or a broken
//! invariant asserted here). See `docs/fuzzing.md`.

pub mod fuzz_op;
pub mod pushbuf_decode;
pub mod seeds;
pub mod serve_control;
pub mod shadow_walk;
pub mod snapshot_stream;
pub mod vgpu_mmio;

// The control module names its streaming verbs' module (and they name it) from the crate
// root, as in the `gpuvm` binary.
use serve_control::control;
#[allow(dead_code)]
#[path = "../../apps/gpuvm/src/serve_migrate.rs"]
mod serve_migrate;

/// Reads the fuzz input as a stream of little-endian values; past the end it yields zeros.
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }

    /// True once every byte has been consumed.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next `n` bytes (zero-padded past the end).
    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let start = self.pos.min(self.data.len());
        let avail = (self.data.len() - start).min(N);
        b[..avail].copy_from_slice(&self.data[start..start + avail]);
        self.pos += N;
        b
    }

    pub fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
}

/// FNV-1a over `data`, to compare memory before and after a run.
pub fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    //! Smoke tests (`cargo +stable test` in `fuzz/`): every target on a few fixed inputs, and on
    //! every file in `corpus/<target>/` and `artifacts/<target>/` when those exist, so a crash
    //! found by libFuzzer can be replayed without nightly.
    use std::path::Path;

    fn inputs(target: &str) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = vec![
            vec![],
            vec![0; 64],
            vec![0xff; 256],
            (0..=255u8).collect(),
            (0..2048u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect(),
        ];
        for dir in ["corpus", "artifacts"] {
            let d = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join(target);
            if let Ok(rd) = std::fs::read_dir(d) {
                for e in rd.flatten() {
                    if let Ok(b) = std::fs::read(e.path()) {
                        v.push(b);
                    }
                }
            }
        }
        v
    }

    #[test]
    fn vgpu_mmio() {
        for i in inputs("vgpu_mmio") {
            super::vgpu_mmio::run(&i);
        }
    }

    /// Every kind of operation survives encode -> decode unchanged.
    #[test]
    fn vgpu_mmio_ops_round_trip() {
        use super::vgpu_mmio::FuzzOp;
        use gpuvm::phys::Bar;
        let ops = vec![
            FuzzOp::Bar {
                bar: Bar::Bar0,
                offset: 0x2254,
                width: 4,
                write: true,
                value: 0x8000_0001,
            },
            FuzzOp::Bar {
                bar: Bar::Bar0,
                offset: 0x70_0008,
                width: 8,
                write: false,
                value: 7,
            },
            FuzzOp::Bar {
                bar: Bar::Bar1,
                offset: 0x10_0040,
                width: 4,
                write: true,
                value: 0x40,
            },
            FuzzOp::Bar {
                bar: Bar::Bar3,
                offset: 0x3f_fff8,
                width: 8,
                write: true,
                value: u64::MAX,
            },
            FuzzOp::Bar {
                bar: Bar::Bar1,
                offset: 0x7ff_fffe,
                width: 2,
                write: false,
                value: 0,
            },
            FuzzOp::Config {
                offset: 0x04,
                width: 2,
                write: true,
                value: 0x6,
            },
            FuzzOp::Config {
                offset: 0xffc,
                width: 4,
                write: false,
                value: 0,
            },
            FuzzOp::Advance { us: 65535 },
            FuzzOp::RamWrite {
                gpa: 0x12_3458,
                value: 0xdead_beef,
            },
            FuzzOp::Poll,
            FuzzOp::Destroy,
        ];
        let mut bytes = Vec::new();
        for op in &ops {
            op.encode(&mut bytes);
        }
        let mut inp = super::Input::new(&bytes);
        let mut back = Vec::new();
        while let Some(op) = FuzzOp::decode(&mut inp) {
            back.push(op);
        }
        assert_eq!(back, ops);
    }

    /// A seed made from a recorded trace drives VM 0 through bring-up to real submissions
    /// that complete: the corpus starts deep in the device, not at empty inputs.
    #[test]
    fn trace_seed_reaches_completed_submissions() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/traces/1vm-lazy/vm0.mmiotrace.xz");
        let trace = gpuvm_trace::format::read_file(&path).expect("reading the trace");
        let (bytes, ops) = super::seeds::vgpu_mmio_seed(&trace);
        assert!(ops.len() < super::vgpu_mmio::MAX_OPS, "{} ops", ops.len());
        let summary = super::vgpu_mmio::run(&bytes);
        assert_eq!(summary.ops, ops.len());
        assert!(summary.doorbells > 0, "{summary:?}");
        assert!(summary.completions > 0, "{summary:?}");
    }

    /// Checkpoint seeds start from a vGPU restored from a snapshot of the trace's prefix and run
    /// the rest of it: each runs whole (the rig's checks after it hold) and together they
    /// reach the GPU (doorbells accepted by a restored vGPU, work completed).
    #[test]
    fn checkpoint_seeds_run_the_rest_of_their_trace_on_a_restored_vgpu() {
        let plan = super::seeds::checkpoint_plan();
        assert_eq!(plan.len(), 10 * super::seeds::CHECKPOINT_CUTS.len());
        let cuts = super::vgpu_mmio::Rig::new().checkpoint_cuts();
        let taken: Vec<usize> = (0..plan.len()).filter(|&i| cuts[i].is_some()).collect();
        assert!(taken.len() * 2 >= plan.len(), "{cuts:?}");
        let (mut doorbells, mut completions) = (0, 0);
        for i in taken {
            let cut = cuts[i].unwrap();
            assert!(cut >= plan[i].cut && cut < plan[i].ops.len(), "{i}: {cut}");
            let s = super::vgpu_mmio::run(&plan[i].seed(i, cut));
            assert_eq!(s.ops, plan[i].ops.len() - cut, "{}", plan[i].name);
            doorbells += s.doorbells;
            completions += s.completions;
        }
        assert!(
            doorbells > 0 && completions > 0,
            "{doorbells} {completions}"
        );
    }

    /// Reusing one rig gives an input the same result as a rig of its own, also after other
    /// inputs ran on it (the reset between inputs is complete enough for the trace seed).
    #[test]
    fn vgpu_mmio_reuse_matches_a_fresh_rig() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/traces/1vm-lazy/vm0.mmiotrace.xz");
        let trace = gpuvm_trace::format::read_file(&path).expect("reading the trace");
        let (bytes, _) = super::seeds::vgpu_mmio_seed(&trace);
        let fresh = super::vgpu_mmio::run_fresh(&bytes);
        for i in inputs("vgpu_mmio").iter().take(5) {
            super::vgpu_mmio::run(i);
        }
        assert_eq!(super::vgpu_mmio::run(&bytes), fresh);
        assert_eq!(super::vgpu_mmio::run(&bytes), fresh);
    }

    #[test]
    fn serve_control() {
        let mut handled = 0;
        for i in super::serve_control::seeds()
            .into_iter()
            .chain(inputs("serve_control"))
        {
            handled += super::serve_control::run(&i);
        }
        assert!(handled >= 10, "{handled}");
    }

    /// The seeds parse, the whole snapshots restore; prefixes of the short seed, flipped bytes
    /// in it and in the parked channel's device state, are refused or restored without a
    /// finding.
    #[test]
    fn snapshot_stream() {
        let seeds = super::snapshot_stream::seeds();
        for (i, s) in seeds.iter().enumerate() {
            let r = super::snapshot_stream::run(s);
            if i == 1 {
                // Without its pages the bound channel's instance block reads as zeroes.
                assert!(r.parsed && !r.restored, "{r:?}");
                assert!(
                    r.error.as_deref().unwrap_or("").contains("beyond its"),
                    "{r:?}"
                );
            } else {
                assert!(r.parsed && r.restored, "{r:?}");
            }
        }
        let short = &seeds[1];
        for n in (0..300).chain((300..short.len()).step_by(13)) {
            super::snapshot_stream::run(&short[..n.min(short.len())]);
        }
        for i in (0..short.len()).step_by(97) {
            let mut b = short.clone();
            b[i] ^= 0x5a;
            super::snapshot_stream::run(&b);
        }
        for i in inputs("snapshot_stream") {
            super::snapshot_stream::run(&i);
        }
    }

    #[test]
    fn pushbuf_decode() {
        for i in inputs("pushbuf_decode") {
            super::pushbuf_decode::run(&i);
        }
    }

    #[test]
    fn shadow_walk() {
        for i in inputs("shadow_walk") {
            super::shadow_walk::run(&i);
        }
    }
}
