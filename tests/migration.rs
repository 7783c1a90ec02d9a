//! Snapshot, restore and live migration of a vGPU between two simulated GPUs in one process,
//! with the unmodified guest driver running its workloads before and after the move.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gpuvm::clock::{Clock, SimClock};
use gpuvm::gf100::pfifo;
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::migrate::{self, LiveOptions};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, Gpu, MemLocation, PushBuf};
use gpuvm_harness::hal::InProcessHal;
use gpuvm_harness::MovableVgpu;
use gpuvm_sim::{SimConfig, SimGpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const RAM: usize = 32 << 20;

fn host(clock: &Arc<SimClock>) -> GpuHost {
    let gpu: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: 1 << 30,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let h = GpuHost::new(gpu, HostConfig::default()).unwrap();
    h.set_clock(clock.clone());
    h
}

fn profile(shadow: ShadowMode) -> VgpuProfile {
    VgpuProfile {
        name: "mover".into(),
        vram_mib: 128,
        channels: 8,
        weight: 1,
        shadow,
    }
}

type Drv = Gpu<InProcessHal<MovableVgpu>>;

fn run_all(drv: &mut Drv) {
    for w in [
        Workload::Madd,
        Workload::MemcpyHtod,
        Workload::MemcpyDtoh,
        Workload::Fmadd,
    ] {
        let r = workloads::run(drv, w, 32).unwrap();
        assert!(r.verified, "{w:?}");
    }
}

#[test]
fn live_migration_moves_a_running_vm() {
    let clock = Arc::new(SimClock::new());
    let (a, b) = (host(&clock), host(&clock));
    let v = a.create_vgpu(&profile(ShadowMode::Lazy)).unwrap();
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM)]).unwrap();
    v.attach_guest_memory(ram.clone()).unwrap();
    let dev = MovableVgpu::new(v.clone());
    let c: Arc<dyn Clock> = clock.clone();
    let hal = InProcessHal::with_device(dev.clone(), c, ram.clone(), 0, RAM as u64);
    let moved = dev.clone();
    let guest = std::thread::spawn(move || {
        let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
        // Workloads until the guest has been moved, then 7 more there (however fast the guest
        // runs against the migration, some of its work runs on the destination).
        let (mut done, mut after) = (0, 0);
        while after < 7 {
            if moved.moves() > 0 {
                after += 1;
            }
            let w = Workload::ALL[done % Workload::ALL.len()];
            let r = workloads::run(&mut drv, w, 32).unwrap();
            assert!(r.verified, "{w:?} run {done}");
            done += 1;
        }
        done
    });
    // Let the guest get going (the migration then finds work in flight).
    while v.stats().submissions < 5 {
        std::thread::yield_now();
    }
    let mut buf = Vec::new();
    let (p, u) = (dev.clone(), dev.clone());
    let stats = migrate::migrate_live(
        &a,
        &v,
        &*clock,
        LiveOptions::default(),
        &mut buf,
        &mut || p.pause(),
        &mut || u.unpause(),
    )
    .unwrap();
    assert!(stats.rounds.len() >= 2, "{stats:?}");
    let v2 = migrate::restore(&b, &buf[..], Some(ram.clone())).unwrap();
    dev.switch_to(v2.clone());
    a.destroy_vgpu(&v).unwrap();
    assert!(guest.join().unwrap() >= 7, "every workload verified");
    assert!(
        v2.stats().submissions > 0,
        "the guest went on on the destination"
    );
    assert_eq!(v2.stats().violations.total, 0);
}

// ---------------------------------------------------------------------------------------------
// Several VMs on each GPU, one moved mid-workload.

/// A guest running workloads in its own thread on `dev`: at least `min_runs`, and once `until`
/// is set, two more (so a guest that moved runs on the destination); returns how many verified.
fn spawn_guest(
    dev: MovableVgpu,
    clock: &Arc<SimClock>,
    ram: GuestMemoryMmap,
    min_runs: usize,
    until: Arc<AtomicBool>,
    name: String,
) -> std::thread::JoinHandle<usize> {
    let c: Arc<dyn Clock> = clock.clone();
    let hal = InProcessHal::with_device(dev, c, ram, 0, RAM as u64);
    std::thread::spawn(move || {
        let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
        let mut verified = 0;
        let mut last = None;
        for i in 0.. {
            if last.is_none() && i >= min_runs && until.load(Ordering::SeqCst) {
                last = Some(i + 2);
            }
            if last == Some(i) {
                break;
            }
            let w = Workload::ALL[i % Workload::ALL.len()];
            let r = workloads::run(&mut drv, w, 24).unwrap();
            assert!(r.verified, "{name}: {w:?} run {i}");
            verified += 1;
        }
        verified
    })
}

