//! `gpuvm serve` (the vfio-user daemon) and `gpuvm run --kvm --vfio-user` (a VMM per VM, each
//! its own process): two VMMs share one daemon, killing one mid-submission hurts only its own
//! vGPU, and malformed protocol messages get error replies or lose only their connection,
//! never the daemon. Tests that need KVM print "SKIPPED: /dev/kvm not available" without it.
//! Every test kills the daemon it started (a Drop guard), so none is left behind.

mod support;

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpuvm_vfio_user::wire::{
    self, cmd, dma_map_body, region_access, set_irqs_body, version_body, RawClient,
};
use serde_json::Value;
use support::kvm_available;

/// The tests that run KVM guests take turns (each holds this while it runs). Two at once on a
/// 2-core machine — daemons, VMMs and guests of both — slowed the live migration's pre-copy,
/// which runs beside its guest, three- to seven-fold (0.66 s against 0.1-0.2 s alone) while
/// the guest's own work barely slowed, so the guest once finished before it could be paused
/// and the migration was refused. A test that failed leaves the lock poisoned; the next one
/// takes it anyway.
static KVM_GUESTS: Mutex<()> = Mutex::new(());

fn kvm_guests_take_turns() -> MutexGuard<'static, ()> {
    KVM_GUESTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lines a child printed on standard error, shared with a reader thread.
type Lines = Arc<(Mutex<Vec<String>>, Condvar)>;

fn collect_stderr(child: &mut Child, prefix: &'static str) -> Lines {
    let lines: Lines = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
    let err = child.stderr.take().expect("piped stderr");
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("{prefix}{line}");
            l.0.lock().unwrap().push(line);
            l.1.notify_all();
        }
    });
    lines
}

/// Waits until a line from index `from` on satisfies `pred`; returns its index. The bound
/// (minutes) only stops a broken build from hanging the suite.
fn wait_line(lines: &Lines, from: usize, what: &str, pred: impl Fn(&str) -> bool) -> usize {
    let end = Instant::now() + Duration::from_secs(300);
    let mut g = lines.0.lock().unwrap();
    loop {
        if let Some(i) = g.iter().skip(from).position(|l| pred(l)) {
            return from + i;
        }
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "never printed: {what}; got {:#?}", *g);
        g = lines.1.wait_timeout(g, left).unwrap().0;
    }
}

fn line_count(lines: &Lines) -> usize {
    lines.0.lock().unwrap().len()
}

/// A running `gpuvm serve`, killed (and its socket directory removed) when dropped.
struct Serve {
    child: Child,
    dir: PathBuf,
    lines: Lines,
}

