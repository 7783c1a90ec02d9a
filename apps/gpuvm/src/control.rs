//! The control socket of `gpuvm serve` (`DIR/control.sock`, mode 0600): JSON lines, one
//! request object per line, one reply object per line (`docs/serve.md` has the protocol).
//!
//! Every request is untrusted input: a line that is not valid JSON, names an unknown command,
//! has unknown or mistyped fields or is longer than [`MAX_LINE`] gets `{"ok":false,"error":..}`,
//! is counted (`control_errors`) and logged, and changes nothing.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuvm::profile::VgpuProfile;
use gpuvm_vfio_user::{Daemon, VmDevice, VmSpec};
use serde::{Deserialize, Serialize};

/// Longest request line accepted (bytes).
pub const MAX_LINE: usize = 64 * 1024;

/// A request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// The VMs and their profiles.
    List,
    /// Per-VM usage now (what `gpuvm stat --json` prints).
    Stat,
    /// Serve one more VM.
    Add {
        /// Its name (socket `NAME.sock`).
        name: String,
        /// Its vGPU profile.
        profile: VgpuProfile,
        /// Its cap, percent of GPU time (fixed-share scheduler only).
        #[serde(default)]
        cap_pct: Option<f64>,
    },
    /// Stop serving a VM: its vGPU destroyed and scrubbed, its socket removed.
    Remove {
        /// The VM.
        name: String,
    },
    /// Change a VM's weight (1-100).
    Weight {
        /// The VM.
        name: String,
        /// The new weight.
        weight: u32,
    },
    /// Change the scheduling policy of the shared GPU now (VMs keep their weights and caps).
    Policy {
        /// `fifo`, `credit`, `band`, `band-gdev`, `equal-share` or `fixed-share`.
        policy: String,
    },
    /// Set (percent) or clear (null) a VM's cap.
    Cap {
        /// The VM.
        name: String,
        /// The cap in percent of GPU time, or null for none.
        cap_pct: Option<f64>,
    },
    /// Drain in-flight work and stop the daemon (as SIGTERM).
    Stop,
    /// Move a VM's vGPU out: the connection becomes a migration session
    /// ([`crate::serve_migrate`]).
    #[serde(rename = "migrate_out")]
    MigrateOut {
        /// The VM.
        name: String,
    },
    /// Rebuild a VM's vGPU from the `bytes` of migration stream that follow the line
    /// ([`crate::serve_migrate`]).
    Restore {
        /// The VM.
        name: String,
        /// Length of the stream that follows.
        bytes: u64,
    },
}

/// One VM in `list`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmInfo {
    /// Its name.
    pub name: String,
    /// Its current vGPU's id on the host (changes with every teardown).
    pub vgpu: Option<String>,
    /// Its current vGPU's generation: 1 for its first, one more for each fresh vGPU.
    #[serde(default)]
    pub vgpu_generation: u64,
    /// Its profile.
    pub profile: VgpuProfile,
    /// Its cap (percent), if one was set.
    pub cap_pct: Option<f64>,
    /// A client is connected.
    pub connected: bool,
    /// Its vGPU is being migrated out (a `migrate_out` session is open).
    #[serde(default)]
    pub migrating: bool,
    /// Its socket.
    pub socket: String,
}

/// A VM's counters over its whole life: every vGPU it had, every client session (each
/// session's vGPU is fresh and its own counters start at 0).
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct VmLifetime {
    /// GPU time, seconds.
    pub gpu_busy_seconds: f64,
    /// Doorbells.
    pub doorbells: u64,
    /// Submissions handed to the scheduler.
    pub submissions: u64,
    /// Submissions completed.
    pub completions: u64,
    /// Trapped BAR accesses.
    pub exits: u64,
    /// MMU and BAR faults delivered.
    pub faults: u64,
    /// Isolation violations refused.
    pub violations: u64,
    /// Channels killed by the hang watchdog.
    pub watchdog_kills: u64,
    /// Bytes the clients moved through the device's regions (BARs, configuration space).
    pub bytes_moved: u64,
}

