//! PVH boot: the same guest program started by a PVH loader (Cloud Hypervisor, Firecracker,
//! QEMU, or `gpuvm run --kvm --pvh`) instead of the KVM VMM's direct ring-3 start.
//!
//! A PVH loader finds the entry in the ELF note "Xen" of type `XEN_ELFNOTE_PHYS32_ENTRY` (18)
//! and enters it in 32-bit protected mode, paging off, with `%ebx` = the guest-physical address
//! of `hvm_start_info` (magic 0x336ec578, version 1: command line and memory map). The stub
//! below, still in assembly, builds identity page tables for the first 4 GiB (2 MiB pages, user
//! bit), a GDT with ring-3 code and data and a TSS (ring-0 stack for interrupts, an I/O bitmap
//! allowing every port), an empty IDT, enables long mode and leaves ring 0 with `iretq` into
//! [`gpuvm_pvh_main`] in **ring 3**. Why ring 3: on a PVM host (this project's machines) guest
//! ring-0 code is interpreted by KVM's instruction emulator, which has no SSE — and compiled
//! Rust uses SSE everywhere — while ring-3 code runs natively. On a VT-x/AMD-V host ring 3 is
//! just as good. So nothing before the `iretq` may use SSE or any instruction the emulator
//! lacks; everything after it is the ring-3 program the KVM VMM runs.
//!
//! [`gpuvm_pvh_main`] fills in the boot-parameter block the VMM would have written (RAM from the
//! memory map, heap and DMA halves, size, workloads and interrupt mode from the command line,
//! TSC from CPUID) and then runs the very `run` of the ring-3 path.
//!
//! Command line: `size=N`, `workloads=a,b,...` (names as `Workload::name`), `irq=MODE` with
//! MODE `poll` (default), `intx` (the vGPU's INTx on every IOAPIC pin from 5 up: a loader such
//! as Cloud Hypervisor names the pin only in ACPI, which this program does not read),
//! `intx:GSI` (that one pin) or `msi` (the vGPU's MSI capability, programmed by the program),
//! and `tsc_khz=N` (else the TSC is measured against the ACPI PM timer).
//!
//! Differences from the VMM path, all behind [`active`]: the vGPU's BARs stay where the VMM's
//! firmware-less PCI setup put them (read, identity-mapped above 4 GiB if needed, not moved;
//! placed by the program as on the VMM path if the loader left them unprogrammed);
//! the results go to the serial console as well as the results block, and the program stops
//! with a write to the exit port (`gpuvm run --kvm` stops there), an ACPI S5 write to port
//! 0x600 (Cloud Hypervisor's shutdown device), then an i8042 reset (`out 0x64, 0xfe`,
//! Firecracker).

use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

use gpuvm_guest::hal::Bar;
use gpuvm_guest::workloads::Workload;

use crate::{abi, cfg_read, cfg_write, outb, rd32, rd64, wr32, wr64, wr8, Bars, Serial};

/// `hvm_start_info.magic` ("xEn3" with the top bit of the last byte set).
const HVM_START_MAGIC: u32 = 0x336e_c578;
/// Memory-map entry type: usable RAM.
const E820_RAM: u32 = 1;
/// Cloud Hypervisor's ACPI shutdown port and the S5 value it accepts (SLP_TYP 5, SLP_EN).
const ACPI_SHUTDOWN_PORT: u16 = 0x600;
const ACPI_S5: u8 = (5 << 2) | (1 << 5);
/// i8042 command port and its "pulse reset line" command.
const I8042_CMD: u16 = 0x64;
const I8042_RESET: u8 = 0xfe;
/// Page-table entry bits: present, writable, user (ring 3 walks every level), 2 MiB page.
const PTE_P_RW_US: u64 = 0x7;
const PTE_PS: u64 = 0x80;
/// Offset of the I/O permission bitmap in the TSS (right after the 104-byte 64-bit TSS).
const IOPB_OFFSET: u64 = 0x68;
/// TSS limit: the TSS and a bitmap for all 65536 ports; the terminator byte sits at the limit.
const TSS_LIMIT: u64 = IOPB_OFFSET + 65536 / 8;

