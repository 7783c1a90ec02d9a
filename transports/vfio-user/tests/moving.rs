//! Moving a VM's vGPU between two daemons in one process (`gpuvm_vfio_user::migration`): what a
//! client put in the vGPU (configuration space, registers, VRAM through PRAMIN) is what the
//! next client finds on the other daemon; every refusal names its reason and leaves the VM
//! with a working vGPU and its neighbour untouched.

mod support;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use gf100::pbus::{PMEM, PRAMIN_BASE};
use gpuvm::clock::ClockKind;
use gpuvm_vfio_user::Daemon;
use vfio_user::Client;

/// A daemon serving `a` (256 MiB) and `b` (128 MiB).
fn start(test: &str) -> (Daemon, PathBuf) {
    support::start(
        &format!("moving-{test}"),
        2 << 30,
        None,
        vec![support::spec("a", 256, 1), support::spec("b", 128, 1)],
    )
}

fn rd(c: &mut Client, region: u32, off: u64) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(region, off, &mut b).unwrap();
    u32::from_le_bytes(b)
}

fn wr(c: &mut Client, region: u32, off: u64, v: u32) {
    c.region_write(region, off, &v.to_le_bytes()).unwrap();
}

/// A client of `vm` with `ram` mapped at GPA 0 that has read its configuration space's ids
/// (as a booting VMM does first; one that first writes PCI_COMMAND is taken for a Cloud
/// Hypervisor restore and refused).
fn client(d: &Daemon, dir: &std::path::Path, vm: &str, ram: &File) -> Client {
    let mut c = Client::new(&dir.join(format!("{vm}.sock"))).unwrap();
    c.dma_map(0, 0, 2 << 20, ram.as_raw_fd()).unwrap();
    assert_eq!(rd(&mut c, 7, 0), 0x06d8_10de);
    // Answered, so the daemon's thread is serving this connection: it marked the client
    // connected before it began to serve.
    assert!(d.device(vm).unwrap().has_client(), "{vm}: connected");
    c
}

/// Words the first client writes into VRAM through PRAMIN at 1 MiB, and reads back.
const PATTERN: [u32; 4] = [0xdead_beef, 0x0123_4567, 0x89ab_cdef, 0x5a5a_a5a5];

#[test]
fn a_vgpu_moves_to_another_daemon_with_what_its_client_put_there() {
    let (src, sdir) = start("src");
    let (dst, ddir) = start("dst");
    let ram = support::sealed_memfd(2 << 20);
    let mut c = client(&src, &sdir, "a", &ram);
    wr(&mut c, 7, 4, 0x6); // memory decoding and bus mastering
    wr(&mut c, 0, PMEM as u64, 0x10); // PRAMIN at 1 MiB of the slice
    for (i, w) in PATTERN.iter().enumerate() {
        wr(&mut c, 0, PRAMIN_BASE as u64 + 4 * i as u64, *w);
    }
    let dev = src.device("a").unwrap();

    // Refusals first: no second session while one runs.
    let mut out = dev.migrate_out().unwrap();
    let e = dev.migrate_out().err().unwrap();
    assert!(e.contains("already being migrated"), "{e}");
    // Abandoned: the vGPU goes on, and a new session may start.
    out.round().unwrap();
    drop(out);
    assert_eq!(rd(&mut c, 0, PRAMIN_BASE as u64), PATTERN[0]);

    let mut out = dev.migrate_out().unwrap();
    let mut stream = out.take();
    out.round().unwrap();
    stream.extend(out.take());
    let clock = ClockKind::Real.create();
    let st = out.stop(&*clock, 1_000_000_000).unwrap();
    assert_eq!(st.withdrawn, 0);
    stream.extend(out.take());
    out.commit();

    // Restore needs the new client connected with its RAM mapped.
    let target = dst.device("a").unwrap();
    let e = target.restore_from(&stream).err().unwrap();
    assert!(e.contains("has no client"), "{e}");
    let mut n = client(&dst, &ddir, "a", &ram);
    let fresh = target.vgpu().unwrap().id();
    let v = target.restore_from(&stream).unwrap();
    assert_ne!(v.id(), fresh);
    // The new client finds configuration space, the PRAMIN window and VRAM as they were.
    assert_eq!(rd(&mut n, 7, 4) & 0x6, 0x6);
    assert_eq!(rd(&mut n, 0, PMEM as u64) & 0xff_ffff, 0x10);
    for (i, w) in PATTERN.iter().enumerate() {
        assert_eq!(rd(&mut n, 0, PRAMIN_BASE as u64 + 4 * i as u64), *w);
    }
    // And it goes on: a write reaches the restored vGPU.
    wr(&mut n, 0, PRAMIN_BASE as u64, 7);
    assert_eq!(rd(&mut n, 0, PRAMIN_BASE as u64), 7);
    assert_eq!(target.rejected(), 0);
    drop(n);
    drop(c);
    src.shutdown();
    dst.shutdown();
    let _ = std::fs::remove_dir_all(&sdir);
    let _ = std::fs::remove_dir_all(&ddir);
}

