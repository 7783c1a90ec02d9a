//! Every path through the host's locks at once (the engines-and-locks issue): on one simulated
//! GPU with the real clock (engines on the simulator's worker, register reads on the fast path
//! under only their VM's lock), VMs whose drivers run verified workloads while several threads
//! per VM hammer their registers and USERD; meanwhile a thread creates and destroys
//! VMs, and another migrates a running VM back and forth to a second GPU. In a debug build
//! (what `cargo test` runs) the lock order is checked at every lock (`gpuvm::vgpu::cell`): a
//! violation panics instead of deadlocking. The threads stop once VMs were churned and moves
//! made ([`CHURNED`], [`MOVES`]); the test passes if every workload verified and every thread
//! came back — a deadlock never returns (CI's timeout then fails it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use gpuvm::clock::{Clock, RealClock};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::migrate;
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::Vgpu;
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, Gpu};
use gpuvm_harness::hal::InProcessHal;
use gpuvm_harness::MovableVgpu;
use gpuvm_sim::{SimConfig, SimGpu};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const RAM: usize = 16 << 20;
/// VMs the churn thread creates and destroys, and moves the mover makes, before the test
/// stops every thread (the test is bounded by work done, not by time).
const CHURNED: u64 = 1;
const MOVES: u64 = 2;
const HAMMERS_PER_VM: usize = 3;

fn host(clock: &Arc<dyn Clock>) -> Arc<GpuHost> {
    let gpu: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: 2 << 30,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let h = GpuHost::new(gpu, HostConfig::default()).unwrap();
    h.set_clock(clock.clone());
    Arc::new(h)
}

fn profile(name: &str, shadow: ShadowMode) -> VgpuProfile {
    VgpuProfile {
        name: name.into(),
        vram_mib: 64,
        channels: 4,
        weight: 1,
        shadow,
    }
}

fn ram() -> GuestMemoryMmap {
    GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), RAM)]).unwrap()
}

/// What every thread counts.
#[derive(Default)]
struct Counts {
    verified: AtomicU64,
    failed: AtomicU64,
    accesses: AtomicU64,
    created: AtomicU64,
    moves: AtomicU64,
}

/// Register reads and USERD reads (GP_GET, GP_PUT of each of the VM's channels, in the poll
/// area the driver set up) until `stop`: the fast path, beside the driver's own accesses (its
/// doorbells, with new work, take the host lock). The hammer writes nothing (a second writer
/// of a GP_PUT the driver owns would rewind its ring) and reads USERD only once the poll area
/// is set (a BAR1 read elsewhere may fault, which the driver would see).
fn hammer(v: &Arc<Vgpu>, stop: &AtomicBool, c: &Counts) {
    use gpuvm::gf100::{pfifo, pmc, userd};
    let mut b = [0u8; 4];
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let chan = (i / 4) % 4 * userd::SIZE;
        match i % 4 {
            0 => v.bar_read(Bar::Bar0, u64::from(pmc::INTR_HOST), &mut b),
            1 => v.bar_read(Bar::Bar0, u64::from(pfifo::INTR), &mut b),
            reg => {
                v.bar_read(Bar::Bar0, u64::from(pfifo::USERD_POLL_BASE), &mut b);
                if let Some(area) = pfifo::userd_poll_decode(u32::from_le_bytes(b)) {
                    let word = if reg == 2 {
                        userd::GP_GET
                    } else {
                        userd::GP_PUT
                    };
                    v.bar_read(Bar::Bar1, area + chan + word, &mut b);
                }
            }
        }
        i += 1;
    }
    c.accesses.fetch_add(i, Ordering::Relaxed);
}