// The note, the 32-bit entry, the system tables and the switch to ring 3.
//
// Layout of what the stub builds (all inside this image, so nothing depends on what the loader
// put in low memory):
// * GDT (`.data`, writable: `ltr` sets the TSS descriptor's busy bit): the selectors of
//   `abi.rs` — 0x08 kernel code, 0x10 kernel data, 0x18|3 user data, 0x20|3 user code, 0x28 the
//   16-byte 64-bit TSS descriptor (filled in at run time: its base is a link-time address the
//   assembler cannot split into descriptor fields).
// * TSS (`.bss`): RSP0 and IST1 = `abi::IST_TOP` (the stack an interrupt arrives on), the I/O
//   permission bitmap right after the 104-byte TSS, all zeros = every port allowed, and the
//   all-ones terminator byte. PVM runs ring 3 with the hardware IOPL forced to 0, so every
//   `in`/`out` from ring 3 faults into KVM's emulator, which allows it by this bitmap (the KVM
//   VMM's TSS is built the same way, `apps/gpuvm/src/kvm/cpu.rs`).
// * IDT (`.bss`): 256 empty gates; the Rust code installs the device's gate (DPL 3, ring-3 code
//   selector, IST1) at [`idt_base`].
// * Page tables (`.bss`): identity map of the first 4 GiB with 2 MiB pages, the user bit set at
//   every level so ring 3 reaches RAM, MMIO and the tables themselves (the Rust code adds
//   mappings above 4 GiB for BARs placed there).
core::arch::global_asm!(
    // PT_NOTE: name "Xen", type 18, a 32-bit physical entry address.
    ".pushsection .note.Xen, \"a\", @note",
    ".balign 4",
    ".long 4",
    ".long 4",
    ".long 18",
    ".asciz \"Xen\"",
    ".balign 4",
    ".long gpuvm_pvh_start",
    ".balign 4",
    ".popsection",
    ".pushsection .data.gpuvm_pvh_gdt, \"aw\"",
    ".balign 16",
    "gpuvm_pvh_gdt:",
    ".quad 0",                  // 0x00 null
    ".quad 0x00af9b000000ffff", // 0x08 kernel code, 64-bit
    ".quad 0x00cf93000000ffff", // 0x10 kernel data
    ".quad 0x00cff3000000ffff", // 0x18 user data (DPL 3)
    ".quad 0x00affb000000ffff", // 0x20 user code, 64-bit (DPL 3)
    "gpuvm_pvh_gdt_tss:",
    ".quad 0", // 0x28 TSS, low half (filled in below)
    ".quad 0", // 0x30 TSS, high half (base bits 63:32: 0, the image is below 4 GiB)
    "gpuvm_pvh_gdt_end:",
    ".balign 8",
    "gpuvm_pvh_gdt_ptr:",
    ".word gpuvm_pvh_gdt_end - gpuvm_pvh_gdt - 1",
    ".quad gpuvm_pvh_gdt",
    ".balign 8",
    "gpuvm_pvh_idt_ptr:",
    ".word 256 * 16 - 1",
    ".quad gpuvm_pvh_idt",
    ".popsection",
    // PML4, PDPT, 4 page directories (first 4 GiB), 8 spare tables for mappings above, the
    // IDT and the TSS with its I/O bitmap. All zeroed by the stub.
    ".pushsection .bss.gpuvm_pvh_tables, \"aw\", @nobits",
    ".balign 4096",
    ".global gpuvm_pvh_pml4",
    "gpuvm_pvh_pml4: .skip 4096",
    "gpuvm_pvh_pdpt: .skip 4096",
    "gpuvm_pvh_pd: .skip 4 * 4096",
    ".global gpuvm_pvh_spare",
    "gpuvm_pvh_spare: .skip 8 * 4096",
    ".global gpuvm_pvh_idt",
    "gpuvm_pvh_idt: .skip 4096",
    "gpuvm_pvh_tss: .skip {tss_limit} + 1",
    ".balign 16",
    "gpuvm_pvh_tables_end:",
    ".popsection",
    // 32-bit entry: %ebx = hvm_start_info. Keep it in %esi (rdmsr/wrmsr use eax, ecx, edx).
    // Ring 0 under PVM is interpreted by KVM's instruction emulator: only plain integer
    // instructions until the switch to ring 3 (no SSE, nothing the emulator lacks).
    ".pushsection .text.gpuvm_pvh, \"ax\"",
    ".code32",
    ".global gpuvm_pvh_start",
    "gpuvm_pvh_start:",
    "cli",
    "cld",
    "movl %ebx, %esi",
    // Zero every table.
    "movl $gpuvm_pvh_pml4, %edi",
    "movl $(gpuvm_pvh_tables_end - gpuvm_pvh_pml4) / 4, %ecx",
    "xorl %eax, %eax",
    "rep stosl",
    // PML4[0] -> PDPT; PDPT[0..4] -> the four PDs (present, writable, user).
    "movl $gpuvm_pvh_pdpt + 7, gpuvm_pvh_pml4",
    "movl $gpuvm_pvh_pd + 7, gpuvm_pvh_pdpt",
    "movl $gpuvm_pvh_pd + 4096 + 7, gpuvm_pvh_pdpt + 8",
    "movl $gpuvm_pvh_pd + 2 * 4096 + 7, gpuvm_pvh_pdpt + 16",
    "movl $gpuvm_pvh_pd + 3 * 4096 + 7, gpuvm_pvh_pdpt + 24",
    // 2048 2 MiB pages: entry i = i << 21 | PS | US | RW | P (the high dword is i >> 11).
    "movl $gpuvm_pvh_pd, %edi",
    "xorl %ecx, %ecx",
    "2:",
    "movl %ecx, %eax",
    "shll $21, %eax",
    "orl $0x87, %eax",
    "movl %eax, (%edi,%ecx,8)",
    "movl %ecx, %eax",
    "shrl $11, %eax",
    "movl %eax, 4(%edi,%ecx,8)",
    "incl %ecx",
    "cmpl $2048, %ecx",
    "jne 2b",
    // CR4 = PAE | OSFXSR | OSXMMEXCPT (compiled code uses SSE, in ring 3), CR3 = PML4.
    "movl $0x620, %eax",
    "movl %eax, %cr4",
    "movl $gpuvm_pvh_pml4, %eax",
    "movl %eax, %cr3",
    // EFER.LME.
    "movl $0xc0000080, %ecx",
    "rdmsr",
    "orl $0x100, %eax",
    "wrmsr",
    // CR0 = PE | MP | ET | NE | WP | PG.
    "movl $0x80010033, %eax",
    "movl %eax, %cr0",
    "lgdt gpuvm_pvh_gdt_ptr",
    "ljmpl $0x08, $3f",
    ".code64",
    "3:",
    "movw $0x10, %ax",
    "movw %ax, %ds",
    "movw %ax, %es",
    "movw %ax, %ss",
    "xorw %ax, %ax",
    "movw %ax, %fs",
    "movw %ax, %gs",
    "movq ${ist_top}, %rsp",
    // TSS: RSP0 (+4) and IST1 (+0x24) = the interrupt stack; the I/O bitmap offset (+0x66);
    // the bitmap's terminator byte at the limit.
    "movl $gpuvm_pvh_tss, %edx",
    "movq ${ist_top}, %rax",
    "movq %rax, 4(%rdx)",
    "movq %rax, 0x24(%rdx)",
    "movw ${iopb}, 0x66(%rdx)",
    "movb $0xff, {tss_limit}(%rdx)",
    // TSS descriptor, low half: limit 15:0 | base 15:0 << 16 (first dword); base 23:16 |
    // type 9 (available 64-bit TSS) | present << 15 | base 31:24 << 24 (second dword). The
    // limit is below 64 KiB, so its bits 19:16 are 0.
    "movl %edx, %eax",
    "shll $16, %eax",
    "orl ${tss_limit}, %eax",
    "movl %eax, gpuvm_pvh_gdt_tss",
    "movl %edx, %eax",
    "shrl $16, %eax",
    "andl $0xff, %eax",
    "orl $0x8900, %eax",
    "movl %edx, %ecx",
    "andl $0xff000000, %ecx",
    "orl %ecx, %eax",
    "movl %eax, gpuvm_pvh_gdt_tss + 4",
    "movw ${sel_tss}, %ax",
    "ltr %ax",
    "lidt gpuvm_pvh_idt_ptr",
    // Into ring 3: data segments with DPL 3, then an iretq frame of SS, RSP, RFLAGS, CS, RIP.
    // RFLAGS = IOPL 3 | IF | bit 1: IF because ring 3 cannot `sti` under PVM (the device's
    // interrupt is masked at the IOAPIC or MSI until the program sets it up); IOPL 3 for hosts
    // that honour it (PVM does not: the TSS bitmap above covers it there). The stack pointer is
    // the one of a called function (STACK_TOP - 8, 16-byte aligned after the return address).
    "movw ${sel_user_ds}, %ax",
    "movw %ax, %ds",
    "movw %ax, %es",
    "pushq ${sel_user_ds}",
    "pushq ${stack_top} - 8",
    "pushq $0x3202",
    "pushq ${sel_user_cs}",
    "pushq $gpuvm_pvh_main",
    "movl %esi, %edi",
    "iretq",
    ".popsection",
    stack_top = const abi::STACK_TOP,
    ist_top = const abi::IST_TOP,
    iopb = const IOPB_OFFSET,
    tss_limit = const TSS_LIMIT,
    sel_tss = const abi::SEL_TSS,
    sel_user_ds = const abi::SEL_USER_DS,
    sel_user_cs = const abi::SEL_USER_CS,
    options(att_syntax),
);

