//! Prometheus metrics of `gpuvm serve` (`--metrics ADDR`, loopback by default): the
//! OpenMetrics text format (`application/openmetrics-text; version=1.0.0`, what the
//! `prometheus-client` crate encodes and what Prometheus asks for first) over HTTP at
//! `/metrics`, from a fresh [`crate::control::Stat`] at every scrape (so values are exactly what
//! `gpuvm stat` shows). Every family has HELP and TYPE; units are in the names and in UNIT
//! lines (`_seconds`, `_bytes`); counter samples end in `_total`; one `vm` label per VM, the
//! VM's stable name. Counters are the VM's lifetime totals, which survive its client sessions
//! (each session gets a fresh vGPU whose own counters start at 0); the vGPU generation is a
//! gauge of its own.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use crate::control::{Control, Stat, VmStat};

/// The content type of what [`encode_stat`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VmLabel {
    vm: String,
}

type FCounter = Counter<f64, AtomicU64>;
type FGauge = Gauge<f64, AtomicU64>;

/// A per-VM counter: name, help, value.
type CounterSpec = (&'static str, &'static str, fn(&VmStat) -> u64);
/// A per-VM gauge: name, help, unit, value (absent where unknown).
type GaugeSpec = (
    &'static str,
    &'static str,
    Option<Unit>,
    fn(&VmStat) -> Option<f64>,
);

fn label(v: &VmStat) -> VmLabel {
    VmLabel { vm: v.name.clone() }
}