fn small_profile(name: &str) -> VgpuProfile {
    VgpuProfile {
        name: name.into(),
        vram_mib: 64,
        channels: 8,
        weight: 1,
        shadow: ShadowMode::Lazy,
    }
}

/// A VM with its RAM attached and a movable handle.
fn new_vm(h: &GpuHost, p: &VgpuProfile) -> (Arc<gpuvm::vgpu::Vgpu>, GuestMemoryMmap, MovableVgpu) {
    let v = h.create_vgpu(p).unwrap();
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM)]).unwrap();
    v.attach_guest_memory(ram.clone()).unwrap();
    let dev = MovableVgpu::new(v.clone());
    (v, ram, dev)
}

#[test]
fn live_migration_among_busy_neighbours() {
    const RUNS: usize = 14;
    for n in [1usize, 2, 4] {
        let clock = Arc::new(SimClock::new());
        let (a, b) = (host(&clock), host(&clock));
        let (v, ram, dev) = new_vm(&a, &small_profile("mover"));
        let mut others = Vec::new();
        for i in 1..n {
            others.push(("src", i, new_vm(&a, &small_profile("src-other"))));
        }
        for i in 0..n {
            others.push(("dst", i, new_vm(&b, &small_profile("dst-other"))));
        }
        let until = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for (side, i, (ov, oram, odev)) in &others {
            handles.push((
                ov.clone(),
                spawn_guest(
                    odev.clone(),
                    &clock,
                    oram.clone(),
                    RUNS,
                    until.clone(),
                    format!("{n} VMs: {side} vm{i}"),
                ),
            ));
        }
        let mover = spawn_guest(
            dev.clone(),
            &clock,
            ram.clone(),
            RUNS,
            until.clone(),
            format!("{n}: mover"),
        );
        // Mid-workload: the mover has submitted work (no timing involved: a counter).
        while v.stats().submissions < 6 {
            std::thread::yield_now();
        }
        let before = v.stats().submissions;
        let mut buf = Vec::new();
        let (p, u) = (dev.clone(), dev.clone());
        let stats = migrate::migrate_live(
            &a,
            &v,
            &*clock,
            LiveOptions::default(),
            &mut buf,
            &mut || p.pause(),
            &mut || u.unpause(),
        )
        .unwrap();
        assert!(!stats.rounds.is_empty());
        let v2 = migrate::restore(&b, &buf[..], Some(ram.clone())).unwrap();
        dev.switch_to(v2.clone());
        a.destroy_vgpu(&v).unwrap();
        until.store(true, Ordering::SeqCst);
        assert!(mover.join().unwrap() >= RUNS, "{n} VMs: the mover");
        assert!(
            before > 0 && v2.stats().submissions > 0,
            "{n} VMs: ran on both sides"
        );
        assert_eq!(v2.stats().violations.total, 0, "{n} VMs: mover");
        for (ov, h) in handles {
            assert!(h.join().unwrap() >= RUNS, "{n} VMs: a neighbour");
            assert_eq!(ov.stats().violations.total, 0, "{n} VMs: a neighbour");
        }
        assert_eq!(dev.moves(), 1);
    }
}

// ---------------------------------------------------------------------------------------------
// The guest sees the same device after a round trip.

/// What the guest can see of its vGPU, apart from clocks and timers.
#[derive(Debug, PartialEq, Eq)]
struct Visible {
    /// (BAR0 offset, value) of every register word of the region tables (timers excluded).
    regs: Vec<(u32, u32)>,
    /// Per guest channel: CHAN word, STATE word, GP_GET and GP_PUT in its USERD (0 if unbound).
    chans: Vec<(u32, u32, u32, u32)>,
}

fn rd32(v: &gpuvm::vgpu::Vgpu, bar: gpuvm_guest::hal::Bar, off: u64) -> u32 {
    let mut b = [0u8; 4];
    v.bar_read(bar, off, &mut b);
    u32::from_le_bytes(b)
}