extern "C" {
    static mut gpuvm_pvh_pml4: [u64; 512];
    static mut gpuvm_pvh_spare: [[u64; 512]; 8];
    static mut gpuvm_pvh_idt: [u64; 512];
}

/// Where the IDT is: the stub's own under PVH, the VMM's (`abi::IDT_ADDR`) otherwise.
pub fn idt_base() -> u64 {
    if active() {
        (&raw const gpuvm_pvh_idt) as u64
    } else {
        abi::IDT_ADDR
    }
}

/// True once the program was started through the PVH entry.
static PVH: AtomicBool = AtomicBool::new(false);

/// Whether this boot came through the PVH entry (its own tables, loader-placed BARs).
pub fn active() -> bool {
    PVH.load(Ordering::Relaxed)
}

/// What the PVH start info says.
struct StartInfo {
    /// The RAM range holding the heap start: (start, end).
    ram: Option<(u64, u64)>,
    cmdline: u64,
}

fn start_info(addr: u64) -> Option<StartInfo> {
    if rd32(addr) != HVM_START_MAGIC {
        return None;
    }
    let version = rd32(addr + 4);
    let cmdline = rd64(addr + 24);
    let mut ram = None;
    if version >= 1 {
        let map = rd64(addr + 40);
        let entries = rd32(addr + 48).min(128) as u64;
        for i in 0..entries {
            let e = map + 24 * i;
            let (base, size, kind) = (rd64(e), rd64(e + 8), rd32(e + 16));
            let end = base.saturating_add(size);
            if kind == E820_RAM && base <= abi::HEAP_BASE && end > abi::HEAP_BASE {
                ram = Some((base, end));
            }
        }
    }
    Some(StartInfo { ram, cmdline })
}

