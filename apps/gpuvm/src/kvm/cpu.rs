//! The vCPU: 64-bit long mode set up directly by the VMM, the guest started in ring 3.
//!
//! On PVM (`/sys/module/kvm_pvm`) guest ring-0 code is interpreted (slow, no SSE), ring-3 code
//! runs natively, so the guest starts in ring 3 and never leaves it: CS/SS and the data segments
//! have DPL 3, RFLAGS.IOPL = 3 so `in`/`out` work, every page-table entry has the user bit.
//! The system tables (GDT, TSS, page tables) are written by [`write_system_tables`]; the IDT is
//! empty until the guest installs its interrupt gate (see `guest-bin`).

use anyhow::Context;
use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::abi;

const CR0_PE: u64 = 1;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// RFLAGS: reserved bit 1, IOPL 3 (port I/O allowed in ring 3 on hardware virtualization;
/// PVM ignores IOPL, see [`TSS_LIMIT`]), interrupts off.
pub const RFLAGS_RING3: u64 = 0x3002;
/// RFLAGS.IF.
const RFLAGS_IF: u64 = 1 << 9;

const PTE_P: u64 = 1;
const PTE_RW: u64 = 1 << 1;
const PTE_US: u64 = 1 << 2;
const PTE_PWT: u64 = 1 << 3;
const PTE_PCD: u64 = 1 << 4;
const PTE_PS: u64 = 1 << 7;

/// GDT entries: null, kernel code (flags 0xa09b), kernel data (0xc093), user data (0xc0f3),
/// user code (0xa0fb), then the 16-byte TSS descriptor.
const GDT_CODE_DATA: [u64; 5] = [
    0,
    0x00af_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x00cf_f300_0000_ffff,
    0x00af_fb00_0000_ffff,
];
/// Offset of the I/O permission bitmap in the TSS (right after the 104-byte 64-bit TSS).
const IOPB_OFFSET: u64 = 0x68;
/// TSS limit: the TSS, a bitmap allowing all 65536 ports, and the all-ones terminator byte.
///
/// PVM runs guest ring 3 with the hardware IOPL forced to 0 (it masks RFLAGS on every entry),
/// so an `in`/`out` from ring 3 raises #GP, which PVM hands to KVM's instruction emulator; that
/// emulator allows the access when the guest's TSS I/O bitmap does. With IOPL 3 alone the
/// emulator reflects the #GP into the guest, which cannot handle it (KVM_EXIT_SHUTDOWN).
const TSS_LIMIT: u64 = IOPB_OFFSET + 65536 / 8;

/// Writes the GDT, the TSS (IST1 = the interrupt stack, no I/O bitmap) and identity page tables
/// for the first 4 GiB (2 MiB pages, user bit; the MMIO hole uncached) into guest RAM.
pub fn write_system_tables(mem: &GuestMemoryMmap) -> anyhow::Result<()> {
    let w = |addr: u64, v: u64| {
        mem.write_obj(v, GuestAddress(addr))
            .with_context(|| format!("writing guest RAM at {addr:#x}"))
    };
    for (i, e) in GDT_CODE_DATA.iter().enumerate() {
        w(abi::GDT_ADDR + 8 * i as u64, *e)?;
    }
    let base = abi::TSS_ADDR;
    let tss_lo = (TSS_LIMIT & 0xffff)
        | (base & 0xff_ffff) << 16
        | 0x89 << 40 // present, 64-bit TSS (available)
        | ((TSS_LIMIT >> 16) & 0xf) << 48
        | ((base >> 24) & 0xff) << 56;
    w(abi::GDT_ADDR + abi::SEL_TSS as u64, tss_lo)?;
    w(abi::GDT_ADDR + abi::SEL_TSS as u64 + 8, base >> 32)?;
    // TSS: RSP0 and IST1 both name the interrupt stack; an I/O bitmap of zeros (every port
    // allowed, RAM is zero) ending in the terminator byte.
    w(abi::TSS_ADDR + 0x04, abi::IST_TOP)?;
    w(abi::TSS_ADDR + 0x24, abi::IST_TOP)?;
    mem.write_obj(IOPB_OFFSET as u16, GuestAddress(abi::TSS_ADDR + 0x66))
        .context("writing the TSS")?;
    mem.write_obj(0xffu8, GuestAddress(abi::TSS_ADDR + TSS_LIMIT))
        .context("writing the TSS")?;
    // Page tables: PML4 -> PDPT -> 4 PDs of 512 2 MiB pages.
    let pdpt = abi::PML4_ADDR + 0x1000;
    let pd = abi::PML4_ADDR + 0x2000;
    w(abi::PML4_ADDR, pdpt | PTE_P | PTE_RW | PTE_US)?;
    for i in 0..4u64 {
        w(pdpt + 8 * i, (pd + 0x1000 * i) | PTE_P | PTE_RW | PTE_US)?;
        for j in 0..512u64 {
            let addr = (i * 512 + j) << 21;
            let mut e = addr | PTE_P | PTE_RW | PTE_US | PTE_PS;
            if addr >= abi::MMIO_HOLE {
                e |= PTE_PCD | PTE_PWT;
            }
            w(pd + 0x1000 * i + 8 * j, e)?;
        }
    }
    Ok(())
}

fn segment(selector: u16, code: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 0xb } else { 0x3 },
        present: 1,
        dpl: (selector & 3) as u8,
        db: if code { 0 } else { 1 },
        s: 1,
        l: if code { 1 } else { 0 },
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Sets up the vCPU: CPUID as KVM supports it, long mode with paging, ring-3 segments, the TSS,
/// GDT and IDT registers, RIP = `entry`, the stack, RFLAGS with IOPL 3 (and IF if
/// `interrupts`: a ring-3 guest cannot `sti` under PVM), FPU/SSE state.
pub fn setup(kvm: &Kvm, vcpu: &VcpuFd, entry: u64, interrupts: bool) -> anyhow::Result<()> {
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .context("KVM_GET_SUPPORTED_CPUID")?;
    vcpu.set_cpuid2(&cpuid).context("KVM_SET_CPUID2")?;

    let mut sregs = vcpu.get_sregs().context("KVM_GET_SREGS")?;
    sregs.gdt.base = abi::GDT_ADDR;
    sregs.gdt.limit = abi::SEL_TSS + 16 - 1;
    sregs.idt.base = abi::IDT_ADDR;
    sregs.idt.limit = 16 * 256 - 1;
    sregs.cs = segment(abi::SEL_USER_CS, true);
    let data = segment(abi::SEL_USER_DS, false);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = kvm_segment {
        base: abi::TSS_ADDR,
        limit: TSS_LIMIT as u32,
        selector: abi::SEL_TSS,
        type_: 0xb, // busy 64-bit TSS
        present: 1,
        dpl: 0,
        db: 0,
        s: 0,
        l: 0,
        g: 0,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = abi::PML4_ADDR;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.efer = EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs).context("KVM_SET_SREGS")?;

    let regs = kvm_regs {
        rip: entry,
        rsp: abi::STACK_TOP - 8,
        rflags: RFLAGS_RING3 | if interrupts { RFLAGS_IF } else { 0 },
        ..Default::default()
    };
    vcpu.set_regs(&regs).context("KVM_SET_REGS")?;

    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).context("KVM_SET_FPU")?;
    Ok(())
}
