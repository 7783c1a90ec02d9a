//! One KVM VM: guest RAM in one memory slot (a `vm-memory` `GuestMemoryMmap`, the same mapping
//! the vGPU reaches by DMA), KVM's in-kernel irqchip (PIC, IOAPIC, local APIC), the guest
//! program loaded from its ELF's PT_LOAD segments, the system tables and the boot parameters.

use anyhow::{bail, Context};
use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

use super::abi;

/// A VM and its RAM.
pub struct GuestVm {
    /// The VM.
    pub fd: VmFd,
    /// Guest RAM (GPA 0 .. size).
    pub mem: GuestMemoryMmap,
}

/// The guest page: KVM's dirty-log granularity, and the unit of the RAM file and of the
/// migration stream.
pub const PAGE: u64 = 4096;

/// Pages (GPA / [`PAGE`]) below `ram` that KVM's dirty log of slot 0 reports written since the
/// last call (the log is cleared by reading it). Takes the VM fd, not a [`GuestVm`]: a live
/// migration reads it from its own thread through a duplicate descriptor.
pub fn dirty_pages(vm: &VmFd, ram: u64) -> anyhow::Result<Vec<u64>> {
    let bitmap = vm
        .get_dirty_log(0, ram as usize)
        .context("KVM_GET_DIRTY_LOG")?;
    let mut pages = Vec::new();
    for (w, &bits) in bitmap.iter().enumerate() {
        let mut b = bits;
        while b != 0 {
            let page = w as u64 * 64 + u64::from(b.trailing_zeros());
            b &= b - 1;
            if page < ram / PAGE {
                pages.push(page);
            }
        }
    }
    Ok(pages)
}