/// The command line (at most 1 KiB) as bytes, up to its NUL.
fn cmdline(addr: u64, buf: &mut [u8; 1024]) -> &[u8] {
    if addr == 0 {
        return &[];
    }
    let mut n = 0;
    while n < buf.len() {
        // SAFETY: the loader's command line, identity-mapped guest RAM, NUL-terminated.
        let b = unsafe { core::ptr::read_volatile((addr + n as u64) as *const u8) };
        if b == 0 {
            break;
        }
        buf[n] = b;
        n += 1;
    }
    &buf[..n]
}

fn parse_u32(s: &[u8]) -> Option<u32> {
    let s = core::str::from_utf8(s).ok()?;
    s.parse().ok()
}

/// How the program waits for fences (the command line's `irq=`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Irq {
    /// Polling.
    Poll,
    /// INTx on one IOAPIC pin, or on every pin from 5 up (`None`).
    Intx(Option<u32>),
    /// MSI.
    Msi,
}

/// The IDT vector of the vGPU's interrupt (the KVM VMM uses the same).
const IRQ_VECTOR: u32 = 0x40;

fn parse_irq(v: &[u8]) -> Option<Irq> {
    match v {
        b"poll" => Some(Irq::Poll),
        b"intx" => Some(Irq::Intx(None)),
        b"msi" => Some(Irq::Msi),
        _ => {
            let gsi = parse_u32(v.strip_prefix(b"intx:")?)?;
            (gsi < 24).then_some(Irq::Intx(Some(gsi)))
        }
    }
}