fn visible(v: &gpuvm::vgpu::Vgpu) -> Visible {
    use gf100::{pfifo, userd};
    use gpuvm::mmio::regions::{Policy, BAR0_REGIONS, BOARD_REGIONS};
    use gpuvm_guest::hal::Bar;
    let mut regs = Vec::new();
    for r in BAR0_REGIONS.iter().chain(BOARD_REGIONS.iter()) {
        // Timers and the clock-derived words move on their own; big windows (PRAMIN, ...)
        // are VRAM, compared below.
        if r.policy == Policy::Denied || r.name.contains("TIME") || r.size > 0x8000 {
            continue;
        }
        for off in (r.offset..r.offset + r.size.max(4)).step_by(4) {
            regs.push((off, rd32(v, Bar::Bar0, off as u64)));
        }
    }
    let poll = pfifo::userd_poll_decode(rd32(v, Bar::Bar0, pfifo::USERD_POLL_BASE as u64));
    let chans = (0..v.profile().channels)
        .map(|g| {
            let word = rd32(v, Bar::Bar0, pfifo::chan_table(g) as u64);
            let state = rd32(v, Bar::Bar0, pfifo::chan_state(g) as u64);
            let (get, put) = match poll {
                Some(base) if word & pfifo::CHAN_VALID != 0 => {
                    let u = base + g as u64 * userd::SIZE;
                    (
                        rd32(v, Bar::Bar1, u + userd::GP_GET),
                        rd32(v, Bar::Bar1, u + userd::GP_PUT),
                    )
                }
                _ => (0, 0),
            };
            (word, state, get, put)
        })
        .collect();
    Visible { regs, chans }
}

fn same_vram(a: &gpuvm::vgpu::Vgpu, b: &gpuvm::vgpu::Vgpu) {
    let size = a.vram_slice().size;
    assert_eq!(size, b.vram_slice().size);
    let mut x = vec![0u8; 1 << 20];
    let mut y = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < size {
        a.vram_read(off, &mut x).unwrap();
        b.vram_read(off, &mut y).unwrap();
        if x != y {
            let i = x.iter().zip(&y).position(|(p, q)| p != q).unwrap();
            panic!("VRAM differs at {:#x}", off + i as u64);
        }
        off += x.len() as u64;
    }
}

#[test]
fn a_round_trip_keeps_what_the_guest_sees() {
    for mode in [ShadowMode::Lazy, ShadowMode::Eager, ShadowMode::Pv] {
        let clock = Arc::new(SimClock::new());
        let (a, b) = (host(&clock), host(&clock));
        // Another VM on the destination first: the mover gets another slice and other
        // physical channels there.
        let _other = b.create_vgpu(&profile(mode)).unwrap();
        let v = a.create_vgpu(&profile(mode)).unwrap();
        let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM)]).unwrap();
        v.attach_guest_memory(ram.clone()).unwrap();
        let dev = MovableVgpu::new(v.clone());
        let c: Arc<dyn Clock> = clock.clone();
        let hal = InProcessHal::with_device(dev.clone(), c, ram.clone(), 0, RAM as u64);
        let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
        run_all(&mut drv);
        // The workloads returned: nothing of the guest's is in flight, so what it sees now is
        // what the snapshot must carry.
        dev.pause();
        let seen = visible(&v);
        assert!(
            seen.chans
                .iter()
                .any(|c| c.0 & gf100::pfifo::CHAN_VALID != 0),
            "{mode:?}: a bound channel to compare"
        );
        let mut buf = Vec::new();
        let st = migrate::snapshot(&a, &v, &*clock, 1_000_000_000, &mut buf).unwrap();
        assert!(st.pages > 0, "{mode:?}");
        assert_eq!(
            visible(&v),
            seen,
            "{mode:?}: quiescing changed nothing visible"
        );
        let v2 = migrate::restore(&b, &buf[..], Some(ram.clone())).unwrap();
        assert_ne!(v2.vram_slice().base, v.vram_slice().base, "{mode:?}");
        assert_ne!(v2.phys_channels(), v.phys_channels(), "{mode:?}");
        assert_eq!(visible(&v2), seen, "{mode:?}: restored");
        same_vram(&v, &v2);
        // And it goes on.
        dev.switch_to(v2.clone());
        a.destroy_vgpu(&v).unwrap();
        run_all(&mut drv);
        assert_eq!(v2.stats().violations.total, 0, "{mode:?}");
    }
}

