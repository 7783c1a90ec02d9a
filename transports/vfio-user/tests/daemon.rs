//! The daemon in-process on the simulated GPU: a well-behaved vfio-user client sees the vGPU's
//! configuration space and registers, maps RAM and hands over its eventfd; a reset and a
//! disconnect each give the VM a fresh vGPU while the other VM's keeps running; shutdown
//! destroys every vGPU and removes the sockets.

mod support;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuvm_vfio_user::wire::RawClient;
use gpuvm_vfio_user::Daemon;
use vfio_user::Client;

fn start(test: &str) -> (Daemon, PathBuf) {
    support::start(
        test,
        2 << 30,
        None,
        vec![support::spec("a", 256, 1), support::spec("b", 256, 1)],
    )
}

fn config_dword(c: &mut Client, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(7, offset, &mut b).unwrap();
    u32::from_le_bytes(b)
}

fn boot0(c: &mut Client) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(0, 0, &mut b).unwrap();
    u32::from_le_bytes(b)
}

fn eventually(what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < end, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn clients_reset_and_disconnect_only_touch_their_own_vgpu() {
    let (d, dir) = start("lifecycle");
    let (a, b) = (d.devices()[0].clone(), d.devices()[1].clone());
    let mut ca = Client::new(&dir.join("a.sock")).unwrap();
    let mut cb = Client::new(&dir.join("b.sock")).unwrap();
    assert_eq!(config_dword(&mut ca, 0), 0x06d8_10de, "Quadro 6000 ids");
    let id = boot0(&mut ca);
    assert_ne!(id, 0);
    assert_eq!(boot0(&mut cb), id);
    assert_eq!(ca.region(7).unwrap().size, 4096);
    assert!(ca.region(1).unwrap().sparse_areas.is_empty());
    // Config writes reach the device model: BAR sizing reads back the size mask.
    ca.region_write(7, 0x10, &0xffff_ffffu32.to_le_bytes())
        .unwrap();
    assert_eq!(config_dword(&mut ca, 0x10) & !0xf, !((32u32 << 20) - 1));

    // RAM and the interrupt.
    let ram = support::sealed_memfd(2 << 20);
    ca.dma_map(0, 0, 2 << 20, ram.as_raw_fd()).unwrap();
    // SAFETY: eventfd returns a new descriptor or -1.
    let evt = unsafe { libc::eventfd(0, 0) };
    assert!(evt >= 0);
    ca.set_irqs(0, 4 | 32, 0, 1, &[evt]).unwrap();
    assert_eq!(a.rejected(), 0, "a well-behaved client is never refused");

    // A reset gives vm a a fresh vGPU; vm b's is untouched.
    let before = a.vgpu().unwrap().id();
    let b_id = b.vgpu().unwrap().id();
    ca.reset().unwrap();
    assert_eq!(a.teardowns(), 1);
    assert_ne!(a.vgpu().unwrap().id(), before);
    assert_eq!(
        config_dword(&mut ca, 0x10) & !0xf,
        0,
        "BARs unprogrammed again"
    );
    assert_eq!(boot0(&mut cb), id);

    // A disconnect does the same.
    drop(ca);
    eventually("vm a torn down after its client left", || {
        a.teardowns() == 2
    });
    assert_eq!(b.teardowns(), 0);
    assert_eq!(b.vgpu().unwrap().id(), b_id);
    let mut ca = Client::new(&dir.join("a.sock")).unwrap();
    assert_eq!(boot0(&mut ca), id);

    // A raw client that breaks the protocol loses only its connection.
    let mut raw = RawClient::connect(&dir.join("a.sock")).unwrap();
    drop(ca);
    // A VERSION whose message size is smaller than the VERSION structure.
    raw.send_raw(&gpuvm_vfio_user::wire::message(
        1,
        1,
        &[0, 0, 1, 0],
        Some(8),
    ))
    .unwrap();
    eventually("vm a torn down after the malformed VERSION", || {
        a.teardowns() >= 3
    });
    assert_eq!(boot0(&mut cb), id);

    let host = d.host().clone();
    let sockets = d.sockets();
    drop(cb);
    d.shutdown();
    assert_eq!(host.stats().vms, 0, "every vGPU destroyed");
    assert!(sockets.iter().all(|s| !s.exists()), "sockets removed");
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: closing the eventfd we created.
    unsafe { libc::close(evt) };
}

#[test]
fn a_restoring_client_is_refused_by_content_and_the_next_boot_gets_a_fresh_vgpu() {
    let (d, dir) = start("restore");
    let a = d.devices()[0].clone();
    let sock = dir.join("a.sock");

    // A booting client reads configuration space first: served normally, including MSI.
    let mut boot = Client::new(&sock).unwrap();
    assert_eq!(config_dword(&mut boot, 0), 0x06d8_10de);
    let id = boot0(&mut boot);
    // SAFETY: eventfd returns a new descriptor or -1.
    let evt = unsafe { libc::eventfd(0, 0) };
    assert!(evt >= 0);
    boot.set_irqs(1, 4 | 32, 0, 1, &[evt]).unwrap();
    assert_eq!(a.rejected(), 0);
    let first = a.vgpu().unwrap().id();
    drop(boot);
    eventually("the booting client's vGPU torn down", || a.teardowns() == 1);

    // Cloud Hypervisor's restore pushes PCI_COMMAND before it ever reads configuration space:
    // every region access of that connection is then answered all-ones / dropped (no error
    // reply, which would hang the client), and counted.
    let mut restore = Client::new(&sock).unwrap();
    assert_ne!(
        a.vgpu().unwrap().id(),
        first,
        "a fresh vGPU for the new client"
    );
    restore
        .region_write(7, 4, &0x0006u16.to_le_bytes())
        .unwrap();
    assert_eq!(config_dword(&mut restore, 0), 0xffff_ffff);
    assert_eq!(boot0(&mut restore), 0xffff_ffff);
    assert!(a.rejected() >= 3, "refusals counted: {}", a.rejected());
    drop(restore);
    eventually("the restored client's vGPU torn down", || {
        a.teardowns() == 2
    });

    // The next booting client is served again.
    let mut again = Client::new(&sock).unwrap();
    assert_eq!(config_dword(&mut again, 0), 0x06d8_10de);
    assert_eq!(boot0(&mut again), id);
    drop(again);
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: closing the eventfd we created.
    unsafe { libc::close(evt) };
}