impl GuestVm {
    /// Turns KVM's dirty-page logging of the RAM slot (slot 0) on or off: the same mapping is
    /// registered again with only the flag changed.
    pub fn set_dirty_log(&self, on: bool) -> anyhow::Result<()> {
        let r = self.mem.iter().next().context("the VM has no RAM")?;
        let host = self
            .mem
            .get_host_address(r.start_addr())
            .context("guest RAM host address")?;
        let slot = kvm_userspace_memory_region {
            slot: 0,
            flags: if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
            guest_phys_addr: r.start_addr().0,
            memory_size: r.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the same live mapping `GuestVm::with_memory` registered as slot 0 (owned by
        // `self.mem`, which outlives the VM fd); only the flags change.
        unsafe { self.fd.set_user_memory_region(slot) }
            .context("KVM_SET_USER_MEMORY_REGION (dirty logging)")
    }

    /// Creates a VM with `ram` bytes of RAM at GPA 0 and the in-kernel irqchip.
    pub fn new(kvm: &Kvm, ram: u64) -> anyhow::Result<GuestVm> {
        if ram > abi::MMIO_HOLE {
            bail!(
                "guest RAM of {} MiB does not fit below the MMIO hole at {:#x}",
                ram >> 20,
                abi::MMIO_HOLE
            );
        }
        let len = usize::try_from(ram).context("guest RAM size")?;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), len)])
            .with_context(|| format!("allocating {} MiB of guest RAM", ram >> 20))?;
        GuestVm::with_memory(kvm, mem)
    }

    /// Creates a VM whose RAM is `mem` (for example shared memory, see
    /// [`super::shared_ram`]) and the in-kernel irqchip.
    pub fn with_memory(kvm: &Kvm, mem: GuestMemoryMmap) -> anyhow::Result<GuestVm> {
        if mem.last_addr().0 >= abi::MMIO_HOLE {
            bail!(
                "guest RAM ends at {:#x}, inside the MMIO hole at {:#x}",
                mem.last_addr().0,
                abi::MMIO_HOLE
            );
        }
        let fd = kvm.create_vm().context("KVM_CREATE_VM")?;
        // Intel VMX needs a TSS region for real mode; harmless elsewhere (PVM ignores it).
        let _ = fd.set_tss_address(0xfffb_d000);
        fd.create_irq_chip().context("KVM_CREATE_IRQCHIP")?;
        for (slot, region) in mem.iter().enumerate() {
            let host = mem
                .get_host_address(region.start_addr())
                .context("guest RAM host address")?;
            let r = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: host as u64,
            };
            // SAFETY: `host` is the start of a live mmap of `region.len()` bytes owned by `mem`,
            // which this struct keeps alive for as long as the VM (its `fd`) exists; field
            // order drops `fd` before `mem`.
            unsafe { fd.set_user_memory_region(r) }.context("KVM_SET_USER_MEMORY_REGION")?;
        }
        Ok(GuestVm { fd, mem })
    }

    /// Copies the PT_LOAD segments of an ELF64 x86-64 executable into guest RAM (the rest of
    /// each segment stays zero, as fresh RAM is) and returns the entry point.
    pub fn load_elf(&self, elf: &[u8]) -> anyhow::Result<u64> {
        let u16_at = |o: usize| -> anyhow::Result<u16> {
            Ok(u16::from_le_bytes(
                elf.get(o..o + 2).context("truncated ELF")?.try_into()?,
            ))
        };
        let u32_at = |o: usize| -> anyhow::Result<u32> {
            Ok(u32::from_le_bytes(
                elf.get(o..o + 4).context("truncated ELF")?.try_into()?,
            ))
        };
        let u64_at = |o: usize| -> anyhow::Result<u64> {
            Ok(u64::from_le_bytes(
                elf.get(o..o + 8).context("truncated ELF")?.try_into()?,
            ))
        };
        if elf.get(0..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || u16_at(18)? != 62 {
            bail!("the guest program is not an x86-64 ELF64 executable");
        }
        let entry = u64_at(24)?;
        let phoff = u64_at(32)? as usize;
        let phentsize = u16_at(54)? as usize;
        let phnum = u16_at(56)? as usize;
        for i in 0..phnum {
            let ph = phoff + i * phentsize;
            if u32_at(ph)? != 1 {
                continue; // not PT_LOAD
            }
            let offset = u64_at(ph + 8)? as usize;
            let paddr = u64_at(ph + 24)?;
            let filesz = u64_at(ph + 32)? as usize;
            let memsz = u64_at(ph + 40)?;
            if paddr < abi::LOAD_ADDR || paddr + memsz > abi::STACK_BOTTOM {
                bail!(
                    "guest segment {paddr:#x}+{memsz:#x} outside the program area {:#x}..{:#x}",
                    abi::LOAD_ADDR,
                    abi::STACK_BOTTOM
                );
            }
            let bytes = elf
                .get(offset..offset + filesz)
                .context("ELF segment past the end of the file")?;
            self.mem
                .write_slice(bytes, GuestAddress(paddr))
                .context("loading the guest program")?;
        }
        Ok(entry)
    }

    /// Creates vCPU 0.
    pub fn create_vcpu(&self) -> anyhow::Result<VcpuFd> {
        self.fd.create_vcpu(0).context("KVM_CREATE_VCPU")
    }

    /// Writes a u32 into guest RAM.
    pub fn write_u32(&self, addr: u64, v: u32) -> anyhow::Result<()> {
        self.mem
            .write_obj(v, GuestAddress(addr))
            .with_context(|| format!("writing guest RAM at {addr:#x}"))
    }

    /// Writes a u64 into guest RAM.
    pub fn write_u64(&self, addr: u64, v: u64) -> anyhow::Result<()> {
        self.mem
            .write_obj(v, GuestAddress(addr))
            .with_context(|| format!("writing guest RAM at {addr:#x}"))
    }

    /// Reads a u32 from guest RAM (0 if out of range).
    pub fn read_u32(&self, addr: u64) -> u32 {
        self.mem.read_obj(GuestAddress(addr)).unwrap_or(0)
    }

    /// Reads a u64 from guest RAM (0 if out of range).
    pub fn read_u64(&self, addr: u64) -> u64 {
        self.mem.read_obj(GuestAddress(addr)).unwrap_or(0)
    }
}