/// One VM in `stat`. The VM is named by `name` everywhere (stat, top, metrics, logs); the
/// unprefixed counters are its current client session's (its current vGPU's), `lifetime`
/// holds the totals that survive sessions.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct VmStat {
    /// Its name.
    pub name: String,
    /// Its current vGPU's generation: 1 for its first, one more for each fresh vGPU (a new
    /// client, a device reset, a restore).
    #[serde(default)]
    pub vgpu_generation: u64,
    /// Its current vGPU's id on the host (`vmN`; internal, changes with each generation).
    pub vgpu: String,
    /// A client is connected.
    pub connected: bool,
    /// Scheduler state: `running` (work on the GPU), `capped` (work held by its cap),
    /// `buffer` (work queued while BAND holds the GPU idle for another VM's time buffer),
    /// `waiting` (work queued), `idle`.
    pub state: String,
    /// Weight and target share (weight / sum of weights).
    pub weight: u32,
    /// Target share (0..1).
    pub target_share: f64,
    /// Cap in force (0..1), under a capping policy.
    pub cap: Option<f64>,
    /// GPU time of its current vGPU, seconds.
    pub gpu_busy_seconds: f64,
    /// Share of the GPU's busy time over the scheduler's last window (1 s).
    pub share_window: f64,
    /// Share of all VMs' GPU time since its vGPU was created.
    pub share_total: f64,
    /// VRAM slice, bytes.
    pub vram_bytes: u64,
    /// Bytes of the slice in use — written by the guest or its GPU work and not scrubbed
    /// since — if the physical GPU can tell (the simulator can; `None` otherwise).
    pub vram_in_use_bytes: Option<u64>,
    /// Hardware channels.
    pub channels: u32,
    /// Doorbells, submissions dispatched and completed by the vGPU.
    pub doorbells: u64,
    /// Submissions handed to the scheduler.
    pub submissions: u64,
    /// Submissions completed.
    pub completions: u64,
    /// Submissions queued in the scheduler.
    pub queued: usize,
    /// Trapped BAR accesses.
    pub exits: u64,
    /// MMU faults and BAR faults delivered to the guest.
    pub faults: u64,
    /// Isolation violations refused.
    pub violations: u64,
    /// Channels killed by the hang watchdog.
    pub watchdog_kills: u64,
    /// BAND's credit (ns) and run-list position.
    pub credit_ns: Option<i64>,
    /// Run-list position (0 = head).
    pub position: Option<usize>,
    /// Clients accepted, vGPU teardowns and refused requests since the VM was added.
    pub connections: u64,
    /// vGPU teardowns.
    pub teardowns: u64,
    /// Requests refused.
    pub rejected: u64,
    /// Bytes the current client moved through the device's regions.
    #[serde(default)]
    pub bytes_moved: u64,
    /// The VM's client now: `pid N (comm), uid U, gid G` from SO_PEERCRED, if known.
    #[serde(default)]
    pub client: Option<String>,
    /// Totals over the VM's life.
    #[serde(default)]
    pub lifetime: VmLifetime,
}

/// What `stat` returns.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Stat {
    /// Scheduling policy.
    pub policy: String,
    /// Seconds since the daemon started.
    pub uptime_seconds: f64,
    /// GPU busy time over elapsed time since the first VM.
    pub gpu_utilization: f64,
    /// The same over the last window.
    pub gpu_window_utilization: f64,
    /// GPU busy seconds (all VMs).
    pub gpu_busy_seconds: f64,
    /// Free VRAM assignable to VMs, bytes.
    pub vram_free_bytes: u64,
    /// Submissions in flight on the GPU.
    pub inflight: usize,
    /// Poller wake-ups, host polls and nudges (how busy the event loop is).
    pub poller_wakeups: u64,
    /// Host polls by the poller.
    pub poller_polls: u64,
    /// Wake-ups requested by accesses or control changes.
    pub poller_nudges: u64,
    /// Control requests served and refused.
    pub control_requests: u64,
    /// Control requests refused (malformed or invalid).
    pub control_errors: u64,
    /// Per VM.
    pub vms: Vec<VmStat>,
}

