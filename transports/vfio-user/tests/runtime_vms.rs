//! VMs added, removed and re-weighted while the daemon serves clients (issue 16), in-process
//! on the simulated GPU: a removed VM's VRAM slice is scrubbed and its socket gone while the
//! other VMs' clients keep answering and their memory is untouched; bad requests change
//! nothing; an idle daemon's event loop does not wake up.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use gpuvm::addr::HostVram;
use gpuvm::phys::PhysicalGpu;
use gpuvm::sched::Policy;
use gpuvm_vfio_user::{Daemon, VmSpec};
use vfio_user::Client;

fn spec(n: &str, weight: u32) -> VmSpec {
    support::spec(n, 64, weight)
}

fn start(test: &str, policy: Policy) -> (Daemon, PathBuf) {
    support::start(
        &format!("rt-{test}"),
        1 << 30,
        Some(policy),
        vec![spec("a", 1), spec("b", 1)],
    )
}

fn boot0(c: &mut Client) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(0, 0, &mut b).unwrap();
    u32::from_le_bytes(b)
}

const PATTERN: [u8; 8] = [0xde, 0xad, 0xbe, 0xef, 0x12, 0x34, 0x56, 0x78];

fn slice_words(phys: &dyn PhysicalGpu, base: u64, size: u64) -> Vec<[u8; 8]> {
    [0, size / 2, size - 8]
        .iter()
        .map(|o| {
            let mut b = [0u8; 8];
            phys.read_vram(HostVram(base + o), &mut b);
            b
        })
        .collect()
}