impl Serve {
    fn start(test: &str, vms: u32) -> Serve {
        let dir = std::env::temp_dir().join(format!("gpuvm-serve-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpuvm"))
            .args(["serve", "--socket-dir"])
            .arg(&dir)
            .args(["--vms", &vms.to_string(), "--vram-mib", "256"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpuvm serve");
        let lines = collect_stderr(&mut child, "[serve] ");
        let s = Serve { child, dir, lines };
        wait_line(&s.lines, 0, "ready", |l| l.contains("gpuvm serve: ready"));
        s
    }

    fn socket(&self, vm: &str) -> PathBuf {
        self.dir.join(format!("{vm}.sock"))
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// SIGTERM, then the exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("wait for gpuvm serve")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `gpuvm run --kvm --vfio-user` process, killed when dropped.
struct Vmm {
    child: Option<Child>,
    /// What it printed on standard error (also echoed with its name).
    lines: Lines,
}

impl Vmm {
    fn start(socket: &Path, name: &'static str, args: &[&str]) -> Vmm {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpuvm"))
            .args(["run", "--kvm", "--json", "--timeout", "240", "--vfio-user"])
            .arg(socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpuvm run");
        // Echoed with the VM's name (kept for a failure's context).
        let lines = collect_stderr(&mut child, name);
        Vmm {
            child: Some(child),
            lines,
        }
    }

    fn finish(mut self) -> (Output, Value) {
        let out = self.child.take().unwrap().wait_with_output().expect("wait");
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "invalid JSON ({e}); status {}; stdout: {}",
                out.status,
                String::from_utf8_lossy(&out.stdout)
            )
        });
        (out, v)
    }

    fn kill(mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().expect("kill the VMM");
        let _ = c.wait();
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn assert_verified(out: &Output, v: &Value, workloads: &[&str]) {
    assert!(out.status.success(), "status {}: {v:#}", out.status);
    assert_eq!(v["backend"], "kvm-vfio-user");
    let vm = &v["vms"][0];
    assert_eq!(vm["kvm"]["exit_code"], 0, "{vm:#}");
    assert!(vm["kvm"]["stopped"].is_null(), "{vm:#}");
    assert_eq!(vm["init"]["verified"], true, "{vm:#}");
    let names: Vec<&str> = vm["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, workloads);
    for w in vm["workloads"].as_array().unwrap() {
        assert_eq!(w["verified"], true, "{w}");
        assert!(w["mmio_reads"].as_u64().unwrap() > 0, "{w}");
    }
    // Every exit went over the socket; the daemon keeps the counters.
    assert!(
        vm["kvm"]["exits"]["mmio_writes"].as_u64().unwrap() > 1000,
        "{vm:#}"
    );
    assert_eq!(vm["stats"]["doorbells"], 0, "counters stay with the daemon");
}

#[test]
fn two_vmms_share_the_daemon_and_killing_one_hurts_only_its_vgpu() {
    if !kvm_available("two_vmms_share_the_daemon_and_killing_one_hurts_only_its_vgpu") {
        return;
    }
    let _turn = kvm_guests_take_turns();
    let mut serve = Serve::start("share", 2);
    // vm0: several workloads, fences by interrupt (the daemon signals the irqfd).
    let a_work = ["madd", "mmul", "memcpy_htod", "memcpy_dtoh", "loop"];
    let mut a_args = vec!["--size", "32", "--irq"];
    for w in a_work {
        a_args.extend(["--workload", w]);
    }
    let a = Vmm::start(&serve.socket("vm0"), "[vm0 vmm] ", &a_args);
    // vm1: keeps the GPU busy (0.9 s loop kernels, four outstanding, for up to 60 s), killed
    // once the daemon reports work of it on the GPU (dispatched and still running at two
    // looks: not the driver's short set-up submissions). The daemon sees the kill only when
    // the VMM's socket closes, once the process is gone — up to 1.6 s after the event on a
    // loaded machine — so at least 2.7 s of work stays queued.
    let mark = line_count(&serve.lines);
    let b = Vmm::start(
        &serve.socket("vm1"),
        "[vm1 vmm] ",
        &["--size", "32", "--stream-for", "0=60"],
    );
    wait_line(&serve.lines, mark, "vm1's kernels on the GPU", |l| {
        l.contains("[vm1] work on the GPU")
    });
    let killed_at = line_count(&serve.lines);
    b.kill();
    wait_line(&serve.lines, killed_at, "vm1's teardown", |l| {
        l.contains("[vm1]") && l.contains("vGPU destroyed and scrubbed")
    });
    assert!(
        serve.alive(),
        "the daemon survived a VMM killed mid-submission"
    );
    // The killed VM's socket serves a fresh vGPU.
    let c = Vmm::start(
        &serve.socket("vm1"),
        "[vm1 vmm 2] ",
        &["--size", "32", "--workload", "madd", "--workload", "fmmul"],
    );
    let (out, v) = c.finish();
    assert_verified(&out, &v, &["madd", "fmmul"]);
    let (out, v) = a.finish();
    assert_verified(&out, &v, &a_work);
    let k = &v["vms"][0]["kvm"];
    assert_eq!(k["fence_irq"], true, "{v:#}");
    // The daemon signalled the guest's INTx on the client's eventfd (the VMM's irqfd).
    let ended = wait_line(&serve.lines, 0, "vm0's connection end", |l| {
        l.contains("[vm0] connection ended")
    });
    let ended = serve.lines.0.lock().unwrap()[ended].clone();
    let signalled: u64 = ended
        .split("interrupt edges so far: ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no interrupt edge count in {ended:?}"));
    assert!(signalled > 0, "{ended}");
    // And reached the guest: handled while it waited for a fence, or still pending in its
    // local APIC at the end. Under PVM (this project's KVM: `"pvm": true`) KVM's trace shows
    // each edge accepted into the guest's local APIC, yet on a loaded machine now and then
    // neither handled nor pending at the end (docs/vfio-user.md): reported there, asserted
    // on other KVM hosts.
    let pending = k["final_lapic"]
        .as_str()
        .is_some_and(|l| l.contains("IRR[") && l.ends_with("] true"));
    let delivered = k["irqs_seen"].as_u64().unwrap() > 0 || pending;
    if v["pvm"] == true && !delivered {
        eprintln!("NOTE: PVM lost the INTx between the local APIC and the guest: {k:#}");
    } else {
        assert!(delivered, "{v:#}");
    }
    // SIGTERM: clean exit, sockets gone.
    let (s0, s1) = (serve.socket("vm0"), serve.socket("vm1"));
    let status = serve.terminate();
    assert!(status.success(), "{status}");
    assert!(!s0.exists() && !s1.exists(), "sockets removed");
    let i = wait_line(&serve.lines, 0, "the shutdown summary", |l| {
        l.contains("stopped: sockets and lock removed, 0 vGPUs left")
    });
    let summary = serve.lines.0.lock().unwrap()[i].clone();
    // The killed VM's loop was on the GPU: its teardown aborted it.
    let aborted: u64 = summary
        .trim_end_matches(" aborted")
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no abort count in {summary:?}"));
    assert!(aborted >= 1, "{summary}");
}

/// A sealed memfd of `len` bytes, and one without the seal.
fn memfd(len: u64, seal: bool) -> std::fs::File {
    // SAFETY: memfd_create with a NUL-terminated name returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    if seal {
        // SAFETY: adds a seal to our descriptor.
        assert_eq!(
            unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) },
            0
        );
    }
    f
}

/// A well-behaved client (the `vfio_user` crate's) sees the vGPU on `socket`.
fn healthy(socket: &Path) {
    let mut c = vfio_user::Client::new(socket).expect("a fresh client connects");
    let mut b = [0u8; 4];
    c.region_read(7, 0, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b), 0x06d8_10de);
    c.region_read(0, 0, &mut b).unwrap();
    assert_ne!(u32::from_le_bytes(b), 0xffff_ffff);
}