/// Encodes `stat` in the OpenMetrics text format.
pub fn encode_stat(stat: &Stat) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::default();
    let counter = |reg: &mut Registry,
                   name: &str,
                   help: &str,
                   unit: Option<Unit>,
                   f: &dyn Fn(&VmStat) -> u64| {
        let fam = Family::<VmLabel, Counter>::default();
        match unit {
            Some(u) => reg.register_with_unit(name, help, u, fam.clone()),
            None => reg.register(name, help, fam.clone()),
        }
        for v in &stat.vms {
            fam.get_or_create(&label(v)).inc_by(f(v));
        }
    };
    let gauge = |reg: &mut Registry,
                 name: &str,
                 help: &str,
                 unit: Option<Unit>,
                 f: &dyn Fn(&VmStat) -> Option<f64>| {
        let fam = Family::<VmLabel, FGauge>::default();
        match unit {
            Some(u) => reg.register_with_unit(name, help, u, fam.clone()),
            None => reg.register(name, help, fam.clone()),
        }
        for v in &stat.vms {
            // Absent, not a made-up 0, where the value is unknown.
            if let Some(x) = f(v) {
                fam.get_or_create(&label(v)).set(x);
            }
        }
    };
    {
        let fam = Family::<VmLabel, FCounter>::default();
        reg.register_with_unit(
            "gpuvm_vm_gpu_busy",
            "GPU time charged to the VM over its life (all its vGPUs and client sessions)",
            Unit::Seconds,
            fam.clone(),
        );
        for v in &stat.vms {
            fam.get_or_create(&label(v))
                .inc_by(v.lifetime.gpu_busy_seconds);
        }
    }
    let lifetime: [CounterSpec; 7] = [
        (
            "gpuvm_vm_doorbells",
            "Doorbells (GP_PUT writes) over the VM's life",
            |v| v.lifetime.doorbells,
        ),
        (
            "gpuvm_vm_submissions",
            "Submissions handed to the scheduler over the VM's life",
            |v| v.lifetime.submissions,
        ),
        (
            "gpuvm_vm_completions",
            "Submissions completed over the VM's life",
            |v| v.lifetime.completions,
        ),
        (
            "gpuvm_vm_exits",
            "Trapped BAR accesses over the VM's life",
            |v| v.lifetime.exits,
        ),
        (
            "gpuvm_vm_faults",
            "MMU and BAR faults delivered to the guest over the VM's life",
            |v| v.lifetime.faults,
        ),
        (
            "gpuvm_vm_violations",
            "Isolation violations refused over the VM's life",
            |v| v.lifetime.violations,
        ),
        (
            "gpuvm_vm_watchdog_kills",
            "Channels killed by the hang watchdog over the VM's life",
            |v| v.lifetime.watchdog_kills,
        ),
    ];
    for (name, help, f) in lifetime {
        counter(&mut reg, name, help, None, &f);
    }
    counter(
        &mut reg,
        "gpuvm_vm_moved",
        "Bytes the VM's clients moved through its BARs and configuration space",
        Some(Unit::Bytes),
        &|v| v.lifetime.bytes_moved,
    );
    counter(
        &mut reg,
        "gpuvm_vm_connections",
        "vfio-user clients accepted",
        None,
        &|v| v.connections,
    );
    counter(
        &mut reg,
        "gpuvm_vm_teardowns",
        "vGPUs destroyed and scrubbed",
        None,
        &|v| v.teardowns,
    );
    counter(
        &mut reg,
        "gpuvm_vm_rejected_requests",
        "vfio-user requests refused (and second clients turned away)",
        None,
        &|v| v.rejected,
    );
    let gauges: [GaugeSpec; 12] = [
        ("gpuvm_vm_vgpu_generation", "The current vGPU's generation: 1 for the VM's first, one more for each fresh vGPU", None, |v| Some(v.vgpu_generation as f64)),
        ("gpuvm_vm_share_window_ratio", "Share of the GPU's busy time over the last window", None, |v| Some(v.share_window)),
        ("gpuvm_vm_share_ratio", "Share of all VMs' GPU time since the current vGPU was created", None, |v| Some(v.share_total)),
        ("gpuvm_vm_target_share_ratio", "Weight over the sum of weights", None, |v| Some(v.target_share)),
        ("gpuvm_vm_cap_ratio", "Cap in force (1 when uncapped)", None, |v| Some(v.cap.unwrap_or(1.0))),
        ("gpuvm_vm_weight", "Scheduling weight", None, |v| Some(f64::from(v.weight))),
        ("gpuvm_vm_vram", "VRAM slice", Some(Unit::Bytes), |v| Some(v.vram_bytes as f64)),
        ("gpuvm_vm_vram_in_use", "VRAM of the slice written by the guest or its GPU work and not scrubbed since (only where the GPU can tell)", Some(Unit::Bytes), |v| v.vram_in_use_bytes.map(|b| b as f64)),
        ("gpuvm_vm_channels", "Hardware channels", None, |v| Some(f64::from(v.channels))),
        ("gpuvm_vm_queued_submissions", "Submissions queued in the scheduler", None, |v| Some(v.queued as f64)),
        ("gpuvm_vm_connected", "1 while a client is connected", None, |v| Some(f64::from(u8::from(v.connected)))),
        ("gpuvm_vm_session_gpu_busy", "GPU time of the current client session's vGPU", Some(Unit::Seconds), |v| Some(v.gpu_busy_seconds)),
    ];
    for (name, help, unit, f) in gauges {
        gauge(&mut reg, name, help, unit, &f);
    }
    reg.register(
        "gpuvm_scheduler",
        "The scheduling policy in force",
        Info::new(vec![("policy".to_string(), stat.policy.clone())]),
    );
    let g = |reg: &mut Registry, name: &str, help: &str, unit: Option<Unit>, x: f64| {
        let m = FGauge::default();
        m.set(x);
        match unit {
            Some(u) => reg.register_with_unit(name, help, u, m),
            None => reg.register(name, help, m),
        }
    };
    g(
        &mut reg,
        "gpuvm_gpu_utilization_ratio",
        "GPU busy time over elapsed time",
        None,
        stat.gpu_utilization,
    );
    g(
        &mut reg,
        "gpuvm_gpu_window_utilization_ratio",
        "GPU utilisation over the last window",
        None,
        stat.gpu_window_utilization,
    );
    g(
        &mut reg,
        "gpuvm_vram_free",
        "VRAM free for new VMs",
        Some(Unit::Bytes),
        stat.vram_free_bytes as f64,
    );
    g(
        &mut reg,
        "gpuvm_inflight_submissions",
        "Submissions on the GPU",
        None,
        stat.inflight as f64,
    );
    g(
        &mut reg,
        "gpuvm_vms",
        "VMs served",
        None,
        stat.vms.len() as f64,
    );
    g(
        &mut reg,
        "gpuvm_uptime",
        "Time since the daemon started",
        Some(Unit::Seconds),
        stat.uptime_seconds,
    );
    let c = |reg: &mut Registry, name: &str, help: &str, x: u64| {
        let m = Counter::<u64>::default();
        m.inc_by(x);
        reg.register(name, help, m);
    };
    c(
        &mut reg,
        "gpuvm_poller_wakeups",
        "Wake-ups of the daemon's event loop",
        stat.poller_wakeups,
    );
    c(
        &mut reg,
        "gpuvm_poller_polls",
        "Host polls by the event loop",
        stat.poller_polls,
    );
    c(
        &mut reg,
        "gpuvm_control_requests",
        "Control requests",
        stat.control_requests,
    );
    c(
        &mut reg,
        "gpuvm_control_errors",
        "Control requests refused",
        stat.control_errors,
    );
    let mut out = String::new();
    encode(&mut out, &reg)?;
    Ok(out)
}

/// Serves `/metrics` on `addr` in a thread; returns the address bound (port 0 picks one).
pub fn serve(ctl: Arc<Control>, addr: &str) -> anyhow::Result<std::net::SocketAddr> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| anyhow::anyhow!("--metrics {addr}: cannot listen: {e}"))?;
    let bound = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow::anyhow!("--metrics {addr}: not an IP address"))?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let resp = if req.url() == "/metrics" {
                    let ctype = tiny_http::Header::from_bytes(
                        &b"Content-Type"[..],
                        CONTENT_TYPE.as_bytes(),
                    );
                    match (encode_stat(&ctl.stat()), ctype) {
                        (Ok(body), Ok(h)) => tiny_http::Response::from_string(body).with_header(h),
                        _ => tiny_http::Response::from_string("encoding failed\n")
                            .with_status_code(500),
                    }
                } else {
                    tiny_http::Response::from_string("not found: try /metrics\n")
                        .with_status_code(404)
                };
                let _ = req.respond(resp);
            }
        })?;
    Ok(bound)
}
