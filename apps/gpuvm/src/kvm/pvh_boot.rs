//! `gpuvm run --kvm --pvh`: start the guest program through its PVH entry, as Cloud Hypervisor
//! does, instead of the VMM's direct ring-3 start.
//!
//! The PVH boot ABI: the loader reads the entry from the ELF note "Xen" of type
//! `XEN_ELFNOTE_PHYS32_ENTRY` (18), writes an `hvm_start_info` (version 1: command line and
//! memory map) into guest RAM and enters the entry in 32-bit protected mode with paging off,
//! flat segments and `%ebx` = the start info's address. The guest's stub (guest-bin `pvh.rs`)
//! then builds its own page tables, GDT, TSS and IDT and switches to ring 3 by itself; the VMM
//! writes neither system tables nor the boot-parameter block (the guest derives that from the
//! command line). This is how the same image that Cloud Hypervisor boots is checked here.

use anyhow::{bail, Context};
use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Where the start info goes (Cloud Hypervisor uses the same page).
pub const START_INFO: u64 = 0x6000;
/// The memory map: one entry, right after the start info.
const MEMMAP: u64 = START_INFO + 0x40;
/// The command line (NUL-terminated), up to the boot-parameter block at 0x7000.
const CMDLINE: u64 = START_INFO + 0x400;
/// Longest command line, NUL included.
const CMDLINE_MAX: usize = 0xc00;
/// `hvm_start_info.magic`.
const HVM_START_MAGIC: u32 = 0x336e_c578;
/// `XEN_ELFNOTE_PHYS32_ENTRY`.
const PHYS32_ENTRY: u32 = 18;
const PT_NOTE: u32 = 4;
/// E820 type of usable RAM.
const E820_RAM: u32 = 1;

fn field<const N: usize>(elf: &[u8], off: usize) -> anyhow::Result<[u8; N]> {
    elf.get(off..off + N)
        .context("truncated ELF")?
        .try_into()
        .context("truncated ELF")
}

/// The PHYS32_ENTRY address of the ELF's PVH note.
pub fn entry(elf: &[u8]) -> anyhow::Result<u32> {
    let u16_at = |o| field::<2>(elf, o).map(u16::from_le_bytes);
    let u32_at = |o| field::<4>(elf, o).map(u32::from_le_bytes);
    let u64_at = |o| field::<8>(elf, o).map(u64::from_le_bytes);
    let (phoff, phentsize, phnum) = (u64_at(32)? as usize, u16_at(54)? as usize, u16_at(56)?);
    for i in 0..usize::from(phnum) {
        let ph = phoff + i * phentsize;
        if u32_at(ph)? != PT_NOTE {
            continue;
        }
        let mut p = u64_at(ph + 8)? as usize;
        let end = p.saturating_add(u64_at(ph + 32)? as usize);
        while p + 12 <= end {
            let (namesz, descsz, ty) =
                (u32_at(p)? as usize, u32_at(p + 4)? as usize, u32_at(p + 8)?);
            let name = elf.get(p + 12..p + 12 + namesz).context("truncated note")?;
            let desc = p + 12 + namesz.next_multiple_of(4);
            if name == b"Xen\0" && ty == PHYS32_ENTRY && descsz >= 4 {
                return u32_at(desc);
            }
            p = desc + descsz.next_multiple_of(4);
        }
    }
    bail!("the guest program has no PVH entry note")
}

/// Writes the start info, a one-entry memory map (RAM from 0 to `ram`) and `cmdline`.
pub fn write_start_info(mem: &GuestMemoryMmap, ram: u64, cmdline: &str) -> anyhow::Result<()> {
    if cmdline.len() >= CMDLINE_MAX || cmdline.contains('\0') {
        bail!(
            "PVH command line of {} bytes: at most {} and no NUL",
            cmdline.len(),
            CMDLINE_MAX - 1
        );
    }
    let mut info = [0u8; 56];
    info[0..4].copy_from_slice(&HVM_START_MAGIC.to_le_bytes());
    info[4..8].copy_from_slice(&1u32.to_le_bytes()); // version
    info[24..32].copy_from_slice(&CMDLINE.to_le_bytes());
    info[40..48].copy_from_slice(&MEMMAP.to_le_bytes());
    info[48..52].copy_from_slice(&1u32.to_le_bytes()); // memmap entries
    let mut map = [0u8; 24];
    map[8..16].copy_from_slice(&ram.to_le_bytes());
    map[16..20].copy_from_slice(&E820_RAM.to_le_bytes());
    let mut line = cmdline.as_bytes().to_vec();
    line.push(0);
    for (addr, bytes) in [
        (START_INFO, &info[..]),
        (MEMMAP, &map[..]),
        (CMDLINE, &line[..]),
    ] {
        mem.write_slice(bytes, GuestAddress(addr))
            .with_context(|| format!("writing the PVH start info at {addr:#x}"))?;
    }
    Ok(())
}

fn flat(selector: u16, code: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 0xb } else { 0x3 },
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Sets up the vCPU as the PVH ABI says: CPUID as KVM supports it, 32-bit protected mode with
/// paging off, flat 4 GiB code and data segments, interrupts off, `%ebx` = [`START_INFO`],
/// `%eip` = `entry`.
pub fn setup_vcpu(kvm: &Kvm, vcpu: &VcpuFd, entry: u32) -> anyhow::Result<()> {
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .context("KVM_GET_SUPPORTED_CPUID")?;
    vcpu.set_cpuid2(&cpuid).context("KVM_SET_CPUID2")?;
    let mut sregs = vcpu.get_sregs().context("KVM_GET_SREGS")?;
    sregs.cs = flat(0x08, true);
    let data = flat(0x10, false);
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = kvm_segment {
        base: 0,
        limit: 0x67,
        selector: 0,
        type_: 0xb, // busy 32-bit TSS (what VMX requires of TR)
        present: 1,
        s: 0,
        ..Default::default()
    };
    sregs.cr0 = 0x11; // PE | ET
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
    vcpu.set_sregs(&sregs).context("KVM_SET_SREGS")?;
    let regs = kvm_regs {
        rip: u64::from(entry),
        rbx: START_INFO,
        rflags: 0x2,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_guest_has_a_pvh_entry_below_4_gib() {
        let e = entry(super::super::GUEST_ELF).unwrap();
        assert!(e >= super::super::abi::LOAD_ADDR as u32);
    }

    #[test]
    fn an_elf_without_the_note_is_refused() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        assert!(entry(&elf).is_err());
        assert!(entry(&elf[..10]).is_err());
    }

    #[test]
    fn start_info_is_what_the_guest_reads() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_start_info(&mem, 64 << 20, "size=16 workloads=madd").unwrap();
        let r32 = |a: u64| mem.read_obj::<u32>(GuestAddress(a)).unwrap();
        let r64 = |a: u64| mem.read_obj::<u64>(GuestAddress(a)).unwrap();
        assert_eq!(r32(START_INFO), HVM_START_MAGIC);
        assert_eq!(r64(START_INFO + 24), CMDLINE);
        let map = r64(START_INFO + 40);
        assert_eq!((r64(map), r64(map + 8), r32(map + 16)), (0, 64 << 20, 1));
        let mut line = [0u8; 23];
        mem.read_slice(&mut line, GuestAddress(CMDLINE)).unwrap();
        assert_eq!(&line, b"size=16 workloads=madd\0");
        assert!(write_start_info(&mem, 1 << 20, &"x".repeat(CMDLINE_MAX)).is_err());
    }
}
