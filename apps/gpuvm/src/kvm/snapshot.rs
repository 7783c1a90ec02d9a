//! Snapshot and restore of a whole KVM guest (`gpuvm run --kvm --snapshot-to DIR
//! --snapshot-after-exits N`, `gpuvm run --kvm --restore DIR`), and the state that live
//! migration ([`super::migrate`]) sends over its stream.
//!
//! What is captured, with the vCPU paused at an exit boundary ([`complete_pending_io`]):
//!
//! * the vCPU: regs, sregs, XSAVE area (x87/SSE/AVX), XCRs, debug registers, local APIC, MP
//!   state, pending events, CPUID, every MSR of `KVM_GET_MSR_INDEX_LIST` that reads back (the
//!   TSC among them, so the guest's clock continues where it stopped), the TSC frequency;
//! * the VM: the in-kernel irqchip (both PICs and the IOAPIC) and the KVM clock (no PIT is
//!   created);
//! * the VMM's own devices: the 16550's registers and console, the PCI configuration-address
//!   latch (0xCF8), the exit counters and phase marks the report is built from, the wall time
//!   the guest has run (BAR windows, coalesced zones and the ECAM window are derived from the
//!   vGPU's configuration space and need nothing of their own);
//! * guest RAM, as a sparse file holding only the non-zero pages;
//! * the vGPU, through the [`DeviceSnapshot`] seam: opaque bytes the device produces and takes
//!   back. [`MigratableVgpu`] (the vGPU in this process) quiesces the vGPU (the vCPU is
//!   already paused) and writes a `gpuvm::migrate` stream (VRAM pages, then the device
//!   state); a restore reads it into a new vGPU of the new process's host with the restored
//!   RAM attached. With `--vfio-user` the daemon does the same through its control socket
//!   ([`super::remote::RemoteVgpu`]). Schemes that map VRAM straight into the guest (BAR
//!   remap) are refused ([`check_supported`]).
//!
//! The directory: `manifest.json` (versioned, [`Manifest`]), `ram.bin` (sparse, RAM size
//! long), `vgpu.bin` (the seam's bytes). The manifest is written last (renamed into place), so
//! a directory without one is an unfinished snapshot. Every length, hash and field is checked
//! on restore.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context};
use gpuvm::profile::ShadowMode;
use gpuvm_guest::workloads::Workload;
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap};

use super::device_seam::DeviceSnapshot;
use super::vcpu_state::{VcpuState, VmState};
use super::{abi, scheme, ExitCounts, KvmOptions};

/// The manifest's `format`.
pub const FORMAT: &str = "gpuvm-kvm-snapshot";
/// The manifest's `version`; a snapshot of another version is refused.
pub const VERSION: u32 = 1;
/// Guest page size of the RAM file and of the migration stream.
pub use super::vm::PAGE;
/// File names inside a snapshot directory.
pub const MANIFEST: &str = "manifest.json";
const RAM_FILE: &str = "ram.bin";
const VGPU_FILE: &str = "vgpu.bin";
/// Largest manifest read (it holds the console lines; 10 000 lines of 512 bytes at most).
const MAX_MANIFEST: u64 = 64 << 20;

// ---------------------------------------------------------------------------------------------
// Byte blobs and the RAM hash

/// A 64-bit hash of a byte string (four multiply-xor lanes over 64-bit words; not
/// cryptographic: it finds damaged files and pages the dirty log missed, not forgery).
#[derive(Debug, Clone, Copy)]
pub struct Hasher {
    lanes: [u64; 4],
    len: u64,
}

impl Default for Hasher {
    fn default() -> Self {
        Hasher {
            lanes: [
                0x243f_6a88_85a3_08d3,
                0x1319_8a2e_0370_7344,
                0xa409_3822_299f_31d0,
                0x082e_fa98_ec4e_6c89,
            ],
            len: 0,
        }
    }
}

impl Hasher {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;

    /// Adds `b` (callers feed whole pages, so the word split does not depend on chunking).
    pub fn update(&mut self, b: &[u8]) {
        self.len += b.len() as u64;
        let mut chunks = b.chunks_exact(32);
        for c in &mut chunks {
            for (i, lane) in self.lanes.iter_mut().enumerate() {
                let w = u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
                *lane = (*lane ^ w).wrapping_mul(Self::K).rotate_left(29);
            }
        }
        for (i, &x) in chunks.remainder().iter().enumerate() {
            let lane = &mut self.lanes[i % 4];
            *lane = (*lane ^ u64::from(x)).wrapping_mul(Self::K);
        }
    }

