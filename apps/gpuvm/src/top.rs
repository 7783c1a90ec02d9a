//! The operator's commands over the control socket of `gpuvm serve`: `gpuvm ctl` (list, add,
//! remove, weight, cap, policy, stop; a table or a sentence, `--json` for the daemon's reply),
//! `gpuvm stat` (per-VM usage once, `--json`) and `gpuvm top` (the same, live).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::control::{request, Request, Stat, VmInfo};

/// Options of `gpuvm ctl`.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The daemon's socket directory (its control socket is DIR/control.sock).
    #[arg(long, value_name = "DIR")]
    socket_dir: PathBuf,
    /// Print the daemon's reply as JSON (for scripts) instead of a table or a sentence.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// List the VMs, their profiles and whether a client is connected.
    List,
    /// Serve one more VM NAME with the vGPU profile in the TOML file PROFILE (fields name,
    /// vram_mib, channels, weight, shadow, and cap_pct: its cap in percent of GPU time).
    Add {
        /// The VM's name (socket DIR/NAME.sock).
        name: String,
        /// The TOML profile.
        profile: PathBuf,
    },
    /// Stop serving VM NAME: its vGPU destroyed and its VRAM scrubbed, its socket removed.
    Remove {
        /// The VM.
        name: String,
    },
    /// Change VM NAME's scheduling weight (1-100) now.
    Weight {
        /// The VM.
        name: String,
        /// The new weight.
        weight: u32,
    },
    /// Cap VM NAME at PCT percent of GPU time, or `none`: a ceiling the policy honours (a
    /// policy without caps refuses it), kept across reconnects and policy changes.
    Cap {
        /// The VM.
        name: String,
        /// Percent (0-100], or `none`.
        pct: String,
    },
    /// Change the scheduling policy of the shared GPU now: fifo, credit, band, band-gdev,
    /// equal-share or fixed-share (VMs keep their weights and caps).
    Policy {
        /// The policy.
        policy: String,
    },
    /// Drain in-flight work and stop the daemon (as SIGTERM).
    Stop,
}

/// Runs `gpuvm ctl`.
pub fn ctl(args: &CtlArgs) -> anyhow::Result<bool> {
    let req = match &args.verb {
        Verb::List => Request::List,
        Verb::Add { name, profile } => {
            let text = std::fs::read_to_string(profile)
                .with_context(|| format!("reading {}", profile.display()))?;
            let (profile, cap) = crate::serve::profile_from_toml(&text)
                .with_context(|| format!("{}", profile.display()))?;
            Request::Add {
                name: name.clone(),
                profile,
                cap_pct: cap.map(|c| f64::from(c) / 10_000.0),
            }
        }
        Verb::Remove { name } => Request::Remove { name: name.clone() },
        Verb::Weight { name, weight } => Request::Weight {
            name: name.clone(),
            weight: *weight,
        },
        Verb::Cap { name, pct } => Request::Cap {
            name: name.clone(),
            cap_pct: if pct == "none" {
                None
            } else {
                Some(
                    pct.parse::<f64>()
                        .map_err(|_| anyhow::anyhow!("cap '{pct}': a percentage or 'none'"))?,
                )
            },
        },
        Verb::Policy { policy } => {
            // Checked here too, so a typo is told without a round trip.
            policy
                .parse::<gpuvm::sched::Policy>()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Request::Policy {
                policy: policy.clone(),
            }
        }
        Verb::Stop => Request::Stop,
    };
    let reply = request(&args.socket_dir, &req)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    } else {
        print!("{}", describe(&args.verb, &reply)?);
    }
    Ok(true)
}

fn cap_cell(cap_pct: Option<f64>) -> String {
    cap_pct.map_or("-".into(), |c| format!("{c} %"))
}

/// The VMs of a `list` reply as a table.
fn list_table(vms: &[VmInfo]) -> String {
    let mut t = crate::table::Table::new([
        "vm", "gen", "client", "profile", "VRAM", "chans", "weight", "cap", "shadow", "socket",
    ]);
    for v in vms {
        t.row([
            v.name.clone(),
            v.vgpu_generation.to_string(),
            if v.migrating {
                "migrating".into()
            } else if v.connected {
                "yes".into()
            } else {
                "no".into()
            },
            v.profile.name.clone(),
            format!("{} MiB", v.profile.vram_mib),
            v.profile.channels.to_string(),
            v.profile.weight.to_string(),
            cap_cell(v.cap_pct),
            v.profile.shadow.to_string(),
            v.socket.clone(),
        ]);
    }
    t.render()
}

