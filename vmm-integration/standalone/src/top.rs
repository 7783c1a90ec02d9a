//! The operator's commands over the control socket of `gpuvm serve`: `gpuvm ctl` (list, add,
//! remove, weight, cap, stop), `gpuvm stat` (per-VM usage once, `--json`) and `gpuvm top`
//! (the same, live).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::control::{request, Request, Stat};

/// Options of `gpuvm ctl`.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The daemon's socket directory (its control socket is DIR/control.sock).
    #[arg(long, value_name = "DIR")]
    socket_dir: PathBuf,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// List the VMs, their profiles and whether a client is connected (JSON).
    List,
    /// Serve one more VM NAME with the vGPU profile in the TOML file PROFILE (fields name,
    /// vram_mib, channels, weight, shadow, and cap_pct for fixed-share).
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
    /// Cap VM NAME at PCT percent of GPU time (fixed-share scheduler), or `none`.
    Cap {
        /// The VM.
        name: String,
        /// Percent (0-100], or `none`.
        pct: String,
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
        Verb::Stop => Request::Stop,
    };
    let reply = request(&args.socket_dir, &req)?;
    println!("{}", serde_json::to_string_pretty(&reply)?);
    Ok(true)
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
         event loop: {} wake-ups, {} polls; control: {} requests, {} refused\n\n",
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
        "vgpu",
        "client",
        "state",
        "weight",
        "cap",
        "share 1s",
        "share",
        "GPU time",
        "VRAM used",
        "chans",
        "subs",
        "exits",
        "faults",
        "violations",
    ];
    let mut t = crate::table::Table::new(head);
    for v in &s.vms {
        t.row([
            v.name.clone(),
            v.vgpu.clone(),
            if v.connected { "yes" } else { "no" }.into(),
            v.state.clone(),
            v.weight.to_string(),
            v.cap.map_or("-".into(), pct),
            pct(v.share_window),
            pct(v.share_total),
            format!("{:.3} s", v.gpu_busy_seconds),
            match v.vram_in_use_bytes {
                Some(b) => format!(
                    "{:.1}/{} MiB",
                    b as f64 / f64::from(1 << 20),
                    v.vram_bytes >> 20
                ),
                None => format!("-/{} MiB", v.vram_bytes >> 20),
            },
            v.channels.to_string(),
            v.submissions.to_string(),
            v.exits.to_string(),
            v.faults.to_string(),
            v.violations.to_string(),
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