    /// The hash, as 16 hex digits.
    pub fn finish(&self) -> String {
        let mut h = self.len.wrapping_mul(Self::K);
        for l in self.lanes {
            h = (h ^ l).wrapping_mul(Self::K).rotate_left(31);
        }
        format!("{h:016x}")
    }
}

/// Hashes all of guest RAM, page by page. In a file-backed region (a memfd, when the vGPU is
/// in a `gpuvm serve` daemon) the file's holes are hashed as the zeros they read as, without
/// reading them: reading a hole of shared memory allocates a page for it, which made the
/// destination of a migration spend about 35 ms of the guest's downtime, and 44 MiB of memory,
/// on pages nobody wrote.
pub fn ram_hash(mem: &GuestMemoryMmap, ram: u64) -> anyhow::Result<String> {
    const CHUNK: u64 = 1 << 20;
    let mut h = Hasher::default();
    let mut buf = vec![0u8; CHUNK as usize];
    let zeros = vec![0u8; CHUNK as usize];
    let mut at = 0;
    while at < ram {
        let (n, hole) = match hole_at(mem, at) {
            Some(Extent::Hole(len)) => (len, true),
            Some(Extent::Data(len)) => (len, false),
            None => (PAGE, false),
        };
        let n = n.min(ram - at).clamp(1, CHUNK);
        if hole {
            h.update(&zeros[..n as usize]);
        } else {
            mem.read_slice(&mut buf[..n as usize], GuestAddress(at))
                .context("reading guest RAM")?;
            h.update(&buf[..n as usize]);
        }
        at += n;
    }
    Ok(h.finish())
}

/// A stretch of a file-backed RAM region: a hole (reads as zeros) or data, page-aligned.
enum Extent {
    Hole(u64),
    Data(u64),
}

/// The stretch of RAM at `gpa` as its backing file sees it (`lseek` `SEEK_DATA`/`SEEK_HOLE`),
/// or `None` if the region is not file-backed or the file cannot tell.
fn hole_at(mem: &GuestMemoryMmap, gpa: u64) -> Option<Extent> {
    use std::os::fd::AsRawFd;
    use vm_memory::GuestMemoryRegion;
    let region = mem.find_region(GuestAddress(gpa))?;
    let fo = region.file_offset()?;
    let into = gpa - region.start_addr().0;
    let left = region.len() - into;
    let off = i64::try_from(fo.start() + into).ok()?;
    let fd = fo.file().as_raw_fd();
    // SAFETY: lseek on a descriptor the region owns; it moves only the file position, which
    // nothing here uses (RAM is accessed through the mapping).
    let data = unsafe { libc::lseek(fd, off, libc::SEEK_DATA) };
    if data < 0 {
        // ENXIO: no data from here to the end of the file.
        return (std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO))
            .then_some(Extent::Hole(left));
    }
    if data > off {
        let len = ((data - off) as u64).min(left);
        return (len > 0).then_some(Extent::Hole(len));
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, off, libc::SEEK_HOLE) };
    if hole <= off {
        return None;
    }
    Some(Extent::Data(((hole - off) as u64).min(left)))
}

// ---------------------------------------------------------------------------------------------
// What the guest was started with

/// The parameters that define the guest (its program, RAM layout, boot parameters and vGPU
/// profile): a restore takes them from the snapshot, not from the command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestSpec {
    /// Problem size.
    pub size: u32,
    /// Workload names, in order.
    pub workloads: Vec<String>,
    /// The guest waits for fences by interrupt (its irqfd is wired on restore).
    pub fence_irq: bool,
    /// PCI through ECAM.
    pub ecam: bool,
    /// Calibration exits of each kind.
    pub calibrate: u32,
    /// `abi::MODE_*`.
    pub mode: u32,
    /// The vGPU's shadow mode.
    pub shadow: ShadowMode,
    /// The scheme (`fv-naive` or none: BAR remap is refused).
    pub scheme: Option<String>,
    /// VRAM slice, MiB.
    pub vram_mib: u64,
    /// `--guest-ram-mib` as bytes (0: derived from the size).
    pub guest_ram: u64,
    /// The RAM size that came out of it, bytes.
    pub ram_bytes: u64,
    /// Started through the PVH entry.
    pub pvh: bool,
    /// Hash of the guest program this VMM embeds: the guest in RAM and the VMM share the ABI of
    /// `guest-bin/src/abi.rs` (boot parameters, results block, ports).
    pub guest_elf_hash: String,
}