#[test]
fn a_bad_stream_or_a_mismatched_vm_is_refused_and_the_vm_keeps_a_working_vgpu() {
    let (src, sdir) = start("bad-src");
    let (dst, ddir) = start("bad-dst");
    let ram = support::sealed_memfd(2 << 20);
    let e = src.device("a").unwrap().migrate_out().err().unwrap();
    assert!(e.contains("has no client"), "{e}");
    let mut c = client(&src, &sdir, "a", &ram);
    wr(&mut c, 7, 4, 0x6);
    let mut out = src.device("a").unwrap().migrate_out().unwrap();
    let mut stream = out.take();
    let clock = ClockKind::Real.create();
    out.stop(&*clock, 1_000_000_000).unwrap();
    stream.extend(out.take());
    drop(out);

    let mut nb = client(&dst, &ddir, "b", &ram);
    wr(&mut nb, 7, 4, 0x6);
    let b_boot = rd(&mut nb, 0, 0);
    let mut na = client(&dst, &ddir, "a", &ram);
    let target = dst.device("a").unwrap();
    let host = dst.host().clone();
    let vms = host.stats().vms;
    // Damaged: cut short, a flipped byte in the header, nothing at all.
    let mut flipped = stream.clone();
    flipped[3] ^= 0x40;
    for (what, bad) in [
        ("cut", &stream[..stream.len() / 2]),
        ("flipped", &flipped[..]),
        ("empty", &[][..]),
    ] {
        let e = target.restore_from(bad).err().unwrap();
        assert!(e.contains("the stream"), "{what}: {e}");
        assert_eq!(host.stats().vms, vms, "{what}: one vGPU per VM, no more");
        // The VM has a fresh vGPU its client can use; the neighbour is untouched.
        wr(&mut na, 7, 4, 0x6);
        assert_eq!(rd(&mut na, 0, 0), b_boot, "{what}");
        assert_eq!(rd(&mut nb, 0, 0), b_boot, "{what}");
    }
    // A 256 MiB vGPU does not go into the 128 MiB VM `b`.
    let e = dst
        .device("b")
        .unwrap()
        .restore_from(&stream)
        .err()
        .unwrap();
    assert!(e.contains("256 MiB") && e.contains("128 MiB"), "{e}");
    assert_eq!(host.stats().vms, vms);
    wr(&mut nb, 7, 4, 0x6);
    assert_eq!(rd(&mut nb, 0, 0), b_boot);
    // The good stream still restores.
    target.restore_from(&stream).unwrap();
    assert_eq!(rd(&mut na, 7, 4) & 0x6, 0x6);
    drop((c, na, nb));
    src.shutdown();
    dst.shutdown();
    let _ = std::fs::remove_dir_all(&sdir);
    let _ = std::fs::remove_dir_all(&ddir);
}
