//! `serve_control`: the control protocol of `gpuvm serve` (`DIR/control.sock`, JSON lines,
//! docs/serve.md). The input is split into lines, and each goes through the same steps as a
//! line read from the socket: longer than `MAX_LINE` or not UTF-8 is refused before parsing
//! (as `read_line` does); the rest is handed to the daemon's real `Control::handle_line`
//! (the module is `apps/gpuvm/src/control.rs`, included by path), against an
//! in-process vfio-user daemon serving one VM, `base`, on a small simulated GF100.
//!
//! Invariants: no panic; every reply is an object with a boolean `ok`, a refusal carries a
//! string `error`; every line counts one request and every refusal one error; after the
//! input every VM the daemon lists has a live vGPU on the host. Between inputs every VM but
//! `base` is removed and `base`'s weight and cap restored; the host's VRAM, channels and DMA
//! windows must then be back to where they started. A `stop` request is skipped (it signals
//! the process, as SIGTERM does).

use std::path::PathBuf;
use std::sync::Arc;

use gpuvm::clock::{Clock, SimClock};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::sched::{Policy, SchedParams};
use gpuvm_sim::{CostModel, SimConfig, SimGpu};
use gpuvm_vfio_user::{Daemon, DaemonConfig, VmSpec};

#[allow(dead_code)]
#[path = "../../apps/gpuvm/src/control.rs"]
pub(crate) mod control;

/// Lines per input at most.
pub const MAX_LINES: usize = 64;

/// The daemon and its control state, built once per process.
pub struct Rig {
    daemon: Arc<Daemon>,
    ctl: control::Control,
    dir: PathBuf,
    baseline: (usize, u64, u32, u64),
}

fn host_state(host: &GpuHost) -> (usize, u64, u32, u64) {
    let s = host.stats();
    (s.vms, s.vram_free, s.channels_free, s.iova_free)
}

impl Rig {
    /// A 2 GiB simulated GPU (lazily allocated), a host, a daemon serving `base` from a
    /// directory of its own.
    pub fn new() -> Rig {
        let clock = Arc::new(SimClock::new());
        let gpu = Arc::new(SimGpu::new(SimConfig {
            vram_size: 2 << 30,
            clock: clock.clone(),
            cost: CostModel::instant(),
            ..SimConfig::default()
        }));
        let host = Arc::new(
            GpuHost::new(
                gpu,
                HostConfig {
                    hypervisor_vram: 64 << 20,
                    ..HostConfig::default()
                },
            )
            .expect("GpuHost::new"),
        );
        // The policy `gpuvm serve` starts with by default (BAND: weights apply, caps do not).
        host.set_scheduler(Policy::Band.create(&SchedParams::default()))
            .expect("set_scheduler");
        let dir = std::env::temp_dir().join(format!("gpuvm-fuzz-ctl-{}", std::process::id()));
        let clock: Arc<dyn Clock> = clock;
        let daemon = Arc::new(
            Daemon::start(
                host.clone(),
                clock,
                DaemonConfig {
                    socket_dir: dir.clone(),
                    vms: vec![VmSpec {
                        name: "base".into(),
                        profile: VgpuProfile {
                            name: "base".into(),
                            vram_mib: 64,
                            channels: 4,
                            weight: 1,
                            shadow: ShadowMode::Lazy,
                        },
                        cap_ppm: None,
                    }],
                    require_sealed_dma: true,
                },
            )
            .expect("Daemon::start"),
        );
        let baseline = host_state(&host);
        Rig {
            ctl: control::Control::new(daemon.clone()),
            daemon,
            dir,
            baseline,
        }
    }

    /// Runs one input's lines, checks, and resets the daemon to `base` alone.
    pub fn execute(&self, data: &[u8]) -> usize {
        let mut handled = 0;
        for raw in data.split(|&b| b == b'\n').take(MAX_LINES) {
            let before = self.ctl.stat();
            let line = if raw.len() > control::MAX_LINE {
                None
            } else {
                std::str::from_utf8(raw).ok()
            };
            let Some(line) = line else {
                continue;
            };
            let line = line.trim_end();
            if line.trim().is_empty() {
                continue;
            }
            if matches!(
                serde_json::from_str::<control::Request>(line),
                Ok(control::Request::Stop)
            ) {
                continue;
            }
            let reply = self.ctl.handle_line(line);
            handled += 1;
            let ok = reply
                .get("ok")
                .and_then(|v| v.as_bool())
                .unwrap_or_else(|| panic!("reply without a boolean ok: {reply}"));
            if !ok {
                assert!(
                    reply.get("error").is_some_and(|e| e.is_string()),
                    "a refusal without an error string: {reply}"
                );
            }
            let after = self.ctl.stat();
            // `stat` itself is not a request; the line is one.
            assert_eq!(after.control_requests, before.control_requests + 1);
            assert_eq!(
                after.control_errors,
                before.control_errors + u64::from(!ok),
                "refusals are counted: {reply}"
            );
        }
        let host = self.daemon.host();
        let devices = self.daemon.devices();
        assert_eq!(
            devices.iter().filter(|d| d.vgpu().is_some()).count(),
            devices.len(),
            "a listed VM without a vGPU"
        );
        assert_eq!(
            host.stats().vms,
            devices.len(),
            "vGPUs the daemon does not list"
        );
        for d in devices {
            if d.name() != "base" {
                self.daemon.remove_vm(d.name()).expect("remove_vm");
            } else {
                d.set_weight(1).expect("set_weight");
                if d.cap_ppm().is_some() {
                    d.set_cap(None).expect("set_cap");
                }
            }
        }
        assert_eq!(
            host_state(host),
            self.baseline,
            "removing the VMs did not give everything back"
        );
        handled
    }
}

impl Default for Rig {
    fn default() -> Self {
        Rig::new()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.daemon.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

thread_local! {
    static RIG: Rig = Rig::new();
}

/// The fuzz entry point.
pub fn run(data: &[u8]) -> usize {
    RIG.with(|rig| rig.execute(data))
}

/// Seeds: every verb of docs/serve.md, well-formed, plus a few near misses.
pub fn seeds() -> Vec<Vec<u8>> {
    [
        "{\"cmd\":\"list\"}",
        "{\"cmd\":\"stat\"}",
        "{\"cmd\":\"add\",\"name\":\"c\",\"profile\":{\"name\":\"c\",\"vram_mib\":64,\"channels\":2,\"weight\":2,\"shadow\":\"incremental\"}}\n{\"cmd\":\"list\"}\n{\"cmd\":\"remove\",\"name\":\"c\"}",
        "{\"cmd\":\"weight\",\"name\":\"base\",\"weight\":3}",
        "{\"cmd\":\"cap\",\"name\":\"base\",\"cap_pct\":25}\n{\"cmd\":\"cap\",\"name\":\"base\",\"cap_pct\":null}",
        "{\"cmd\":\"add\",\"name\":\"d\",\"profile\":{\"vram_mib\":64},\"cap_pct\":10.5}\n{\"cmd\":\"stat\"}",
        "{\"cmd\":\"weight\",\"name\":\"base\",\"weight\":0}",
        "{\"cmd\":\"remove\",\"name\":\"nobody\"}",
        "{\"cmd\":\"add\",\"name\":\"control\",\"profile\":{}}",
        "not json\n{}\n{\"cmd\":\"list\",\"extra\":1}",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}
