//! Executions per second of a fuzz target's body without libFuzzer, on the same inputs each
//! time, so that a change can be measured before and after:
//!
//! ```sh
//! cargo +stable run --release --bin exec_rate -- vgpu_mmio [--fresh] [--secs 20] [FILE|DIR]...
//! cargo +stable run --release --bin exec_rate -- serve_control --write-seeds corpus/serve_control
//! cargo +stable run --release --bin exec_rate -- snapshot_stream --write-seeds corpus/snapshot_stream
//! ```
//!
//! Without files the inputs are 512 pseudo-random byte strings of 1 to 4,096 bytes (seed 1).
//! `--fresh` runs `vgpu_mmio` as every execution ran before the rig was reused (a new host,
//! GPU and victim per input).

use std::path::PathBuf;
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let target = args.next().unwrap_or_default();
    let (mut fresh, mut secs, mut files, mut seeds_to) = (false, 10.0f64, Vec::new(), None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--fresh" => fresh = true,
            "--secs" => secs = args.next().and_then(|s| s.parse().ok()).unwrap_or(secs),
            "--write-seeds" => seeds_to = args.next().map(PathBuf::from),
            _ => files.push(PathBuf::from(a)),
        }
    }
    if let Some(dir) = seeds_to {
        std::fs::create_dir_all(&dir).expect("creating the seed directory");
        if target == "snapshot_stream" {
            gpuvm_fuzz::snapshot_stream::write_seeds(&dir);
            return;
        }
        for (i, s) in gpuvm_fuzz::serve_control::seeds().iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s).expect("writing a seed");
        }
        return;
    }
    let run: fn(&[u8]) = match (target.as_str(), fresh) {
        ("vgpu_mmio", false) => |d| {
            gpuvm_fuzz::vgpu_mmio::run(d);
        },
        ("vgpu_mmio", true) => |d| {
            gpuvm_fuzz::vgpu_mmio::run_fresh(d);
        },
        ("serve_control", _) => |d| {
            gpuvm_fuzz::serve_control::run(d);
        },
        ("snapshot_stream", _) => |d| {
            gpuvm_fuzz::snapshot_stream::run(d);
        },
        ("pushbuf_decode", _) => gpuvm_fuzz::pushbuf_decode::run,
        ("shadow_walk", _) => gpuvm_fuzz::shadow_walk::run,
        _ => {
            eprintln!("usage: exec_rate vgpu_mmio|serve_control|snapshot_stream|pushbuf_decode|shadow_walk [--fresh] [--secs S] [FILE|DIR]...");
            std::process::exit(2);
        }
    };
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    for f in &files {
        match std::fs::read_dir(f) {
            Ok(rd) => inputs.extend(rd.flatten().filter_map(|e| std::fs::read(e.path()).ok())),
            Err(_) => inputs.extend(std::fs::read(f).ok()),
        }
    }
    if inputs.is_empty() {
        let mut s = 1u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..512 {
            let len = 1 + (next() % 4096) as usize;
            inputs.push((0..len).map(|_| next() as u8).collect());
        }
    }
    let bytes: usize = inputs.iter().map(Vec::len).sum();
    // The first input also builds the reused rig; time it apart.
    let t0 = Instant::now();
    run(&inputs[0]);
    let first = t0.elapsed();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        run(&inputs[n as usize % inputs.len()]);
        n += 1;
    }
    let el = start.elapsed().as_secs_f64();
    println!(
        "{target}{}: {n} executions in {el:.1} s = {:.0} exec/s over {} inputs ({} bytes); first execution {:.1} ms",
        if fresh { " (fresh rig per input)" } else { "" },
        n as f64 / el,
        inputs.len(),
        bytes,
        first.as_secs_f64() * 1e3
    );
}