/// The daemon's control state.
pub struct Control {
    /// The daemon.
    pub daemon: Arc<Daemon>,
    /// When it started.
    pub started: Instant,
    /// Requests handled.
    pub requests: AtomicU64,
    /// Requests refused.
    pub errors: AtomicU64,
    /// Set when a `stop` request came.
    pub stop_requested: AtomicBool,
}

fn pct_to_ppm(p: Option<f64>) -> Result<Option<u32>, String> {
    match p {
        None => Ok(None),
        Some(p) if p.is_finite() && p > 0.0 && p <= 100.0 => Ok(Some((p * 10_000.0) as u32)),
        Some(p) => Err(format!("cap_pct {p} must be in (0, 100]")),
    }
}

fn vm_info(d: &Daemon, dev: &VmDevice) -> VmInfo {
    VmInfo {
        name: dev.name().to_string(),
        vgpu: dev.vgpu().map(|v| v.id().to_string()),
        vgpu_generation: dev.vgpu_generation(),
        profile: dev.profile(),
        cap_pct: dev.cap_ppm().map(|c| f64::from(c) / 10_000.0),
        connected: dev.has_client(),
        migrating: dev.migrating(),
        socket: d
            .socket_dir()
            .join(format!("{}.sock", dev.name()))
            .display()
            .to_string(),
    }
}

impl Control {
    /// Control state for `daemon`.
    pub fn new(daemon: Arc<Daemon>) -> Control {
        Control {
            daemon,
            started: Instant::now(),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            stop_requested: AtomicBool::new(false),
        }
    }

