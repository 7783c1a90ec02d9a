//! `gpuvm nouveau`: boots an unmodified Linux (User-Mode Linux, built from Debian's
//! linux-source-6.12 by `scripts/uml/build.sh`) whose built-in nouveau drives a gpuvm vGPU
//! over the vhost-user PCI transport (`gpuvm-vhost-user`), while by default a second VM on the
//! same simulated GF100 runs gpuvm's own driver's workloads and verifies them. Prints the rungs
//! of the bring-up ladder the kernel log shows (docs/nouveau.md), `--json` with the first
//! failure's log lines and the map of BAR0 registers nouveau touched that the model lacks.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use gpuvm::addr::HostVram;
use gpuvm::clock::ClockKind;
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::phys::PhysicalGpu;
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::sched::{Policy, SchedParams};
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, Gpu};
use gpuvm_harness::virt::VirtHal;
use gpuvm_sim::{SimConfig, SimGpu};
use gpuvm_vhost_user::{Server, ServerConfig};
use serde::Serialize;
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// The virtio device id the UML kernel is configured with (scripts/uml/config.fragment).
pub const VIRTIO_DEVICE_ID: u32 = 1234;

/// Options of `gpuvm nouveau`.
#[derive(Args, Debug, Clone)]
pub struct NouveauArgs {
    /// The UML kernel (default: uml/linux under $CARGO_TARGET_DIR, else under the target
    /// directory this gpuvm binary was built into, else under the repository's target/: as
    /// scripts/uml/build.sh leaves it; found from any working directory).
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// Run this static program as init instead of the built-in gpuvm-nvtest (its own root
    /// directory is made in the run's temporary directory, removed afterwards). It passes when
    /// a line of the kernel log matches --expect and none contains FAIL. (`--kernel-arg
    /// init=/NAME`, a program next to gpuvm-nvtest in the kernel's rootfs, is judged the same
    /// way.)
    #[arg(long, value_name = "PROG")]
    init: Option<PathBuf>,
    /// With --init: the regular expression a log line must match for the program to pass
    /// (default: a PASS line, or init exiting with status 0).
    #[arg(
        long,
        value_name = "REGEX",
        default_value = r"\bPASS\b|Attempted to kill init! exitcode=0x00000000"
    )]
    expect: String,
    /// Run scripts/uml/build.sh first (builds the kernel if it is missing or stale).
    #[arg(long)]
    build: bool,
    /// Boot without acceleration (nouveau.noaccel=1): no FIFO, GR or channels.
    #[arg(long)]
    noaccel: bool,
    /// Do not run the second VM with gpuvm's own driver.
    #[arg(long)]
    no_second_vm: bool,
    /// Seconds to let the guest run before it is stopped.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Guest RAM of the UML kernel, MiB.
    #[arg(long, default_value_t = 256)]
    mem_mib: u64,
    /// VRAM of nouveau's vGPU, MiB.
    #[arg(long, default_value_t = 512)]
    vram_mib: u64,
    /// Extra kernel arguments (repeatable), e.g. nouveau.debug=debug.
    #[arg(long = "kernel-arg", value_name = "ARG")]
    kernel_args: Vec<String>,
    /// Write the whole kernel log here.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// One rung of the ladder.
#[derive(Debug, Clone, Serialize)]
pub struct Rung {
    /// Letter (a..l).
    pub id: char,
    /// What it means.
    pub name: &'static str,
    /// Reached.
    pub reached: bool,
    /// The log line that shows it (or why it is not reached).
    pub evidence: Option<String>,
}

/// One unimplemented register.
#[derive(Debug, Clone, Serialize)]
pub struct Unknown {
    /// BAR0 offset.
    pub offset: String,
    /// Reads.
    pub reads: u64,
    /// Writes.
    pub writes: u64,
}

