//! `snapshot_stream`: the vGPU snapshot / migration stream (`gpuvm::migrate::stream`,
//! docs/migration.md) read as the untrusted input it is. Every input is first read record by
//! record by `StreamReader` alone; if its header and INFO record parse, it is then handed to
//! `gpuvm::migrate::restore` on a host reused for the whole process (a small simulated GF100
//! with one neighbour VM), with guest RAM attached.
//!
//! Invariants: no panic; a refused restore leaves the host's allocators (VMs, VRAM, hypervisor
//! VRAM and its quarantine, channels, DMA windows, IOVA space, withheld partitions) exactly at
//! their baseline; a restore that succeeds gives a vGPU of the INFO record's profile, and once
//! it is destroyed the host is back at the baseline too. A sample of the neighbour's VRAM (a
//! page every 256 KiB) is compared before and after: a restore writes only into the slice of
//! the vGPU it creates.
//!
//! Seeds ([`seeds`]): real snapshots of a small VM — after its driver ran a workload (pages,
//! bound channels, GPU contexts), the same with its PAGES records dropped (short, so mutations
//! land on the JSON; refused at the first channel's binding, its instance block being absent),
//! and a VM the guest never touched.

use std::sync::Arc;

use gpuvm::clock::{Clock, SimClock};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::migrate::{self, stream::StreamReader};
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::Vgpu;
use gpuvm_sim::{CostModel, SimConfig, SimGpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// Guest RAM of the seeds' VM and of every restore.
pub const RAM: usize = 32 << 20;

/// The profile of the seeds' VM.
pub fn profile() -> VgpuProfile {
    VgpuProfile {
        name: "fuzz".into(),
        vram_mib: 64,
        channels: 8,
        weight: 1,
        shadow: ShadowMode::Lazy,
    }
}

fn new_host(clock: &Arc<SimClock>) -> GpuHost {
    let gpu = Arc::new(SimGpu::new(SimConfig {
        vram_size: 512 << 20,
        clock: clock.clone(),
        cost: CostModel::instant(),
        ..SimConfig::default()
    }));
    let h = GpuHost::new(
        gpu,
        HostConfig {
            hypervisor_vram: 64 << 20,
            ..HostConfig::default()
        },
    )
    .expect("GpuHost::new");
    h.set_clock(clock.clone());
    h
}

/// The allocator figures of a host.
fn figures(h: &GpuHost) -> [u64; 8] {
    let s = h.stats();
    [
        s.vms as u64,
        s.vram_free,
        s.hypervisor_vram_used,
        s.hypervisor_vram_quarantined,
        u64::from(s.channels_free),
        s.dma_windows_free as u64,
        s.iova_free,
        s.withheld_partitions,
    ]
}

/// A sample of the neighbour's slice: one page every 256 KiB (the patterned pages among them)
/// and the last page. Reading all 64 MiB per input cost more than the rest of an execution.
fn slice_sample(v: &Vgpu) -> u64 {
    let size = v.vram_slice().size;
    let mut page = [0u8; 4096];
    let mut h = 0u64;
    let offsets = (0..size)
        .step_by(256 << 10)
        .chain(std::iter::once(size - 4096));
    for off in offsets {
        v.vram_read(off, &mut page)
            .expect("reading the neighbour's slice");
        h = h.rotate_left(7) ^ crate::fnv(&page);
    }
    h
}

/// The host, its neighbour and the baseline, built once per process.
pub struct Rig {
    host: GpuHost,
    neighbour: Arc<Vgpu>,
    neighbour_hash: u64,
    ram: GuestMemoryMmap,
    baseline: [u64; 8],
}

impl Rig {
    fn new() -> Rig {
        let clock = Arc::new(SimClock::new());
        let host = new_host(&clock);
        let neighbour = host.create_vgpu(&profile()).expect("the neighbour");
        // Something other than zeroes in the neighbour's slice, on the sampled pages.
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        for p in 0..64u64 {
            neighbour
                .restore_vram(p * 0x10_0000, &pattern)
                .expect("neighbour pattern");
        }
        let neighbour_hash = slice_sample(&neighbour);
        let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM)]).expect("RAM");
        let baseline = figures(&host);
        Rig {
            host,
            neighbour,
            neighbour_hash,
            ram,
            baseline,
        }
    }
}

thread_local! {
    static RIG: Rig = Rig::new();
}

/// What one input did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// Records the reader accepted.
    pub records: u64,
    /// The reader reached END.
    pub parsed: bool,
    /// A restore was tried.
    pub restore_tried: bool,
    /// It succeeded.
    pub restored: bool,
    /// Why it was refused.
    pub error: Option<String>,
}

/// Runs one input (panics on a finding).
pub fn run(data: &[u8]) -> Summary {
    RIG.with(|rig| run_on(rig, data))
}

