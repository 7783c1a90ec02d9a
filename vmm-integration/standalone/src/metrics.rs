//! Prometheus metrics of `gpuvm serve` (`--metrics ADDR`, loopback by default): the text
//! exposition format over HTTP at `/metrics`, encoded by the `prometheus-client` crate from a
//! fresh [`crate::control::Stat`] at every scrape (so values are exactly what `gpuvm stat`
//! shows). Names follow Prometheus' conventions: `gpuvm_` prefix, base units (seconds, bytes),
//! `_total` on counters, one `vm` label per VM.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::control::{Control, Stat};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VmLabel {
    vm: String,
}

type FCounter = Counter<f64, AtomicU64>;
type FGauge = Gauge<f64, AtomicU64>;

/// Encodes `stat` in the text exposition format.
pub fn encode_stat(stat: &Stat) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::default();
    let counter =
        |reg: &mut Registry, name: &str, help: &str, f: &dyn Fn(&crate::control::VmStat) -> u64| {
            let fam = Family::<VmLabel, Counter>::default();
            reg.register(name, help, fam.clone());
            for v in &stat.vms {
                fam.get_or_create(&VmLabel { vm: v.name.clone() })
                    .inc_by(f(v));
            }
        };
    let gauge =
        |reg: &mut Registry, name: &str, help: &str, f: &dyn Fn(&crate::control::VmStat) -> f64| {
            let fam = Family::<VmLabel, FGauge>::default();
            reg.register(name, help, fam.clone());
            for v in &stat.vms {
                fam.get_or_create(&VmLabel { vm: v.name.clone() }).set(f(v));
            }
        };
    {
        let fam = Family::<VmLabel, FCounter>::default();
        reg.register(
            "gpuvm_vm_gpu_busy_seconds",
            "GPU time of the VM's current vGPU",
            fam.clone(),
        );
        for v in &stat.vms {
            fam.get_or_create(&VmLabel { vm: v.name.clone() })
                .inc_by(v.gpu_busy_seconds);
        }
    }
    counter(
        &mut reg,
        "gpuvm_vm_doorbells",
        "Doorbells (GP_PUT writes) of the vGPU",
        &|v| v.doorbells,
    );
    counter(
        &mut reg,
        "gpuvm_vm_submissions",
        "Submissions handed to the scheduler",
        &|v| v.submissions,
    );
    counter(
        &mut reg,
        "gpuvm_vm_completions",
        "Submissions completed",
        &|v| v.completions,
    );
    counter(&mut reg, "gpuvm_vm_exits", "Trapped BAR accesses", &|v| {
        v.exits
    });
    counter(
        &mut reg,
        "gpuvm_vm_faults",
        "MMU and BAR faults delivered to the guest",
        &|v| v.faults,
    );
    counter(
        &mut reg,
        "gpuvm_vm_violations",
        "Isolation violations refused",
        &|v| v.violations,
    );
    counter(
        &mut reg,
        "gpuvm_vm_watchdog_kills",
        "Channels killed by the hang watchdog",
        &|v| v.watchdog_kills,
    );
    counter(
        &mut reg,
        "gpuvm_vm_connections",
        "vfio-user clients accepted",
        &|v| v.connections,
    );
    counter(
        &mut reg,
        "gpuvm_vm_teardowns",
        "vGPUs destroyed and scrubbed",
        &|v| v.teardowns,
    );
    counter(
        &mut reg,
        "gpuvm_vm_rejected_requests",
        "vfio-user requests refused",
        &|v| v.rejected,
    );
    gauge(
        &mut reg,
        "gpuvm_vm_share_window_ratio",
        "Share of the GPU's busy time over the last window",
        &|v| v.share_window,
    );
    gauge(
        &mut reg,
        "gpuvm_vm_share_ratio",
        "Share of all VMs' GPU time since the vGPU was created",
        &|v| v.share_total,
    );
    gauge(
        &mut reg,
        "gpuvm_vm_target_share_ratio",
        "Weight over the sum of weights",
        &|v| v.target_share,
    );
    gauge(
        &mut reg,
        "gpuvm_vm_cap_ratio",
        "Cap in force (1 when uncapped)",
        &|v| v.cap.unwrap_or(1.0),
    );
    gauge(&mut reg, "gpuvm_vm_weight", "Scheduling weight", &|v| {
        f64::from(v.weight)
    });
    gauge(&mut reg, "gpuvm_vm_vram_bytes", "VRAM slice", &|v| {
        v.vram_bytes as f64
    });
    {
        // Only for VMs whose GPU can tell (the simulator); absent rather than a made-up 0.
        let fam = Family::<VmLabel, FGauge>::default();
        reg.register(
            "gpuvm_vm_vram_in_use_bytes",
            "VRAM of the slice written by the guest or its GPU work and not scrubbed since",
            fam.clone(),
        );
        for v in &stat.vms {
            if let Some(b) = v.vram_in_use_bytes {
                fam.get_or_create(&VmLabel { vm: v.name.clone() })
                    .set(b as f64);
            }
        }
    }
    gauge(&mut reg, "gpuvm_vm_channels", "Hardware channels", &|v| {
        f64::from(v.channels)
    });
    gauge(
        &mut reg,
        "gpuvm_vm_queued_submissions",
        "Submissions queued in the scheduler",
        &|v| v.queued as f64,
    );
    gauge(
        &mut reg,
        "gpuvm_vm_connected",
        "1 while a client is connected",
        &|v| f64::from(u8::from(v.connected)),
    );
    let g = |reg: &mut Registry, name: &str, help: &str, x: f64| {
        let m = FGauge::default();
        m.set(x);
        reg.register(name, help, m);
    };
    g(
        &mut reg,
        "gpuvm_gpu_utilization_ratio",
        "GPU busy time over elapsed time",
        stat.gpu_utilization,
    );
    g(
        &mut reg,
        "gpuvm_gpu_window_utilization_ratio",
        "GPU utilisation over the last window",
        stat.gpu_window_utilization,
    );
    g(
        &mut reg,
        "gpuvm_vram_free_bytes",
        "VRAM free for new VMs",
        stat.vram_free_bytes as f64,
    );
    g(
        &mut reg,
        "gpuvm_inflight_submissions",
        "Submissions on the GPU",
        stat.inflight as f64,
    );
    g(&mut reg, "gpuvm_vms", "VMs served", stat.vms.len() as f64);
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
                        &b"text/plain; version=0.0.4; charset=utf-8"[..],
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