impl GuestSpec {
    /// The spec of VM 0 of `opts`, or why its run cannot be snapshotted.
    pub fn of(opts: &KvmOptions) -> anyhow::Result<GuestSpec> {
        check_supported(opts)?;
        let setup = opts.setups.first().cloned().unwrap_or_default();
        Ok(GuestSpec {
            size: opts.size,
            workloads: super::vm_workloads(opts, 0)
                .iter()
                .map(|w| w.name().to_string())
                .collect(),
            fence_irq: setup.fence_irq.unwrap_or(opts.fence_irq),
            ecam: opts.ecam,
            calibrate: opts.calibrate,
            mode: opts.modes.first().copied().unwrap_or(abi::MODE_NORMAL),
            shadow: opts.shadow,
            scheme: opts.scheme.map(|s| s.name().to_string()),
            vram_mib: opts.vram_mib,
            guest_ram: opts.guest_ram,
            ram_bytes: super::ram_layout(opts).0,
            pvh: opts.pvh,
            guest_elf_hash: elf_hash(),
        })
    }

    /// Overwrites the guest-defining options of `opts` with this spec (the command line keeps
    /// the run's control: timeout, console, coalescing, JSON) and checks the result.
    pub fn apply(&self, opts: &mut KvmOptions) -> anyhow::Result<()> {
        ensure!(
            self.guest_elf_hash == elf_hash(),
            "the snapshot's guest program (hash {}) is not the one this gpuvm embeds ({}): restore it with the gpuvm build that took it",
            self.guest_elf_hash,
            elf_hash()
        );
        let workloads = self
            .workloads
            .iter()
            .map(|w| {
                w.parse::<Workload>()
                    .map_err(|e| anyhow::anyhow!("workload '{w}': {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        ensure!(
            workloads.len() <= abi::MAX_WORKLOADS,
            "{} workloads (at most {})",
            workloads.len(),
            abi::MAX_WORKLOADS
        );
        ensure!(
            (1..=1024).contains(&self.size),
            "size {} out of range",
            self.size
        );
        let scheme = match &self.scheme {
            None => None,
            Some(s) => Some(
                <scheme::KvmScheme as clap::ValueEnum>::from_str(s, false)
                    .map_err(|e| anyhow::anyhow!("scheme '{s}': {e}"))?,
            ),
        };
        opts.vms = 1;
        opts.size = self.size;
        opts.workloads = workloads;
        opts.fence_irq = self.fence_irq;
        opts.ecam = self.ecam;
        opts.calibrate = self.calibrate;
        opts.modes = vec![self.mode];
        opts.shadow = self.shadow;
        opts.scheme = scheme;
        opts.vram_mib = self.vram_mib;
        opts.guest_ram = self.guest_ram;
        opts.pvh = self.pvh;
        let weight = opts.setups.first().map_or(1, |s| s.weight);
        let (timeout, stall) = opts
            .setups
            .first()
            .map_or((None, None), |s| (s.timeout, s.stall));
        opts.setups = vec![super::setup::VmSetup {
            weight,
            timeout,
            stall,
            ..Default::default()
        }];
        check_supported(opts)?;
        let ram = super::ram_layout(opts).0;
        ensure!(
            ram == self.ram_bytes,
            "the snapshot's RAM is {} bytes but its parameters give {ram}",
            self.ram_bytes
        );
        Ok(())
    }
}

/// Hash of the embedded guest program.
pub fn elf_hash() -> String {
    let mut h = Hasher::default();
    h.update(super::GUEST_ELF);
    h.finish()
}

/// Refuses the runs whose state this VMM cannot capture.
pub fn check_supported(opts: &KvmOptions) -> anyhow::Result<()> {
    ensure!(
        opts.vms == 1,
        "snapshot and migration take one guest: run --vms 1 (this run has {})",
        opts.vms
    );
    ensure!(
        opts.record.is_none(),
        "snapshot and migration cannot be combined with --record (both use the RAM slot's dirty log)"
    );
    ensure!(
        opts.sample_every.is_none(),
        "snapshot and migration are not for the experiments' sampler"
    );
    if let Some(s) = opts.scheme {
        ensure!(
            !s.remaps() && s != scheme::KvmScheme::Native,
            "snapshot and migration need every BAR access to exit (--scheme {} maps VRAM into the guest or passes the GPU through): use --scheme fv-naive or no --scheme",
            s.name()
        );
    }
    if let Some(s) = opts.setups.first() {
        ensure!(
            s.stream.is_none() && !s.gate && s.workloads.is_none(),
            "snapshot and migration are not for kernel streams, the start gate or per-VM workload lists"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The VMM's devices

/// The 16550's registers (vm-superio's `SerialState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialRegs {
    /// DLL, DLM, IER, IIR, LCR, LSR, MCR, MSR, SCR.
    pub regs: [u8; 9],
    /// Received bytes not yet read.
    pub in_buffer: Vec<u8>,
}

impl SerialRegs {
    /// From vm-superio's state.
    pub fn of(s: &vm_superio::serial::SerialState) -> SerialRegs {
        SerialRegs {
            regs: [
                s.baud_divisor_low,
                s.baud_divisor_high,
                s.interrupt_enable,
                s.interrupt_identification,
                s.line_control,
                s.line_status,
                s.modem_control,
                s.modem_status,
                s.scratch,
            ],
            in_buffer: s.in_buffer.clone(),
        }
    }

    /// Back to vm-superio's state.
    pub fn state(&self) -> vm_superio::serial::SerialState {
        let r = self.regs;
        vm_superio::serial::SerialState {
            baud_divisor_low: r[0],
            baud_divisor_high: r[1],
            interrupt_enable: r[2],
            interrupt_identification: r[3],
            line_control: r[4],
            line_status: r[5],
            modem_control: r[6],
            modem_status: r[7],
            scratch: r[8],
            in_buffer: self.in_buffer.clone(),
        }
    }
}

/// A phase mark, relative to the VM's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkState {
    /// Phase id.
    pub phase: u32,
    /// ns after the VM started (time the guest was not running excluded).
    pub at_ns: u64,
    /// GPU busy time so far.
    pub busy_ns: u64,
    /// MMIO reads so far.
    pub reads: u64,
    /// MMIO writes so far.
    pub writes: u64,
}

/// What the VMM itself keeps about the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmmState {
    /// The UART.
    pub serial: SerialRegs,
    /// The console's unfinished line.
    pub console_partial: Vec<u8>,
    /// Console lines so far.
    pub console: Vec<String>,
    /// The PCI configuration-address latch (port 0xCF8).
    pub pci_address: u32,
    /// Exits so far.
    pub exits: ExitCounts,
    /// Phase marks so far.
    pub marks: Vec<MarkState>,
    /// Wall time the guest has run, ns (summed over the processes it ran in).
    pub elapsed_ns: u64,
}

/// The device's bytes as they travel: who made them, length, hash; the bytes themselves are in
/// `vgpu.bin` (or follow in the stream).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceInfo {
    /// [`DeviceSnapshot::kind`].
    pub kind: String,
    /// Length.
    pub len: u64,
    /// [`Hasher`] of the bytes.
    pub hash: String,
}

/// The guest's state except RAM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineState {
    /// The VM.
    pub vm: VmState,
    /// The vCPUs.
    pub vcpus: Vec<VcpuState>,
    /// The VMM's devices.
    pub vmm: VmmState,
    /// The vGPU's bytes.
    pub vgpu: DeviceInfo,
}

/// Where RAM is and how to check it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RamInfo {
    /// RAM size, bytes (GPA 0..size, one slot).
    pub size: u64,
    /// Page size of the file.
    pub page_size: u64,
    /// The file (sparse: zero pages are holes).
    pub file: String,
    /// Non-zero pages written.
    pub data_pages: u64,
    /// [`Hasher`] of all of RAM.
    pub hash: String,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The gpuvm that wrote it.
    pub created_by: String,
    /// Why it was taken (`--snapshot-after-exits N`).
    pub trigger: String,
    /// The guest's parameters.
    pub guest: GuestSpec,
    /// RAM.
    pub ram: RamInfo,
    /// The rest.
    pub machine: MachineState,
    /// The vGPU's file.
    pub vgpu_file: String,
}

