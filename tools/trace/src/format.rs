//! The trace file format: Linux mmiotrace text (`VERSION 20070824`) plus documented gpuvm side
//! records carried in `MARK` lines. The full specification is `docs/trace-format.md`; in short:
//!
//! ```text
//! VERSION 20070824
//! PCIDEV 0100 10de06d8 b f0000000 c000000c 0 c800000c 0 d001 0 2000000 8000000 0 4000000 0 80 0 gpuvm
//! MARK 0.000000 gpuvm-header format=1 vm=0 vms=2 session=... name=vm0 vram_mib=64 ...
//! MAP 0.000000 0 0xf0000000 0x0 0x2000000 0x0 0
//! R 4 0.000000 0 0xf0000000 0xc0000a3 0x1 0          <- width secs.usecs map addr value seq pid
//! W 4 0.000012 0 0xf0000200 0xffffffff 0x2 0
//! MARK 0.000012 gpuvm-clock 0x3 12000                 <- the clock moved to 12000 ns
//! MARK 0.000012 gpuvm-poll 0x4                        <- the VM polled the device model
//! MARK 0.000012 gpuvm-irq 0x5 1                       <- the driver saw its interrupt line high
//! MARK 0.000012 gpuvm-dmaw 0x6 0x10000 00a0ff...      <- the driver wrote guest RAM
//! MARK 0.000012 gpuvm-dmar 0x7 0x10000 00a0ff...      <- the driver read guest RAM (and got this)
//! MARK 0.000012 gpuvm-phase madd begin                <- informational
//! ```
//!
//! The `pc` field of `R`/`W` lines (the kernel puts the instruction pointer there; mmiotrace
//! tools ignore it) holds the access's *global sequence number*: one counter for every VM of a
//! recording session, so traces of VMs recorded together can be merged back into the order the
//! device model saw. Side records carry the same number right after their tag.

use std::fmt::Write as _;

use gf100::pci::Bar;

use gpuvm::profile::{ShadowMode, VgpuProfile};

/// The mmiotrace format version this file follows.
pub const MMIOTRACE_VERSION: &str = "20070824";
/// The version of the gpuvm side records (`format=` in the header).
pub const GPUVM_FORMAT: u32 = 1;
/// Prefix of every gpuvm side record's text in a `MARK` line.
pub const MARK_PREFIX: &str = "gpuvm-";
/// Most bytes of guest RAM one `gpuvm-dmaw` / `gpuvm-dmar` record carries (the kernel's
/// `trace_marker` accepts about 1 KiB per write; 512 bytes is 1 KiB of hex).
pub const DMA_CHUNK: usize = 512;

/// The bus addresses the trace places the vGPU's BARs at (what a VMM would typically assign;
/// the device model itself works with BAR offsets, so they only have to be consistent).
pub const BAR0_BASE: u64 = 0xf000_0000;
/// BAR1 bus address (64-bit prefetchable).
pub const BAR1_BASE: u64 = 0xc000_0000;
/// BAR3 bus address (64-bit prefetchable).
pub const BAR3_BASE: u64 = 0xc800_0000;
/// BAR5 I/O port base.
pub const BAR5_IO: u64 = 0xd000;

/// BAR base (bus address) of `bar`.
pub fn bar_base(bar: Bar) -> u64 {
    match bar {
        Bar::Bar0 => BAR0_BASE,
        Bar::Bar1 => BAR1_BASE,
        Bar::Bar3 => BAR3_BASE,
    }
}

/// The mmiotrace map id used for `bar` (its BAR index).
pub fn map_id(bar: Bar) -> u32 {
    match bar {
        Bar::Bar0 => 0,
        Bar::Bar1 => 1,
        Bar::Bar3 => 3,
    }
}