#[test]
fn add_and_remove_with_clients_connected() {
    let (d, dir) = start("addrm", Policy::Band);
    let phys = d.host().phys().clone();
    let mut ca = Client::new(&dir.join("a.sock")).unwrap();
    let mut cb = Client::new(&dir.join("b.sock")).unwrap();
    let id = boot0(&mut ca);
    assert_eq!(boot0(&mut cb), id);
    let (a, b) = (d.device("a").unwrap(), d.device("b").unwrap());
    let sa = a.vgpu().unwrap().vram_slice();
    let sb = b.vgpu().unwrap().vram_slice();
    let used_before = b
        .vgpu()
        .unwrap()
        .vram_in_use_bytes()
        .expect("the simulator tells");
    for s in [sa, sb] {
        for o in [0, s.size / 2, s.size - 8] {
            phys.write_vram(HostVram(s.base.0 + o), &PATTERN);
        }
    }
    // "VRAM in use" (`gpuvm stat`): the three written pages of b's slice count.
    let used = b.vgpu().unwrap().vram_in_use_bytes().unwrap();
    assert!(
        used >= used_before + 3 * 4096 && used <= sb.size,
        "{used_before} -> {used}"
    );

    // A third VM joins while both clients are connected.
    let c = d.add_vm(spec("c", 2)).unwrap();
    assert!(dir.join("c.sock").exists());
    let mut cc = Client::new(&dir.join("c.sock")).unwrap();
    assert_eq!(boot0(&mut cc), id);
    assert_eq!(c.profile().weight, 2);
    assert_eq!(d.host().stats().vms, 3);

    // Bad additions are refused and change nothing.
    let before = d.devices().len();
    assert!(d.add_vm(spec("a", 1)).is_err(), "duplicate name");
    assert!(d.add_vm(spec("no/slash", 1)).is_err(), "bad name");
    assert!(d.add_vm(spec("control", 1)).is_err(), "reserved name");
    let mut huge = spec("huge", 1);
    huge.profile.vram_mib = 1 << 20;
    assert!(d.add_vm(huge).is_err(), "no room");
    assert!(!dir.join("huge.sock").exists());
    assert!(d.remove_vm("nobody").is_err());
    assert_eq!(d.devices().len(), before);
    assert_eq!(d.host().stats().vms, 3);

    // vm b goes while its client is connected: its slice is scrubbed, its socket removed; a
    // and c are undisturbed.
    let removed = d.remove_vm("b").unwrap();
    assert!(removed.vgpu().is_none());
    assert!(!dir.join("b.sock").exists());
    assert!(d.device("b").is_none());
    assert_eq!(d.host().stats().vms, 2);
    assert!(
        slice_words(&*phys, sb.base.0, sb.size)
            .iter()
            .all(|w| *w == [0u8; 8]),
        "the removed VM's VRAM is scrubbed"
    );
    assert_eq!(
        phys.vram_resident_bytes(sb.base, sb.size),
        Some(0),
        "the scrub gave the removed slice's pages back"
    );
    assert!(
        slice_words(&*phys, sa.base.0, sa.size)
            .iter()
            .all(|w| *w == PATTERN),
        "the other VM's VRAM is untouched"
    );
    // The client of the removed VM still talks to its (dead) vGPU handle: no GPU answers.
    let dead = boot0(&mut cb);
    assert!(
        dead == u32::MAX || dead == 0xbad0_0100,
        "removed vGPU read {dead:#x}"
    );
    assert_eq!(boot0(&mut ca), id);
    assert_eq!(boot0(&mut cc), id);
    assert_eq!(a.teardowns(), 0);
    assert_eq!(a.rejected() + c.rejected(), 0);

    // The name can be served again, with a fresh vGPU.
    let b2 = d.add_vm(spec("b", 1)).unwrap();
    let mut cb2 = Client::new(&dir.join("b.sock")).unwrap();
    assert_eq!(boot0(&mut cb2), id);
    assert!(b2.vgpu().is_some());
    drop(cb2);
    drop((ca, cb, cc));
    d.shutdown();
    assert_eq!(d.host().stats().vms, 0);
    assert!(!dir.join("a.sock").exists() && !dir.join("c.sock").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn weights_and_caps_change_at_run_time_or_are_refused_unchanged() {
    let (d, dir) = start("weights", Policy::Band);
    let (a, b) = (d.device("a").unwrap(), d.device("b").unwrap());
    let share = |name: &str| {
        let id = d.device(name).unwrap().vgpu().unwrap().id();
        let s = d.host().sched_stats();
        s.vms.iter().find(|v| v.vm == id).unwrap().target_share
    };
    assert!((share("a") - 0.5).abs() < 1e-9);
    a.set_weight(3).unwrap();
    assert!((share("a") - 0.75).abs() < 1e-9);
    assert_eq!(a.profile().weight, 3);
    assert!(a.set_weight(0).is_err());
    assert!(a.set_weight(101).is_err());
    assert_eq!(a.profile().weight, 3, "a refused weight changes nothing");
    assert!((share("a") - 0.75).abs() < 1e-9);
    // A cap out of range is refused under BAND (with or without caps under every policy in
    // the core) and changes nothing.
    assert!(b.set_cap(Some(0)).is_err());
    assert!(b.set_cap(Some(2_000_000)).is_err());
    assert_eq!(b.cap_ppm(), None);
    // The weight survives a teardown (a reconnect gets the same profile).
    a.recycle("test").unwrap();
    assert!((share("a") - 0.75).abs() < 1e-9);
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);

    let (d, dir) = start("caps", Policy::FixedShare);
    let a = d.device("a").unwrap();
    let id = a.vgpu().unwrap().id();
    assert_eq!(
        d.host().vm_cap(id).0,
        Some(500_000),
        "uncapped: its weight's share"
    );
    a.set_cap(Some(250_000)).unwrap();
    assert_eq!(d.host().vm_cap(id).0, Some(250_000));
    assert!(a.set_cap(Some(0)).is_err());
    assert!(a.set_cap(Some(2_000_000)).is_err());
    assert_eq!(a.cap_ppm(), Some(250_000), "a refused cap changes nothing");
    a.recycle("test").unwrap();
    let id2 = a.vgpu().unwrap().id();
    assert_ne!(id, id2);
    assert_eq!(
        d.host().vm_cap(id2).0,
        Some(250_000),
        "the cap survives a teardown"
    );
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// With nothing pending the poller's timer is disarmed: it does not wake up at all (the old
/// poller woke every 200 us). Counts wake-ups, not time.
#[test]
fn an_idle_daemon_does_not_wake_up() {
    let (d, dir) = start("idle", Policy::Band);
    let mut ca = Client::new(&dir.join("a.sock")).unwrap();
    boot0(&mut ca);
    std::thread::sleep(Duration::from_millis(100));
    let w0 = d.waker().wakeups();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        d.waker().wakeups(),
        w0,
        "the event loop woke with nothing to do"
    );
    // A control change wakes it once.
    d.device("a").unwrap().set_weight(2).unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while d.waker().wakeups() == w0 {
        assert!(
            std::time::Instant::now() < end,
            "a kick never woke the loop"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(ca);
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