/// The device's bytes with their [`DeviceInfo`].
pub fn device_info(dev: &dyn DeviceSnapshot, bytes: &[u8]) -> DeviceInfo {
    let mut h = Hasher::default();
    h.update(bytes);
    DeviceInfo {
        kind: dev.kind(),
        len: bytes.len() as u64,
        hash: h.finish(),
    }
}

/// Checks `bytes` against `info` and gives them to `dev`.
pub fn restore_device(
    dev: &dyn DeviceSnapshot,
    info: &DeviceInfo,
    bytes: &[u8],
    ram: &GuestMemoryMmap,
) -> anyhow::Result<()> {
    ensure!(
        info.kind == dev.kind(),
        "the vGPU state was made by '{}', this vGPU takes '{}'",
        info.kind,
        dev.kind()
    );
    ensure!(
        bytes.len() as u64 == info.len,
        "the vGPU state is {} bytes, the manifest says {}",
        bytes.len(),
        info.len
    );
    let mut h = Hasher::default();
    h.update(bytes);
    ensure!(
        h.finish() == info.hash,
        "the vGPU state's hash {} is not the manifest's {}",
        h.finish(),
        info.hash
    );
    dev.restore(bytes, ram)
}

/// Sizes of what [`write_dir`] wrote.
#[derive(Debug, Clone, Serialize)]
pub struct Written {
    /// The directory.
    pub dir: PathBuf,
    /// RAM size.
    pub ram_bytes: u64,
    /// Non-zero pages written to the RAM file.
    pub data_pages: u64,
    /// Bytes the RAM file occupies on disk (holes not counted).
    pub ram_file_disk_bytes: u64,
    /// Length of the manifest.
    pub manifest_bytes: u64,
    /// Time to write everything, ns.
    pub write_ns: u64,
}