/// The trace's description of the VM and the host it ran on (`gpuvm-header`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The VM's id in the recording session (creation order, from 0).
    pub vm: u32,
    /// Number of VMs recorded in the same session.
    pub vms: u32,
    /// Identifies the recording session (traces merge only with traces of the same session).
    pub session: String,
    /// The vGPU profile.
    pub profile: VgpuProfile,
    /// Guest RAM size, bytes (mapped at GPA 0).
    pub guest_ram: u64,
    /// VRAM of the physical GPU, bytes.
    pub phys_vram: u64,
    /// Host setting: hypervisor VRAM, bytes.
    pub hypervisor_vram: u64,
    /// Host setting: DMA window per VM, bytes.
    pub iova_window: u64,
    /// Host setting: submissions in flight at most.
    pub max_inflight: usize,
    /// Free text describing how the trace was made (workloads, size, fence mode); no spaces.
    pub note: String,
}

impl Header {
    fn render(&self) -> String {
        let p = &self.profile;
        format!(
            "gpuvm-header format={GPUVM_FORMAT} vm={} vms={} session={} name={} vram_mib={} channels={} weight={} shadow={} guest_ram={:#x} phys_vram={:#x} hypervisor_vram={:#x} iova_window={:#x} max_inflight={} note={}",
            self.vm,
            self.vms,
            self.session,
            p.name,
            p.vram_mib,
            p.channels,
            p.weight,
            p.shadow,
            self.guest_ram,
            self.phys_vram,
            self.hypervisor_vram,
            self.iova_window,
            self.max_inflight,
            if self.note.is_empty() { "-" } else { &self.note },
        )
    }

    fn parse(text: &str) -> Result<Header, String> {
        let mut kv = std::collections::HashMap::new();
        for tok in text.split_ascii_whitespace() {
            let (k, v) = tok
                .split_once('=')
                .ok_or_else(|| format!("header field '{tok}' is not key=value"))?;
            if kv.insert(k, v).is_some() {
                return Err(format!("header field '{k}' given twice"));
            }
        }
        let get = |k: &str| kv.get(k).copied().ok_or(format!("header lacks '{k}'"));
        let num = |k: &str| -> Result<u64, String> {
            let v = get(k)?;
            parse_u64(v).ok_or(format!("header field {k}={v} is not a number"))
        };
        let format = num("format")?;
        if format != GPUVM_FORMAT as u64 {
            return Err(format!(
                "gpuvm trace format {format} (this build reads {GPUVM_FORMAT})"
            ));
        }
        let shadow: ShadowMode = get("shadow")?.parse()?;
        let note = get("note")?;
        Ok(Header {
            vm: num("vm")? as u32,
            vms: num("vms")? as u32,
            session: get("session")?.to_string(),
            profile: VgpuProfile {
                name: get("name")?.to_string(),
                vram_mib: num("vram_mib")?,
                channels: num("channels")? as u32,
                weight: num("weight")? as u32,
                shadow,
            },
            guest_ram: num("guest_ram")?,
            phys_vram: num("phys_vram")?,
            hypervisor_vram: num("hypervisor_vram")?,
            iova_window: num("iova_window")?,
            max_inflight: num("max_inflight")? as usize,
            note: if note == "-" {
                String::new()
            } else {
                note.to_string()
            },
        })
    }
}

/// What one trace line records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A BAR read of `width` bytes that returned `value`.
    Read {
        /// Which BAR.
        bar: Bar,
        /// Offset in the BAR.
        offset: u64,
        /// 1, 2, 4 or 8 bytes.
        width: u8,
        /// The value read (little-endian, `width` bytes).
        value: u64,
    },
    /// A BAR write.
    Write {
        /// Which BAR.
        bar: Bar,
        /// Offset in the BAR.
        offset: u64,
        /// 1, 2, 4 or 8 bytes.
        width: u8,
        /// The value written.
        value: u64,
    },
    /// The simulated clock moved to `ns` (absolute).
    Clock {
        /// Nanoseconds since the clock's epoch.
        ns: u64,
    },
    /// The VM let the device model service the GPU (`Vgpu::poll`).
    Poll,
    /// The driver looked at its interrupt line and saw it at this level.
    Irq {
        /// Asserted?
        asserted: bool,
    },
    /// The driver wrote guest RAM.
    DmaWrite {
        /// Guest-physical address.
        gpa: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// The driver read guest RAM and got these bytes.
    DmaRead {
        /// Guest-physical address.
        gpa: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// The VMM destroyed the VM here (`Vgpu` torn down, possibly with work in flight).
    Destroy,
    /// Informational marker (phase names, submissions); replay ignores it.
    Mark(String),
}

impl Op {
    /// True for a BAR write.
    pub fn is_write(&self) -> bool {
        matches!(self, Op::Write { .. })
    }
}

/// One event of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Line number in the file it was read from (1-based; 0 for events made in memory).
    pub line: usize,
    /// Global sequence number in the recording session (0 for informational marks).
    pub seq: u64,
    /// Simulated time of the event, ns (the file keeps microseconds; `Clock` records keep ns).
    pub time_ns: u64,
    /// What happened.
    pub op: Op,
}

