//! Snapshot, restore and live migration of a whole KVM guest between `gpuvm` processes
//! (docs/migration.md, "The standalone KVM VMM"). Without a usable /dev/kvm every test prints
//! "SKIPPED: /dev/kvm not available" and returns.
//!
//! [`GUEST`] calibrates first (`--calibrate 20000`: 20 000 port-I/O exits, then 20 000 MMIO
//! reads of an address outside every BAR, then BAR0 reads), then brings the driver up and runs
//! `madd`, which checks its result: a guest that resumed in the wrong place, with a wrong
//! register or a wrong page, does not verify. [`BUSY`] brings the driver up at once and runs
//! eight workloads: handed off after 1500 exits, its vGPU has been used (126 000 BAR writes of
//! the driver's bring-up) and most of its workloads are still to run, so its VRAM, device
//! state and the guest RAM the GPU writes by DMA must all arrive for them to verify.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{gpuvm, json, kvm_available};

/// A guest in the middle of its work: the driver, then eight workloads that check their
/// results (about 3 s of guest time after the driver's bring-up in a debug build).
const BUSY: &[&str] = &[
    "run",
    "--kvm",
    "--vms",
    "1",
    "--size",
    "256",
    "--workload",
    "madd",
    "--workload",
    "mmul",
    "--workload",
    "memcpy_dtoh",
    "--workload",
    "fmadd",
    "--workload",
    "memcpy_htod",
    "--workload",
    "mmul",
    "--workload",
    "fmmul",
    "--workload",
    "loop",
    "--json",
    "--quiet-console",
    "--timeout",
    "300",
];

/// The console lines of a VM report.
fn console(vm: &Value) -> Vec<String> {
    vm["kvm"]["console"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str().map(str::to_string))
        .collect()
}

/// The source of a hand-off of [`BUSY`]: its vGPU was used and work was left to do.
fn assert_left_mid_workload(vm: &Value) {
    let k = &vm["kvm"];
    assert!(k["exit_code"].is_null(), "{k:#}");
    let lines = console(vm);
    assert!(
        lines.iter().any(|l| l.starts_with("driver up")),
        "the driver was up (the vGPU used) before the hand-off: {lines:?}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("PASS")), "{lines:?}");
    let done = lines.iter().filter(|l| l.ends_with("verified")).count();
    assert!(done < 8, "workloads were left to run: {lines:?}");
    assert!(k["exits"]["mmio_writes"].as_u64().unwrap() > 1000, "{k:#}");
}

/// A restored or migrated [`BUSY`] ran every workload to a verified result.
fn assert_busy_finished(vm: &Value) {
    let k = &vm["kvm"];
    assert_eq!(k["exit_code"], 0, "{vm:#}");
    assert!(k["stopped"].is_null(), "{vm:#}");
    assert_eq!(vm["init"]["verified"], true, "{vm:#}");
    let w = vm["workloads"].as_array().unwrap();
    assert_eq!(w.len(), 8, "{vm:#}");
    for x in w {
        assert_eq!(x["verified"], true, "{x:#}");
    }
    assert!(
        console(vm).iter().any(|l| l.starts_with("PASS")),
        "{:?}",
        console(vm)
    );
}

/// The hash of `ram.bin`/`vgpu.bin` in the manifest (the VMM's `snapshot::Hasher`, repeated
/// here so that a test can damage a file and make the manifest agree with it).
fn hasher(b: &[u8]) -> String {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut lanes: [u64; 4] = [
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    ];
    let mut chunks = b.chunks_exact(32);
    for c in &mut chunks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap());
            *lane = (*lane ^ w).wrapping_mul(K).rotate_left(29);
        }
    }
    for (i, &x) in chunks.remainder().iter().enumerate() {
        let lane = &mut lanes[i % 4];
        *lane = (*lane ^ u64::from(x)).wrapping_mul(K);
    }
    let mut h = (b.len() as u64).wrapping_mul(K);
    for l in lanes {
        h = (h ^ l).wrapping_mul(K).rotate_left(31);
    }
    format!("{h:016x}")
}

/// The guest of most tests here.
const GUEST: &[&str] = &[
    "run",
    "--kvm",
    "--vms",
    "1",
    "--workload",
    "madd",
    "--size",
    "16",
    "--calibrate",
    "20000",
    "--json",
    "--quiet-console",
    "--timeout",
    "300",
];

fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpuvm-kvmsnap-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    GUEST.iter().copied().chain(extra.iter().copied()).collect()
}

/// `gpuvm run --kvm --restore DIR --json --quiet-console --timeout 300`.
fn restore_dir(dir: &str) -> std::process::Output {
    gpuvm(&[
        "run",
        "--kvm",
        "--restore",
        dir,
        "--json",
        "--quiet-console",
        "--timeout",
        "300",
    ])
}

/// The busy guest (`BUSY`) migrated to `sock` after 2000 exits: past the driver's bring-up and
/// into the workloads (the first has mapped its buffers in guest RAM for the GPU), with most of
/// them still to run.
fn migrate_busy(sock: &Path) -> std::process::Output {
    gpuvm(
        &BUSY
            .iter()
            .copied()
            .chain([
                "--migrate-to",
                sock.to_str().unwrap(),
                // Past the driver's bring-up (about 2,000 exits here), inside the workloads,
                // whose buffers in guest RAM are mapped for the GPU; well before the end.
                "--migrate-after-exits",
                "3000",
            ])
            .collect::<Vec<_>>(),
    )
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The guest ran to its exit port here with the driver up and `madd` verified.
fn assert_finished(vm: &Value) {
    let k = &vm["kvm"];
    assert_eq!(k["exit_code"], 0, "{vm:#}");
    assert!(k["stopped"].is_null(), "{vm:#}");
    assert_eq!(vm["init"]["verified"], true, "{vm:#}");
    assert_eq!(vm["workloads"][0]["name"], "madd", "{vm:#}");
    assert_eq!(vm["workloads"][0]["verified"], true, "{vm:#}");
    let console: Vec<&str> = k["console"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    assert!(console.iter().any(|l| l.starts_with("PASS")), "{console:?}");
    // The calibration phases were timed (they span the hand-off in these tests).
    let cal = &k["calibration"];
    for key in ["pio_exit_ns", "bare_mmio_exit_ns", "vgpu_mmio_exit_ns"] {
        assert!(cal[key].as_u64().unwrap() > 0, "{cal}");
    }
}

/// Takes a snapshot after `exits` exits into `dir`; returns the source's report of vm0.
fn take_snapshot(dir: &Path, exits: &str) -> Value {
    let out = gpuvm(&args(&[
        "--snapshot-to",
        dir.to_str().unwrap(),
        "--snapshot-after-exits",
        exits,
    ]));
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    json(&out)["vms"][0].clone()
}

#[test]
fn a_snapshot_restores_in_a_new_process_and_the_guest_finishes_its_run() {
    if !kvm_available("a_snapshot_restores_in_a_new_process_and_the_guest_finishes_its_run") {
        return;
    }
    let tmp = scratch("restore");
    let dir = tmp.join("snap");
    let src = take_snapshot(&dir, "3000");
    let k = &src["kvm"];
    assert_eq!(k["handoff"]["kind"], "snapshot", "{k:#}");
    assert!(
        k["exit_code"].is_null(),
        "the guest did not finish in the source: {k:#}"
    );
    // The pause came at the 3000th exit; every one of them so far was port I/O (serial, PCI
    // configuration, the calibration's port loop).
    assert_eq!(k["exits"]["pio"], 3000, "{k:#}");
    assert_eq!(k["exits"]["mmio_reads"], 0, "{k:#}");
    let pages = k["handoff"]["data_pages"].as_u64().unwrap();
    let ram = k["handoff"]["ram_bytes"].as_u64().unwrap();
    assert!(pages > 0 && pages < ram / 4096, "{k:#}");
    // The RAM file is sparse: it occupies about the non-zero pages, not the RAM size.
    assert!(
        k["handoff"]["ram_file_disk_bytes"].as_u64().unwrap() < ram / 4,
        "{k:#}"
    );
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], "gpuvm-kvm-snapshot");
    assert_eq!(manifest["version"], 1);
    assert_eq!(manifest["guest"]["workloads"][0], "madd");
    assert_eq!(manifest["machine"]["vcpus"][0]["summary"]["cs"], "0x23");
    assert_eq!(
        manifest["machine"]["vgpu"]["kind"],
        "gpuvm-migrate-stream/1"
    );
    assert_eq!(
        std::fs::metadata(dir.join("ram.bin")).unwrap().len(),
        ram,
        "the RAM file has the RAM's length"
    );

    // A new process: only the snapshot says what the guest is.
    let out = restore_dir(dir.to_str().unwrap());
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v = json(&out);
    let vm = &v["vms"][0];
    assert_finished(vm);
    let k = &vm["kvm"];
    assert!(
        k["restored"]["from"]
            .as_str()
            .unwrap()
            .starts_with("snapshot "),
        "{k:#}"
    );
    // The VMM's state came along: the console lines the guest printed before the snapshot and
    // the exit counters continue.
    let console: Vec<&str> = k["console"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    assert!(
        console.contains(&"pci 00:01.0 10de:06d8 class 030000"),
        "{console:?}"
    );
    assert!(k["exits"]["pio"].as_u64().unwrap() > 20_000, "{k:#}");
    // The same snapshot restores again (it is not consumed).
    let again = restore_dir(dir.to_str().unwrap());
    assert!(again.status.success(), "stderr: {}", stderr(&again));
    assert_finished(&json(&again)["vms"][0]);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn damaged_or_foreign_snapshots_are_refused_with_a_clear_error() {
    if !kvm_available("damaged_or_foreign_snapshots_are_refused_with_a_clear_error") {
        return;
    }
    let tmp = scratch("damaged");
    let good = tmp.join("good");
    take_snapshot(&good, "500");
    let copy = |name: &str| -> PathBuf {
        let d = tmp.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["manifest.json", "ram.bin", "vgpu.bin"] {
            std::fs::copy(good.join(f), d.join(f)).unwrap();
        }
        d
    };
    let edit_manifest = |d: &Path, f: &dyn Fn(&mut Value)| {
        let p = d.join("manifest.json");
        let mut m: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        f(&mut m);
        std::fs::write(&p, serde_json::to_vec(&m).unwrap()).unwrap();
    };
    let refused = |d: &Path, expect: &str| {
        let out = gpuvm(&[
            "run",
            "--kvm",
            "--restore",
            d.to_str().unwrap(),
            "--json",
            "--quiet-console",
        ]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{} was accepted: {err}", d.display());
        assert!(err.contains(expect), "expected '{expect}' in: {err}");
        assert!(!err.contains("panicked"), "{err}");
    };

    let d = copy("truncated-ram");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("ram.bin"))
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - 4096).unwrap();
    refused(&d, "truncated or damaged");

    let d = copy("flipped-ram");
    // Flip one byte of the guest program (1 MiB), a page that is certainly non-zero.
    let mut ram = std::fs::read(d.join("ram.bin")).unwrap();
    ram[0x10_0010] ^= 0x55;
    std::fs::write(d.join("ram.bin"), ram).unwrap();
    refused(&d, "is not the manifest's");

    let d = copy("no-manifest");
    std::fs::remove_file(d.join("manifest.json")).unwrap();
    refused(&d, "no snapshot here");

    let d = copy("cut-manifest");
    let m = std::fs::read(d.join("manifest.json")).unwrap();
    std::fs::write(d.join("manifest.json"), &m[..m.len() / 2]).unwrap();
    refused(&d, "not a JSON manifest");

    let d = copy("future-version");
    edit_manifest(&d, &|m| m["version"] = 99.into());
    refused(&d, "version 99; this gpuvm reads version 1");

    let d = copy("short-regs");
    edit_manifest(&d, &|m| {
        let r = m["machine"]["vcpus"][0]["regs"].as_str().unwrap();
        m["machine"]["vcpus"][0]["regs"] = r[..r.len() - 2].into();
    });
    refused(&d, "regs: 143 bytes, expected 144");

    let d = copy("big-ram");
    edit_manifest(&d, &|m| m["ram"]["size"] = (8u64 << 30).into());
    refused(&d, "is not valid here");

    let d = copy("foreign-guest");
    edit_manifest(&d, &|m| {
        m["guest"]["guest_elf_hash"] = "0123456789abcdef".into()
    });
    refused(&d, "is not the one this gpuvm embeds");

    let d = copy("edited-vgpu");
    let mut b = std::fs::read(d.join("vgpu.bin")).unwrap();
    b[0] ^= 1;
    std::fs::write(d.join("vgpu.bin"), b).unwrap();
    refused(&d, "the vGPU state's hash");

    // A vGPU stream damaged with a manifest that agrees: the stream's own checks refuse it.
    let damaged_stream = |name: &str, f: &dyn Fn(&mut Vec<u8>)| -> PathBuf {
        let d = copy(name);
        let mut b = std::fs::read(d.join("vgpu.bin")).unwrap();
        f(&mut b);
        std::fs::write(d.join("vgpu.bin"), &b).unwrap();
        edit_manifest(&d, &|m| {
            m["machine"]["vgpu"]["len"] = (b.len() as u64).into();
            m["machine"]["vgpu"]["hash"] = hasher(&b).into();
        });
        d
    };
    let d = damaged_stream("cut-vgpu", &|b| b.truncate(b.len() - 21));
    refused(&d, "restoring the vGPU: the vGPU's snapshot stream");
    let d = damaged_stream("foreign-vgpu", &|b| b[7] = b'X');
    refused(&d, "restoring the vGPU: the vGPU's snapshot stream");

    // The good one still restores (nothing above changed it).
    let out = restore_dir(good.to_str().unwrap());
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert_finished(&json(&out)["vms"][0]);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn a_guest_that_used_its_vgpu_is_snapshotted_mid_workload_and_finishes_after_restore() {
    if !kvm_available(
        "a_guest_that_used_its_vgpu_is_snapshotted_mid_workload_and_finishes_after_restore",
    ) {
        return;
    }
    let tmp = scratch("used");
    let dir = tmp.join("snap");
    let out = gpuvm(
        &BUSY
            .iter()
            .copied()
            .chain([
                "--snapshot-to",
                dir.to_str().unwrap(),
                "--snapshot-after-exits",
                "1500",
            ])
            .collect::<Vec<_>>(),
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let src = &json(&out)["vms"][0];
    assert_eq!(src["kvm"]["handoff"]["kind"], "snapshot", "{src:#}");
    assert_left_mid_workload(src);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        manifest["machine"]["vgpu"]["kind"],
        "gpuvm-migrate-stream/1"
    );
    let vgpu = std::fs::read(dir.join("vgpu.bin")).unwrap();
    assert_eq!(&vgpu[..8], b"GPUVMSNP", "a gpuvm::migrate stream");
    assert!(
        vgpu.len() > 4096,
        "VRAM pages came along: {} bytes",
        vgpu.len()
    );

    let out = restore_dir(dir.to_str().unwrap());
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let vm = &json(&out)["vms"][0];
    assert_busy_finished(vm);
    assert!(vm["kvm"]["restored"]["from"]
        .as_str()
        .unwrap()
        .starts_with("snapshot "));
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A destination VMM, its standard error read by a thread of its own.
struct Destination {
    child: std::process::Child,
    stderr: std::thread::JoinHandle<String>,
}

impl Destination {
    /// Waits for it to end; its output with all it printed on standard error.
    fn wait_with_output(self) -> std::process::Output {
        let mut out = self.child.wait_with_output().unwrap();
        out.stderr = self.stderr.join().unwrap().into_bytes();
        out
    }
}

/// Starts a destination listening on `sock`; returns once it says it listens (it prints that
/// after binding the socket).
fn destination(sock: &Path) -> Destination {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuvm"))
        .args([
            "run",
            "--kvm",
            "--migrate-listen",
            sock.to_str().unwrap(),
            "--json",
            "--quiet-console",
            "--timeout",
            "300",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the destination");
    let err = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("waiting for a migration on") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let out = Destination { child, stderr }.wait_with_output();
        panic!(
            "the destination never listened ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Destination { child, stderr }
}

#[test]
fn a_running_guest_migrates_live_to_another_process_and_finishes_there() {
    if !kvm_available("a_running_guest_migrates_live_to_another_process_and_finishes_there") {
        return;
    }
    let tmp = scratch("migrate");
    let sock = tmp.join("m.sock");
    let dst = destination(&sock);
    // Early (20 exits): the guest is still printing, so pre-copy rounds find dirty pages.
    // With --irq the destination's guest waits for its fences by interrupt: the irqchip and
    // the local APIC it restored deliver them.
    let out = gpuvm(&args(&[
        "--irq",
        "--migrate-to",
        sock.to_str().unwrap(),
        "--migrate-after-exits",
        "20",
    ]));
    let dout = dst.wait_with_output();
    assert!(out.status.success(), "source: {}", stderr(&out));
    assert!(dout.status.success(), "destination: {}", stderr(&dout));
    let src = &json(&out)["vms"][0]["kvm"];
    let m = &src["handoff"];
    assert_eq!(m["kind"], "migration", "{src:#}");
    assert!(src["exit_code"].is_null(), "{src:#}");
    let rounds = m["rounds"].as_array().unwrap();
    assert!(
        rounds.len() >= 3,
        "round 0, at least one dirty round, stop-and-copy: {m:#}"
    );
    assert!(rounds[0]["pages"].as_u64().unwrap() > 0, "{m:#}");
    let last = rounds.last().unwrap();
    assert_eq!(last["stop_and_copy"], true, "{m:#}");
    assert!(rounds[..rounds.len() - 1]
        .iter()
        .all(|r| r["stop_and_copy"] == false));
    let sum: u64 = rounds.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
    assert!(m["bytes"].as_u64().unwrap() >= sum, "{m:#}");
    let downtime = m["downtime_ns"].as_u64().unwrap();
    assert!(
        downtime > 0 && downtime <= m["total_ns"].as_u64().unwrap(),
        "{m:#}"
    );

    let dst = &json(&dout)["vms"][0];
    assert_finished(dst);
    assert_eq!(dst["kvm"]["fence_irq"], true, "{dst:#}");
    assert!(dst["kvm"]["irqs_seen"].as_u64().unwrap() > 0, "{dst:#}");
    let r = &dst["kvm"]["restored"];
    assert!(
        r["from"].as_str().unwrap().starts_with("migration "),
        "{r:#}"
    );
    let got = r["migration"]["rounds"].as_array().unwrap();
    assert_eq!(got.len(), rounds.len(), "{r:#}");
    for (a, b) in got.iter().zip(rounds) {
        assert_eq!(a["pages"], b["pages"], "{r:#}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn a_failed_migration_leaves_the_guest_running_in_the_source() {
    if !kvm_available("a_failed_migration_leaves_the_guest_running_in_the_source") {
        return;
    }
    let tmp = scratch("nodest");
    let sock = tmp.join("nobody.sock");
    let out = gpuvm(&args(&[
        "--migrate-to",
        sock.to_str().unwrap(),
        "--migrate-after-exits",
        "100",
    ]));
    assert!(
        !out.status.success(),
        "a failed migration must fail the run"
    );
    let vm = &json(&out)["vms"][0];
    let e = vm["kvm"]["handoff_error"].as_str().unwrap();
    assert!(e.contains("connecting to"), "{e}");
    assert!(vm["kvm"]["handoff"].is_null());
    assert_finished(vm);
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn a_destination_refuses_a_stream_that_is_not_a_migration() {
    if !kvm_available("a_destination_refuses_a_stream_that_is_not_a_migration") {
        return;
    }
    let tmp = scratch("garbage");
    let sock = tmp.join("g.sock");
    let dst = destination(&sock);
    {
        use std::io::Write;
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        // A HELLO-tagged message whose payload is not a gpuvm stream.
        let mut msg = vec![1u8];
        msg.extend_from_slice(&16u32.to_le_bytes());
        msg.extend_from_slice(b"GET / HTTP/1.1\r\n");
        s.write_all(&msg).unwrap();
    }
    let out = dst.wait_with_output();
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("not a gpuvm migration stream"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn a_guest_mid_workload_migrates_live_with_its_vgpu_and_finishes_there() {
    if !kvm_available("a_guest_mid_workload_migrates_live_with_its_vgpu_and_finishes_there") {
        return;
    }
    let tmp = scratch("busy");
    let sock = tmp.join("b.sock");
    let dst = destination(&sock);
    let out = migrate_busy(&sock);
    let dout = dst.wait_with_output();
    assert!(out.status.success(), "source: {}", stderr(&out));
    assert!(dout.status.success(), "destination: {}", stderr(&dout));
    let src = &json(&out)["vms"][0];
    assert_left_mid_workload(src);
    let m = &src["kvm"]["handoff"];
    assert_eq!(m["kind"], "migration", "{m:#}");
    let rounds = m["rounds"].as_array().unwrap();
    let vram = m["vram_rounds"].as_array().unwrap();
    // A VRAM round after each RAM round, the stop-and-copy one included.
    assert_eq!(vram.len(), rounds.len(), "{m:#}");
    assert!(rounds.len() >= 2, "{m:#}");
    assert!(vram[0]["sent"].as_u64().unwrap() > 0, "{m:#}");
    let sent: u64 = vram.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
    let stream = m["vgpu_stream_bytes"].as_u64().unwrap();
    assert!(stream > sent, "pages plus the device state: {m:#}");
    // The workloads' buffers in guest RAM are mapped for the GPU: the last round resends them.
    assert!(m["dma_pages"].as_u64().unwrap() > 0, "{m:#}");
    let last = rounds.last().unwrap();
    assert_eq!(last["stop_and_copy"], true, "{m:#}");
    assert!(
        last["pages"].as_u64().unwrap() >= m["dma_pages"].as_u64().unwrap(),
        "{m:#}"
    );
    let downtime = m["downtime_ns"].as_u64().unwrap();
    assert!(
        downtime > 0 && downtime <= m["total_ns"].as_u64().unwrap(),
        "{m:#}"
    );

    let dst = &json(&dout)["vms"][0];
    assert_busy_finished(dst);
    let r = &dst["kvm"]["restored"];
    assert!(
        r["from"].as_str().unwrap().starts_with("migration "),
        "{r:#}"
    );
    assert_eq!(r["migration"]["vgpu_stream_bytes"], stream, "{r:#}");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A destination that takes the whole stream, then refuses the state at the very end: the
/// source has quiesced its vGPU and sent everything by then.
#[test]
fn a_migration_refused_at_the_last_step_resumes_the_used_vgpu_in_the_source() {
    if !kvm_available("a_migration_refused_at_the_last_step_resumes_the_used_vgpu_in_the_source") {
        return;
    }
    use std::io::{Read, Write};
    let tmp = scratch("refuse-late");
    let sock = tmp.join("r.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let fake = std::thread::spawn(move || -> Vec<u8> {
        let (mut s, _) = l.accept().unwrap();
        let mut tags = Vec::new();
        loop {
            let mut head = [0u8; 5];
            if s.read_exact(&mut head).is_err() {
                return tags;
            }
            let len = u32::from_le_bytes(head[1..5].try_into().unwrap()) as usize;
            let mut p = vec![0u8; len];
            s.read_exact(&mut p).unwrap();
            tags.push(head[0]);
            let answer: Option<(u8, &[u8])> = match head[0] {
                1 => Some((2, b"ready")),
                6 => Some((3, b"refused by the test destination")),
                _ => None,
            };
            if let Some((t, text)) = answer {
                let mut m = vec![t];
                m.extend_from_slice(&(text.len() as u32).to_le_bytes());
                m.extend_from_slice(text);
                s.write_all(&m).unwrap();
            }
            if head[0] == 6 {
                return tags;
            }
        }
    });
    let out = migrate_busy(&sock);
    let tags = fake.join().unwrap();
    // HELLO, RAM pages, VGPU stream, ..., STATE: the source got as far as the end.
    assert_eq!(tags.first(), Some(&1), "{tags:?}");
    assert_eq!(tags.last(), Some(&6), "{tags:?}");
    assert!(tags.contains(&8), "VGPU messages were sent: {tags:?}");
    assert!(
        !out.status.success(),
        "a failed migration must fail the run"
    );
    let vm = &json(&out)["vms"][0];
    let e = vm["kvm"]["handoff_error"].as_str().unwrap();
    assert!(e.contains("refused by the test destination"), "{e}");
    assert!(vm["kvm"]["handoff"].is_null());
    // The vGPU was quiesced for the stop-and-copy: resumed, it runs every workload here.
    assert_busy_finished(vm);
    let _ = std::fs::remove_dir_all(&tmp);
}