/// A channel parked on a semaphore acquire when the VM is stopped has left the scheduler (its
/// submission ended), but the GPU is part-way through its pushbuffer. It moves with the
/// acquire, the rest of its segment and where GP_GET stands: on the destination it is still
/// parked, does not run ahead, and once the guest releases the semaphore it runs the rest of
/// its work there.
#[test]
fn a_channel_parked_on_an_acquire_moves_and_runs_on() {
    for mode in [ShadowMode::Lazy, ShadowMode::Eager, ShadowMode::Pv] {
        let clock = Arc::new(SimClock::new());
        let (a, b) = (host(&clock), host(&clock));
        let _other = b.create_vgpu(&profile(mode)).unwrap();
        let (v, ram, dev) = new_vm(&a, &profile(mode));
        let c: Arc<dyn Clock> = clock.clone();
        let hal = InProcessHal::with_device(dev.clone(), c, ram.clone(), 0, RAM as u64);
        let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
        let mut ch = drv.channel_new().unwrap();
        let sem = drv
            .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true)
            .unwrap();
        let mut pb = PushBuf::new();
        pb.semaphore_acquire_geq(sem.va(), 1);
        pb.semaphore_release(sem.va() + 64, 0xbeef, false, false);
        let fence = drv.submit(&mut ch, &pb).unwrap();
        let parked = |h: &GpuHost, v: &gpuvm::vgpu::Vgpu| {
            h.poll();
            let p = v.phys_channels().start + ch.chid();
            v.phys().read_reg(pfifo::chan_state(p)) & pfifo::STATE_ACQUIRE_PENDING != 0
        };
        for _ in 0..100 {
            clock.advance(100_000);
            a.poll();
        }
        assert!(parked(&a, &v), "{mode:?}: parked on the acquire");

        dev.pause();
        let seen = visible(&v);
        let mut buf = Vec::new();
        migrate::snapshot(&a, &v, &*clock, 1_000_000_000, &mut buf)
            .unwrap_or_else(|e| panic!("{mode:?}: snapshot of a parked channel: {e}"));
        let v2 = migrate::restore(&b, &buf[..], Some(ram.clone())).unwrap();
        assert_ne!(v2.phys_channels(), v.phys_channels(), "{mode:?}");
        // GP_GET included: the GPU stopped short of the GP_PUT it was given.
        assert_eq!(visible(&v2), seen, "{mode:?}: restored");
        dev.switch_to(v2.clone());
        a.destroy_vgpu(&v).unwrap();
        for _ in 0..100 {
            clock.advance(100_000);
            b.poll();
        }
        assert!(parked(&b, &v2), "{mode:?}: still parked on the destination");
        assert!(!drv.fence_done(&ch, fence).unwrap(), "{mode:?}");
        assert_eq!(drv.buffer_rd32(&sem, 64).unwrap(), 0, "{mode:?}: ran ahead");

        drv.buffer_wr32(&sem, 0, 1).unwrap();
        drv.fence_wait(&mut ch, fence).unwrap();
        assert_eq!(drv.buffer_rd32(&sem, 64).unwrap(), 0xbeef, "{mode:?}");
        run_all(&mut drv);
        let s = v2.stats();
        assert_eq!((s.violations.total, s.faults_delivered), (0, 0), "{mode:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Damaged snapshots: refused by name, the destination as it was.

/// A stream taken apart: the 12-byte header and the records (tag, payload).
struct Parts {
    head: Vec<u8>,
    recs: Vec<(u8, Vec<u8>)>,
}

const T_INFO: u8 = 1;
const T_PAGES: u8 = 2;
const T_DEVICE: u8 = 3;
const T_END: u8 = 4;

impl Parts {
    fn parse(b: &[u8]) -> Parts {
        let mut recs = Vec::new();
        let mut i = 12;
        while i < b.len() {
            let len = u32::from_le_bytes(b[i + 1..i + 5].try_into().unwrap()) as usize;
            recs.push((b[i], b[i + 5..i + 5 + len].to_vec()));
            i += 5 + len;
        }
        Parts {
            head: b[..12].to_vec(),
            recs,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        for (t, p) in &self.recs {
            out.push(*t);
            out.extend_from_slice(&(p.len() as u32).to_le_bytes());
            out.extend_from_slice(p);
        }
        out
    }

    /// Makes END's counts match the records (after records were added, moved or removed).
    fn fix_end(&mut self) {
        let n = self.recs.len();
        let pages: usize = self
            .recs
            .iter()
            .filter(|r| r.0 == T_PAGES)
            .map(|r| r.1.len() / (8 + 4096))
            .sum();
        if let Some(end) = self.recs.iter_mut().find(|r| r.0 == T_END) {
            end.1[..8].copy_from_slice(&(pages as u64).to_le_bytes());
            end.1[8..].copy_from_slice(&((n - 1) as u64).to_le_bytes());
        }
    }

    fn find(&self, tag: u8) -> usize {
        self.recs.iter().position(|r| r.0 == tag).unwrap()
    }

    fn json(&self, tag: u8) -> serde_json::Value {
        serde_json::from_slice(&self.recs[self.find(tag)].1).unwrap()
    }

    fn set_json(&mut self, tag: u8, v: &serde_json::Value) {
        let i = self.find(tag);
        self.recs[i].1 = serde_json::to_vec(v).unwrap();
    }
}

/// The allocator and VM figures of a host.
fn figures(h: &GpuHost) -> [u64; 8] {
    let s = h.stats();
    [
        s.vms as u64,
        s.vram_free,
        s.hypervisor_vram_used,
        s.hypervisor_vram_quarantined,
        s.channels_free as u64,
        s.dma_windows_free as u64,
        s.iova_free,
        s.withheld_partitions,
    ]
}

/// A small VM that ran a workload, and its snapshot.
fn small_snapshot(clock: &Arc<SimClock>) -> (Vec<u8>, GuestMemoryMmap) {
    let a = host(clock);
    let p = VgpuProfile {
        vram_mib: 64,
        ..profile(ShadowMode::Lazy)
    };
    let (v, ram, dev) = new_vm(&a, &p);
    let c: Arc<dyn Clock> = clock.clone();
    let hal = InProcessHal::with_device(dev.clone(), c, ram.clone(), 0, RAM as u64);
    let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
    let r = workloads::run(&mut drv, Workload::Madd, 16).unwrap();
    assert!(r.verified);
    dev.pause();
    let mut buf = Vec::new();
    migrate::snapshot(&a, &v, &**clock, 1_000_000_000, &mut buf).unwrap();
    (buf, ram)
}

/// The first bound channel of a DEVICE record's JSON.
fn bound_chan(dev: &serde_json::Value) -> usize {
    dev["chans"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| !c["gpu_context"].is_null())
        .expect("a bound channel")
}

#[test]
fn damaged_snapshots_are_refused_and_leave_the_host_as_it_was() {
    let clock = Arc::new(SimClock::new());
    let (good, ram) = small_snapshot(&clock);
    let b = host(&clock);
    let _neighbour = b.create_vgpu(&profile(ShadowMode::Lazy)).unwrap();
    let base = figures(&b);

    let refuse = |bytes: &[u8], expect: &str, case: &str| {
        let e = match migrate::restore(&b, bytes, Some(ram.clone())) {
            Ok(_) => panic!("{case}: restored"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(expect), "{case}: {e:?} does not say {expect:?}");
        assert_eq!(figures(&b), base, "{case}: the host changed");
    };

    let parts = Parts::parse(&good);
    assert_eq!(parts.bytes(), good, "the test's parser");
    let info_end = 12 + 5 + parts.recs[0].1.len();

    // Truncated: every prefix up to past INFO, every record boundary and its neighbours, and
    // a prefix every 509 bytes beyond (every prefix of the whole stream would be ~1000 times
    // more restores for no other code path: a cut inside a payload or a header is all there is).
    let mut cuts: Vec<usize> = (0..info_end + 64).collect();
    let mut at = 12;
    for (_, p) in &parts.recs {
        cuts.extend([at - 1, at, at + 1, at + 4, at + 5, at + 6]);
        at += 5 + p.len();
    }
    cuts.extend((0..good.len()).step_by(509));
    cuts.extend(good.len() - 21..good.len());
    cuts.sort_unstable();
    cuts.dedup();
    for &n in cuts.iter().filter(|&&n| n < good.len()) {
        let e = match migrate::restore(&b, &good[..n], Some(ram.clone())) {
            Ok(_) => panic!("a {n}-byte prefix restored"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("truncated"), "prefix {n}: {e}");
        assert_eq!(figures(&b), base, "prefix {n}");
    }

    let edit = |f: &dyn Fn(&mut Parts)| {
        let mut p = Parts::parse(&good);
        f(&mut p);
        p.bytes()
    };
    let device = |f: &dyn Fn(&mut serde_json::Value)| {
        edit(&|p: &mut Parts| {
            let mut d = p.json(T_DEVICE);
            f(&mut d);
            p.set_json(T_DEVICE, &d);
        })
    };

    let mut bad = good.clone();
    bad[0] = b'X';
    refuse(&bad, "bad magic", "magic");
    let mut bad = good.clone();
    bad[8..12].copy_from_slice(&2u32.to_le_bytes());
    refuse(&bad, "format version 2", "version");
    refuse(
        &edit(&|p| {
            p.recs.insert(1, (9, vec![0; 4]));
            p.fix_end();
        }),
        "tag 9",
        "unknown tag",
    );
    let mut bad = good[..info_end].to_vec();
    bad.push(T_PAGES);
    bad.extend_from_slice(&u32::MAX.to_le_bytes());
    refuse(&bad, "at most", "oversize length");
    refuse(
        &edit(&|p| {
            let i = p.find(T_PAGES);
            p.recs[i].1[..8].copy_from_slice(&(64u64 << 20 >> 12).to_le_bytes());
        }),
        "outside the 16384-page slice",
        "page beyond the slice",
    );
    refuse(
        &edit(&|p| {
            let i = p.find(T_PAGES);
            p.recs[i].1.truncate(100);
        }),
        "not whole pages",
        "a partial page",
    );
    refuse(
        &edit(&|p| {
            // A copy of a page record after DEVICE (moving the record instead would apply the
            // device state over an instance block not yet restored: refused too, but by the
            // binding check).
            let r = p.recs[p.find(T_PAGES)].clone();
            let d = p.find(T_DEVICE);
            p.recs.insert(d + 1, r);
            p.fix_end();
        }),
        "pages after DEVICE",
        "pages after DEVICE",
    );
    refuse(
        &edit(&|p| {
            let r = p.recs[0].clone();
            p.recs.insert(1, r);
            p.fix_end();
        }),
        "a second INFO",
        "second INFO",
    );
    refuse(
        &edit(&|p| {
            let d = p.find(T_DEVICE);
            let r = p.recs[d].clone();
            p.recs.insert(d, r);
            p.fix_end();
        }),
        "a second DEVICE",
        "second DEVICE",
    );
    refuse(
        &edit(&|p| {
            let d = p.find(T_DEVICE);
            p.recs.remove(d);
            p.fix_end();
        }),
        "no DEVICE record before END",
        "no DEVICE",
    );
    refuse(
        &edit(&|p| {
            p.recs.pop();
        }),
        "truncated: no END record",
        "missing END",
    );
    refuse(
        &edit(&|p| {
            let e = p.find(T_END);
            p.recs[e].1[0] ^= 1;
        }),
        "the producer sent",
        "END page count",
    );
    refuse(
        &edit(&|p| {
            let e = p.find(T_END);
            p.recs[e].1[8] ^= 1;
        }),
        "the producer sent",
        "END record count",
    );
    refuse(
        &edit(&|p| {
            let e = p.find(T_END);
            p.recs[e].1.push(0);
        }),
        "at most 16",
        "END of 17 bytes",
    );
    refuse(
        &edit(&|p| {
            p.recs[0].1 = b"{\"format\": ".to_vec();
        }),
        "record 0 (INFO)",
        "INFO malformed JSON",
    );
    refuse(
        &edit(&|p| {
            let mut i = p.json(T_INFO);
            i["extra"] = 1.into();
            p.set_json(T_INFO, &i);
        }),
        "unknown field `extra`",
        "INFO unknown field",
    );
    refuse(
        &edit(&|p| {
            let mut i = p.json(T_INFO);
            i["profile"]["vram_mib"] = 128.into();
            p.set_json(T_INFO, &i);
        }),
        "slice of 67108864 bytes, the profile has 134217728",
        "INFO slice and profile disagree",
    );
    refuse(
        &edit(&|p| {
            let d = p.find(T_DEVICE);
            let n = p.recs[d].1.len();
            p.recs[d].1.truncate(n / 2);
        }),
        "(DEVICE)",
        "DEVICE malformed JSON",
    );
    refuse(
        &device(&|d| d["extra"] = true.into()),
        "unknown field `extra`",
        "DEVICE unknown field",
    );
    refuse(
        &device(&|d| {
            let g = bound_chan(d);
            d["chans"][g]["extra"] = true.into();
        }),
        "unknown field `extra`",
        "channel unknown field",
    );
    refuse(
        &device(&|d| d["profile"]["name"] = "someone-else".into()),
        "its profile differs from INFO's",
        "DEVICE names another profile",
    );
    refuse(
        &device(&|d| d["version"] = 7.into()),
        "device state version 7",
        "DEVICE version",
    );
    refuse(
        &device(&|d| {
            d["chans"].as_array_mut().unwrap().pop();
        }),
        "7 channels, the profile has 8",
        "channel count",
    );
    refuse(
        &device(&|d| d["runlist"].as_array_mut().unwrap().push(8.into())),
        "runlist entry 8 is not a channel of the partition",
        "runlist outside the partition",
    );
    refuse(
        &device(&|d| {
            let g = bound_chan(d);
            d["runlist"] = vec![g, g].into();
        }),
        "or repeats",
        "runlist repeats a channel",
    );
    refuse(
        &device(&|d| {
            // The instance block at 256 MiB: outside the 64 MiB slice.
            let g = bound_chan(d);
            let w = gf100::pfifo::chan_encode(256 << 20, gf100::Target::Vram);
            d["chans"][g]["chan_word"] = w.into();
        }),
        "does not bind on the destination",
        "CHAN word outside the VM's memory",
    );
    refuse(
        &device(&|d| {
            let g = bound_chan(d);
            d["chans"][g]["gp_put"] = (1u32 << 30).into();
        }),
        "beyond its",
        "GP_PUT beyond the ring",
    );
    refuse(
        &device(&|d| {
            let g = bound_chan(d);
            d["chans"][g]["phys_put"] = (1u32 << 30).into();
        }),
        "beyond its",
        "the GPU's GP_PUT beyond the ring",
    );
    refuse(
        &device(&|d| {
            let g = bound_chan(d);
            d["chans"][g]["gp_get"] = (1u32 << 30).into();
        }),
        "beyond its",
        "the GPU's GP_GET beyond the ring",
    );
    refuse(
        &device(&|d| {
            let g = bound_chan(d);
            d["chans"][g]["gpu_context"] = b"not a context".to_vec().into();
        }),
        "invalid channel state",
        "corrupted GPU channel context",
    );
    refuse(
        &device(&|d| {
            let g = bound_chan(d);
            d["chans"][g]["gpu_context"] = serde_json::Value::Null;
        }),
        "needs its GPU context",
        "a bound channel without its context",
    );
    refuse(
        &device(&|d| {
            let g = bound_chan(d);
            d["chans"][g]["scan"]["run"] = serde_json::json!([7, 0, 1]);
        }),
        "invalid pushbuffer scan state",
        "scan mode",
    );
    refuse(
        &device(&|d| {
            let g = bound_chan(d);
            d["chans"][g]["scan"]["run"] = serde_json::json!([0, 0x100, 0]);
        }),
        "invalid pushbuffer scan state",
        "scan run with nothing remaining",
    );
    refuse(
        &device(&|d| {
            let g = bound_chan(d);
            d["chans"][g]["state"] = (1u32 << 31).into();
        }),
        "STATE bits beyond",
        "STATE bits",
    );

    // The host still works: the good snapshot restores, and a VM created afterwards runs.
    let v = migrate::restore(&b, &good[..], Some(ram.clone())).unwrap();
    b.destroy_vgpu(&v).unwrap();
    assert_eq!(figures(&b), base, "after the good one was destroyed");
    let (v, ram, dev) = new_vm(&b, &profile(ShadowMode::Lazy));
    let c: Arc<dyn Clock> = clock.clone();
    let hal = InProcessHal::with_device(dev, c, ram, 0, RAM as u64);
    let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
    run_all(&mut drv);
    assert_eq!(v.stats().violations.total, 0);
}

// ---------------------------------------------------------------------------------------------
// A migration that fails midway: the source goes on.

/// A writer that fails after `left` bytes.
struct FailAfter {
    left: usize,
}

impl std::io::Write for FailAfter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the destination went away",
            ));
        }
        let n = b.len().min(self.left);
        self.left -= n;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_failed_migration_leaves_the_source_running() {
    const RUNS: usize = 30;
    let clock = Arc::new(SimClock::new());
    let (a, b) = (host(&clock), host(&clock));
    let (v, ram, dev) = new_vm(&a, &small_profile("mover"));
    let until = Arc::new(AtomicBool::new(false));
    let guest = spawn_guest(
        dev.clone(),
        &clock,
        ram.clone(),
        RUNS,
        until.clone(),
        "source".into(),
    );
    while v.stats().submissions < 4 {
        std::thread::yield_now();
    }
    let (p, u) = (dev.clone(), dev.clone());

    // The stream breaks after the header, after a few pages, and deep into the rounds.
    for cut in [10usize, 300, 20_000] {
        let e = migrate::migrate_live(
            &a,
            &v,
            &*clock,
            LiveOptions::default(),
            FailAfter { left: cut },
            &mut || p.pause(),
            &mut || u.unpause(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("destination went away"), "{e}");
    }

    // Quiescing may not wait (0 ns) while the guest has work on the GPU: the migration is
    // abandoned as hung and the VM resumed. Whether work is in flight at the instant of the
    // pause depends on the guest thread, so try until it is (each try pauses the guest once).
    let mut hung = 0;
    for _ in 0..200 {
        let opts = LiveOptions {
            max_wait_ns: 0,
            ..LiveOptions::default()
        };
        match migrate::migrate_live(
            &a,
            &v,
            &*clock,
            opts,
            std::io::sink(),
            &mut || p.pause(),
            &mut || u.unpause(),
        ) {
            Err(e) => {
                assert!(e.to_string().contains("still had work on the GPU"), "{e}");
                hung += 1;
                if hung == 3 {
                    break;
                }
            }
            // Nothing was in flight: it worked, into a sink. Go on where it was.
            Ok(_) => {
                a.resume(&v).unwrap();
                u.unpause();
            }
        }
    }
    assert!(hung > 0, "never caught the guest with work in flight");

    // A snapshot (no pause from the harness: the guest is paused here by hand) that cannot
    // wait is refused too, and the VM resumed.
    dev.pause();
    let r = migrate::snapshot(&a, &v, &*clock, 0, std::io::sink());
    if let Err(e) = &r {
        assert!(e.to_string().contains("still had work"), "{e}");
    } else {
        a.resume(&v).unwrap();
    }
    dev.unpause();

    // After all that, a migration that works moves it, and everything verified on both sides.
    let mut buf = Vec::new();
    migrate::migrate_live(
        &a,
        &v,
        &*clock,
        LiveOptions::default(),
        &mut buf,
        &mut || p.pause(),
        &mut || u.unpause(),
    )
    .unwrap();
    let v2 = migrate::restore(&b, &buf[..], Some(ram.clone())).unwrap();
    dev.switch_to(v2.clone());
    a.destroy_vgpu(&v).unwrap();
    until.store(true, Ordering::SeqCst);
    assert!(guest.join().unwrap() >= RUNS);
    assert_eq!(v.stats().violations.total, 0);
    assert_eq!(v2.stats().violations.total, 0);
}

// ---------------------------------------------------------------------------------------------
// The vGPU's side of a migration driven piece by piece (what a daemon does for a VMM).

#[test]
fn an_outgoing_session_in_pieces_moves_the_vm_and_an_abandoned_one_resumes_it() {
    const RUNS: usize = 12;
    let clock = Arc::new(SimClock::new());
    let (a, b) = (Arc::new(host(&clock)), host(&clock));
    let (v, ram, dev) = new_vm(&a, &small_profile("mover"));
    let until = Arc::new(AtomicBool::new(false));
    let guest = spawn_guest(
        dev.clone(),
        &clock,
        ram.clone(),
        RUNS,
        until.clone(),
        "pieces".into(),
    );
    while v.stats().submissions < 4 {
        std::thread::yield_now();
    }
    // Abandoned after the stop: dropping the session resumes the VM, which goes on here.
    {
        let mut o = migrate::Outgoing::start(a.clone(), v.clone()).unwrap();
        o.round().unwrap();
        dev.pause();
        o.stop(&*clock, 1_000_000_000).unwrap();
    }
    dev.unpause();
    let resumed_at = v.stats().submissions;
    while v.stats().submissions < resumed_at + 3 {
        std::thread::yield_now();
    }
    // Now a whole one, its pieces taken between calls as a transport would.
    let mut o = migrate::Outgoing::start(a.clone(), v.clone()).unwrap();
    let mut stream = o.take();
    assert!(stream.starts_with(b"GPUVMSNP"));
    for _ in 0..2 {
        o.round().unwrap();
        stream.extend(o.take());
    }
    dev.pause();
    let st = o.stop(&*clock, 1_000_000_000).unwrap();
    stream.extend(o.take());
    assert!(o.round().is_err(), "no round after the stream has ended");
    assert!(o.take().is_empty());
    o.commit();
    // Committed: the source VM stays quiesced (no doorbell of it reaches the GPU).
    let frozen = v.stats().submissions;
    assert!(
        !st.dma_pages.is_empty(),
        "the guest's rings and buffers in RAM are reachable by the GPU"
    );
    let v2 = migrate::restore(&b, &stream[..], Some(ram.clone())).unwrap();
    dev.switch_to(v2.clone());
    until.store(true, Ordering::SeqCst);
    assert!(guest.join().unwrap() >= RUNS, "every workload verified");
    assert_eq!(v.stats().submissions, frozen);
    assert!(v2.stats().submissions > 0);
    a.destroy_vgpu(&v).unwrap();
    assert_eq!(v2.stats().violations.total, 0);
}