/// The connection was dropped: the next read sees end of file or a reset.
fn dropped(c: &mut RawClient) -> bool {
    use std::io::Read;
    let mut b = [0u8; 1];
    matches!(c.stream.read(&mut b), Ok(0) | Err(_))
}

#[test]
fn malformed_messages_get_errors_and_never_take_the_daemon_down() {
    let mut serve = Serve::start("malformed", 2);
    let (good, bad) = (serve.socket("vm0"), serve.socket("vm1"));
    let mut bystander = vfio_user::Client::new(&good).unwrap();
    let check_bystander = |c: &mut vfio_user::Client| {
        let mut b = [0u8; 4];
        c.region_read(7, 0, &mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), 0x06d8_10de, "vm0 unaffected");
    };

    // Region accesses the device does not take are refused by content, never with an error
    // reply (Cloud Hypervisor ignores the error flag and would wait forever for the data):
    // reads answer all-ones, writes are dropped; the connection stays usable.
    let mut c = RawClient::connect_negotiated(&bad).unwrap();
    let by_content: Vec<(&str, u16, Vec<u8>, usize)> = vec![
        (
            "region 6 (no ROM)",
            cmd::REGION_READ,
            region_access(6, 0, 4, &[]),
            4,
        ),
        (
            "BAR0 past its end",
            cmd::REGION_READ,
            region_access(0, 32 << 20, 4, &[]),
            4,
        ),
        (
            "offset that wraps",
            cmd::REGION_READ,
            region_access(0, u64::MAX - 1, 4, &[]),
            4,
        ),
        (
            "misaligned",
            cmd::REGION_READ,
            region_access(0, 2, 4, &[]),
            4,
        ),
        (
            "4 KiB read of BAR1",
            cmd::REGION_READ,
            region_access(1, 0, 4096, &[]),
            4096,
        ),
        (
            "write past config space",
            cmd::REGION_WRITE,
            region_access(7, 4094, 4, &[0; 4]),
            0,
        ),
        (
            "odd-size BAR write",
            cmd::REGION_WRITE,
            region_access(0, 0, 3, &[0; 3]),
            0,
        ),
    ];
    for (what, command, body, len) in by_content {
        let (r, data) = c.request(command, &body, None, &[]).unwrap();
        assert!(!r.is_error(), "{what}: {r:?}");
        if command == cmd::REGION_READ {
            assert_eq!(data.len(), 16 + len, "{what}");
            assert!(data[16..].iter().all(|&b| b == 0xff), "{what}: all-ones");
        }
        let (r, data) = c.region_read(7, 0, 4).unwrap();
        assert!(!r.is_error(), "after {what}");
        assert_eq!(data[16..], 0x06d8_10deu32.to_le_bytes(), "after {what}");
    }
    // A dropped write changed nothing: BAR0 still reads its real BOOT_0.
    let (_, data) = c.region_read(0, 0, 4).unwrap();
    assert_ne!(data[16..], [0xff; 4]);

    // Other requests the server refuses with an error reply; the connection stays usable.
    let refused: Vec<(&str, u16, Vec<u8>)> = vec![
        // An index past the regions the server announced: the vfio_user crate itself answers
        // with an error before the backend sees it (Cloud Hypervisor only uses announced ones).
        ("region 99", cmd::REGION_READ, region_access(99, 0, 4, &[])),
        // Too large to answer with all-ones without committing the memory.
        (
            "1 GiB read",
            cmd::REGION_READ,
            region_access(1, 0, 1 << 30, &[]),
        ),
        (
            "DMA map without a descriptor",
            cmd::DMA_MAP,
            dma_map_body(3, 0, 0, 1 << 20),
        ),
        (
            "DMA unmap of nothing",
            cmd::DMA_UNMAP,
            wire::dma_unmap_body(0, 0x1000, 0x1000),
        ),
        (
            "SET_IRQS on MSI-X",
            cmd::SET_IRQS,
            set_irqs_body(4 | 32, 2, 0, 1),
        ),
        (
            "SET_IRQS eventfd without a descriptor",
            cmd::SET_IRQS,
            set_irqs_body(4 | 32, 0, 0, 1),
        ),
        ("unknown command", 999, vec![]),
        ("unsupported DMA_READ", 11, vec![]),
    ];
    for (what, command, body) in refused {
        let (r, _) = c.request(command, &body, None, &[]).unwrap();
        assert!(r.is_error(), "{what}: {r:?}");
        // Still framed: a good request on the same connection works.
        let (r, data) = c.region_read(7, 0, 4).unwrap();
        assert!(!r.is_error(), "after {what}");
        assert_eq!(data[16..], 0x06d8_10deu32.to_le_bytes(), "after {what}");
    }
    // DMA maps: one good, then an overlapping one, an unaligned one, ...
    let ram = memfd(2 << 20, true);
    assert!(!c
        .dma_map(0, 0, 2 << 20, Some(ram.as_raw_fd()))
        .unwrap()
        .is_error());
    let other = memfd(2 << 20, true);
    assert!(
        c.dma_map(0, 1 << 20, 1 << 20, Some(other.as_raw_fd()))
            .unwrap()
            .is_error(),
        "overlap"
    );
    // (An unsealed map is not answered with an error: it fails the device for the client and
    // closes the connection; serve_ops.rs `an_unsealed_dma_map_fails_the_device_at_once_...`.)
    assert!(
        c.dma_map(0, (8 << 20) + 1, 4096, Some(other.as_raw_fd()))
            .unwrap()
            .is_error(),
        "unaligned"
    );
    assert!(
        c.dma_map(0, 16 << 20, 4 << 20, Some(other.as_raw_fd()))
            .unwrap()
            .is_error(),
        "past the file"
    );
    assert!(
        c.dma_map(0, 1 << 50, 1 << 20, Some(other.as_raw_fd()))
            .unwrap()
            .is_error(),
        "past the window"
    );
    // SET_IRQS with a socket instead of an eventfd.
    let (s, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let (r, _) = c
        .request(
            cmd::SET_IRQS,
            &set_irqs_body(4 | 32, 0, 0, 1),
            None,
            &[s.as_raw_fd()],
        )
        .unwrap();
    assert!(r.is_error(), "a socket is not an eventfd");
    drop(c);
    check_bystander(&mut bystander);
    healthy(&bad);

    // Messages the vfio_user crate itself panics on (contained: the connection is dropped).
    let panics: Vec<(&str, Vec<u8>)> = vec![
        (
            "VERSION smaller than its structure",
            wire::message(1, cmd::VERSION, &[0, 0, 1, 0], Some(8)),
        ),
        (
            "VERSION without a NUL-terminated capability string",
            wire::message(1, cmd::VERSION, &[0, 0, 1, 0, b'{', b'}'], None),
        ),
        (
            "VERSION with an empty capability string",
            wire::message(1, cmd::VERSION, &[0, 0, 1, 0], None),
        ),
    ];
    for (what, bytes) in panics {
        let mut c = RawClient::connect(&bad).unwrap();
        c.send_raw(&bytes).unwrap();
        assert!(dropped(&mut c), "{what}: connection dropped");
        assert!(serve.alive(), "{what}: the daemon survived");
        check_bystander(&mut bystander);
        healthy(&bad);
    }
    // Garbage headers: unknown commands get error replies; a client that hangs up mid-message
    // just disconnects.
    let mut c = RawClient::connect(&bad).unwrap();
    c.send_raw(&[0xa5; 16]).unwrap();
    let (r, _) = c.reply().unwrap();
    assert!(r.is_error());
    c.send_raw(&wire::message(7, cmd::REGION_WRITE, &region_access(0, 0, 4, &[1]), None)[..20])
        .unwrap();
    drop(c);
    // A VERSION with a broken capability string is refused with an error, not a crash.
    let mut c = RawClient::connect(&bad).unwrap();
    let mut body = version_body();
    body.truncate(4);
    body.extend_from_slice(b"not json\0");
    let (r, _) = c.request(cmd::VERSION, &body, None, &[]).unwrap();
    assert!(r.is_error());
    drop(c);

    assert!(serve.alive());
    check_bystander(&mut bystander);
    healthy(&bad);
    // One client per socket at a time: the bystander leaves first.
    drop(bystander);
    healthy(&good);
    let status = serve.terminate();
    assert!(status.success(), "{status}");
    // Every line read (the summary is the last one), the refusals were logged for vm1 only.
    wait_line(&serve.lines, 0, "the shutdown summary", |l| {
        l.contains("stopped: sockets")
    });
    let lines = serve.lines.0.lock().unwrap().clone();
    assert!(
        lines.iter().any(|l| l.contains("[vm1] request refused")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("[vm1] vfio_user server panicked")),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("[vm0] request refused")),
        "{lines:#?}"
    );
}

