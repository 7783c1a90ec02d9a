//! Operating `gpuvm serve` (issues 16 and 26) through the built binary: the control socket and
//! the `ctl`/`stat`/`top` verbs, Prometheus metrics scraped and parsed by a real OpenMetrics
//! parser after two client sessions of a VM that ran GPU work, malformed control input, a
//! second daemon on the same directory, a second client on a busy VM, an unsealed DMA map
//! refused with the fix named, and `ctl stop` draining and exiting 0. No KVM needed (the
//! client sessions run gpuvm's guest driver in this process over vfio-user); every wait is
//! bounded and the daemon is killed by a Drop guard if a test fails.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
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
        s.wait_line("ready", |l| l.contains("gpuvm serve: ready"));
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
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let out = self.ctl(&a);
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
        vec!["cap", "vm0", "0"],
        vec!["cap", "vm0", "101"],
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

    // Without --json: a table, and a sentence per change.
    let out = s.ctl(&["list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()[..3]
            == ["vm", "gen", "client"]
            && text.contains("vm2")
            && text.trim_end().ends_with("3 VMs"),
        "{text}"
    );
    let out = s.ctl(&["weight", "vm2", "2"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "vm2: weight 2\n");

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
    for f in ["vm0.sock", "vm2.sock", "control.sock", "serve.lock"] {
        assert!(!s.dir.join(f).exists(), "{f} left behind");
    }
    // Every line the daemon printed begins with its time (RFC 3339, UTC, milliseconds).
    for l in s.lines.0.lock().unwrap().iter() {
        let (ts, rest) = l.split_once(' ').unwrap_or_default();
        let b = ts.as_bytes();
        assert!(
            rest.starts_with("gpuvm serve: ")
                && b.len() == 24
                && b[4] == b'-'
                && b[10] == b'T'
                && b[19] == b'.'
                && b[23] == b'Z',
            "not a timestamped daemon line: {l:?}"
        );
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

type Exposition = openmetrics_parser::MetricsExposition<
    openmetrics_parser::OpenMetricsType,
    openmetrics_parser::OpenMetricsValue,
>;

/// Parses a scrape with a real OpenMetrics parser (which checks the format: TYPE, UNIT and
/// HELP per family, counter samples named `_total`, `# EOF`), then checks what Prometheus
/// needs on top: every family has HELP, and every counter family has samples (the issue:
/// a 0.0.4 parser saw 15 empty counter families).
fn parse_metrics(body: &str) -> Exposition {
    let m = openmetrics_parser::openmetrics::parse_openmetrics(body)
        .unwrap_or_else(|e| panic!("not OpenMetrics ({e:?}):\n{body}"));
    assert!(
        m.families.len() >= 30,
        "{} families:\n{body}",
        m.families.len()
    );
    for (name, f) in &m.families {
        assert!(!f.help.is_empty(), "{name} has no HELP");
        if f.family_type == openmetrics_parser::OpenMetricsType::Counter {
            assert!(
                f.iter_samples().next().is_some(),
                "counter family {name} is empty"
            );
        }
    }
    m
}

/// The value of family `name`'s sample for `vm` (or its one sample without labels).
fn value(m: &Exposition, name: &str, vm: Option<&str>) -> f64 {
    use openmetrics_parser::{MetricNumber, OpenMetricsValue};
    let f = m
        .families
        .get(name)
        .unwrap_or_else(|| panic!("no family {name}"));
    let labels: Vec<String> = vm.into_iter().map(String::from).collect();
    let s = f
        .get_sample_by_label_values(&labels)
        .unwrap_or_else(|| panic!("{name} has no sample for {vm:?}"));
    let n: MetricNumber = match &s.value {
        OpenMetricsValue::Counter(c) => c.value,
        OpenMetricsValue::Gauge(g) | OpenMetricsValue::Unknown(g) => *g,
        v => panic!("{name}: unexpected {v:?}"),
    };
    n.as_f64()
}

fn metrics_addr(s: &Serve) -> String {
    let line = s.wait_line("metrics address", |l| l.contains("metrics on http://"));
    line.split("http://")
        .nth(1)
        .unwrap()
        .trim_end_matches("/metrics")
        .to_string()
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
    let addr = metrics_addr(&s);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    s.ctl_json(&["cap", "vm1", "25"]);
    s.ctl_json(&["weight", "vm0", "4"]);
    let (head, body) = scrape(&addr, "/metrics");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200"),
        "{head}"
    );
    assert!(
        head.contains("Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{head}"
    );
    let m = parse_metrics(&body);
    use openmetrics_parser::OpenMetricsType::{Counter, Gauge};
    for (name, ty) in [
        ("gpuvm_vm_gpu_busy_seconds", Counter),
        ("gpuvm_vm_submissions", Counter),
        ("gpuvm_vm_exits", Counter),
        ("gpuvm_vm_faults", Counter),
        ("gpuvm_vm_violations", Counter),
        ("gpuvm_vm_moved_bytes", Counter),
        ("gpuvm_vm_share_window_ratio", Gauge),
        ("gpuvm_vm_vram_bytes", Gauge),
        ("gpuvm_vm_vgpu_generation", Gauge),
    ] {
        assert_eq!(m.families[name].family_type, ty, "{name}");
        for vm in ["vm0", "vm1"] {
            value(&m, name, Some(vm));
        }
    }
    assert_eq!(m.families["gpuvm_vm_gpu_busy_seconds"].unit, "seconds");
    assert_eq!(value(&m, "gpuvm_vm_cap_ratio", Some("vm1")), 0.25);
    assert_eq!(value(&m, "gpuvm_vm_weight", Some("vm0")), 4.0);
    assert_eq!(
        value(&m, "gpuvm_vm_vram_bytes", Some("vm0")),
        (128u64 << 20) as f64
    );
    assert_eq!(value(&m, "gpuvm_vm_vgpu_generation", Some("vm0")), 1.0);
    assert_eq!(value(&m, "gpuvm_vms", None), 2.0);
    assert!(value(&m, "gpuvm_control_requests", None) >= 2.0);
    assert!(
        body.contains("gpuvm_scheduler_info{policy=\"fixed-share\"} 1"),
        "{body}"
    );
    let (head, _) = scrape(&addr, "/other");
    assert!(head.contains(" 404"), "{head}");
}

/// Polls `stat` (bounded) until `cond` holds for VM `vm`; returns that stat.
fn wait_stat(s: &Serve, vm: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let st = s.stat();
        let v = st["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == vm)
            .cloned()
            .unwrap_or_else(|| panic!("no {vm} in {st}"));
        if cond(&v) {
            return v;
        }
        assert!(Instant::now() < end, "{vm} never {what}: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 26's bar: a VM's counters survive its client sessions. Two sessions of vm0 each
/// bring the guest driver up over vfio-user and run the same verified GPU work; after both,
/// the metrics parse, every counter family is typed and non-empty, and vm0's submissions are
/// at least twice one session's, while stat shows the session's own counters back at 0.
#[test]
fn metrics_after_two_client_sessions_keep_the_vms_lifetime_totals() {
    let s = Serve::start(
        "sessions",
        &[
            "--metrics",
            "127.0.0.1:0",
            "--vms",
            "1",
            "--vram-mib",
            "128",
        ],
    );
    let addr = metrics_addr(&s);
    let sock = s.dir.join("vm0.sock");

    assert_eq!(support::vfio_guest::session(&sock, 2), 2);
    let v = wait_stat(&s, "vm0", "saw its first client go", |v| {
        v["teardowns"] == 1 && v["connected"] == false
    });
    assert_eq!(v["vgpu_generation"], 2, "{v}");
    assert_eq!(v["submissions"], 0, "a fresh vGPU for the next client: {v}");
    let one = value(
        &parse_metrics(&scrape(&addr, "/metrics").1),
        "gpuvm_vm_submissions",
        Some("vm0"),
    );
    assert!(one > 0.0, "the first session submitted work");
    assert_eq!(v["lifetime"]["submissions"].as_f64().unwrap(), one, "{v}");

    assert_eq!(support::vfio_guest::session(&sock, 2), 2);
    let v = wait_stat(&s, "vm0", "saw its second client go", |v| {
        v["teardowns"] == 2 && v["connected"] == false
    });
    let (head, body) = scrape(&addr, "/metrics");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    let m = parse_metrics(&body);
    let two = value(&m, "gpuvm_vm_submissions", Some("vm0"));
    assert!(
        two >= 2.0 * one,
        "after two sessions {two} submissions, one session {one}"
    );
    assert_eq!(v["lifetime"]["submissions"].as_f64().unwrap(), two, "{v}");
    for name in [
        "gpuvm_vm_gpu_busy_seconds",
        "gpuvm_vm_doorbells",
        "gpuvm_vm_completions",
        "gpuvm_vm_exits",
        "gpuvm_vm_moved_bytes",
    ] {
        assert!(
            value(&m, name, Some("vm0")) > 0.0,
            "{name} after two sessions"
        );
    }
    assert_eq!(value(&m, "gpuvm_vm_connections", Some("vm0")), 2.0);
    assert_eq!(value(&m, "gpuvm_vm_vgpu_generation", Some("vm0")), 3.0);
    // The log names the VM and its vGPU generation, not the host's vGPU ids.
    s.wait_line("generation logged", |l| {
        l.contains("[vm0] client connected (connection 2): freshly reset vGPU generation 2")
    });
}

/// A VMM that maps guest RAM which is not a sealed memfd (Cloud Hypervisor without the flag)
/// has that DMA_MAP fail at once, because the daemon closes the connection (a client ignores
/// an error reply to DMA_MAP), and the daemon's log names the flag that fixes it. The VM is
/// served to the next client as usual.
#[test]
fn an_unsealed_dma_map_fails_the_device_at_once_with_the_flag_named() {
    let s = Serve::start("unsealed", &[]);
    let sock = s.dir.join("vm0.sock");
    let mut c = vfio_user::Client::new(&sock).unwrap();
    let mut id = [0u8; 4];
    c.region_read(7, 0, &mut id).unwrap();
    let ram = support::vfio_guest::memfd(2 << 20, false);
    let r = c.dma_map(0, 0, 2 << 20, ram.as_raw_fd());
    assert!(
        r.is_err(),
        "the VMM's DMA_MAP must fail, not be answered and ignored"
    );
    let l = s.wait_line("refusal logged", |l| {
        l.contains("[vm0] device failed for this client") && l.contains("--allow-unsealed-dma")
    });
    assert!(l.contains("not sealed"), "{l}");
    // The connection is gone: the next request fails too.
    assert!(c.region_read(7, 0, &mut id).is_err());
    let v = wait_stat(&s, "vm0", "saw the failed client go", |v| {
        v["teardowns"] == 1 && v["connected"] == false
    });
    assert!(v["rejected"].as_u64().unwrap() >= 1, "{v}");
    // A VMM with sealed RAM is served as usual.
    assert_eq!(support::vfio_guest::session(&sock, 1), 1);
    drop(s);

    // With the flag the same map is accepted.
    let s = Serve::start("unsealed-allowed", &["--allow-unsealed-dma"]);
    let mut c = vfio_user::Client::new(&s.dir.join("vm0.sock")).unwrap();
    c.region_read(7, 0, &mut id).unwrap();
    let ram = support::vfio_guest::memfd(2 << 20, false);
    c.dma_map(0, 0, 2 << 20, ram.as_raw_fd()).unwrap();
    c.region_read(7, 0, &mut id).unwrap();
    assert_eq!(u32::from_le_bytes(id), 0x06d8_10de);
    let st = s.stat();
    assert_eq!(st["vms"][0]["rejected"], 0, "{st}");
}

/// A second client of a VM that is served already is turned away at once, with who holds the
/// VM in the log; the first goes on. The sockets get the mode asked for, and the client's
/// uid is known.
#[test]
fn a_second_client_of_a_busy_vm_is_refused_with_the_holder_named() {
    use std::os::unix::fs::PermissionsExt;
    let s = Serve::start("busy", &["--socket-mode", "0660"]);
    let sock = s.dir.join("vm0.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660, "VM socket mode {mode:o}");
    let mut first = vfio_user::Client::new(&sock).unwrap();
    let mut id = [0u8; 4];
    first.region_read(7, 0, &mut id).unwrap();
    let me = std::process::id();
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    s.wait_line("the client identified", |l| {
        l.contains(&format!("[vm0] client is pid {me} ")) && l.contains(&format!("uid {uid}"))
    });
    assert!(
        vfio_user::Client::new(&sock).is_err(),
        "a second client must not be left waiting"
    );
    let l = s.wait_line("the second client refused", |l| {
        l.contains("[vm0] refused a second client")
    });
    assert!(
        l.contains("served since") && l.contains(&format!("pid {me} ")),
        "{l}"
    );
    first.region_read(7, 0, &mut id).unwrap();
    assert_eq!(
        u32::from_le_bytes(id),
        0x06d8_10de,
        "the first client goes on"
    );
    let st = s.stat();
    let vm0 = &st["vms"][0];
    assert!(
        vm0["client"]
            .as_str()
            .unwrap()
            .contains(&format!("uid {uid}")),
        "{vm0}"
    );
    assert_eq!(vm0["connections"], 1, "{vm0}");
    // The first client leaves and a new one connects at once, as a rebooting VMM does: it is
    // served, not taken for a second client (the old connection has hung up, whether or not
    // the daemon has finished tearing it down when the new one arrives).
    drop(first);
    let mut again = vfio_user::Client::new(&sock).unwrap();
    again.region_read(7, 0, &mut id).unwrap();
    assert_eq!(u32::from_le_bytes(id), 0x06d8_10de);
    let v = wait_stat(&s, "vm0", "serves its second client", |v| {
        v["connections"] == 2
    });
    assert_eq!(
        v["rejected"], 1,
        "only the one second client was refused: {v}"
    );
}

/// `ctl cap` under the default policy (band) and `ctl policy` at run time: the cap is kept and
/// shown (stat, metrics) under every policy, the policy in force too, a bad policy is refused.
#[test]
fn cap_under_the_default_policy_and_a_policy_change_at_run_time() {
    let s = Serve::start("policy", &["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&s);
    assert_eq!(s.stat()["policy"], "band");
    let r = s.ctl_json(&["cap", "vm0", "30"]);
    assert_eq!(r["vm"]["cap_pct"], 30.0, "{r}");
    let v = wait_stat(&s, "vm0", "shows its cap", |v| v["cap"].as_f64().is_some());
    assert!((v["cap"].as_f64().unwrap() - 0.3).abs() < 1e-9, "{v}");
    let out = s.ctl(&["cap", "vm0", "30"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "vm0: capped at 30 % of GPU time\n"
    );
    for p in ["credit", "fifo", "fixed-share", "band"] {
        let r = s.ctl_json(&["policy", p]);
        assert_eq!(r["policy"], p, "{r}");
        let st = s.stat();
        assert_eq!(st["policy"], p, "{st}");
        let m = parse_metrics(&scrape(&addr, "/metrics").1);
        assert_eq!(
            value(&m, "gpuvm_vm_cap_ratio", Some("vm0")),
            0.3,
            "under {p}"
        );
        assert!(scrape(&addr, "/metrics")
            .1
            .contains(&format!("gpuvm_scheduler_info{{policy=\"{p}\"}} 1")));
    }
    s.wait_line("policy change logged", |l| {
        l.contains("gpuvm serve: scheduling policy changed from fixed-share to band")
    });
    let out = s.ctl(&["policy", "round-robin"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown scheduler"),
        "{out:?}"
    );
    let r = s.ctl_json(&["cap", "vm0", "none"]);
    assert!(r["vm"]["cap_pct"].is_null(), "{r}");
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

/// More VMs than fixed 32 GiB DMA windows fit in the 2^40-byte IOVA space (31): by default each
/// VM's window is sized from the RAM its client maps, so 64 VMs are served and a client's
/// guest driver runs GPU work (madd copies its inputs from guest RAM and its result back)
/// through a window grown at its DMA_MAP; a second session of the same VM does too. A fixed
/// `--dma-window-mib` still stops at 31 with the reason named; bad sizes are refused.
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
            "--dma-window-mib",
            "32768",
        ])
        .arg("--socket-dir")
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success(), "40 fixed 32 GiB windows cannot fit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no DMA window left"), "{err}");
    for flag in ["--dma-window-mib", "--dma-window-max-mib"] {
        let bad = gpuvm()
            .args(["serve", "--vms", "1", flag, "3000", "--socket-dir"])
            .arg(&dir)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!bad.status.success(), "{flag} 3000");
        assert!(
            String::from_utf8_lossy(&bad.stderr).contains("power of two"),
            "{flag}: {bad:?}"
        );
    }
    let s = Serve::start(
        "window",
        &["--vms", "64", "--vram-mib", "64", "--channels", "1"],
    );
    s.wait_line("the window mode", |l| {
        l.contains("ready: 64 VMs") && l.contains("DMA windows sized from each VM's RAM")
    });
    let list = s.ctl_json(&["list"]);
    assert_eq!(names(&list).len(), 64);
    // Each session ends with its vGPU torn down and a fresh one made (the next client's).
    for (vm, generation) in [("vm0", 2), ("vm63", 2), ("vm0", 3)] {
        let sock = s.dir.join(format!("{vm}.sock"));
        assert_eq!(support::vfio_guest::session(&sock, 1), 1, "{vm}");
        let fresh = format!("fresh vGPU generation {generation} ");
        s.wait_line("the session's end", |l| {
            l.contains(&format!("[{vm}] ")) && l.contains(&fresh)
        });
    }
    // The guest RAM of the test client is 32 MiB at GPA 0: each session's vGPU grew from the
    // smallest window to 32 MiB before the driver touched the GPU.
    let grown = |vm: &str| {
        let g = s.lines.0.lock().unwrap();
        g.iter()
            .filter(|l| {
                l.contains(&format!(
                    "[{vm}] DMA window grown from 0x100000 to 0x2000000 bytes"
                ))
            })
            .count()
    };
    assert_eq!((grown("vm0"), grown("vm63"), grown("vm1")), (2, 1, 0));
    let stat = s.stat();
    let refused: Vec<_> = stat["vms"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["rejected"].as_u64() != Some(0))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
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