/// What the second VM did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Neighbour {
    /// Workload runs.
    pub runs: u64,
    /// Runs that verified.
    pub verified: u64,
    /// Driver errors.
    pub errors: u64,
    /// A pattern the host wrote into the unused top `CANARY_BYTES` of this VM's VRAM slice
    /// before nouveau booted read back bit-identical after nouveau's VM ended.
    pub vram_canary_intact: bool,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Kernel arguments used.
    pub kernel_args: Vec<String>,
    /// The rungs.
    pub rungs: Vec<Rung>,
    /// The highest consecutive rung reached.
    pub reached: Option<char>,
    /// The first rung not reached, with the nouveau/kernel lines that precede it.
    pub first_failure: Option<(char, Vec<String>)>,
    /// BAR0 registers nouveau touched that the model does not implement.
    pub unknown_registers: Vec<Unknown>,
    /// Transport commands performed and refused.
    pub transport: (u64, u64),
    /// Interrupt messages delivered to the guest.
    pub interrupts: u64,
    /// The second VM (None with --no-second-vm).
    pub neighbour: Option<Neighbour>,
    /// After nouveau's VM ended (its test program done, or killed at the timeout), its vGPU
    /// was destroyed and scrubbed and a fresh one is served on its socket.
    pub nouveau_vgpu_recycled: bool,
    /// What the simulated GPU executed over the whole run, both VMs together.
    pub gpu_work: GpuWork,
    /// The --init program's verdict (None for the built-in test program).
    pub init: Option<InitResult>,
    /// The built-in test program's result lines (`gpuvm-nvtest: ...`).
    pub program_lines: Vec<String>,
    /// nouveau's reports of work the GPU refused (`[ILLEGAL_MTHD]`, `ILLEGAL_CLASS`, killed
    /// channels): the test program provokes one by binding the 3D class, which the model does
    /// not execute.
    pub refusals: Vec<String>,
    /// Seconds the guest ran.
    pub seconds: f64,
}

/// How a `--init` program did.
#[derive(Debug, Clone, Serialize)]
pub struct InitResult {
    /// The program.
    pub program: String,
    /// The pattern its pass line must match.
    pub expect: String,
    /// The first log line that matched it.
    pub matched: Option<String>,
    /// The first log line with FAIL, if any.
    pub failed: Option<String>,
    /// Matched and nothing failed.
    pub passed: bool,
}

/// The --init verdict from the kernel log.
pub fn init_result(log: &str, program: &Path, expect: &regex::Regex) -> InitResult {
    let matched = log.lines().find(|l| expect.is_match(l)).map(str::to_string);
    let failed = log.lines().find(|l| l.contains("FAIL")).map(str::to_string);
    InitResult {
        program: program.display().to_string(),
        expect: expect.as_str().to_string(),
        passed: matched.is_some() && failed.is_none(),
        matched,
        failed,
    }
}

/// Work the simulated GPU counted (both VMs; the second VM's driver never uses class 0x9039,
/// so the M2MF counters are nouveau's).
#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuWork {
    /// Engine operations completed (copies, kernels, M2MF memory transfers).
    pub engine_ops: u64,
    /// M2MF transfers executed by the simulated GR.
    pub m2mf_transfers: u64,
    /// Bytes they moved.
    pub m2mf_bytes: u64,
}

