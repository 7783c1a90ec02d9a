//! Seed inputs for `vgpu_mmio` made from the recorded traces in `tests/traces/` (see
//! docs/trace-format.md): a driver's real bring-up, channel setup, page-table writes, pushbuffer
//! contents and doorbells, encoded as [`FuzzOp`]s so that libFuzzer starts from deep device
//! states instead of from empty inputs.
//!
//! A trace has far more operations than one fuzz execution should run (about 170 k BAR writes
//! for the whole workload suite, almost all of them zeroes written into fresh page tables), so
//! the seed keeps what changes state in a fresh VM:
//! * BAR writes, except zero writes to aperture and PRAMIN addresses that were never written
//!   with anything else before (fresh VRAM is already zero). The same VRAM can be reached
//!   through several apertures, so this can drop a zero that overwrote an earlier value written
//!   elsewhere: a seed is a starting point for mutation, not an exact replay (that is
//!   `gpuvm trace replay`).
//! * Guest RAM writes, in 8-byte pieces, except all-zero pieces never written before.
//! * Clock advances (in steps of at most 65 ms, each with a host poll), polls, the VM's
//!   destruction.
//! * Reads, interrupt observations and marks are dropped: they do not change the device.

use std::collections::HashSet;

use gpuvm::phys::Bar;
use gpuvm::profile::ShadowMode;
use gpuvm_trace::format::{Op, Trace};

use crate::fuzz_op::{FuzzOp, MAX_OPS};

/// The BAR0 PRAMIN window (64 KiB of VRAM at the PBUS PMEM base).
const PRAMIN: std::ops::Range<u64> = 0x70_0000..0x80_0000;

/// Where the checkpoints of [`checkpoint_plan`] cut each trace: after this share of its
/// operations (percent).
pub const CHECKPOINT_CUTS: [usize; 3] = [50, 75, 90];

/// The recorded traces the seeds and checkpoints are made from.
pub fn trace_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/traces")
}

/// A trace's name for seed files: its directory and its file's stem (`1vm-lazy-vm0`).
pub fn trace_name(path: &std::path::Path) -> String {
    let dir = path
        .parent()
        .and_then(|p| p.file_name())
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file = path.file_name().unwrap_or_default().to_string_lossy();
    format!("{dir}-{}", file.split('.').next().unwrap_or("vm"))
}

/// One checkpoint of `vgpu_mmio` (see its module doc): a trace's operations and where to cut
/// them; the rig replays and snapshots those before the cut (moving it forward if that state
/// cannot be snapshotted), the seed is those after.
#[derive(Debug, Clone)]
pub struct CheckpointPlan {
    /// The trace (its directory and file) and the nominal cut, for file names.
    pub name: String,
    /// VM 0's shadow mode.
    pub mode: ShadowMode,
    /// The trace's operations.
    pub ops: Vec<FuzzOp>,
    /// The nominal cut.
    pub cut: usize,
}

impl CheckpointPlan {
    /// The seed input for the checkpoint `index` cut at `cut`: the index with bit 7 set, then
    /// the operations from the cut on.
    pub fn seed(&self, index: usize, cut: usize) -> Vec<u8> {
        let mut bytes = vec![0x80 | (index as u8 & 0x7f)];
        for op in &self.ops[cut.min(self.ops.len())..] {
            op.encode(&mut bytes);
        }
        bytes
    }
}

/// The checkpoints, in a fixed order (traces sorted by path, then [`CHECKPOINT_CUTS`]); empty
/// if the traces are not there. Read once per process.
pub fn checkpoint_plan() -> &'static [CheckpointPlan] {
    static PLAN: std::sync::OnceLock<Vec<CheckpointPlan>> = std::sync::OnceLock::new();
    PLAN.get_or_init(|| {
        let mut paths: Vec<_> = std::fs::read_dir(trace_dir())
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(".mmiotrace.xz"))
            .collect();
        paths.sort();
        let mut plan = Vec::new();
        for path in paths {
            let Ok(trace) = gpuvm_trace::format::read_file(&path) else {
                continue;
            };
            let (_, ops) = vgpu_mmio_seed(&trace);
            let name = trace_name(&path);
            for cut in CHECKPOINT_CUTS {
                plan.push(CheckpointPlan {
                    name: format!("{name}-{cut}"),
                    mode: trace.header.profile.shadow,
                    cut: ops.len() * cut / 100,
                    ops: ops.clone(),
                });
            }
        }
        plan.truncate(128);
        plan
    })
}

/// Encodes `trace` (one VM's accesses) as a `vgpu_mmio` input of at most [`MAX_OPS`]
/// operations. The first byte selects the trace's shadow mode for VM 0.
pub fn vgpu_mmio_seed(trace: &Trace) -> (Vec<u8>, Vec<FuzzOp>) {
    let mode = ShadowMode::ALL
        .iter()
        .position(|m| *m == trace.header.profile.shadow)
        .unwrap_or(0) as u8;
    let mut ops = Vec::new();
    let mut written: HashSet<(u8, u64)> = HashSet::new();
    let mut ram_written: HashSet<u64> = HashSet::new();
    let mut now = trace.events.first().map_or(0, |e| e.time_ns);
    for e in &trace.events {
        match &e.op {
            Op::Write {
                bar,
                offset,
                width,
                value,
            } => {
                let data_window = *bar != Bar::Bar0 || PRAMIN.contains(offset);
                let key = (*bar as u8, *offset);
                if data_window && *value == 0 && !written.contains(&key) {
                    continue;
                }
                if data_window {
                    written.insert(key);
                }
                ops.push(FuzzOp::Bar {
                    bar: *bar,
                    offset: *offset,
                    width: *width,
                    write: true,
                    value: *value,
                });
            }
            Op::Clock { ns } => {
                let mut delta_us = ns.saturating_sub(now) / 1000;
                now = now.max(*ns);
                while delta_us > 0 {
                    let step = delta_us.min(u64::from(u16::MAX));
                    ops.push(FuzzOp::Advance { us: step as u16 });
                    delta_us -= step;
                }
            }
            Op::DmaWrite { gpa, data } => {
                // 8-byte pieces on 8-byte boundaries, merged with what was there (zero if new).
                let start = gpa & !7;
                let end = gpa + data.len() as u64;
                let mut a = start;
                while a < end {
                    let mut piece = [0u8; 8];
                    for (i, b) in piece.iter_mut().enumerate() {
                        let at = a + i as u64;
                        if at >= *gpa && at < end {
                            *b = data[(at - gpa) as usize];
                        }
                    }
                    let value = u64::from_le_bytes(piece);
                    // A piece only partly covered would zero its other bytes; the driver's
                    // writes are 4-byte aligned words in practice, so take the risk in a seed.
                    if value != 0 || ram_written.contains(&a) {
                        ram_written.insert(a);
                        if let Ok(gpa) = u32::try_from(a) {
                            ops.push(FuzzOp::RamWrite { gpa, value });
                        }
                    }
                    a += 8;
                }
            }
            Op::Poll => ops.push(FuzzOp::Poll),
            Op::Destroy => ops.push(FuzzOp::Destroy),
            Op::Read { .. } | Op::Irq { .. } | Op::DmaRead { .. } | Op::Mark(_) => {}
        }
    }
    ops.truncate(MAX_OPS);
    let mut bytes = vec![mode];
    for op in &ops {
        op.encode(&mut bytes);
    }
    (bytes, ops)
}