/// What a successful reply means, for a person.
fn describe(verb: &Verb, reply: &serde_json::Value) -> anyhow::Result<String> {
    let vm = || -> anyhow::Result<VmInfo> {
        Ok(serde_json::from_value(
            reply
                .get("vm")
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("reply without vm: {reply}"))?,
        )?)
    };
    Ok(match verb {
        Verb::List => {
            let vms: Vec<VmInfo> = serde_json::from_value(
                reply
                    .get("vms")
                    .cloned()
                    .ok_or_else(|| anyhow::anyhow!("reply without vms: {reply}"))?,
            )?;
            let n = vms.len();
            format!(
                "{}{n} VM{}\n",
                list_table(&vms),
                if n == 1 { "" } else { "s" }
            )
        }
        Verb::Add { .. } => {
            let v = vm()?;
            format!(
                "added {}: profile '{}' ({} MiB VRAM, {} channels, weight {}, cap {}), socket {}\n",
                v.name,
                v.profile.name,
                v.profile.vram_mib,
                v.profile.channels,
                v.profile.weight,
                cap_cell(v.cap_pct),
                v.socket
            )
        }
        Verb::Remove { name } => format!(
            "removed {name}: vGPU destroyed, {} MiB of VRAM scrubbed, socket removed ({} client connections served)\n",
            reply["scrubbed_bytes"].as_u64().unwrap_or(0) >> 20,
            reply["connections"].as_u64().unwrap_or(0)
        ),
        Verb::Weight { .. } => {
            let v = vm()?;
            format!("{}: weight {}\n", v.name, v.profile.weight)
        }
        Verb::Cap { .. } => {
            let v = vm()?;
            match v.cap_pct {
                Some(c) => format!("{}: capped at {c} % of GPU time\n", v.name),
                None => format!("{}: cap cleared\n", v.name),
            }
        }
        Verb::Policy { .. } => format!(
            "scheduling policy: {}\n",
            reply["policy"].as_str().unwrap_or("?")
        ),
        Verb::Stop => "the daemon is draining its in-flight work and will exit\n".to_string(),
    })
}

/// Options of `gpuvm stat`.
#[derive(Args, Debug)]
pub struct StatArgs {
    /// The daemon's socket directory.
    #[arg(long, value_name = "DIR")]
    socket_dir: PathBuf,
    /// Print JSON (the control socket's `stat` object).
    #[arg(long)]
    json: bool,
}

/// Options of `gpuvm top`.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// The daemon's socket directory.
    #[arg(long, value_name = "DIR")]
    socket_dir: PathBuf,
    /// Refresh interval, milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    interval_ms: u64,
    /// Stop after this many refreshes (default: until interrupted).
    #[arg(long)]
    count: Option<u64>,
}

fn fetch(dir: &std::path::Path) -> anyhow::Result<Stat> {
    let v = request(dir, &Request::Stat)?;
    let s = v
        .get("stat")
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("reply without stat"))?;
    Ok(serde_json::from_value(s)?)
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// The table `stat` and `top` print.
pub fn render(s: &Stat) -> String {
    let mut out = format!(
        "gpuvm serve: {} scheduler, up {:.0} s, GPU {} busy (last window {}), {} in flight, {:.1} GiB VRAM free\n\
         event loop: {} wake-ups, {} polls; control: {} requests, {} refused\n\
         GPU time, subs, exits, faults and violations are over each VM's life; `session` columns are its current client's\n\n",
        s.policy,
        s.uptime_seconds,
        pct(s.gpu_utilization),
        pct(s.gpu_window_utilization),
        s.inflight,
        s.vram_free_bytes as f64 / (1u64 << 30) as f64,
        s.poller_wakeups,
        s.poller_polls,
        s.control_requests,
        s.control_errors
    );
    let head = [
        "vm",
        "gen",
        "client",
        "state",
        "weight",
        "cap",
        "share 1s",
        "GPU time",
        "subs",
        "exits",
        "faults",
        "violations",
        "session GPU",
        "session subs",
        "VRAM used",
        "chans",
    ];
    let mut t = crate::table::Table::new(head);
    for v in &s.vms {
        t.row([
            v.name.clone(),
            v.vgpu_generation.to_string(),
            if v.connected { "yes" } else { "no" }.into(),
            v.state.clone(),
            v.weight.to_string(),
            v.cap.map_or("-".into(), pct),
            pct(v.share_window),
            crate::table::ns((v.lifetime.gpu_busy_seconds * 1e9) as u64),
            v.lifetime.submissions.to_string(),
            v.lifetime.exits.to_string(),
            v.lifetime.faults.to_string(),
            v.lifetime.violations.to_string(),
            crate::table::ns((v.gpu_busy_seconds * 1e9) as u64),
            v.submissions.to_string(),
            match v.vram_in_use_bytes {
                Some(b) => format!(
                    "{:.1}/{} MiB",
                    b as f64 / f64::from(1 << 20),
                    v.vram_bytes >> 20
                ),
                None => format!("-/{} MiB", v.vram_bytes >> 20),
            },
            v.channels.to_string(),
        ]);
    }
    out.push_str(&t.render());
    out
}

/// Runs `gpuvm stat`.
pub fn stat(args: &StatArgs) -> anyhow::Result<bool> {
    let s = fetch(&args.socket_dir)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", render(&s));
    }
    Ok(true)
}

/// Runs `gpuvm top`: the table, redrawn every interval (ANSI clear on a terminal).
pub fn top(args: &TopArgs) -> anyhow::Result<bool> {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let mut n = 0;
    loop {
        let s = fetch(&args.socket_dir)?;
        let mut out = std::io::stdout().lock();
        if tty {
            write!(out, "\x1b[H\x1b[2J")?;
        }
        write!(out, "{}", render(&s))?;
        if !tty {
            writeln!(out)?;
        }
        out.flush()?;
        drop(out);
        n += 1;
        if args.count.is_some_and(|c| n >= c) {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(args.interval_ms));
    }
}