/// What the command line says.
struct Options {
    size: u32,
    list: [u8; abi::MAX_WORKLOADS],
    n: usize,
    irq: Irq,
    /// `tsc_khz=N`: the TSC frequency, from a loader that knows it (0: find out).
    tsc_khz: u64,
}

/// `size=N`, `workloads=a,b,...` (names as `Workload::name`), `irq=...` and `tsc_khz=N` from the
/// command line.
fn options(line: &[u8]) -> Options {
    let (mut size, mut list, mut n) = (64u32, [0u8; abi::MAX_WORKLOADS], 0usize);
    let mut irq = Irq::Poll;
    let mut tsc_khz = 0;
    list[0] = 0; // Workload::ALL[0], madd
    let mut any = false;
    for word in line.split(|&b| b == b' ') {
        if let Some(v) = word.strip_prefix(b"size=") {
            size = parse_u32(v).unwrap_or(size);
        } else if let Some(v) = word.strip_prefix(b"tsc_khz=") {
            tsc_khz = parse_u32(v).map_or(0, u64::from);
        } else if let Some(v) = word.strip_prefix(b"irq=") {
            match parse_irq(v) {
                Some(i) => irq = i,
                None => {
                    let _ = writeln!(
                        Serial,
                        "pvh: ignoring irq={:?} (poll, intx, intx:GSI or msi)",
                        core::str::from_utf8(v)
                    );
                }
            }
        } else if let Some(v) = word.strip_prefix(b"workloads=") {
            for name in v.split(|&b| b == b',') {
                let idx = Workload::ALL
                    .iter()
                    .position(|w| w.name().as_bytes() == name);
                match idx {
                    Some(i) if n < abi::MAX_WORKLOADS => {
                        list[n] = i as u8;
                        n += 1;
                        any = true;
                    }
                    _ => {
                        let _ = writeln!(
                            Serial,
                            "pvh: ignoring workload {:?}",
                            core::str::from_utf8(name)
                        );
                    }
                }
            }
        }
    }
    if !any {
        n = 1;
    }
    Options {
        size,
        list,
        n,
        irq,
        tsc_khz,
    }
}

/// ACPI PM timer port of Cloud Hypervisor (3.579545 MHz, at least 24 bits).
const PM_TIMER_PORT: u16 = 0x608;
const PM_TIMER_HZ: u64 = 3_579_545;

/// TSC frequency in kHz: from the hypervisor leaf 0x40000010 (KVM-based VMMs fill it in when
/// the host's TSC is invariant), else measured against the ACPI PM timer over 10 ms (Cloud
/// Hypervisor has one at port 0x608; on this project's PVM hosts the leaf is absent; the median
/// of five), else 0
/// (the program then assumes 1 GHz).
fn tsc_khz() -> u64 {
    let max = core::arch::x86_64::__cpuid(0x4000_0000).eax;
    if max >= 0x4000_0010 {
        let khz = u64::from(core::arch::x86_64::__cpuid(0x4000_0010).eax);
        if khz != 0 {
            return khz;
        }
    }
    // Five 10 ms measurements, the median: a vCPU descheduled between a timer read and its
    // TSC read skews one measurement, not the median.
    let mut khz = [0u64; 5];
    for k in khz.iter_mut() {
        *k = pm_timer_khz();
        if *k == 0 {
            return 0;
        }
    }
    khz.sort_unstable();
    khz[2]
}

/// One measurement of the TSC against the ACPI PM timer over 10 ms (0: no timer).
fn pm_timer_khz() -> u64 {
    let pm = || u64::from(crate::inl(PM_TIMER_PORT)) & 0xff_ffff;
    let ticks = PM_TIMER_HZ / 100;
    let (p0, t0) = (pm(), crate::rdtsc());
    // A port nobody decodes reads all-ones and never moves: give up after a few reads.
    let mut reads = 0u32;
    loop {
        let p = pm();
        let t = crate::rdtsc();
        reads += 1;
        let elapsed = p.wrapping_sub(p0) & 0xff_ffff;
        if elapsed >= ticks {
            return (t - t0) * PM_TIMER_HZ / elapsed / 1000;
        }
        if elapsed == 0 && reads > 1000 {
            return 0;
        }
    }
}

