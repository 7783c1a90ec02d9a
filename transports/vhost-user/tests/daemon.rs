//! The daemon against a hand-written hostile front end: a malformed message loses only its
//! connection (the vGPU is destroyed, scrubbed and replaced; the socket serves again), UML's
//! 8-slot SET_MEM_TABLE is accepted (normalized in front of the crate), and the features UML
//! needs (protocol features, BACKEND_REQ) are offered.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuvm::clock::ClockKind;
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::VgpuProfile;
use gpuvm_sim::{SimConfig, SimGpu};
use gpuvm_vhost_user::relay::{self, Message, HDR_LEN, REGION_LEN, SET_MEM_TABLE};
use gpuvm_vhost_user::{Server, ServerConfig};

const GET_FEATURES: u32 = 1;
const GET_PROTOCOL_FEATURES: u32 = 15;
const VERSION_FLAG: u32 = 1;

fn server(dir: &std::path::Path) -> Server {
    let clock = ClockKind::Real.create();
    let sim = Arc::new(SimGpu::new(SimConfig {
        vram_size: 512 << 20,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let phys: Arc<dyn PhysicalGpu> = sim;
    let host = Arc::new(GpuHost::new(phys, HostConfig::default()).unwrap());
    host.set_clock(clock.clone());
    let profile = VgpuProfile {
        name: "t".into(),
        vram_mib: 64,
        ..VgpuProfile::default()
    };
    Server::start(
        host,
        clock,
        ServerConfig {
            socket_dir: dir.to_path_buf(),
            vms: vec![("t".into(), profile)],
        },
    )
    .unwrap()
}

fn header(request: u32, size: u32) -> [u8; HDR_LEN] {
    let mut h = [0u8; HDR_LEN];
    h[0..4].copy_from_slice(&request.to_le_bytes());
    h[4..8].copy_from_slice(&VERSION_FLAG.to_le_bytes());
    h[8..12].copy_from_slice(&size.to_le_bytes());
    h
}

fn ask_u64(s: &UnixStream, request: u32) -> u64 {
    relay::write_message(
        s,
        &Message {
            hdr: header(request, 0),
            payload: Vec::new(),
            fds: Vec::new(),
        },
    )
    .unwrap();
    let m = relay::read_message(s).unwrap().expect("a reply");
    assert_eq!(m.request(), request);
    u64::from_le_bytes(m.payload[..8].try_into().unwrap())
}

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn hostile_front_end_loses_only_its_connection_and_uml_messages_pass() {
    let dir = std::env::temp_dir().join(format!("gpuvm-vhost-test-{}", std::process::id()));
    let srv = server(&dir);
    let sock = srv.sockets()[0].clone();
    let dev = srv.devices()[0].clone();
    let first = dev.vgpu().unwrap().id();

    // 1. A header announcing a 4 GiB payload: the connection is dropped, the vGPU recycled.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(&header(GET_FEATURES, u32::MAX)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        s.read(&mut buf).unwrap_or(0),
        0,
        "the server closes the connection"
    );
    wait_for("the vGPU to be recycled", || dev.teardowns() == 1);
    assert_ne!(dev.vgpu().unwrap().id(), first, "a fresh vGPU is served");
    assert_eq!(
        srv.relay_stats()[0]
            .refused
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );

    // 2. The socket serves again: the features UML needs are offered.
    let s = UnixStream::connect(&sock).unwrap();
    let features = ask_u64(&s, GET_FEATURES);
    assert_ne!(features & (1 << 30), 0, "VHOST_USER_F_PROTOCOL_FEATURES");
    assert_ne!(features & (1 << 32), 0, "VIRTIO_F_VERSION_1");
    let proto = ask_u64(&s, GET_PROTOCOL_FEATURES);
    assert_ne!(proto & (1 << 5), 0, "BACKEND_REQ");

    // 3. UML's SET_MEM_TABLE: 8 slots, num_regions = 1, one memfd. Without normalization the
    //    crate would refuse it and drop the connection; here the connection lives on.
    let name = std::ffi::CString::new("gpuvm-test-ram").unwrap();
    // SAFETY: memfd_create with a valid NUL-terminated name; the descriptor is owned below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: `fd` was just created and is owned by nothing else.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.set_len(16 << 20).unwrap();
    let mut payload = 1u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&0u32.to_le_bytes());
    // Region 0: guest address 0, 16 MiB, user address 0x7f0000000000, offset 0.
    payload.extend_from_slice(&0u64.to_le_bytes());
    payload.extend_from_slice(&(16u64 << 20).to_le_bytes());
    payload.extend_from_slice(&0x7f00_0000_0000u64.to_le_bytes());
    payload.extend_from_slice(&0u64.to_le_bytes());
    payload.resize(8 + 8 * REGION_LEN, 0);
    assert_eq!(file.as_raw_fd(), fd);
    relay::write_message(
        &s,
        &Message {
            hdr: header(SET_MEM_TABLE, payload.len() as u32),
            payload,
            fds: vec![file.into()],
        },
    )
    .unwrap();
    wait_for("the table to be normalized", || {
        srv.relay_stats()[0]
            .normalized
            .load(std::sync::atomic::Ordering::SeqCst)
            == 1
    });
    // Still connected: another request is answered.
    assert_ne!(ask_u64(&s, GET_FEATURES) & (1 << 30), 0);
    assert_eq!(dev.teardowns(), 1, "no teardown from UML's table");

    drop(s);
    wait_for("the second disconnect", || dev.teardowns() == 2);
    srv.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