/// The kernel's default places, in order: `$CARGO_TARGET_DIR`, the target directory this
/// binary lives in (`target/<profile>/gpuvm`), the repository's `target/` (the path it was
/// built from). The first that holds `uml/linux` wins; else the first candidate (for the error).
fn default_kernel() -> PathBuf {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        dirs.push(PathBuf::from(t));
    }
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/gpuvm, or target/<profile>/deps/... for a test binary.
        dirs.extend(exe.ancestors().skip(2).take(2).map(Path::to_path_buf));
    }
    dirs.push(repo_root().join("target"));
    let candidates: Vec<PathBuf> = dirs.iter().map(|d| d.join("uml/linux")).collect();
    candidates
        .iter()
        .find(|k| k.exists())
        .or(candidates.first())
        .cloned()
        .unwrap_or_else(|| PathBuf::from("target/uml/linux"))
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs scripts/uml/build.sh; returns the kernel path it prints.
pub fn build_kernel() -> anyhow::Result<PathBuf> {
    let script = repo_root().join("scripts/uml/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(out.status.success(), "{} failed", script.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let path = text.lines().last().unwrap_or("").trim();
    Ok(PathBuf::from(path))
}

/// Subdevices whose `init completed` lines (nvkm trace level, compiled in with
/// `CONFIG_NOUVEAU_DEBUG=5`) are the evidence of rungs (f) and (g).
pub const SUBDEV_TRACE: &str =
    "PMU=trace,LTC=trace,THERM=trace,CLK=trace,VOLT=trace,GPIO=trace,I2C=trace,IMEM=trace,MMU=trace,BAR=trace";
/// How long UML's virt-pci waits for the back end's answer to a read, in udelay(1) spins
/// (its default is 40,000).
pub const VIRT_PCI_MAX_DELAY_US: u32 = 2_000_000;
/// Rung (f): these subdevices' init completed.
const RUNG_F: [&str; 6] = ["pmu", "ltc", "therm", "clk", "gpio", "i2c"];
/// Rung (g): these subdevices' init completed (and nouveau's TTM saw VRAM and GART, no BAR
/// flush timed out).
const RUNG_G: [&str; 3] = ["imem", "mmu", "bar"];

/// The kernel arguments for a boot against `socket` with `rootfs` as the root directory.
pub fn kernel_args(args: &NouveauArgs, socket: &Path, rootfs: &Path, init: &str) -> Vec<String> {
    let mut v = vec![
        format!("mem={}M", args.mem_mib),
        format!("virtio_uml.device={}:{VIRTIO_DEVICE_ID}", socket.display()),
        "root=/dev/root".into(),
        "rootfstype=hostfs".into(),
        format!("rootflags={}", rootfs.display()),
        "rw".into(),
        format!("init=/{init}"),
        "log_buf_len=32M".into(),
        "nouveau.modeset=2".into(),
        format!("nouveau.debug={SUBDEV_TRACE}"),
        // UML gives up on a non-posted command (a config or BAR read) after 40,000 udelay(1)
        // spins ("um virt-pci delay", WARNING at virt-pci.c:203) and reads all-ones; on a loaded
        // host the back end (sharing the host lock with the second VM) answers later than that.
        format!("virt_pci.max_delay_us={VIRT_PCI_MAX_DELAY_US}"),
        "con0=null,fd:1".into(),
        "con=null".into(),
    ];
    if args.noaccel {
        v.push("nouveau.noaccel=1".into());
    }
    v.extend(args.kernel_args.iter().cloned());
    v
}

fn neighbour_vm(
    host: Arc<GpuHost>,
    clock: Arc<dyn gpuvm::clock::Clock>,
    stop: Arc<AtomicBool>,
    runs: Arc<[AtomicU64; 3]>,
) -> anyhow::Result<bool> {
    let profile = VgpuProfile {
        name: "neighbour".into(),
        vram_mib: 256,
        channels: 8,
        weight: 1,
        shadow: ShadowMode::Lazy,
    };
    let vgpu = host.create_vgpu(&profile)?;
    let ram = 64u64 << 20;
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram as usize)])?;
    vgpu.attach_guest_memory(mem.clone())?;
    let hal = VirtHal::new(vgpu.clone(), clock, mem, 0, ram);
    let mut gpu = Gpu::init(hal, DriverConfig::default())
        .map_err(|e| anyhow::anyhow!("neighbour driver init: {e}"))?;
    let canary_at = HostVram(vgpu.vram_slice().base.0 + vgpu.vram_slice().size - CANARY_BYTES);
    let canary = canary_pattern();
    host.phys().write_vram(canary_at, &canary);
    let list = [Workload::Madd, Workload::MemcpyHtod, Workload::MemcpyDtoh];
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        match workloads::run(&mut gpu, list[i % list.len()], 64) {
            Ok(r) => {
                runs[0].fetch_add(1, Ordering::SeqCst);
                if r.verified {
                    runs[1].fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(_) => {
                runs[0].fetch_add(1, Ordering::SeqCst);
                runs[2].fetch_add(1, Ordering::SeqCst);
            }
        }
        i += 1;
    }
    drop(gpu);
    let mut back = vec![0u8; canary.len()];
    host.phys().read_vram(canary_at, &mut back);
    let intact = back == canary;
    host.destroy_vgpu(&vgpu)?;
    Ok(intact)
}