/// Identity-maps `[base, base + len)` with 2 MiB pages, taking tables from the spare pool for
/// addresses above the first 4 GiB; false if the pool ran out.
///
/// Runs in ring 3: the tables carry the user bit, so the program writes them like any RAM, but
/// it cannot reload CR3. None is needed: the first 4 GiB are rewritten with the entries they
/// already hold, and above that only entries that were not present are filled in, which no TLB
/// or paging-structure cache holds (a shadow-paging host sees the write to its write-protected
/// table and updates its shadow).
fn map_identity(base: u64, len: u64) -> bool {
    static mut USED: usize = 0;
    let mut a = base & !((2 << 20) - 1);
    while a < base.saturating_add(len) {
        // SAFETY: the tables are this program's own (.bss), reached identity-mapped with the
        // user bit; single-threaded, the interrupt handler does not touch them.
        unsafe {
            let pml4 = &raw mut gpuvm_pvh_pml4;
            let next = || -> Option<u64> {
                let spare = &raw mut gpuvm_pvh_spare;
                let i = USED;
                if i >= (*spare).len() {
                    return None;
                }
                USED += 1;
                Some((*spare)[i].as_mut_ptr() as u64)
            };
            let l4 = &mut (*pml4)[(a >> 39) as usize & 511];
            if *l4 & 1 == 0 {
                let Some(t) = next() else { return false };
                *l4 = t | PTE_P_RW_US;
            }
            let pdpt = (*l4 & !0xfff) as *mut u64;
            let l3 = &mut *pdpt.add((a >> 30) as usize & 511);
            if *l3 & 1 == 0 {
                let Some(t) = next() else { return false };
                *l3 = t | PTE_P_RW_US;
            }
            let pd = (*l3 & !0xfff) as *mut u64;
            *pd.add((a >> 21) as usize & 511) = a | PTE_PS | PTE_P_RW_US;
        }
        a += 2 << 20;
    }
    true
}

/// The vGPU's BARs as the VMM placed them (a PVH VMM such as Cloud Hypervisor assigns BARs
/// itself: no firmware to re-program them), identity-mapped; I/O and memory decoding and bus
/// mastering enabled. `None` if BAR0 is unprogrammed (address 0): the loader placed nothing.
pub fn firmware_bars(dev: u8) -> Option<Bars> {
    if cfg_read(dev, 0x10) & !0xf == 0 {
        return None;
    }
    let mut bars = Bars {
        bar0: 0,
        bar1: 0,
        bar3: 0,
    };
    for (slot, bar) in [(0u8, Bar::Bar0), (1, Bar::Bar1), (3, Bar::Bar3)] {
        let size = bar.size();
        let off = 0x10 + slot * 4;
        let lo = cfg_read(dev, off);
        let mut addr = u64::from(lo & !0xf);
        if (lo >> 1) & 3 == 2 {
            addr |= u64::from(cfg_read(dev, off + 4)) << 32;
        }
        let mapped = map_identity(addr, size);
        let _ = writeln!(
            Serial,
            "BAR{slot}: {} MiB at {addr:#x} (placed by the VMM){}",
            size >> 20,
            if mapped { "" } else { ", NOT MAPPED" }
        );
        match slot {
            0 => bars.bar0 = addr,
            1 => bars.bar1 = addr,
            _ => bars.bar3 = addr,
        }
    }
    // BAR5, the I/O window: the phase markers' second port (see `crate::phase`).
    let bar5 = cfg_read(dev, 0x24);
    if bar5 & 1 == 1 && bar5 & !3 != 0 && bar5 & !3 <= 0xffff {
        crate::MARK_PORT.store(u64::from(bar5 & !3), Ordering::Relaxed);
        let _ = writeln!(Serial, "BAR5: I/O at {:#x} (phase markers)", bar5 & !3);
    }
    // I/O, memory decoding and bus mastering.
    cfg_write(dev, 4, cfg_read(dev, 4) | 0x7);
    Some(bars)
}

