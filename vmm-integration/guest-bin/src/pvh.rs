//! PVH boot: the same guest program started by a PVH loader (Cloud Hypervisor, Firecracker,
//! QEMU) instead of `gpuvm run --kvm`.
//!
//! A PVH loader finds the entry in the ELF note "Xen" of type `XEN_ELFNOTE_PHYS32_ENTRY` (18)
//! and enters it in 32-bit protected mode, paging off, with `%ebx` = the guest-physical address
//! of `hvm_start_info` (magic 0x336ec578, version 1: command line and memory map). The 32-bit
//! stub below builds identity page tables for the first 4 GiB (2 MiB pages), loads its own GDT,
//! enables long mode and jumps to 64-bit code, which runs [`gpuvm_pvh_main`] in ring 0 on the
//! stack the VMM path uses. That function fills in the boot-parameter block the VMM would have
//! written (RAM from the memory map, heap and DMA halves, size and workloads from the command
//! line, TSC from CPUID, fences by polling) and then runs the very `run` of the ring-3 path.
//!
//! Differences from the VMM path, all behind [`active`]: the vGPU's BARs stay where the VMM's
//! firmware-less PCI setup put them (read, identity-mapped above 4 GiB if needed, not moved);
//! the exit/phase ports do not exist, so results go to the serial console and the program stops
//! with an ACPI S5 write to port 0x600 (Cloud Hypervisor's shutdown device), then an i8042
//! reset (`out 0x64, 0xfe`, Firecracker), then `cli; hlt`. Ring 0 is native speed under VT-x;
//! on a PVM host it is interpreted (slow) — see docs/cloud-hypervisor.md.

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
/// Page-table entry bits: present, writable, 2 MiB page.
const PTE_P_RW: u64 = 0x3;
const PTE_PS: u64 = 0x80;

// The note, the 32-bit entry, the GDT and the page tables. Tables live in .bss (zeroed by the
// stub itself: a loader need not clear memsz beyond filesz).
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
    // GDT: null, 64-bit code (0x08), data (0x10).
    ".pushsection .rodata.gpuvm_pvh_gdt, \"a\"",
    ".balign 16",
    "gpuvm_pvh_gdt:",
    ".quad 0",
    ".quad 0x00af9b000000ffff",
    ".quad 0x00cf93000000ffff",
    "gpuvm_pvh_gdt_end:",
    ".balign 8",
    "gpuvm_pvh_gdt_ptr:",
    ".word gpuvm_pvh_gdt_end - gpuvm_pvh_gdt - 1",
    ".quad gpuvm_pvh_gdt",
    ".popsection",
    // PML4, PDPT, 4 page directories (first 4 GiB), 8 spare tables for mappings above.
    ".pushsection .bss.gpuvm_pvh_tables, \"aw\", @nobits",
    ".balign 4096",
    ".global gpuvm_pvh_pml4",
    "gpuvm_pvh_pml4: .skip 4096",
    "gpuvm_pvh_pdpt: .skip 4096",
    "gpuvm_pvh_pd: .skip 4 * 4096",
    ".global gpuvm_pvh_spare",
    "gpuvm_pvh_spare: .skip 8 * 4096",
    "gpuvm_pvh_tables_end:",
    ".popsection",
    // 32-bit entry: %ebx = hvm_start_info. Keep it in %esi (rdmsr/wrmsr use eax, ecx, edx).
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
    // PML4[0] -> PDPT; PDPT[0..4] -> the four PDs.
    "movl $gpuvm_pvh_pdpt + 3, gpuvm_pvh_pml4",
    "movl $gpuvm_pvh_pd + 3, gpuvm_pvh_pdpt",
    "movl $gpuvm_pvh_pd + 4096 + 3, gpuvm_pvh_pdpt + 8",
    "movl $gpuvm_pvh_pd + 2 * 4096 + 3, gpuvm_pvh_pdpt + 16",
    "movl $gpuvm_pvh_pd + 3 * 4096 + 3, gpuvm_pvh_pdpt + 24",
    // 2048 2 MiB pages: entry i = i << 21 | PS | RW | P (the high dword is i >> 11).
    "movl $gpuvm_pvh_pd, %edi",
    "xorl %ecx, %ecx",
    "2:",
    "movl %ecx, %eax",
    "shll $21, %eax",
    "orl $0x83, %eax",
    "movl %eax, (%edi,%ecx,8)",
    "movl %ecx, %eax",
    "shrl $11, %eax",
    "movl %eax, 4(%edi,%ecx,8)",
    "incl %ecx",
    "cmpl $2048, %ecx",
    "jne 2b",
    // CR4 = PAE | OSFXSR | OSXMMEXCPT (compiled code uses SSE), CR3 = PML4.
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
    "movq ${stack_top}, %rsp",
    "movl %esi, %edi",
    "call gpuvm_pvh_main",
    "4:",
    "hlt",
    "jmp 4b",
    ".popsection",
    stack_top = const abi::STACK_TOP,
    options(att_syntax),
);

extern "C" {
    static mut gpuvm_pvh_pml4: [u64; 512];
    static mut gpuvm_pvh_spare: [[u64; 512]; 8];
}