/// Bytes at the top of the second VM's slice that its small workloads never touch.
const CANARY_BYTES: u64 = 8 << 20;

/// A pattern no scrub or stray write produces by accident (a xorshift stream).
fn canary_pattern() -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..CANARY_BYTES / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

/// The ladder, read from the kernel log.
pub fn rungs(log: &str, noaccel: bool) -> Vec<Rung> {
    let find = |pat: &dyn Fn(&str) -> bool| log.lines().find(|l| pat(l)).map(str::to_string);
    let has = |s: &str| find(&|l: &str| l.contains(s));
    let nv = |s: &str| find(&|l: &str| l.contains("nouveau") && l.contains(s));
    let enumerated = find(&|l: &str| l.contains("[10de:06d8]"));
    let bars = find(&|l: &str| l.contains("BAR 0") && l.contains("assigned"));
    let a = match (&enumerated, &bars) {
        (Some(e), Some(_)) => Some(e.clone()),
        _ => None,
    };
    let b = nv("NVIDIA GF100");
    let c = nv("bios: version");
    let ctor_fail = nv("ctor failed").or(nv("preinit failed"));
    let e = find(&|l: &str| l.contains("nouveau") && l.contains("fb:") && l.contains("MiB"));
    let d = if ctor_fail.is_none() { e.clone() } else { None };
    let init_fail = nv("init failed");
    // nvkm_subdev_init at trace level: "nouveau 0000:00:00.0: pmu: init completed in 12us".
    let done = |sub: &str| {
        let pat = format!(" {sub}: init completed");
        find(&|l: &str| l.contains("nouveau") && l.contains(&pat))
    };
    let all_done = |subs: &[&str]| -> Option<String> {
        let lines: Option<Vec<String>> = subs.iter().map(|s| done(s)).collect();
        lines.map(|l| l.join(" | "))
    };
    let drm = |s: &str| {
        find(&|l: &str| {
            l.contains("nouveau") && l.to_ascii_lowercase().contains(&format!("drm: {s}"))
        })
    };
    let (vram, gart) = (drm("vram:"), drm("gart:"));
    let f = if init_fail.is_none() {
        all_done(&RUNG_F)
    } else {
        None
    };
    // BAR flush timeouts count until the DRM device is up (after the test program, UML powers
    // off and the disconnected device reads all-ones: nouveau's teardown then times out).
    let up_to_drm = match log.find("Initialized nouveau") {
        Some(i) => &log[..i],
        None => log,
    };
    let flush_timeout = up_to_drm.contains("g84_bar_flush");
    let g = match (all_done(&RUNG_G), &vram, &gart) {
        (Some(subs), Some(v), Some(gt)) if !flush_timeout => Some(format!("{subs} | {v} | {gt}")),
        _ => None,
    };
    let accel_fail = nv("failed to create kernel channel")
        .or(nv("failed to initialise sync"))
        .or(nv("failed to construct context"));
    // (h) is work done, not a message: nouveau chose its buffer-move engine, and a buffer it
    // moved GART -> VRAM -> GART with that engine came back bit-identical (the test program
    // fills it, has the GPU check it in VRAM and reads it back).
    let engine = nv("MM: using");
    let moved = has("gpuvm-nvtest: PASS ttm-move");
    let h = match (noaccel || accel_fail.is_some(), engine, moved) {
        (false, Some(e), Some(m)) => Some(format!("{} | {}", e.trim(), m.trim())),
        _ => None,
    };
    let i = has("Initialized nouveau");
    let j = has("gpuvm-nvtest: PASS semaphores");
    let k = match (
        has("gpuvm-nvtest: PASS m2mf-copy"),
        has("gpuvm-nvtest: PASS ce-copy"),
    ) {
        (Some(m), Some(c)) => Some(format!("{} | {}", m.trim(), c.trim())),
        _ => None,
    };
    vec![
        rung('a', "enumerated with our IDs, BARs assigned", a),
        rung('b', "bound, GF100 identified", b),
        rung('c', "VBIOS accepted", c),
        rung('d', "devinit done or skipped", d),
        rung('e', "VRAM size detected", e),
        rung('f', "PMU, LTC, therm/clk/volt/gpio/i2c up", f),
        rung('g', "instmem, MMU, BAR1/BAR3 working", g),
        rung(
            'h',
            "acceleration on: a TTM buffer move executed, CPU-checked",
            h,
        ),
        rung('i', "DRM device registered", i),
        rung(
            'j',
            "userspace channel: semaphores in VRAM and GART verified",
            j,
        ),
        rung(
            'k',
            "userspace copies by M2MF and the copy engine, CPU-checked",
            k,
        ),
        // Out of reach: a Fermi compute launch runs shader code, and the simulated GF100 has no
        // Fermi shader interpreter (its compute class runs the model's own kernels). Never
        // marked.
        rung(
            'l',
            "compute launch (out of reach: no Fermi shader interpreter)",
            None,
        ),
    ]
}