fn workload_loop<H>(drv: &mut Gpu<H>, stop: &AtomicBool, c: &Counts)
where
    H: gpuvm_guest::hal::Mmio + gpuvm_guest::hal::Dma + gpuvm_guest::hal::Platform,
{
    let ws = [Workload::Madd, Workload::MemcpyHtod, Workload::Mmul];
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let w = ws[i % ws.len()];
        match workloads::run(drv, w, 32) {
            Ok(r) if r.verified => c.verified.fetch_add(1, Ordering::Relaxed),
            other => {
                eprintln!("{w:?}: {:?}", other.map(|r| r.verified));
                c.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
        i += 1;
    }
}

#[test]
fn every_lock_path_at_once_finds_no_deadlock_and_loses_no_work() {
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let (a, b) = (host(&clock), host(&clock));
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let mut threads = Vec::new();

    // Steady VMs: a driver each, and hammering threads.
    for (k, mode) in [ShadowMode::Lazy, ShadowMode::Eager, ShadowMode::Pv]
        .into_iter()
        .enumerate()
    {
        let v = a
            .create_vgpu(&profile(&format!("steady{k}"), mode))
            .unwrap();
        let mem = ram();
        v.attach_guest_memory(mem.clone()).unwrap();
        let (stop1, c, clock, v2) = (stop.clone(), counts.clone(), clock.clone(), v.clone());
        threads.push(std::thread::spawn(move || {
            let hal = InProcessHal::with_device(v2, clock, mem, 0, RAM as u64);
            let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
            workload_loop(&mut drv, &stop1, &c);
        }));
        for _ in 0..HAMMERS_PER_VM {
            let (stop, c, v) = (stop.clone(), counts.clone(), v.clone());
            threads.push(std::thread::spawn(move || hammer(&v, &stop, &c)));
        }
    }

    // Churn: VMs created, brought up, run once and destroyed, over and over.
    {
        let (stop, c, clock, a) = (stop.clone(), counts.clone(), clock.clone(), a.clone());
        threads.push(std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let v = a
                    .create_vgpu(&profile(&format!("churn{n}"), ShadowMode::Lazy))
                    .unwrap();
                let mem = ram();
                v.attach_guest_memory(mem.clone()).unwrap();
                let hal = InProcessHal::with_device(v.clone(), clock.clone(), mem, 0, RAM as u64);
                let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
                match workloads::run(&mut drv, Workload::Madd, 16) {
                    Ok(r) if r.verified => c.verified.fetch_add(1, Ordering::Relaxed),
                    other => {
                        eprintln!("churn madd: {:?}", other.map(|r| r.verified));
                        c.failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                drop(drv);
                a.destroy_vgpu(&v).unwrap();
                c.created.fetch_add(1, Ordering::Relaxed);
                n += 1;
                // Enough of every path: the others stop with it.
                // (A mover that never succeeds still ends the test, which then fails on it.)
                if n >= CHURNED && (c.moves.load(Ordering::Relaxed) >= MOVES || n >= 100) {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }));
    }

    // A VM that moves between the two GPUs while its driver runs.
    {
        let v = a.create_vgpu(&profile("mover", ShadowMode::Lazy)).unwrap();
        let mem = ram();
        v.attach_guest_memory(mem.clone()).unwrap();
        let dev = MovableVgpu::new(v);
        let (stop1, c1, clock1, dev1, mem1) = (
            stop.clone(),
            counts.clone(),
            clock.clone(),
            dev.clone(),
            mem.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let hal = InProcessHal::with_device(dev1, clock1, mem1, 0, RAM as u64);
            let mut drv = Gpu::init(hal, DriverConfig::default()).unwrap();
            workload_loop(&mut drv, &stop1, &c1);
        }));
        let (stop, c, clock) = (stop.clone(), counts.clone(), clock.clone());
        let (a, b) = (a.clone(), b.clone());
        threads.push(std::thread::spawn(move || {
            let mut on_a = true;
            while !stop.load(Ordering::Relaxed) {
                // Back to back: the driver runs between a resume and the next pause.
                let (from, to) = if on_a { (&a, &b) } else { (&b, &a) };
                let cur = dev.current();
                dev.pause();
                let mut buf = Vec::new();
                match migrate::snapshot(from, &cur, &*clock, 2_000_000_000, &mut buf) {
                    Ok(_) => {
                        let next = migrate::restore(to, &buf[..], Some(mem.clone())).unwrap();
                        dev.switch_to(next);
                        from.destroy_vgpu(&cur).unwrap();
                        on_a = !on_a;
                        c.moves.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => dev.unpause(),
                }
            }
        }));
    }

    for t in threads {
        t.join()
            .expect("a thread panicked (a lock-order violation panics)");
    }
    let c = &counts;
    eprintln!(
        "verified {} workloads, {} accesses hammered, {} VMs churned, {} moves, {} fast-path accesses",
        c.verified.load(Ordering::Relaxed),
        c.accesses.load(Ordering::Relaxed),
        c.created.load(Ordering::Relaxed),
        c.moves.load(Ordering::Relaxed),
        a.stats().fast_path_accesses + b.stats().fast_path_accesses
    );
    let (verified, failed) = (
        c.verified.load(Ordering::Relaxed),
        c.failed.load(Ordering::Relaxed),
    );
    assert_eq!(failed, 0, "{verified} workloads verified, {failed} failed");
    assert!(verified > 0);
    assert!(c.accesses.load(Ordering::Relaxed) > 0);
    assert!(
        c.created.load(Ordering::Relaxed) > 0,
        "the churn thread made VMs"
    );
    assert!(c.moves.load(Ordering::Relaxed) > 0, "the mover moved");
    // Both hosts fine afterwards: nothing withheld, the fast path was taken.
    for h in [&a, &b] {
        let s = h.stats();
        assert_eq!(s.withheld_partitions, 0);
        assert_eq!(s.phys_fifo_errors, 0);
    }
    assert!(a.stats().fast_path_accesses > 0);
}