/// True once the program was started through the PVH entry.
static PVH: AtomicBool = AtomicBool::new(false);

/// Whether this boot came through the PVH entry (ring 0, no VMM ports).
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

/// `size=N` and `workloads=a,b,...` (names as `Workload::name`) from the command line.
fn options(line: &[u8]) -> (u32, [u8; abi::MAX_WORKLOADS], usize) {
    let (mut size, mut list, mut n) = (64u32, [0u8; abi::MAX_WORKLOADS], 0usize);
    list[0] = 0; // Workload::ALL[0], madd
    let mut any = false;
    for word in line.split(|&b| b == b' ') {
        if let Some(v) = word.strip_prefix(b"size=") {
            size = parse_u32(v).unwrap_or(size);
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
    (size, list, n)
}

/// TSC frequency in kHz from the hypervisor leaf 0x40000010 (Cloud Hypervisor and KVM-based
/// VMMs fill it in), else 0 (the program then assumes 1 GHz).
fn tsc_khz() -> u64 {
    let max = core::arch::x86_64::__cpuid(0x4000_0000).eax;
    if max >= 0x4000_0010 {
        u64::from(core::arch::x86_64::__cpuid(0x4000_0010).eax)
    } else {
        0
    }
}

/// Identity-maps `[base, base + len)` with 2 MiB pages, taking tables from the spare pool for
/// addresses above the first 4 GiB; false if the pool ran out.
fn map_identity(base: u64, len: u64) -> bool {
    static mut USED: usize = 0;
    let mut a = base & !((2 << 20) - 1);
    while a < base.saturating_add(len) {
        // SAFETY: the tables are this program's own (.bss), reached identity-mapped; ring 0 and
        // single-threaded, nothing else walks or writes them.
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
                *l4 = t | PTE_P_RW;
            }
            let pdpt = (*l4 & !0xfff) as *mut u64;
            let l3 = &mut *pdpt.add((a >> 30) as usize & 511);
            if *l3 & 1 == 0 {
                let Some(t) = next() else { return false };
                *l3 = t | PTE_P_RW;
            }
            let pd = (*l3 & !0xfff) as *mut u64;
            *pd.add((a >> 21) as usize & 511) = a | PTE_PS | PTE_P_RW;
            // Flush the TLB (ring 0).
            core::arch::asm!("mov {t}, cr3", "mov cr3, {t}", t = out(reg) _);
        }
        a += 2 << 20;
    }
    true
}

/// The vGPU's BARs as the VMM placed them (a PVH VMM assigns BARs itself: no firmware to
/// re-program them), identity-mapped; memory decoding and bus mastering enabled.
pub fn firmware_bars(dev: u8) -> Bars {
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
    cfg_write(dev, 4, cfg_read(dev, 4) | 0x6);
    bars
}

/// Stops the VM: ACPI S5 (Cloud Hypervisor), i8042 reset (Firecracker), then halts.
pub fn shutdown(code: u32) -> ! {
    let _ = writeln!(Serial, "gpuvm guest: exit code {code}");
    outb(ACPI_SHUTDOWN_PORT, ACPI_S5);
    outb(I8042_CMD, I8042_RESET);
    loop {
        // SAFETY: ring 0 under PVH; nothing left to do.
        unsafe { core::arch::asm!("cli", "hlt", options(nomem, nostack)) };
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
    let (size, list, n) = options(line);
    // The memory map is read: the boot-parameter block may now overwrite it (0x7000).
    let ram_end = ram_end.min(4 << 30);
    let heap = ((ram_end - abi::HEAP_BASE) / 2) & !((2 << 20) - 1);
    let bp = |o: u64| abi::BOOT_PARAMS + o;
    wr64(bp(abi::BP_MAGIC), abi::MAGIC);
    wr32(bp(abi::BP_MODE), abi::MODE_NORMAL);
    wr32(bp(abi::BP_SIZE), size);
    wr32(bp(abi::BP_FENCE_MODE), 0);
    wr32(bp(abi::BP_NWORKLOADS), n as u32);
    for (i, &w) in list[..n].iter().enumerate() {
        wr8(bp(abi::BP_WORKLOADS) + i as u64, w);
    }
    wr64(bp(abi::BP_TSC_KHZ), tsc_khz());
    wr64(bp(abi::BP_HEAP_BASE), abi::HEAP_BASE);
    wr64(bp(abi::BP_HEAP_SIZE), heap);
    wr64(bp(abi::BP_DMA_BASE), abi::HEAP_BASE + heap);
    wr64(bp(abi::BP_DMA_SIZE), ram_end - abi::HEAP_BASE - heap);
    wr64(bp(abi::BP_MMIO_BASE), 0);
    wr32(bp(abi::BP_CALIBRATE), 0);
    let _ = writeln!(
        Serial,
        "gpuvm guest: PVH boot, ring 0, RAM to {ram_end:#x}, command line {:?}",
        core::str::from_utf8(line).unwrap_or("?")
    );
    let boot = crate::read_boot();
    let code = crate::run(&boot);
    shutdown(code)
}