    /// Per-VM usage now.
    pub fn stat(&self) -> Stat {
        let host = self.daemon.host();
        let hs = host.stats();
        let sched = &hs.sched;
        let total_busy: u64 = sched.vms.iter().map(|v| v.busy_ns).sum();
        let waker = self.daemon.waker();
        let vms = self
            .daemon
            .devices()
            .iter()
            .filter_map(|dev| {
                let v = dev.vgpu()?;
                let (life, cur) = dev.totals();
                let (bytes_total, bytes_session) = dev.bytes_moved();
                let ss = sched.vms.iter().find(|s| s.vm == v.id());
                let (cap, throttled) = host.vm_cap(v.id());
                let running = ss.is_some_and(|s| s.dispatched > s.retired);
                let queued = ss.map_or(0, |s| s.queued);
                let state = if running {
                    "running"
                } else if throttled {
                    "capped"
                } else if ss.is_some_and(|s| s.held_by_buffer) {
                    "buffer"
                } else if queued > 0 {
                    "waiting"
                } else {
                    "idle"
                };
                let busy = ss.map_or(0, |s| s.busy_ns);
                Some(VmStat {
                    name: dev.name().to_string(),
                    vgpu_generation: dev.vgpu_generation(),
                    vgpu: v.id().to_string(),
                    connected: dev.has_client(),
                    state: state.into(),
                    weight: ss.map_or(v.profile().weight, |s| s.weight),
                    target_share: ss.map_or(0.0, |s| s.target_share),
                    cap: cap.map(|c| f64::from(c) / 1e6),
                    gpu_busy_seconds: busy as f64 / 1e9,
                    share_window: ss.map_or(0.0, |s| s.window_share),
                    share_total: if total_busy == 0 {
                        0.0
                    } else {
                        busy as f64 / total_busy as f64
                    },
                    vram_bytes: v.profile().vram_bytes(),
                    vram_in_use_bytes: v.vram_in_use_bytes(),
                    channels: v.profile().channels,
                    doorbells: cur.doorbells,
                    submissions: cur.submissions,
                    completions: cur.completions,
                    queued,
                    exits: cur.exits,
                    faults: cur.faults,
                    violations: cur.violations,
                    watchdog_kills: cur.watchdog_kills,
                    credit_ns: ss.and_then(|s| s.credit_ns),
                    position: ss.and_then(|s| s.position),
                    connections: dev.connections(),
                    teardowns: dev.teardowns(),
                    rejected: dev.rejected(),
                    bytes_moved: bytes_session,
                    client: if dev.has_client() {
                        dev.holder().and_then(|h| h.peer).map(|p| p.to_string())
                    } else {
                        None
                    },
                    lifetime: VmLifetime {
                        gpu_busy_seconds: life.gpu_busy_ns as f64 / 1e9,
                        doorbells: life.doorbells,
                        submissions: life.submissions,
                        completions: life.completions,
                        exits: life.exits,
                        faults: life.faults,
                        violations: life.violations,
                        watchdog_kills: life.watchdog_kills,
                        bytes_moved: bytes_total,
                    },
                })
            })
            .collect();
        Stat {
            policy: sched.policy.clone(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            gpu_utilization: sched.utilization,
            gpu_window_utilization: sched.window_utilization,
            gpu_busy_seconds: sched.busy_ns as f64 / 1e9,
            vram_free_bytes: hs.vram_free,
            inflight: hs.inflight,
            poller_wakeups: waker.wakeups(),
            poller_polls: waker.polls(),
            poller_nudges: waker.nudges(),
            control_requests: self.requests.load(Ordering::Relaxed),
            control_errors: self.errors.load(Ordering::Relaxed),
            vms,
        }
    }

    /// Handles one request line; returns the reply object.
    /// (What a connection does with a line that is not a streaming verb; the `serve_control`
    /// fuzz target, which includes this module, enters here.)
    #[allow(dead_code)]
    pub fn handle_line(&self, line: &str) -> serde_json::Value {
        self.respond(serde_json::from_str::<Request>(line))
    }

    /// Handles one parsed (or unparsable) request; returns the reply object.
    pub fn respond(&self, parsed: serde_json::Result<Request>) -> serde_json::Value {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let reply = match parsed {
            Ok(req) => self.handle(req),
            Err(e) => Err(format!("malformed request: {e}")),
        };
        match reply {
            Ok(v) => {
                let mut v = v;
                if let Some(o) = v.as_object_mut() {
                    o.insert("ok".into(), true.into());
                }
                v
            }
            Err(e) => self.refuse(e),
        }
    }

    /// Replaces the scheduling policy while VMs run (`GpuHost::set_policy`: every VM keeps its
    /// weight and cap, queued work moves to the new policy, which decides from its next time
    /// slice), wakes the event loop and logs the change.
    fn set_policy(&self, p: gpuvm::sched::Policy) -> Result<(), String> {
        let host = self.daemon.host();
        let before = host.sched_stats().policy;
        host.set_policy(p, &gpuvm::sched::SchedParams::default())
            .map_err(|e| e.to_string())?;
        self.daemon.waker().kick();
        gpuvm_vfio_user::say::say(format_args!(
            "scheduling policy changed from {before} to {}",
            p.name()
        ));
        Ok(())
    }

    /// The daemon.
    pub fn daemon(&self) -> &Arc<Daemon> {
        &self.daemon
    }

    /// Counts and logs (the first 16, then every power of two) a refused request; the reply.
    pub fn refuse(&self, e: String) -> serde_json::Value {
        let n = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= 16 || n.is_power_of_two() {
            gpuvm_vfio_user::say::say(format_args!("control request refused ({n} so far): {e}"));
        } else {
            log::info!("control request refused ({n} so far): {e}");
        }
        serde_json::json!({"ok": false, "error": e})
    }

    fn dev(&self, name: &str) -> Result<Arc<VmDevice>, String> {
        self.daemon
            .device(name)
            .ok_or_else(|| format!("no VM named '{name}'"))
    }

    fn handle(&self, req: Request) -> Result<serde_json::Value, String> {
        let d = &self.daemon;
        match req {
            Request::List => {
                let vms: Vec<VmInfo> = d.devices().iter().map(|v| vm_info(d, v)).collect();
                Ok(serde_json::json!({ "vms": vms }))
            }
            Request::Stat => {
                { serde_json::to_value(self.stat()).map(|s| serde_json::json!({ "stat": s })) }
                    .map_err(|e| e.to_string())
            }
            Request::Add {
                name,
                profile,
                cap_pct,
            } => {
                profile.validate().map_err(|e| e.to_string())?;
                let cap_ppm = pct_to_ppm(cap_pct)?;
                let dev = d
                    .add_vm(VmSpec {
                        name,
                        profile,
                        cap_ppm,
                    })
                    .map_err(|e| e.to_string())?;
                Ok(serde_json::json!({ "vm": vm_info(d, &dev) }))
            }
            Request::Remove { name } => {
                let dev = d.remove_vm(&name).map_err(|e| e.to_string())?;
                Ok(serde_json::json!({
                    "removed": name,
                    "scrubbed_bytes": dev.profile().vram_bytes(),
                    "connections": dev.connections(),
                }))
            }
            Request::Weight { name, weight } => {
                let dev = self.dev(&name)?;
                dev.set_weight(weight).map_err(|e| e.to_string())?;
                dev.event(&format!("weight set to {weight}"));
                Ok(serde_json::json!({ "vm": vm_info(d, &dev) }))
            }
            Request::Policy { policy } => {
                let p: gpuvm::sched::Policy = policy.parse()?;
                self.set_policy(p)?;
                Ok(serde_json::json!({ "policy": p.name() }))
            }
            Request::Cap { name, cap_pct } => {
                let dev = self.dev(&name)?;
                let ppm = pct_to_ppm(cap_pct)?;
                dev.set_cap(ppm).map_err(|e| e.to_string())?;
                dev.event(&match cap_pct {
                    Some(p) => format!("cap set to {p} %"),
                    None => "cap cleared".into(),
                });
                Ok(serde_json::json!({ "vm": vm_info(d, &dev) }))
            }
            Request::Stop => {
                self.stop_requested.store(true, Ordering::SeqCst);
                // The main thread waits for SIGTERM/SIGINT with sigwait: the same path as
                // `kill -TERM`.
                // SAFETY: kill(2) on our own pid with a signal every thread blocks.
                unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
                Ok(serde_json::json!({ "stopping": true }))
            }
            Request::MigrateOut { .. } | Request::Restore { .. } => Err(
                "migrate_out and restore stream bytes: send them as the first line of a control connection (docs/serve.md)".into(),
            ),
        }
    }
}

/// A client: sends one request, returns the reply (an error reply as `Err`).
pub fn request(dir: &Path, req: &Request) -> anyhow::Result<serde_json::Value> {
    let path = dir.join("control.sock");
    let mut s = UnixStream::connect(&path).map_err(|e| {
        anyhow::anyhow!(
            "cannot reach the daemon's control socket {}: {e} (is `gpuvm serve --socket-dir {}` running?)",
            path.display(),
            dir.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut r = BufReader::new(s);
    let mut reply = String::new();
    r.read_line(&mut reply)?;
    let v: serde_json::Value = serde_json::from_str(&reply)
        .map_err(|e| anyhow::anyhow!("bad reply from the daemon ({e}): {reply:?}"))?;
    if v.get("ok") != Some(&serde_json::Value::Bool(true)) {
        anyhow::bail!(
            "the daemon refused: {}",
            v.get("error").and_then(|e| e.as_str()).unwrap_or("?")
        );
    }
    Ok(v)
}