/// A parsed trace: one VM's accesses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// VM and host description.
    pub header: Header,
    /// Events, in file order (which is sequence order).
    pub events: Vec<Event>,
}

/// A parse error, with the line it happened on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub msg: String,
}

fn parse_u64(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?, 16).ok()
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.is_empty() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Formats a time in ns as mmiotrace's `secs.usecs`.
pub fn fmt_time(ns: u64) -> String {
    let us = ns / 1000;
    format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
}

fn parse_time(s: &str) -> Option<u64> {
    let (secs, usecs) = s.split_once('.')?;
    if usecs.len() != 6 {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let usecs: u64 = usecs.parse().ok()?;
    Some((secs * 1_000_000 + usecs) * 1000)
}

/// The `PCIDEV` line of a vGPU in the kernel's layout: bus/devfn, vendor/device, irq, 7 resource
/// starts (ORed with the region flags), 7 resource sizes, driver name.
pub fn pcidev_line() -> String {
    use gf100::pci::{BAR0_SIZE, BAR1_SIZE, BAR3_SIZE, BAR5_SIZE, DEVICE_ID, VENDOR_ID};
    // 64-bit prefetchable memory BARs carry flags 0xc and leave the next slot 0; BAR5 is I/O.
    format!(
        "PCIDEV 0100 {VENDOR_ID:04x}{DEVICE_ID:04x} b {BAR0_BASE:x} {:x} 0 {:x} 0 {:x} 0 {BAR0_SIZE:x} {BAR1_SIZE:x} 0 {BAR3_SIZE:x} 0 {BAR5_SIZE:x} 0 gpuvm",
        BAR1_BASE | 0xc,
        BAR3_BASE | 0xc,
        BAR5_IO | 1,
    )
}

/// Which BAR a bus address falls in, and the offset.
pub fn classify(addr: u64) -> Option<(Bar, u64)> {
    use gf100::pci::{BAR0_SIZE, BAR1_SIZE, BAR3_SIZE};
    [
        (Bar::Bar0, BAR0_BASE, BAR0_SIZE),
        (Bar::Bar1, BAR1_BASE, BAR1_SIZE),
        (Bar::Bar3, BAR3_BASE, BAR3_SIZE),
    ]
    .into_iter()
    .find(|&(_, b, s)| addr >= b && addr - b < s)
    .map(|(bar, b, _)| (bar, addr - b))
}

/// Writes a trace as text.
pub fn write(trace: &Trace, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut s = String::with_capacity(64 * 1024);
    writeln!(s, "VERSION {MMIOTRACE_VERSION}").unwrap();
    writeln!(s, "{}", pcidev_line()).unwrap();
    writeln!(s, "MARK 0.000000 {}", trace.header.render()).unwrap();
    for bar in [Bar::Bar0, Bar::Bar1, Bar::Bar3] {
        writeln!(
            s,
            "MAP 0.000000 {} {:#x} 0x0 {:#x} 0x0 0",
            map_id(bar),
            bar_base(bar),
            bar.size()
        )
        .unwrap();
    }
    for e in &trace.events {
        let t = fmt_time(e.time_ns);
        match &e.op {
            Op::Read {
                bar,
                offset,
                width,
                value,
            }
            | Op::Write {
                bar,
                offset,
                width,
                value,
            } => {
                let c = if matches!(e.op, Op::Read { .. }) {
                    'R'
                } else {
                    'W'
                };
                writeln!(
                    s,
                    "{c} {width} {t} {} {:#x} {value:#x} {:#x} 0",
                    map_id(*bar),
                    bar_base(*bar) + offset,
                    e.seq
                )
                .unwrap();
            }
            Op::Clock { ns } => writeln!(s, "MARK {t} gpuvm-clock {:#x} {ns}", e.seq).unwrap(),
            Op::Poll => writeln!(s, "MARK {t} gpuvm-poll {:#x}", e.seq).unwrap(),
            Op::Destroy => writeln!(s, "MARK {t} gpuvm-destroy {:#x}", e.seq).unwrap(),
            Op::Irq { asserted } => {
                writeln!(s, "MARK {t} gpuvm-irq {:#x} {}", e.seq, *asserted as u8).unwrap()
            }
            Op::DmaWrite { gpa, data } | Op::DmaRead { gpa, data } => {
                let tag = if matches!(e.op, Op::DmaWrite { .. }) {
                    "dmaw"
                } else {
                    "dmar"
                };
                write!(s, "MARK {t} gpuvm-{tag} {:#x} {gpa:#x} ", e.seq).unwrap();
                for b in data {
                    write!(s, "{b:02x}").unwrap();
                }
                s.push('\n');
            }
            Op::Mark(text) => writeln!(s, "MARK {t} gpuvm-phase {text}").unwrap(),
        }
        if s.len() > 60 * 1024 {
            out.write_all(s.as_bytes())?;
            s.clear();
        }
    }
    out.write_all(s.as_bytes())
}

/// Renders a trace to a string.
pub fn to_string(trace: &Trace) -> String {
    let mut v = Vec::new();
    write(trace, &mut v).expect("writing to memory");
    String::from_utf8(v).expect("traces are ASCII")
}

/// Parses a trace. Strict: every line must be a known record with well-formed fields (errors
/// name the line); blank lines and lines starting with `#` are skipped; `LSPCI`, `MAP`, `UNMAP`
/// are checked for shape and otherwise ignored; `MARK` lines without the `gpuvm-` prefix are
/// kept as informational marks.
pub fn parse(text: &str) -> Result<Trace, ParseError> {
    let mut header = None;
    let mut version = false;
    let mut pcidev = false;
    let mut events = Vec::new();
    let mut last_seq = 0u64;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim_end();
        let err = |msg: String| ParseError { line, msg };
        if l.trim().is_empty() || l.trim_start().starts_with('#') {
            continue;
        }
        let f: Vec<&str> = l.split_ascii_whitespace().collect();
        if !version && f[0] != "VERSION" {
            return Err(err("the trace must start with 'VERSION 20070824'".into()));
        }
        let mut seq_check = |seq: u64| -> Result<(), ParseError> {
            if seq <= last_seq {
                return Err(err(format!(
                    "sequence number {seq:#x} does not increase (previous {last_seq:#x})"
                )));
            }
            last_seq = seq;
            Ok(())
        };
        match f[0] {
            "VERSION" => {
                if version {
                    return Err(err("second VERSION line".into()));
                }
                if f.len() != 2 || f[1] != MMIOTRACE_VERSION {
                    return Err(err(format!(
                        "unsupported version line '{l}' (expected VERSION {MMIOTRACE_VERSION})"
                    )));
                }
                version = true;
            }
            "PCIDEV" => {
                if f.len() < 18 {
                    return Err(err(format!(
                        "PCIDEV needs 17 fields after the tag, found {}",
                        f.len() - 1
                    )));
                }
                let id = u32::from_str_radix(f[2], 16)
                    .map_err(|_| err(format!("bad vendor/device '{}'", f[2])))?;
                if id >> 16 != gf100::pci::VENDOR_ID as u32 {
                    return Err(err(format!("PCIDEV {:08x} is not an NVIDIA device", id)));
                }
                let mut res = [0u64; 14];
                for (k, r) in res.iter_mut().enumerate() {
                    *r = u64::from_str_radix(f[4 + k], 16)
                        .map_err(|_| err(format!("bad PCIDEV resource '{}'", f[4 + k])))?;
                }
                let expect = [
                    (0, BAR0_BASE, Bar::Bar0),
                    (1, BAR1_BASE, Bar::Bar1),
                    (3, BAR3_BASE, Bar::Bar3),
                ];
                for (slot, base, bar) in expect {
                    if res[slot] & !0xf != base || res[7 + slot] != bar.size() {
                        return Err(err(format!(
                            "PCIDEV resource {slot} is {:#x}+{:#x}; gpuvm traces place {bar:?} at {base:#x}+{:#x}",
                            res[slot] & !0xf,
                            res[7 + slot],
                            bar.size()
                        )));
                    }
                }
                pcidev = true;
            }
            "LSPCI" => {}
            "MAP" => {
                if f.len() != 8 {
                    return Err(err(format!("MAP needs 7 fields, found {}", f.len() - 1)));
                }
            }
            "UNMAP" => {
                if f.len() != 5 {
                    return Err(err(format!("UNMAP needs 4 fields, found {}", f.len() - 1)));
                }
            }
            "R" | "W" => {
                if f.len() != 8 {
                    return Err(err(format!(
                        "{} needs 7 fields (width time map addr value pc pid), found {}",
                        f[0],
                        f.len() - 1
                    )));
                }
                let width: u8 = f[1]
                    .parse()
                    .ok()
                    .filter(|w| matches!(w, 1 | 2 | 4 | 8))
                    .ok_or_else(|| err(format!("bad width '{}' (1, 2, 4 or 8)", f[1])))?;
                let time_ns =
                    parse_time(f[2]).ok_or_else(|| err(format!("bad time '{}'", f[2])))?;
                let map: u32 = f[3]
                    .parse()
                    .map_err(|_| err(format!("bad map id '{}'", f[3])))?;
                let addr = parse_hex(f[4]).ok_or_else(|| err(format!("bad address '{}'", f[4])))?;
                let value = parse_hex(f[5]).ok_or_else(|| err(format!("bad value '{}'", f[5])))?;
                let seq = parse_hex(f[6]).ok_or_else(|| err(format!("bad pc '{}'", f[6])))?;
                let (bar, offset) = classify(addr)
                    .ok_or_else(|| err(format!("address {addr:#x} is in no BAR of PCIDEV")))?;
                if map != map_id(bar) {
                    return Err(err(format!(
                        "map id {map} but {addr:#x} is in {bar:?} (map {})",
                        map_id(bar)
                    )));
                }
                if width < 8 && value >> (width as u32 * 8) != 0 {
                    return Err(err(format!("value {value:#x} wider than {width} bytes")));
                }
                seq_check(seq)?;
                let op = if f[0] == "R" {
                    Op::Read {
                        bar,
                        offset,
                        width,
                        value,
                    }
                } else {
                    Op::Write {
                        bar,
                        offset,
                        width,
                        value,
                    }
                };
                events.push(Event {
                    line,
                    seq,
                    time_ns,
                    op,
                });
            }
            "MARK" => {
                if f.len() < 2 {
                    return Err(err("MARK without a time".into()));
                }
                let time_ns =
                    parse_time(f[1]).ok_or_else(|| err(format!("bad time '{}'", f[1])))?;
                let Some(tag) = f.get(2).and_then(|t| t.strip_prefix(MARK_PREFIX)) else {
                    // A foreign marker ("Lost N events", a user's note): keep it as information.
                    events.push(Event {
                        line,
                        seq: 0,
                        time_ns,
                        op: Op::Mark(f[2..].join(" ")),
                    });
                    continue;
                };
                let args = &f[3..];
                let nargs = |n: usize| -> Result<(), ParseError> {
                    if args.len() != n {
                        Err(err(format!(
                            "gpuvm-{tag} needs {n} fields, found {}",
                            args.len()
                        )))
                    } else {
                        Ok(())
                    }
                };
                let seq_of =
                    |s: &str| parse_hex(s).ok_or_else(|| err(format!("bad sequence number '{s}'")));
                let op = match tag {
                    "header" => {
                        if header.is_some() {
                            return Err(err("second gpuvm-header".into()));
                        }
                        header = Some(Header::parse(&args.join(" ")).map_err(err)?);
                        continue;
                    }
                    "phase" => {
                        events.push(Event {
                            line,
                            seq: 0,
                            time_ns,
                            op: Op::Mark(args.join(" ")),
                        });
                        continue;
                    }
                    "clock" => {
                        nargs(2)?;
                        let ns = args[1]
                            .parse()
                            .map_err(|_| err(format!("bad ns '{}'", args[1])))?;
                        (seq_of(args[0])?, Op::Clock { ns })
                    }
                    "poll" => {
                        nargs(1)?;
                        (seq_of(args[0])?, Op::Poll)
                    }
                    "destroy" => {
                        nargs(1)?;
                        (seq_of(args[0])?, Op::Destroy)
                    }
                    "irq" => {
                        nargs(2)?;
                        let asserted = match args[1] {
                            "0" => false,
                            "1" => true,
                            o => return Err(err(format!("bad irq level '{o}' (0 or 1)"))),
                        };
                        (seq_of(args[0])?, Op::Irq { asserted })
                    }
                    "dmaw" | "dmar" => {
                        nargs(3)?;
                        let gpa = parse_hex(args[1])
                            .ok_or_else(|| err(format!("bad gpa '{}'", args[1])))?;
                        let data =
                            hex_bytes(args[2]).ok_or_else(|| err("bad hex data".to_string()))?;
                        if data.len() > DMA_CHUNK {
                            return Err(err(format!(
                                "{} bytes in one record (at most {DMA_CHUNK})",
                                data.len()
                            )));
                        }
                        let op = if tag == "dmaw" {
                            Op::DmaWrite { gpa, data }
                        } else {
                            Op::DmaRead { gpa, data }
                        };
                        (seq_of(args[0])?, op)
                    }
                    other => return Err(err(format!("unknown gpuvm record 'gpuvm-{other}'"))),
                };
                seq_check(op.0)?;
                events.push(Event {
                    line,
                    seq: op.0,
                    time_ns,
                    op: op.1,
                });
            }
            "UNKNOWN" => {
                return Err(err(
                    "UNKNOWN record (an undecodable access) cannot be replayed".into(),
                ))
            }
            other => return Err(err(format!("unknown record '{other}'"))),
        }
    }
    let last = text.lines().count().max(1);
    if !pcidev {
        return Err(ParseError {
            line: last,
            msg: "no PCIDEV line".into(),
        });
    }
    let header = header.ok_or(ParseError {
        line: last,
        msg: "no 'MARK 0.000000 gpuvm-header ...' line".into(),
    })?;
    Ok(Trace { header, events })
}