fn rung(id: char, name: &'static str, evidence: Option<String>) -> Rung {
    Rung {
        id,
        name,
        reached: evidence.is_some(),
        evidence,
    }
}

/// The last `n` kernel lines about nouveau, DRM, PCI or the test program.
fn failure_lines(log: &str, n: usize) -> Vec<String> {
    let v: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("nouveau")
                || l.contains("drm")
                || l.contains("pci")
                || l.contains("gpuvm-nvtest")
                || l.contains("virt-pci")
                || l.contains("WARNING")
                || l.contains("Kernel panic")
        })
        .collect();
    v[v.len().saturating_sub(n)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Runs the command; `Ok(false)` if the guest did not reach rung (i) (or (j) with acceleration).
pub fn run(args: &NouveauArgs) -> anyhow::Result<bool> {
    let report = boot(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for r in &report.rungs {
            println!(
                "({}) {:<58} {}",
                r.id,
                r.name,
                match &r.evidence {
                    Some(e) => format!("yes  {}", e.trim()),
                    None => "no".into(),
                }
            );
        }
        if let Some(n) = &report.neighbour {
            println!(
                "second VM: {} workload runs, {} verified, {} errors; VRAM canary ({} MiB) {}",
                n.runs,
                n.verified,
                n.errors,
                CANARY_BYTES >> 20,
                if n.vram_canary_intact {
                    "bit-identical"
                } else {
                    "CHANGED"
                }
            );
        }
        println!(
            "nouveau's vGPU after its VM ended: {}",
            if report.nouveau_vgpu_recycled {
                "destroyed, scrubbed, a fresh one served"
            } else {
                "NOT recycled"
            }
        );
        for r in &report.refusals {
            println!("refused, as nouveau reports it: {r}");
        }
        println!(
            "GPU work: {} engine operations; M2MF (nouveau's only): {} transfers, {} KiB",
            report.gpu_work.engine_ops,
            report.gpu_work.m2mf_transfers,
            report.gpu_work.m2mf_bytes >> 10
        );
        println!(
            "transport: {} commands, {} refused, {} interrupts; {} unimplemented registers touched",
            report.transport.0,
            report.transport.1,
            report.interrupts,
            report.unknown_registers.len()
        );
    }
    if let Some(init) = &report.init {
        if !args.json {
            println!(
                "init {}: {} (expect /{}/: {}{})",
                init.program,
                if init.passed { "PASS" } else { "FAIL" },
                init.expect,
                init.matched.as_deref().unwrap_or("no line matched").trim(),
                init.failed
                    .as_deref()
                    .map(|f| format!("; failed: {}", f.trim()))
                    .unwrap_or_default()
            );
        }
        // A program of its own: the device up to the DRM device (its rungs of work are the
        // program's to show), and the program's verdict.
        let drm_up = report.rungs.iter().filter(|r| r.id <= 'g' || r.id == 'i');
        return Ok(drm_up.clone().all(|r| r.reached) && init.passed);
    }
    if args.noaccel {
        // No channels: (h), (j) and (k) cannot happen; the device up to the DRM device can.
        return Ok(report
            .rungs
            .iter()
            .filter(|r| r.id <= 'g' || r.id == 'i')
            .all(|r| r.reached));
    }
    Ok(report.reached.is_some_and(|r| r >= 'k'))
}

/// Boots the guest and returns the report.
pub fn boot(args: &NouveauArgs) -> anyhow::Result<Report> {
    let kernel = if args.build {
        build_kernel()?
    } else {
        args.kernel.clone().unwrap_or_else(default_kernel)
    };
    anyhow::ensure!(
        kernel.exists(),
        "no UML kernel at {} (build it with scripts/uml/build.sh, or pass --build)",
        kernel.display()
    );
    let expect = regex::Regex::new(&args.expect).context("--expect")?;
    let arg_init = args
        .kernel_args
        .iter()
        .rev()
        .find_map(|a| a.strip_prefix("init=/"))
        .filter(|n| !n.is_empty() && !n.contains('/'))
        .map(str::to_string);
    let dir = std::env::temp_dir().join(format!("gpuvm-nouveau-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // Whatever happens below, the temporary directory (socket, UML's memory file, the log
    // unless --log, an --init program's root) goes.
    let _cleanup = RemoveOnDrop(dir.clone());
    // hostfs takes the root directory as given, relative paths included: make it absolute.
    let (rootfs, init_name) = match &args.init {
        Some(prog) => {
            let name = prog
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_graphic()))
                .context("--init: the program's file name must be plain ASCII")?
                .to_string();
            let root = dir.join("rootfs");
            std::fs::create_dir_all(&root)?;
            std::fs::copy(prog, root.join(&name))
                .with_context(|| format!("--init: copying {}", prog.display()))?;
            (root, name)
        }
        None => {
            let root = std::path::absolute(kernel.with_file_name("rootfs"))
                .context("the rootfs directory's absolute path")?;
            let name = arg_init
                .clone()
                .unwrap_or_else(|| "gpuvm-nvtest".to_string());
            anyhow::ensure!(
                root.join(&name).exists(),
                "no program {name} in {} (scripts/uml/build.sh builds gpuvm-nvtest)",
                root.display()
            );
            (root, name)
        }
    };
    // The program judged by --expect: --init's, or one named by --kernel-arg init=/NAME.
    let custom_init = args
        .init
        .clone()
        .or_else(|| arg_init.as_ref().map(|n| rootfs.join(n)));

    let clock = ClockKind::Real.create();
    let sim = Arc::new(SimGpu::new(SimConfig {
        vram_size: 2048 << 20,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let phys: Arc<dyn PhysicalGpu> = sim;
    let host = Arc::new(GpuHost::new(phys, HostConfig::default()).context("GPU host")?);
    host.set_scheduler(Policy::Band.create(&SchedParams::default()))
        .context("scheduler")?;
    host.set_clock(clock.clone());
    let profile = VgpuProfile {
        name: "nouveau".into(),
        vram_mib: args.vram_mib,
        channels: 32,
        weight: 1,
        shadow: ShadowMode::Lazy,
    };
    let server = Server::start(
        host.clone(),
        clock.clone(),
        ServerConfig {
            socket_dir: dir.clone(),
            vms: vec![("nouveau".into(), profile)],
        },
    )
    .context("vhost-user server")?;
    let socket = server.sockets()[0].clone();

    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let neighbour = (!args.no_second_vm).then(|| {
        let (h, c, s, n) = (host.clone(), clock.clone(), stop.clone(), counters.clone());
        std::thread::spawn(move || neighbour_vm(h, c, s, n))
    });

    let kargs = kernel_args(args, &socket, &rootfs, &init_name);
    let log_path = args.log.clone().unwrap_or_else(|| dir.join("kernel.log"));
    let log_file = std::fs::File::create(&log_path)?;
    let started = Instant::now();
    let mut child = Command::new(&kernel)
        .args(&kargs)
        .env("TMPDIR", &dir)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
        .with_context(|| format!("starting {}", kernel.display()))?;
    let deadline = started + Duration::from_secs(args.timeout);
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let seconds = started.elapsed().as_secs_f64();
    // nouveau's VM is gone (however it ended): its vGPU must be recycled — destroyed,
    // scrubbed, a fresh one served — while the second VM still runs.
    let dev = server.devices()[0].clone();
    let recycle_by = Instant::now() + Duration::from_secs(30);
    while dev.teardowns() == 0 && Instant::now() < recycle_by {
        std::thread::sleep(Duration::from_millis(50));
    }
    let nouveau_vgpu_recycled = dev.teardowns() > 0 && dev.vgpu().is_some();
    stop.store(true, Ordering::SeqCst);
    let neighbour = match neighbour {
        Some(t) => {
            let r = t
                .join()
                .map_err(|_| anyhow::anyhow!("second VM thread panicked"))?;
            let vram_canary_intact = match r {
                Ok(intact) => intact,
                Err(e) => {
                    eprintln!("gpuvm nouveau: second VM: {e}");
                    false
                }
            };
            Some(Neighbour {
                runs: counters[0].load(Ordering::SeqCst),
                verified: counters[1].load(Ordering::SeqCst),
                errors: counters[2].load(Ordering::SeqCst),
                vram_canary_intact,
            })
        }
        None => None,
    };
    let mut log = String::new();
    std::fs::File::open(&log_path)?.read_to_string(&mut log)?;
    let unknown_registers = dev
        .unknown_registers()
        .into_iter()
        .map(|(off, u)| Unknown {
            offset: format!("{off:#08x}"),
            reads: u.reads,
            writes: u.writes,
        })
        .collect();
    let transport = (dev.commands(), dev.rejected());
    let st = host.phys().stats();
    let gpu_work = GpuWork {
        engine_ops: st.engine_ops,
        m2mf_transfers: st.m2mf_transfers,
        m2mf_bytes: st.m2mf_bytes,
    };
    let interrupts = dev.line().delivered();
    server.shutdown();
    let init = custom_init.map(|p| init_result(&log, &p, &expect));
    let program_lines = log
        .lines()
        .filter(|l| l.starts_with("gpuvm-nvtest:"))
        .map(str::to_string)
        .collect();
    let refusals = log
        .lines()
        .filter(|l| {
            l.contains("nouveau")
                && (l.contains("ILLEGAL_MTHD")
                    || l.contains("ILLEGAL_CLASS")
                    || l.contains("killed!"))
        })
        .map(|l| l.trim().to_string())
        .collect();
    let rungs = rungs(&log, args.noaccel);
    let reached = rungs.iter().take_while(|r| r.reached).last().map(|r| r.id);
    let first_failure = rungs
        .iter()
        .find(|r| !r.reached)
        .map(|r| (r.id, failure_lines(&log, 25)));
    Ok(Report {
        kernel_args: kargs,
        rungs,
        reached,
        first_failure,
        unknown_registers,
        transport,
        interrupts,
        neighbour,
        nouveau_vgpu_recycled,
        gpu_work,
        init,
        program_lines,
        refusals,
        seconds,
    })
}

/// Removes a directory when dropped (the run's temporary directory, on every exit path).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_verdict_needs_the_pass_line_and_no_fail() {
        let re = regex::Regex::new(r"\bPASS\b").unwrap();
        let p = Path::new("/x/prog");
        assert!(init_result("boot\nprog: PASS all\n", p, &re).passed);
        assert!(!init_result("boot\nprog: PASSED\n", p, &re).passed);
        assert!(!init_result("prog: PASS a\nprog: FAIL b\n", p, &re).passed);
        // The default also accepts init exiting with status 0.
        let re =
            regex::Regex::new(r"\bPASS\b|Attempted to kill init! exitcode=0x00000000").unwrap();
        let exit0 = "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000000\n";
        assert!(init_result(exit0, p, &re).passed);
        assert!(!init_result(&exit0.replace("0000\n", "0100\n"), p, &re).passed);
    }

    #[test]
    fn ladder_from_a_log() {
        let log = "\
pci 0000:00:00.0: [10de:06d8] type 00 class 0x030000 PCIe Endpoint
pci 0000:00:00.0: BAR 0 [mem 0xf0000000-0xf1ffffff]: assigned
nouveau 0000:00:00.0: NVIDIA GF100 (0c0c00a3)
nouveau 0000:00:00.0: bios: version 70.c0.00.01.00
nouveau 0000:00:00.0: fb: 512 MiB of unknown memory type
nouveau 0000:00:00.0: pmu: init completed in 40us
nouveau 0000:00:00.0: ltc: init completed in 3us
nouveau 0000:00:00.0: therm: init completed in 9us
nouveau 0000:00:00.0: clk: init completed in 1us
nouveau 0000:00:00.0: gpio: init completed in 2us
nouveau 0000:00:00.0: i2c: init completed in 5us
nouveau 0000:00:00.0: imem: init completed in 7us
nouveau 0000:00:00.0: mmu: init completed in 0us
nouveau 0000:00:00.0: bar: init completed in 90us
nouveau 0000:00:00.0: drm: VRAM: 512 MiB
nouveau 0000:00:00.0: drm: GART: 1048576 MiB
[drm] Initialized nouveau 1.4.0 20120801 for 0000:00:00.0 on minor 0
";
        let r = rungs(log, true);
        let got: String = r.iter().filter(|r| r.reached).map(|r| r.id).collect();
        assert_eq!(got, "abcdefgi");
        assert!(r[5]
            .evidence
            .as_deref()
            .unwrap_or("")
            .contains("pmu: init completed"));
        // Without a subdevice's line (or with a BAR flush timeout) the rung is not reached.
        let r = rungs(&log.replace("ltc: init", "ltc: oneinit"), true);
        assert!(!r[5].reached && r[6].reached);
        let flush = "WARNING: at g84_bar_flush\n";
        let r = rungs(
            &log.replace("[drm] Initialized", &format!("{flush}[drm] Initialized")),
            true,
        );
        assert!(!r[6].reached);
        // After the DRM device is up (UML powering off) it does not count.
        let r = rungs(&format!("{log}reboot: Power down\n{flush}"), true);
        assert!(r[6].reached);
        assert!(!r[7].reached, "noaccel: no FIFO/GR rung");
        // (h) needs the move done, not only nouveau's choice of engine; (k) both copies.
        let accel = format!(
            "{log}nouveau 0000:00:00.0: drm: MM: using COPY0 for buffer copies\n\
             gpuvm-nvtest: PASS semaphores: ok\n\
             gpuvm-nvtest: PASS m2mf-copy: ok\n"
        );
        let r = rungs(&accel, false);
        assert!(!r[7].reached && r[9].reached && !r[10].reached);
        let r = rungs(
            &format!("{accel}gpuvm-nvtest: PASS ttm-move: ok\ngpuvm-nvtest: PASS ce-copy: ok\n"),
            false,
        );
        let got: String = r.iter().filter(|r| r.reached).map(|r| r.id).collect();
        assert_eq!(got, "abcdefghijk", "(l) is never marked");
        // A constructor failure stops the ladder at (d).
        let bad = log.replace("fb: 512", "bios ctor failed: -22\nnouveau x: fb: 512");
        let r = rungs(&bad, true);
        assert!(!r[3].reached);
    }
}