/// Stops the VM: the exit port (`gpuvm run --kvm` stops the vCPU there; other VMMs ignore the
/// port), ACPI S5 (Cloud Hypervisor), then — should the VM still run a few seconds later — an
/// i8042 reset (Firecracker). Ring 3 cannot `hlt`: it spins.
pub fn shutdown(code: u32) -> ! {
    let _ = writeln!(Serial, "gpuvm guest: exit code {code}");
    crate::outl(abi::PORT_EXIT, code);
    outb(ACPI_SHUTDOWN_PORT, ACPI_S5);
    let start = crate::rdtsc();
    while crate::rdtsc().wrapping_sub(start) < 1 << 33 {
        core::hint::spin_loop();
    }
    outb(I8042_CMD, I8042_RESET);
    loop {
        core::hint::spin_loop();
    }
}

/// The 64-bit entry of a PVH boot: writes the boot parameters from `hvm_start_info` and runs the
/// program.
#[no_mangle]
extern "C" fn gpuvm_pvh_main(start: u64) -> ! {
    PVH.store(true, Ordering::Relaxed);
    let Some(info) = start_info(start) else {
        let _ = writeln!(Serial, "pvh: no hvm_start_info at {start:#x}");
        shutdown(abi::EXIT_PANIC);
    };
    let Some((_, ram_end)) = info.ram else {
        let _ = writeln!(
            Serial,
            "pvh: no RAM at {:#x} in the memory map",
            abi::HEAP_BASE
        );
        shutdown(abi::EXIT_PANIC);
    };
    let mut buf = [0u8; 1024];
    let line = cmdline(info.cmdline, &mut buf);
    let Options {
        size,
        list,
        n,
        irq,
        tsc_khz: given_khz,
    } = options(line);
    // The memory map is read: the boot-parameter block may now overwrite it (0x7000).
    let ram_end = ram_end.min(4 << 30);
    let heap = ((ram_end - abi::HEAP_BASE) / 2) & !((2 << 20) - 1);
    let bp = |o: u64| abi::BOOT_PARAMS + o;
    // The loader's memory map may lie under the block: clear every field first.
    for o in (0..abi::BP_END).step_by(8) {
        wr64(bp(o), 0);
    }
    wr64(bp(abi::BP_MAGIC), abi::MAGIC);
    wr32(bp(abi::BP_MODE), abi::MODE_NORMAL);
    wr32(bp(abi::BP_SIZE), size);
    wr32(bp(abi::BP_FENCE_MODE), u32::from(irq != Irq::Poll));
    wr32(bp(abi::BP_IRQ_VECTOR), IRQ_VECTOR);
    let (gsi, msi) = match irq {
        Irq::Intx(Some(gsi)) => (gsi, 0),
        Irq::Intx(None) => (abi::IRQ_GSI_ALL, 0),
        Irq::Msi => (0, 1),
        Irq::Poll => (0, 0),
    };
    wr32(bp(abi::BP_IRQ_GSI), gsi);
    wr32(bp(abi::BP_IRQ_MSI), msi);
    wr32(bp(abi::BP_NWORKLOADS), n as u32);
    for (i, &w) in list[..n].iter().enumerate() {
        wr8(bp(abi::BP_WORKLOADS) + i as u64, w);
    }
    wr64(
        bp(abi::BP_TSC_KHZ),
        if given_khz != 0 { given_khz } else { tsc_khz() },
    );
    wr64(bp(abi::BP_HEAP_BASE), abi::HEAP_BASE);
    wr64(bp(abi::BP_HEAP_SIZE), heap);
    wr64(bp(abi::BP_DMA_BASE), abi::HEAP_BASE + heap);
    wr64(bp(abi::BP_DMA_SIZE), ram_end - abi::HEAP_BASE - heap);
    wr64(bp(abi::BP_MMIO_BASE), 0);
    wr32(bp(abi::BP_CALIBRATE), 0);
    let _ = writeln!(
        Serial,
        "gpuvm guest: PVH boot, now in ring 3, RAM to {ram_end:#x}, command line {:?}",
        core::str::from_utf8(line).unwrap_or("?")
    );
    let boot = crate::read_boot();
    let code = crate::run(&boot);
    shutdown(code)
}