/// Writes a snapshot directory: the RAM file (non-zero pages only, at their offsets: a sparse
/// file), the device's bytes, and the manifest last, renamed into place.
pub fn write_dir(
    dir: &Path,
    guest: GuestSpec,
    trigger: String,
    mut machine: MachineState,
    vgpu_bytes: &[u8],
    mem: &GuestMemoryMmap,
) -> anyhow::Result<Written> {
    let t0 = std::time::Instant::now();
    if dir.exists() {
        let empty = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_none();
        ensure!(
            empty,
            "{} exists and is not empty: a snapshot goes into a new or empty directory",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ram = guest.ram_bytes;
    let mut f = std::fs::File::create(dir.join(RAM_FILE)).context("creating ram.bin")?;
    let mut h = Hasher::default();
    let mut page = vec![0u8; PAGE as usize];
    let mut data_pages = 0;
    for i in 0..ram / PAGE {
        mem.read_slice(&mut page, GuestAddress(i * PAGE))
            .context("reading guest RAM")?;
        h.update(&page);
        if page.iter().any(|&b| b != 0) {
            f.seek(SeekFrom::Start(i * PAGE))?;
            f.write_all(&page).context("writing ram.bin")?;
            data_pages += 1;
        }
    }
    f.set_len(ram).context("sizing ram.bin")?;
    f.sync_all().context("syncing ram.bin")?;
    let disk = {
        use std::os::unix::fs::MetadataExt;
        f.metadata()?.blocks() * 512
    };
    std::fs::write(dir.join(VGPU_FILE), vgpu_bytes).context("writing vgpu.bin")?;
    machine.vmm.console.truncate(10_000);
    let manifest = Manifest {
        format: FORMAT.to_string(),
        version: VERSION,
        created_by: format!("gpuvm {}", env!("CARGO_PKG_VERSION")),
        trigger,
        ram: RamInfo {
            size: ram,
            page_size: PAGE,
            file: RAM_FILE.to_string(),
            data_pages,
            hash: h.finish(),
        },
        guest,
        machine,
        vgpu_file: VGPU_FILE.to_string(),
    };
    let text = serde_json::to_vec_pretty(&manifest)?;
    let tmp = dir.join("manifest.json.tmp");
    std::fs::write(&tmp, &text).context("writing the manifest")?;
    std::fs::rename(&tmp, dir.join(MANIFEST)).context("renaming the manifest into place")?;
    Ok(Written {
        dir: dir.to_path_buf(),
        ram_bytes: ram,
        data_pages,
        ram_file_disk_bytes: disk,
        manifest_bytes: text.len() as u64,
        write_ns: t0.elapsed().as_nanos() as u64,
    })
}

/// A snapshot directory, its manifest read and checked (RAM and device bytes are read by
/// [`Loaded::load_ram`] and [`Loaded::vgpu_bytes`]).
#[derive(Debug)]
pub struct Loaded {
    /// The directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

impl Loaded {
    /// Reads and checks `DIR/manifest.json` (format, version, the file names it points at).
    pub fn open(dir: &Path) -> anyhow::Result<Loaded> {
        let path = dir.join(MANIFEST);
        let f = std::fs::File::open(&path).with_context(|| {
            format!(
                "{}: no snapshot here (an unfinished snapshot has no manifest)",
                path.display()
            )
        })?;
        let mut text = Vec::new();
        f.take(MAX_MANIFEST + 1).read_to_end(&mut text)?;
        ensure!(
            text.len() as u64 <= MAX_MANIFEST,
            "{}: larger than {MAX_MANIFEST} bytes",
            path.display()
        );
        // The format and version first, so an old or foreign file says what it is.
        #[derive(Deserialize)]
        struct Head {
            format: Option<String>,
            version: Option<u32>,
        }
        let head: Head = serde_json::from_slice(&text)
            .with_context(|| format!("{}: not a JSON manifest", path.display()))?;
        ensure!(
            head.format.as_deref() == Some(FORMAT),
            "{}: format {:?}, expected \"{FORMAT}\"",
            path.display(),
            head.format
        );
        ensure!(
            head.version == Some(VERSION),
            "{}: version {}; this gpuvm reads version {VERSION}",
            path.display(),
            head.version
                .map_or("missing".to_string(), |v| v.to_string())
        );
        let manifest: Manifest = serde_json::from_slice(&text)
            .with_context(|| format!("{}: invalid manifest", path.display()))?;
        let m = &manifest;
        ensure!(
            m.ram.file == RAM_FILE && m.vgpu_file == VGPU_FILE,
            "{}: unexpected file names",
            path.display()
        );
        ensure!(
            m.ram.page_size == PAGE
                && m.ram.size > 0
                && m.ram.size.is_multiple_of(PAGE)
                && m.ram.size == m.guest.ram_bytes
                && m.ram.size < abi::MMIO_HOLE,
            "{}: RAM of {:#x} bytes in pages of {} is not valid here",
            path.display(),
            m.ram.size,
            m.ram.page_size
        );
        ensure!(
            m.machine.vcpus.len() == 1,
            "{}: {} vCPUs (this VMM runs one)",
            path.display(),
            m.machine.vcpus.len()
        );
        Ok(Loaded {
            dir: dir.to_path_buf(),
            manifest,
        })
    }

    /// Reads the RAM file into `mem`, which must be fresh (all zero: only non-zero pages are
    /// written), and checks its length and hash.
    pub fn load_ram(&self, mem: &GuestMemoryMmap) -> anyhow::Result<()> {
        let ram = self.manifest.ram.size;
        let path = self.dir.join(RAM_FILE);
        let mut f =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let len = f.metadata()?.len();
        ensure!(
            len == ram,
            "{}: {len} bytes, the manifest says {ram} (truncated or damaged)",
            path.display()
        );
        ensure!(
            mem.last_addr().0 + 1 == ram,
            "guest RAM here is {:#x} bytes, the snapshot's {ram:#x}",
            mem.last_addr().0 + 1
        );
        let mut h = Hasher::default();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < ram {
            let n = (ram - at).min(buf.len() as u64) as usize;
            f.read_exact(&mut buf[..n])
                .with_context(|| format!("reading {}", path.display()))?;
            h.update(&buf[..n]);
            // Fresh guest RAM is zero: writing only the non-zero pages leaves the rest of it
            // unallocated (a 1 GiB guest with 47 non-zero pages stays small).
            for (i, page) in buf[..n].chunks(PAGE as usize).enumerate() {
                if page.iter().any(|&b| b != 0) {
                    mem.write_slice(page, GuestAddress(at + (i as u64) * PAGE))
                        .context("writing guest RAM")?;
                }
            }
            at += n as u64;
        }
        ensure!(
            h.finish() == self.manifest.ram.hash,
            "{}: hash {} is not the manifest's {} (damaged)",
            path.display(),
            h.finish(),
            self.manifest.ram.hash
        );
        Ok(())
    }

    /// The device's bytes (checked against the manifest by [`restore_device`]).
    pub fn vgpu_bytes(&self) -> anyhow::Result<Vec<u8>> {
        let path = self.dir.join(VGPU_FILE);
        let max = self.manifest.machine.vgpu.len;
        ensure!(
            max <= super::device_seam::MAX_VGPU_STREAM,
            "vGPU state of {max} bytes: too large"
        );
        let f =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let mut b = Vec::new();
        f.take(max + 1).read_to_end(&mut b)?;
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvm::device::VgpuDevice;
    use crate::kvm::device_seam::VGPU_KIND;
    use crate::kvm::migratable::MigratableVgpu;
    use crate::kvm::vcpu_state::Blob;
    use gpuvm::host::{GpuHost, HostConfig};
    use gpuvm_guest::hal::Bar;
    use gpuvm_sim::{SimConfig, SimGpu};
    use kvm_bindings::kvm_regs;
    use std::sync::Arc;

    fn cfg_read(d: &dyn VgpuDevice, off: u16) -> u32 {
        let mut b = [0u8; 4];
        d.config_read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn host() -> (Arc<SimGpu>, Arc<GpuHost>) {
        let sim = Arc::new(SimGpu::new(SimConfig {
            vram_size: 1 << 30,
            ..SimConfig::default()
        }));
        let host = Arc::new(GpuHost::new(sim.clone(), HostConfig::default()).unwrap());
        (sim, host)
    }

    fn ram() -> GuestMemoryMmap {
        ram_of(4 << 20)
    }

    fn ram_of(len: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len as usize)]).unwrap()
    }

    fn bar0_read(d: &dyn VgpuDevice, off: u64) -> u32 {
        let mut b = [0u8; 4];
        d.bar_read(Bar::Bar0, off, &mut b);
        u32::from_le_bytes(b)
    }

    // No KVM needed: the seam on the in-process device model, between two hosts.
    #[test]
    fn a_used_vgpu_comes_back_on_another_host_and_a_damaged_stream_is_refused() {
        let (sim, h) = host();
        let v = h
            .create_vgpu(&gpuvm::profile::VgpuProfile {
                name: "a".into(),
                vram_mib: 128,
                channels: 8,
                ..Default::default()
            })
            .unwrap();
        let a = MigratableVgpu::new(h.clone(), sim.clone(), v);
        a.attach_ram(&ram()).unwrap();
        // What a guest does: place the BARs, turn decoding and bus mastering on, then use
        // the device: write VRAM through BAR0's PRAMIN window.
        a.config_write(0x10, &0xcc00_0000u32.to_le_bytes());
        a.config_write(0x14, &0xc000_0000u32.to_le_bytes());
        a.config_write(0x3c, &[11]);
        a.config_write(0x04, &[0x06, 0x00]);
        assert_ne!(bar0_read(&a, 0), 0, "BOOT_0 reads the chip id");
        for i in 0..1024u64 {
            a.bar_write(
                Bar::Bar0,
                0x70_0000 + 4 * i,
                &(0xa5a5_0000 | i as u32).to_le_bytes(),
            );
        }
        assert!(a.stats().exits.total() > 1024);
        let bytes = a.save().unwrap();
        assert_eq!(a.kind(), VGPU_KIND);
        // Saved means quiesced; resume lets it go on (a snapshot that was not used).
        a.resume();
        assert_eq!(bar0_read(&a, 0x70_0000 + 4 * 7), 0xa5a5_0007);

        let (sim2, h2) = host();
        let b = MigratableVgpu::to_restore(h2.clone(), sim2.clone());
        assert!(b.vgpu().is_none() && b.live().is_err());
        let ram2 = ram();
        b.restore(&bytes, &ram2).unwrap();
        b.attach_ram(&ram2).unwrap();
        for off in (0..0x100).step_by(4) {
            assert_eq!(
                cfg_read(&b, off),
                cfg_read(&a, off),
                "config dword {off:#x}"
            );
        }
        for i in 0..1024u64 {
            assert_eq!(
                bar0_read(&b, 0x70_0000 + 4 * i),
                0xa5a5_0000 | i as u32,
                "VRAM word {i}"
            );
        }
        // Into a device that has one already: refused.
        let e = b.restore(&bytes, &ram2).unwrap_err().to_string();
        assert!(e.contains("not fresh"), "{e}");
        // A cut or foreign stream: refused, and the host is as before (no vGPU left on it).
        let before = h2.stats().vms;
        let c = MigratableVgpu::to_restore(h2.clone(), sim2.clone());
        let e = format!(
            "{:#}",
            c.restore(&bytes[..bytes.len() - 9], &ram2).unwrap_err()
        );
        assert!(e.contains("the vGPU's snapshot stream"), "{e}");
        assert!(c.vgpu().is_none());
        let e = format!("{:#}", c.restore(b"GPUVMSNX\x01\0\0\0", &ram2).unwrap_err());
        assert!(e.contains("the vGPU's snapshot stream"), "{e}");
        assert_eq!(h2.stats().vms, before);
        // Before its restore the device reads as absent, and the VMM cannot attach to it.
        assert_eq!(cfg_read(&c, 0), 0xffff_ffff);
        assert!(c.attach_ram(&ram2).is_err());
    }

    #[test]
    fn blobs_keep_their_bytes_and_refuse_other_lengths() {
        let r = kvm_regs {
            rip: 0x10_1234,
            rsp: 0x5f_fff8,
            ..Default::default()
        };
        let b = Blob::of(&r);
        assert_eq!(b.get::<kvm_regs>("regs").unwrap(), r);
        let short = Blob(b.0[..b.0.len() - 2].to_string());
        let e = short.get::<kvm_regs>("regs").unwrap_err().to_string();
        assert!(e.contains("expected 144"), "{e}");
        assert!(Blob("zz".into()).get::<u8>("x").is_err());
    }

    #[test]
    fn a_memfd_with_holes_hashes_as_the_same_bytes_in_anonymous_memory() {
        const RAM: u64 = 8 << 20;
        let shared = crate::kvm::shared_ram::memfd_ram(RAM).unwrap();
        let anon = ram_of(RAM);
        // Data at the start, in the middle of the first MiB, across a MiB boundary and in the
        // last page; holes everywhere else (never written in the memfd).
        for (gpa, byte) in [
            (0u64, 1u8),
            (0x8_1000, 2),
            ((1 << 20) - 4096, 3),
            (RAM - 8, 4),
        ] {
            for m in [&shared, &anon] {
                m.write_slice(&[byte; 8], GuestAddress(gpa)).unwrap();
            }
        }
        let h = ram_hash(&anon, RAM).unwrap();
        assert_eq!(ram_hash(&shared, RAM).unwrap(), h);
        // And a byte written into a hole is seen.
        shared.write_slice(&[9], GuestAddress(5 << 20)).unwrap();
        assert_ne!(ram_hash(&shared, RAM).unwrap(), h);
    }

    #[test]
    fn the_hash_sees_one_changed_byte_and_the_length() {
        let mut a = vec![0u8; 8192];
        let h0 = {
            let mut h = Hasher::default();
            h.update(&a);
            h.finish()
        };
        a[4097] = 1;
        let mut h = Hasher::default();
        h.update(&a);
        assert_ne!(h.finish(), h0);
        let mut h = Hasher::default();
        h.update(&a[..4096]);
        let mut g = Hasher::default();
        g.update(&a[..4096]);
        g.update(&[]);
        assert_eq!(h.finish(), g.finish());
        let mut z = Hasher::default();
        z.update(&[0u8; 4096]);
        assert_ne!(z.finish(), h0, "length is part of the hash");
    }
}