fn run_on(rig: &Rig, data: &[u8]) -> Summary {
    let mut s = Summary::default();
    let mut info_ok = false;
    if let Ok(mut r) = StreamReader::new(data) {
        loop {
            match r.next_record() {
                Ok(Some(_)) => {
                    s.records += 1;
                    info_ok = true;
                }
                Ok(None) => {
                    s.parsed = true;
                    break;
                }
                Err(_) => break,
            }
        }
    }
    if !info_ok {
        return s;
    }
    s.restore_tried = true;
    let ram = rig.ram.clone();
    match migrate::restore(&rig.host, data, Some(ram)) {
        Ok(v) => {
            assert!(s.parsed, "restore accepted a stream the reader refused");
            s.restored = true;
            rig.host.poll();
            rig.host
                .destroy_vgpu(&v)
                .expect("destroying the restored vGPU");
            rig.host.poll();
            assert_eq!(
                figures(&rig.host),
                rig.baseline,
                "host not back at baseline after a restored vGPU was destroyed"
            );
        }
        Err(e) => {
            s.error = Some(e.to_string());
            assert_eq!(
                figures(&rig.host),
                rig.baseline,
                "host not at baseline after a refused restore"
            );
        }
    }
    assert_eq!(
        slice_sample(&rig.neighbour),
        rig.neighbour_hash,
        "a restore wrote into the neighbour's VRAM"
    );
    s
}

/// Snapshots of a small VM: after a workload, the same without its pages, and untouched.
pub fn seeds() -> Vec<Vec<u8>> {
    use gpuvm_guest::workloads::{self, Workload};
    use gpuvm_guest::{DriverConfig, Gpu};
    use gpuvm_harness::hal::InProcessHal;

    let clock = Arc::new(SimClock::new());
    let host = new_host(&clock);
    let mut out = Vec::new();

    let idle = host.create_vgpu(&profile()).expect("idle VM");
    let mut b = Vec::new();
    migrate::snapshot(&host, &idle, &*clock, 1_000_000_000, &mut b).expect("idle snapshot");
    out.push(b);

    let v = host.create_vgpu(&profile()).expect("VM");
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM)]).expect("RAM");
    v.attach_guest_memory(ram.clone()).expect("attach");
    let c: Arc<dyn Clock> = clock.clone();
    let hal = InProcessHal::with_device(v.clone(), c, ram, 0, RAM as u64);
    let mut drv = Gpu::init(hal, DriverConfig::default()).expect("driver");
    let r = workloads::run(&mut drv, Workload::Madd, 8).expect("madd");
    assert!(r.verified);
    let mut full = Vec::new();
    migrate::snapshot(&host, &v, &*clock, 1_000_000_000, &mut full).expect("snapshot");
    out.push(strip_pages(&full));
    out.push(full);
    host.resume(&v).expect("resume after the snapshot");

    // A channel parked on a semaphore acquire, part-way through its segment: its GPU context
    // carries the segment, the acquire and a GP_GET short of GP_PUT.
    let mut ch = drv.channel_new().expect("channel");
    let sem = drv
        .buffer_new(ch.vm_mut(), 4096, gpuvm_guest::MemLocation::Vram, true)
        .expect("semaphore");
    let mut pb = gpuvm_guest::PushBuf::new();
    pb.semaphore_acquire_geq(sem.va(), 1);
    pb.semaphore_release(sem.va() + 64, 0xbeef, false, false);
    drv.submit(&mut ch, &pb).expect("submit");
    for _ in 0..100 {
        clock.advance(100_000);
        host.poll();
    }
    let mut parked = Vec::new();
    migrate::snapshot(&host, &v, &*clock, 1_000_000_000, &mut parked).expect("parked snapshot");
    out.push(parked);
    out
}

/// `s` without its PAGES records (END's counts adjusted): a stream the reader accepts, which
/// `restore` refuses once it binds a channel (its instance block is not there).
pub fn strip_pages(s: &[u8]) -> Vec<u8> {
    let mut out = s[..12].to_vec();
    let mut recs = 0u64;
    let mut i = 12;
    while i + 5 <= s.len() {
        let tag = s[i];
        let len = u32::from_le_bytes([s[i + 1], s[i + 2], s[i + 3], s[i + 4]]) as usize;
        let rec = &s[i..i + 5 + len];
        i += 5 + len;
        match tag {
            2 => {}
            4 => {
                out.extend_from_slice(&rec[..5]);
                out.extend_from_slice(&0u64.to_le_bytes());
                out.extend_from_slice(&recs.to_le_bytes());
            }
            _ => {
                out.extend_from_slice(rec);
                recs += 1;
            }
        }
    }
    out
}

/// Writes [`seeds`] to `dir` as `seed-N`.
pub fn write_seeds(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).expect("creating the seed directory");
    for (i, s) in seeds().iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i}")), s).expect("writing a seed");
    }
}