/// Reads a trace file (`.gz` files are decompressed).
pub fn read_file(path: &std::path::Path) -> Result<Trace, String> {
    let text =
        crate::compress::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Trace {
        Trace {
            header: Header {
                vm: 1,
                vms: 2,
                session: "s1".into(),
                profile: VgpuProfile {
                    name: "vm1".into(),
                    vram_mib: 64,
                    channels: 8,
                    weight: 1,
                    shadow: ShadowMode::Pv,
                },
                guest_ram: 0x100_0000,
                phys_vram: 1 << 30,
                hypervisor_vram: 32 << 20,
                iova_window: 32 << 30,
                max_inflight: 4,
                note: "w=madd".into(),
            },
            events: vec![
                Event {
                    line: 0,
                    seq: 1,
                    time_ns: 0,
                    op: Op::Read {
                        bar: Bar::Bar0,
                        offset: 0,
                        width: 4,
                        value: 0xc0000a3,
                    },
                },
                Event {
                    line: 0,
                    seq: 0,
                    time_ns: 1000,
                    op: Op::Mark("madd begin".into()),
                },
                Event {
                    line: 0,
                    seq: 3,
                    time_ns: 1000,
                    op: Op::Write {
                        bar: Bar::Bar1,
                        offset: 0x108c,
                        width: 8,
                        value: u64::MAX,
                    },
                },
                Event {
                    line: 0,
                    seq: 4,
                    time_ns: 12_345_678,
                    op: Op::Clock { ns: 12_345_678 },
                },
                Event {
                    line: 0,
                    seq: 5,
                    time_ns: 12_345_678,
                    op: Op::Poll,
                },
                Event {
                    line: 0,
                    seq: 6,
                    time_ns: 12_345_678,
                    op: Op::Irq { asserted: true },
                },
                Event {
                    line: 0,
                    seq: 7,
                    time_ns: 12_345_000,
                    op: Op::DmaWrite {
                        gpa: 0x1000,
                        data: vec![1, 2, 0xff],
                    },
                },
                Event {
                    line: 0,
                    seq: 8,
                    time_ns: 12_345_000,
                    op: Op::DmaRead {
                        gpa: 0x2000,
                        data: vec![0; 16],
                    },
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let t = sample();
        let text = to_string(&t);
        assert!(text.starts_with("VERSION 20070824\nPCIDEV 0100 10de06d8 "));
        assert!(
            text.contains("\nR 4 0.000000 0 0xf0000000 0xc0000a3 0x1 0\n"),
            "{text}"
        );
        let back = parse(&text).unwrap();
        assert_eq!(back.header, t.header);
        assert_eq!(back.events.len(), t.events.len());
        for (a, b) in back.events.iter().zip(&t.events) {
            assert_eq!(a.op, b.op);
            assert_eq!(a.seq, b.seq);
            assert_eq!(a.time_ns / 1000, b.time_ns / 1000);
            assert!(a.line > 0);
        }
    }

    #[test]
    fn tolerant_of_comments_and_foreign_marks() {
        let text = to_string(&sample()).replace(
            "MAP 0.000000 0",
            "# a comment\n\nMARK 0.000000 Lost 0 events.\nMAP 0.000000 0",
        );
        let t = parse(&text).unwrap();
        assert!(t
            .events
            .iter()
            .any(|e| e.op == Op::Mark("Lost 0 events.".into())));
    }

    #[test]
    fn strict_with_line_numbers() {
        let good = to_string(&sample());
        let cases = [
            (
                "R 4 0.000000 0 0xf0000000 0xc0000a3 0x1 0",
                "R 3 0.000000 0 0xf0000000 0xc0000a3 0x1 0",
                "bad width",
            ),
            (
                "R 4 0.000000 0 0xf0000000 0xc0000a3 0x1 0",
                "R 4 0.000000 0 0x10 0xc0000a3 0x1 0",
                "in no BAR",
            ),
            (
                "R 4 0.000000 0 0xf0000000 0xc0000a3 0x1 0",
                "R 4 0.000000 1 0xf0000000 0xc0000a3 0x1 0",
                "map id",
            ),
            (
                "R 4 0.000000 0 0xf0000000 0xc0000a3 0x1 0",
                "R 4 0.000000 0 0xf0000000 0x1c0000a3a 0x1 0",
                "wider",
            ),
            ("gpuvm-poll 0x5", "gpuvm-poll 0x2", "does not increase"),
            ("gpuvm-poll 0x5", "gpuvm-pol 0x5", "unknown gpuvm record"),
            ("gpuvm-irq 0x6 1", "gpuvm-irq 0x6 2", "bad irq level"),
            (
                "VERSION 20070824",
                "VERSION 20080101",
                "unsupported version",
            ),
        ];
        for (from, to, msg) in cases {
            let bad = good.replacen(from, to, 1);
            assert_ne!(bad, good, "{from}");
            let e = parse(&bad).unwrap_err();
            assert!(e.msg.contains(msg), "{to}: {e}");
            let expect = good.lines().position(|l| l.contains(from)).unwrap() + 1;
            assert_eq!(e.line, expect, "{to}: {e}");
        }
        let e = parse("VERSION 20070824\nFOO\n").unwrap_err();
        assert_eq!((e.line, e.msg.contains("unknown record")), (2, true));
        assert!(parse(&good.replace("gpuvm-header", "gpuvm-phase x")).is_err());
    }
}