#[test]
fn serve_explains_itself_and_refuses_bad_arguments() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuvm"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "vfio-user",
        "--socket-dir",
        "--vm <NAME:PROFILE>",
        "--sched",
        "SIGTERM",
    ] {
        assert!(help.contains(word), "{word} missing from:\n{help}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_gpuvm"))
        .args(["serve", "--socket-dir", "/nonexistent/x", "--vm", "nocolon"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NAME:PROFILE"));
}

#[test]
fn serve_takes_one_toml_profile_per_vm() {
    let dir = std::env::temp_dir().join(format!("gpuvm-serve-profiles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let small = dir.join("small.toml");
    std::fs::write(
        &small,
        "name = \"small\"\nvram_mib = 128\nchannels = 4\nweight = 3\nshadow = \"eager\"\n",
    )
    .unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "vram_mib = 1\n").unwrap();
    let sockets = dir.join("sockets");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuvm"))
        .args(["serve", "--sched", "credit", "--socket-dir"])
        .arg(&sockets)
        .arg("--vm")
        .arg(format!("alpha:{}", small.display()))
        .arg("--vm")
        .arg(format!("beta:{}", small.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = collect_stderr(&mut child, "[serve] ");
    let mut serve = Serve {
        child,
        dir: dir.clone(),
        lines,
    };
    let ready = wait_line(&serve.lines, 0, "ready", |l| {
        l.contains("gpuvm serve: ready")
    });
    let text = serve.lines.0.lock().unwrap()[..=ready].join("\n");
    for vm in ["alpha", "beta"] {
        assert!(
            text.contains(&format!("[{vm}] serving"))
                && text
                    .contains("profile 'small': 128 MiB VRAM, 4 channels, weight 3, shadow eager"),
            "{text}"
        );
    }
    assert!(text.contains("credit scheduler"), "{text}");
    healthy(&sockets.join("alpha.sock"));
    assert!(serve.terminate().success());
    // A profile out of range is refused before anything is served.
    let out = Command::new(env!("CARGO_BIN_EXE_gpuvm"))
        .args(["serve", "--socket-dir"])
        .arg(&sockets)
        .arg("--vm")
        .arg(format!("x:{}", bad.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("vram_mib = 1"));
}

/// A guest whose driver is up and whose workloads are under way when it is handed off (the
/// same shape as the KVM snapshot tests' busy guest): its VRAM, device state and the RAM the
/// GPU writes by DMA must all arrive for the rest to verify.
const MOVING: [&str; 6] = [
    "madd",
    "mmul",
    "memcpy_dtoh",
    "fmadd",
    "memcpy_htod",
    "loop",
];

fn moving_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    moving_args_times(1, extra)
}

/// [`moving_args`] with the workloads `times` over (`MOVING` repeated).
fn moving_args_times<'a>(times: usize, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["--size", "256", "--quiet-console"];
    for _ in 0..times {
        for w in MOVING {
            a.extend(["--workload", w]);
        }
    }
    a.extend(extra);
    a
}

/// How many times over the live-migrated guest runs [`MOVING`] (a run takes at most 16
/// workloads): its work must outlast the pre-copy rounds, which run beside it. Once over,
/// under CI's load (the other tests of this file running at once on 2 cores) the guest
/// sometimes finished first and the migration was refused with "the guest ended before it
/// could be paused"; twice over, it did once more beside another KVM test, so those now take
/// turns ([`KVM_GUESTS`]).
const LIVE_TIMES: usize = 2;

#[test]
fn a_guest_moves_live_between_two_daemons_with_its_vmm_and_finishes_there() {
    if !kvm_available("a_guest_moves_live_between_two_daemons_with_its_vmm_and_finishes_there") {
        return;
    }
    let _turn = kvm_guests_take_turns();
    let a = Serve::start("move-live-a", 1);
    let b = Serve::start("move-live-b", 2);
    let msock = b.dir.join("migrate.sock");
    // The destination VMM waits for the guest; its vGPU will be daemon B's vm0.
    let dst = Vmm::start(
        &b.socket("vm0"),
        "[dst vmm] ",
        &[
            "--migrate-listen",
            msock.to_str().unwrap(),
            "--quiet-console",
        ],
    );
    // Printed once its socket is bound.
    wait_line(&dst.lines, 0, "the destination listening", |l| {
        l.contains("waiting for a migration on")
    });
    // A neighbour on daemon B runs throughout.
    let nb = Vmm::start(
        &b.socket("vm1"),
        "[neighbour] ",
        &[
            "--size",
            "32",
            "--workload",
            "madd",
            "--workload",
            "fmmul",
            "--workload",
            "loop",
        ],
    );
    let src = Vmm::start(
        &a.socket("vm0"),
        "[src vmm] ",
        &moving_args_times(
            LIVE_TIMES,
            &[
                "--migrate-to",
                msock.to_str().unwrap(),
                "--migrate-after-exits",
                "3000",
            ],
        ),
    );
    let (sout, s) = src.finish();
    let (dout, d) = dst.finish();
    assert!(sout.status.success(), "source: {s:#}");
    let h = &s["vms"][0]["kvm"]["handoff"];
    assert_eq!(h["kind"], "migration", "{s:#}");
    // Daemon A produced the vGPU's rounds: one per RAM round, the stop included.
    let vram = h["vram_rounds"].as_array().unwrap();
    assert_eq!(vram.len(), h["rounds"].as_array().unwrap().len(), "{h:#}");
    assert!(vram[0]["sent"].as_u64().unwrap() > 0, "{h:#}");
    assert!(h["dma_pages"].as_u64().unwrap() > 0, "{h:#}");
    // The source left mid-run: some workloads were still to do.
    let done_here = s["vms"][0]["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["verified"] == true)
        .count();
    let all: Vec<&str> = MOVING.repeat(LIVE_TIMES);
    assert!(done_here < all.len(), "moved mid-run: {s:#}");
    // Every workload verified on the destination, its vGPU in daemon B.
    assert_verified(&dout, &d, &all);
    assert!(d["vms"][0]["kvm"]["restored"]["from"]
        .as_str()
        .unwrap()
        .starts_with("migration "));
    wait_line(&a.lines, 0, "A committed", |l| {
        l.contains("[vm0] migration committed")
    });
    wait_line(&b.lines, 0, "B restored", |l| {
        l.contains("[vm0] vGPU restored from a migration stream")
    });
    let (out, v) = nb.finish();
    assert_verified(&out, &v, &["madd", "fmmul", "loop"]);
}

#[test]
fn a_snapshot_through_one_daemon_restores_through_another() {
    if !kvm_available("a_snapshot_through_one_daemon_restores_through_another") {
        return;
    }
    let _turn = kvm_guests_take_turns();
    let a = Serve::start("move-snap-a", 1);
    let b = Serve::start("move-snap-b", 1);
    let dir = b.dir.join("snap");
    let src = Vmm::start(
        &a.socket("vm0"),
        "[src vmm] ",
        &moving_args(&[
            "--snapshot-to",
            dir.to_str().unwrap(),
            "--snapshot-after-exits",
            "1500",
        ]),
    );
    let (sout, s) = src.finish();
    assert!(sout.status.success(), "source: {s:#}");
    assert_eq!(s["vms"][0]["kvm"]["handoff"]["kind"], "snapshot", "{s:#}");
    let vgpu = std::fs::read(dir.join("vgpu.bin")).unwrap();
    assert_eq!(
        &vgpu[..8],
        b"GPUVMSNP",
        "the daemon's gpuvm::migrate stream"
    );
    let dst = Vmm::start(
        &b.socket("vm0"),
        "[dst vmm] ",
        &["--restore", dir.to_str().unwrap(), "--quiet-console"],
    );
    let (dout, d) = dst.finish();
    assert_verified(&dout, &d, &MOVING);
    // The same snapshot into a VMM with the vGPU in its own process: the stream is one format.
    let out = support::gpuvm(&[
        "run",
        "--kvm",
        "--restore",
        dir.to_str().unwrap(),
        "--json",
        "--quiet-console",
        "--timeout",
        "240",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = support::json(&out);
    for w in v["vms"][0]["workloads"].as_array().unwrap() {
        assert_eq!(w["verified"], true, "{w}");
    }
}
