//! Operating `gpuvm serve` (issue 16) through the built binary: the control socket and the
//! `ctl`/`stat`/`top` verbs, Prometheus metrics scraped and parsed, malformed control input,
//! a second daemon on the same directory, and `ctl stop` draining and exiting 0. No KVM needed;
//! every wait is bounded and the daemon is killed by a Drop guard if a test fails.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

type Lines = Arc<(Mutex<Vec<String>>, Condvar)>;

struct Serve {
    child: Child,
    dir: PathBuf,
    lines: Lines,
}

fn gpuvm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuvm"))
}

impl Serve {
    fn start(test: &str, extra: &[&str]) -> Serve {
        let dir = std::env::temp_dir().join(format!("gpuvm-ops-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut child = gpuvm()
            .args(["serve", "--socket-dir"])
            .arg(&dir)
            .args(if extra.contains(&"--vms") {
                &[][..]
            } else {
                &["--vms", "2", "--vram-mib", "128"][..]
            })
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpuvm serve");
        let lines: Lines = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let err = child.stderr.take().expect("piped");
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[serve] {line}");
                l.0.lock().unwrap().push(line);
                l.1.notify_all();
            }
        });
        let s = Serve { child, dir, lines };
        s.wait_line("ready", |l| l.starts_with("gpuvm serve: ready"));
        s
    }

    fn wait_line(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + Duration::from_secs(120);
        let mut g = self.lines.0.lock().unwrap();
        loop {
            if let Some(l) = g.iter().find(|l| pred(l)) {
                return l.clone();
            }
            let left = end.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "never printed: {what}; got {:#?}", *g);
            g = self.lines.1.wait_timeout(g, left).unwrap().0;
        }
    }

    fn ctl(&self, args: &[&str]) -> Output {
        gpuvm()
            .arg("ctl")
            .arg("--socket-dir")
            .arg(&self.dir)
            .args(args)
            .output()
            .unwrap()
    }

    fn ctl_json(&self, args: &[&str]) -> Value {
        let out = self.ctl(args);
        assert!(out.status.success(), "ctl {args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn stat(&self) -> Value {
        let out = gpuvm()
            .args(["stat", "--json", "--socket-dir"])
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Waits (bounded) for the daemon to exit.
    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < end, "the daemon did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends raw lines on the control socket; returns the reply lines.
fn raw(dir: &Path, input: &[u8], replies: usize) -> Vec<Value> {
    let mut s = UnixStream::connect(dir.join("control.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(input).unwrap();
    let mut r = BufReader::new(s);
    (0..replies)
        .map(|_| {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            serde_json::from_str(&l).unwrap_or_else(|e| panic!("reply {l:?}: {e}"))
        })
        .collect()
}

fn names(list: &Value) -> Vec<String> {
    list["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn control_verbs_list_add_weight_remove_and_stop() {
    let mut s = Serve::start("verbs", &[]);
    let mode = std::fs::metadata(s.dir.join("control.sock"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "control socket mode {mode:o}");
    assert_eq!(names(&s.ctl_json(&["list"])), ["vm0", "vm1"]);

    // add from a TOML profile
    let profile = s.dir.join("p.toml");
    std::fs::write(&profile, "name = 'small'\nvram_mib = 64\nweight = 2\n").unwrap();
    let r = s.ctl_json(&["add", "vm2", profile.to_str().unwrap()]);
    assert_eq!(r["vm"]["profile"]["weight"], 2);
    assert!(s.dir.join("vm2.sock").exists());
    assert_eq!(names(&s.ctl_json(&["list"])), ["vm0", "vm1", "vm2"]);

    // a runtime weight change shows in the target shares (2:1:2 -> 3:1:2)
    let share = |st: &Value, vm: &str| {
        st["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == vm)
            .unwrap()["target_share"]
            .as_f64()
            .unwrap()
    };
    assert!((share(&s.stat(), "vm0") - 0.25).abs() < 1e-6);
    s.ctl_json(&["weight", "vm0", "3"]);
    let st = s.stat();
    assert!((share(&st, "vm0") - 0.5).abs() < 1e-6, "{st}");
    assert_eq!(st["policy"], "band");
    for v in st["vms"].as_array().unwrap() {
        // The simulated GPU tells what a slice uses; nothing has been written to these yet.
        let used = v["vram_in_use_bytes"].as_u64().expect("VRAM in use shown");
        assert!(used <= v["vram_bytes"].as_u64().unwrap(), "{v}");
        assert!(
            ["running", "capped", "buffer", "waiting", "idle"]
                .contains(&v["state"].as_str().unwrap()),
            "{v}"
        );
    }

    // refused requests change nothing
    for bad in [
        vec!["weight", "vm0", "0"],
        vec!["weight", "nobody", "2"],
        vec!["cap", "vm0", "50"], // BAND has no caps
        vec!["remove", "nobody"],
        vec!["add", "vm1", profile.to_str().unwrap()],
    ] {
        let out = s.ctl(&bad);
        assert!(!out.status.success(), "{bad:?} was accepted");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("refused"),
            "{out:?}"
        );
    }
    assert_eq!(names(&s.ctl_json(&["list"])), ["vm0", "vm1", "vm2"]);
    assert!((share(&s.stat(), "vm0") - 0.5).abs() < 1e-6);

    // remove
    let r = s.ctl_json(&["remove", "vm1"]);
    assert_eq!(r["scrubbed_bytes"], 128u64 << 20);
    assert!(!s.dir.join("vm1.sock").exists());
    assert_eq!(names(&s.ctl_json(&["list"])), ["vm0", "vm2"]);

    // the human-readable views
    let out = gpuvm()
        .args(["stat", "--socket-dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("share 1s") && text.contains("vm2"), "{text}");
    let out = gpuvm()
        .args([
            "top",
            "--count",
            "2",
            "--interval-ms",
            "100",
            "--socket-dir",
        ])
        .arg(&s.dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("gpuvm serve:")
            .count(),
        2
    );

    // stop drains and exits 0, leaving no sockets
    assert_eq!(s.ctl_json(&["stop"])["stopping"], true);
    let status = s.wait_exit();
    assert_eq!(status.code(), Some(0));
    s.wait_line("drained", |l| l.contains("drained in"));
    for f in ["vm0.sock", "vm2.sock", "control.sock"] {
        assert!(!s.dir.join(f).exists(), "{f} left behind");
    }
}

#[test]
fn malformed_control_input_gets_an_error_and_changes_nothing() {
    let s = Serve::start("malformed", &[]);
    let before = s.ctl_json(&["list"]);
    let input = b"not json\n{\"cmd\":\"explode\"}\n{\"cmd\":\"remove\"}\n{\"cmd\":\"remove\",\"name\":\"vm0\",\"extra\":1}\n{\"cmd\":\"weight\",\"name\":\"vm0\",\"weight\":-3}\n{\"cmd\":\"add\",\"name\":\"x\",\"profile\":{\"vram_mib\":0}}\n{\"cmd\":\"add\",\"name\":\"../x\",\"profile\":{}}\n[1,2]\n";
    let replies = raw(&s.dir, input, 8);
    for r in &replies {
        assert_eq!(r["ok"], false, "{r}");
        assert!(!r["error"].as_str().unwrap().is_empty());
    }
    // a line longer than the limit is refused and closes that connection only
    let mut long = vec![b'x'; 70 * 1024];
    long.push(b'\n');
    let r = raw(&s.dir, &long, 1);
    assert_eq!(r[0]["ok"], false);
    assert_eq!(s.ctl_json(&["list"]), before, "nothing changed");
    let st = s.stat();
    assert_eq!(st["control_errors"], 9, "{st}");
    s.wait_line("refusals logged", |l| {
        l.contains("control request refused (9 so far)")
    });
}

/// Parses the text exposition format strictly enough to catch malformed output: every sample
/// belongs to a declared family, has a float value and well-formed labels.
fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("TYPE line");
            types.insert(name.to_string(), ty.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
        let name = series.split('{').next().unwrap();
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
                for kv in labels[1..labels.len() - 1].split(',') {
                    let (k, v) = kv.split_once('=').expect("label");
                    assert!(k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
                    assert!(v.starts_with('"') && v.ends_with('"'), "{line}");
                }
            }
        }
        let family = name.strip_suffix("_total").unwrap_or(name);
        let ty = types
            .get(family)
            .unwrap_or_else(|| panic!("undeclared {name}"));
        if ty == "counter" {
            assert!(name.ends_with("_total"), "counter {name} without _total");
            assert!(v >= 0.0);
        }
        samples.insert(series.to_string(), v);
    }
    samples
}

fn scrape(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

#[test]
fn metrics_are_scraped_and_parse() {
    let s = Serve::start(
        "metrics",
        &["--metrics", "127.0.0.1:0", "--sched", "fixed-share"],
    );
    let line = s.wait_line("metrics address", |l| l.contains("metrics on http://"));
    let addr = line
        .split("http://")
        .nth(1)
        .unwrap()
        .trim_end_matches("/metrics")
        .to_string();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    s.ctl_json(&["cap", "vm1", "25"]);
    s.ctl_json(&["weight", "vm0", "4"]);
    let (head, body) = scrape(&addr, "/metrics");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200"),
        "{head}"
    );
    assert!(head.to_ascii_lowercase().contains("text/plain"), "{head}");
    let m = parse_exposition(&body);
    for vm in ["vm0", "vm1"] {
        for name in [
            "gpuvm_vm_gpu_busy_seconds_total",
            "gpuvm_vm_submissions_total",
            "gpuvm_vm_exits_total",
            "gpuvm_vm_faults_total",
            "gpuvm_vm_violations_total",
            "gpuvm_vm_share_window_ratio",
            "gpuvm_vm_vram_bytes",
        ] {
            assert!(
                m.contains_key(&format!("{name}{{vm=\"{vm}\"}}")),
                "{name} {vm}:\n{body}"
            );
        }
    }
    assert_eq!(m["gpuvm_vm_cap_ratio{vm=\"vm1\"}"], 0.25);
    assert_eq!(m["gpuvm_vm_weight{vm=\"vm0\"}"], 4.0);
    assert_eq!(m["gpuvm_vm_vram_bytes{vm=\"vm0\"}"], (128u64 << 20) as f64);
    assert_eq!(m["gpuvm_vms"], 2.0);
    assert!(m["gpuvm_control_requests_total"] >= 2.0);
    let (head, _) = scrape(&addr, "/other");
    assert!(head.contains(" 404"), "{head}");
}

#[test]
fn a_second_daemon_on_the_same_directory_refuses_and_sigterm_exits_zero() {
    let mut s = Serve::start("second", &[]);
    let out = gpuvm()
        .args(["serve", "--vms", "1", "--socket-dir"])
        .arg(&s.dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("another gpuvm serve (pid {})", s.child.id())),
        "{err}"
    );
    // the first daemon is undisturbed
    assert_eq!(names(&s.ctl_json(&["list"])), ["vm0", "vm1"]);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    assert_eq!(s.wait_exit().code(), Some(0));
    assert!(!s.dir.join("control.sock").exists());
}

/// More VMs than 32 GiB DMA windows fit in the 2^40-byte IOVA space (31) are served once the
/// windows are sized for the VMs' RAM (64 VMs here); with the default the daemon says what to
/// change.
#[test]
fn sixty_four_vms_with_dma_windows_sized_for_them() {
    let dir = std::env::temp_dir().join(format!("gpuvm-ops-window-{}", std::process::id()));
    let out = gpuvm()
        .args([
            "serve",
            "--vms",
            "40",
            "--vram-mib",
            "64",
            "--channels",
            "2",
        ])
        .arg("--socket-dir")
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success(), "40 x 32 GiB windows cannot fit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no DMA window left"), "{err}");
    let bad = gpuvm()
        .args([
            "serve",
            "--vms",
            "1",
            "--dma-window-mib",
            "3000",
            "--socket-dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("power of two"),
        "{bad:?}"
    );
    let s = Serve::start(
        "window",
        &[
            "--vms",
            "64",
            "--vram-mib",
            "64",
            "--channels",
            "1",
            "--dma-window-mib",
            "8192",
        ],
    );
    let list = s.ctl_json(&["list"]);
    assert_eq!(names(&list).len(), 64);
    assert!(s.dir.join("vm63.sock").exists());
}

/// Sends `input` on a fresh control connection, closes the writing half, returns the reply.
fn once(dir: &Path, input: &[u8]) -> Value {
    let mut s = UnixStream::connect(dir.join("control.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(input).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut l = String::new();
    BufReader::new(s).read_line(&mut l).unwrap();
    serde_json::from_str(&l).unwrap_or_else(|e| panic!("reply {l:?}: {e}"))
}

#[test]
fn bad_migration_requests_are_refused_and_an_abandoned_session_resumes_the_vgpu() {
    let s = Serve::start("migration-verbs", &[]);
    let before = s.ctl_json(&["list"]);
    for (input, expect) in [
        (
            &b"{\"cmd\":\"restore\",\"name\":\"vm0\",\"bytes\":99999999999999}\n"[..],
            "at most",
        ),
        (
            b"{\"cmd\":\"restore\",\"name\":\"nope\",\"bytes\":4}\nabcd",
            "no VM named",
        ),
        (
            b"{\"cmd\":\"restore\",\"name\":\"vm0\",\"bytes\":4}\nabcd",
            "has no client",
        ),
        (
            b"{\"cmd\":\"restore\",\"name\":\"vm0\",\"bytes\":100}\n0123456789",
            "ended after 10 of 100",
        ),
        (
            b"{\"cmd\":\"migrate_out\",\"name\":\"vm0\"}\n",
            "has no client",
        ),
        (
            b"{\"cmd\":\"migrate_out\",\"name\":\"nope\"}\n",
            "no VM named",
        ),
        (
            b"{\"cmd\":\"migrate_out\",\"name\":\"vm0\",\"x\":1}\n",
            "unknown field",
        ),
    ] {
        let r = once(&s.dir, input);
        assert_eq!(r["ok"], false, "{r}");
        let e = r["error"].as_str().unwrap();
        assert!(e.contains(expect), "{e} (expected {expect:?})");
    }
    assert_eq!(s.ctl_json(&["list"]), before, "nothing changed");
    assert_eq!(s.stat()["control_errors"], 7);

    // A client on vm0: a session opens, then a malformed step ends it and the vGPU resumes.
    let mut c = vfio_user::Client::new(&s.dir.join("vm0.sock")).unwrap();
    let mut id = [0u8; 4];
    c.region_read(7, 0, &mut id).unwrap();
    s.wait_line("vm0 connected", |l| l.contains("[vm0] client connected"));
    let mut sock = UnixStream::connect(s.dir.join("control.sock")).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    sock.write_all(b"{\"cmd\":\"migrate_out\",\"name\":\"vm0\"}\n")
        .unwrap();
    let mut r = BufReader::new(sock.try_clone().unwrap());
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    let head: Value = serde_json::from_str(&l).unwrap();
    assert_eq!(head["ok"], true, "{head}");
    let mut header = vec![0u8; head["bytes"].as_u64().unwrap() as usize];
    r.read_exact(&mut header).unwrap();
    assert_eq!(&header[..8], b"GPUVMSNP");
    assert_eq!(s.ctl_json(&["list"])["vms"][0]["migrating"], true);
    // While it runs, a second session on the same VM is refused.
    let r2 = once(&s.dir, b"{\"cmd\":\"migrate_out\",\"name\":\"vm0\"}\n");
    assert!(
        r2["error"]
            .as_str()
            .unwrap()
            .contains("already being migrated"),
        "{r2}"
    );
    sock.write_all(b"{\"op\":\"explode\"}\n").unwrap();
    l.clear();
    r.read_line(&mut l).unwrap();
    let bad: Value = serde_json::from_str(&l).unwrap();
    assert_eq!(bad["ok"], false, "{bad}");
    s.wait_line("resumed", |l| {
        l.contains("[vm0] migration abandoned before its commit: the vGPU resumed")
    });
    // The client goes on with its vGPU, and a new session may start.
    assert_eq!(s.ctl_json(&["list"])["vms"][0]["migrating"], false);
    c.region_read(7, 0, &mut id).unwrap();
    assert_eq!(u32::from_le_bytes(id), 0x06d8_10de);
    let mut again = UnixStream::connect(s.dir.join("control.sock")).unwrap();
    again
        .write_all(b"{\"cmd\":\"migrate_out\",\"name\":\"vm0\"}\n")
        .unwrap();
    l.clear();
    BufReader::new(again).read_line(&mut l).unwrap();
    assert!(l.contains("\"ok\":true"), "{l}");
}
