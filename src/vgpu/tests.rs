//! Unit tests of the virtual GPU, driving it by hand the way a (hostile) guest driver would:
//! register by register, through PRAMIN and the BAR apertures, with the physical GPU simulated.

use std::sync::Arc;

use gf100::fault::{self, FaultFlags};
use gf100::gpfifo::GpEntry;
use gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gf100::{inst, pbus, pfb, pffb, pfifo, pmc, pv, userd, Target};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::addr::HostVram;
use crate::clock::SimClock;
use crate::host::{GpuHost, HostConfig, HostError};
use crate::irq::IrqFlag;
use crate::phys::{Bar, PhysicalGpu};
use crate::profile::{ShadowMode, VgpuProfile};
use crate::vgpu::{Vgpu, VgpuStats};
use gpuvm_sim::{SimConfig, SimGpu};

const HYP: u64 = 32 << 20;
const SLICE_MIB: u64 = 64;
const GUEST_RAM: u64 = 4 << 20;

struct Rig {
    clock: Arc<SimClock>,
    gpu: Arc<SimGpu>,
    host: GpuHost,
}

fn rig() -> Rig {
    let clock = Arc::new(SimClock::new());
    let gpu = Arc::new(SimGpu::new(SimConfig {
        vram_size: 512 << 20,
        clock: clock.clone(),
        ..SimConfig::default()
    }));
    let host = GpuHost::new(
        gpu.clone(),
        HostConfig {
            hypervisor_vram: HYP,
            ..HostConfig::default()
        },
    )
    .unwrap();
    Rig { clock, gpu, host }
}

fn profile(shadow: ShadowMode) -> VgpuProfile {
    VgpuProfile {
        name: "t".into(),
        vram_mib: SLICE_MIB,
        channels: 4,
        weight: 1,
        shadow,
    }
}

impl Rig {
    fn vm(&self, shadow: ShadowMode) -> Arc<Vgpu> {
        let v = self.host.create_vgpu(&profile(shadow)).unwrap();
        let mem =
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), GUEST_RAM as usize)]).unwrap();
        v.attach_guest_memory(mem).unwrap();
        v
    }

    /// Lets simulated time pass and the host service the GPU.
    fn run_for(&self, ns: u64) {
        for _ in 0..64 {
            self.clock.advance(ns / 64 + 1);
            self.host.poll();
        }
    }

    fn phys_u32(&self, addr: HostVram) -> u32 {
        let mut b = [0u8; 4];
        self.gpu.read_vram(addr, &mut b);
        u32::from_le_bytes(b)
    }
}

fn rd(v: &Vgpu, off: u32) -> u32 {
    let mut b = [0u8; 4];
    v.bar_read(Bar::Bar0, u64::from(off), &mut b);
    u32::from_le_bytes(b)
}

pub(crate) fn wr(v: &Vgpu, off: u32, val: u32) {
    v.bar_write(Bar::Bar0, u64::from(off), &val.to_le_bytes());
}

/// Writes guest VRAM through the PRAMIN window, as nouveau's slow path does.
fn pramin_wr(v: &Vgpu, addr: u64, bytes: &[u8]) {
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let a = addr + i as u64 * 4;
        wr(
            v,
            pbus::PMEM,
            pbus::pmem_encode(a & !0xf_ffff, Target::Vram),
        );
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        v.bar_write(Bar::Bar0, u64::from(pbus::PRAMIN_BASE) + (a & 0xf_ffff), &w);
    }
}

fn pramin_wr64(v: &Vgpu, addr: u64, val: u64) {
    pramin_wr(v, addr, &val.to_le_bytes());
}

fn pramin_rd(v: &Vgpu, addr: u64) -> u32 {
    wr(
        v,
        pbus::PMEM,
        pbus::pmem_encode(addr & !0xf_ffff, Target::Vram),
    );
    rd(v, pbus::PRAMIN_BASE + (addr & 0xf_ffff) as u32)
}

/// A guest VM (page directory + one small-page table for the first 128 MiB) built through
/// PRAMIN at `pd`, `pt`; `maps` are (VA, guest address, target) of 4 KiB pages.
fn guest_vm(v: &Vgpu, pd: u64, pt: u64, maps: &[(u64, u64, Target)]) {
    let pde = Pde::small_table(pt, Target::Vram);
    pramin_wr64(v, pd, pde.encode());
    for &(va, addr, t) in maps {
        pramin_wr64(
            v,
            pt + mmu::spt_index(va) * mmu::ENTRY_SIZE,
            Pte::new(addr, t).encode(),
        );
    }
}

fn inst_block(v: &Vgpu, at: u64, pd: u64, userd: u64, ib_va: u64, ib_entries: u32) {
    pramin_wr64(
        v,
        at + inst::RAMFC_USERD_LO,
        inst::userd_encode(userd, Target::Vram),
    );
    pramin_wr(
        v,
        at + inst::RAMFC_IB_BASE_LO,
        &(ib_va as u32).to_le_bytes(),
    );
    pramin_wr(
        v,
        at + inst::RAMFC_IB_CONFIG,
        &inst::ib_config_encode(ib_va, ib_entries).to_le_bytes(),
    );
    for (off, val) in inst::RAMFC_NOUVEAU_DEFAULTS {
        pramin_wr(v, at + off, &val.to_le_bytes());
    }
    pramin_wr64(v, at + inst::PDB_LO, inst::pdb_encode(pd, Target::Vram));
    pramin_wr64(v, at + inst::LIMIT_LO, mmu::VA_LIMIT - 1);
}

#[test]
fn identity_sizing_and_deny_by_default() {
    let r = rig();
    let v = r.vm(ShadowMode::Lazy);
    assert_eq!(rd(&v, pmc::BOOT_0), pmc::BOOT_0_QUADRO_6000);
    assert_eq!(rd(&v, pfb::FBP_COUNT), 1);
    assert_eq!(rd(&v, pfb::FBP_DISABLE_MASK), 0);
    assert_eq!(rd(&v, pfb::fbpa_amount(0)), SLICE_MIB as u32);
    assert_eq!(rd(&v, pfb::fbpa_amount(1)), 0);
    // Unknown and denied offsets.
    assert_eq!(rd(&v, 0x0000_0008), gf100::BAD_REGISTER);
    // PDISPLAY is known and denied (PGRAPH is the per-VM virtual PGRAPH now).
    assert_eq!(rd(&v, 0x0061_0000), gf100::BAD_REGISTER);
    wr(&v, 0x0061_0000, 1);
    wr(&v, 0x0000_0008, 1);
    // The PV interface is absent for a lazy VM.
    assert_eq!(rd(&v, pv::ID), gf100::BAD_REGISTER);
    // Sub-word reads return part of the register; sub-word writes are refused.
    let mut b = [0u8; 2];
    v.bar_read(Bar::Bar0, u64::from(pmc::BOOT_0) + 2, &mut b);
    assert_eq!(
        u16::from_le_bytes(b),
        (pmc::BOOT_0_QUADRO_6000 >> 16) as u16
    );
    v.bar_write(Bar::Bar0, u64::from(pmc::INTR_EN_HOST), &[1]);
    assert_eq!(rd(&v, pmc::INTR_EN_HOST), 0);
    let s = v.stats();
    assert_eq!(s.by_class.unknown.reads, 2);
    assert_eq!(s.by_class.unknown.writes, 2);
    assert_eq!(s.by_class.denied.total(), 2);
    assert_eq!(s.violations.denied_register, 1);
    assert_eq!(s.violations.bad_access, 1);
    assert_eq!(s.exits.bar0.total(), 13);
    // Nothing reached the physical GPU's unknown-register counters.
    let g = r.gpu.stats();
    assert_eq!(g.bad_register_reads + g.bad_register_writes, 0);
    // PCI identity.
    let mut id = [0u8; 4];
    v.config_read(0, &mut id);
    assert_eq!(u32::from_le_bytes(id), 0x06d8_10de);
    assert!(!v.msi().unwrap().enabled);
    // Offsets a VMM should never pass still do not panic.
    let mut q = [0u8; 8];
    v.bar_read(Bar::Bar0, 0xffff_fffc, &mut q);
    v.bar_write(Bar::Bar0, 0xffff_fffc, &q);
    v.bar_read(Bar::Bar0, u64::MAX - 3, &mut q[..4]);
    v.bar_read(Bar::Bar1, u64::MAX - 3, &mut q[..4]);
    v.bar_write(Bar::Bar3, u64::MAX, &q[..1]);
    v.bar_read(Bar::Bar1, 0, &mut [0u8; 3]);

    let p = r.vm(ShadowMode::Pv);
    assert_eq!(rd(&p, pv::ID), pv::MAGIC);
    // A batch larger than the maximum is refused.
    wr(&p, pv::BATCH_COUNT, pv::MAX_BATCH + 1);
    wr(&p, pv::SUBMIT, 1);
    assert_eq!(rd(&p, pv::ERROR), pv::ERR_BAD_BATCH);
    // A batch outside guest RAM too.
    wr(&p, pv::BATCH_COUNT, 1);
    wr(&p, pv::BATCH_HI, 1);
    wr(&p, pv::SUBMIT, 1);
    assert_eq!(rd(&p, pv::ERROR), pv::ERR_BAD_BATCH);
    assert_eq!(p.stats().violations.pv_batch, 2);
    assert!(v.regions().iter().all(|r| r.trapped));
    assert!(
        v.regions().len() + 1 == p.regions().len(),
        "PV range only for PV VMs"
    );
}

#[test]
fn pramin_stays_inside_the_slice() {
    let r = rig();
    let a = r.vm(ShadowMode::Lazy);
    let b = r.vm(ShadowMode::Lazy);
    pramin_wr(&a, 0x1_2340, &0xcafe_f00du32.to_le_bytes());
    assert_eq!(pramin_rd(&a, 0x1_2340), 0xcafe_f00d);
    // Where it landed: A's slice, right after the hypervisor region.
    assert_eq!(r.phys_u32(HostVram(HYP + 0x1_2340)), 0xcafe_f00d);
    assert_eq!(pramin_rd(&b, 0x1_2340), 0, "B sees its own slice");
    // Beyond the slice: all-ones, dropped, counted; B's slice (next to A's) untouched.
    let beyond = SLICE_MIB << 20;
    assert_eq!(pramin_rd(&a, beyond), u32::MAX);
    pramin_wr(&a, beyond, &7u32.to_le_bytes());
    assert_eq!(pramin_rd(&b, 0), 0);
    assert_eq!(r.phys_u32(HostVram(HYP + beyond)), 0);
    assert_eq!(a.stats().violations.vram_out_of_slice, 2);
    // The invalid target.
    wr(&a, pbus::PMEM, 1 << 24);
    assert_eq!(rd(&a, pbus::PRAMIN_BASE), u32::MAX);
    assert_eq!(a.stats().violations.invalid_target, 1);
    // System memory through the window: inside guest RAM only.
    wr(
        &a,
        pbus::PMEM,
        pbus::pmem_encode(0x10_0000, Target::SysCoherent),
    );
    wr(&a, pbus::PRAMIN_BASE + 8, 0x55);
    assert_eq!(rd(&a, pbus::PRAMIN_BASE + 8), 0x55);
    wr(
        &a,
        pbus::PMEM,
        pbus::pmem_encode(GUEST_RAM, Target::SysCoherent),
    );
    assert_eq!(rd(&a, pbus::PRAMIN_BASE), u32::MAX);
    assert_eq!(a.stats().violations.sysram_out_of_ram, 1);
}

#[test]
fn bar3_is_walked_through_the_guest_tables() {
    let r = rig();
    let v = r.vm(ShadowMode::Lazy);
    let (inst_a, pd, pt) = (0x1_0000, 0x2_0000, 0x10_0000);
    guest_vm(
        &v,
        pd,
        pt,
        &[
            (0x0000, 0x80_0000, Target::Vram),
            (0x1000, SLICE_MIB << 20, Target::Vram),
            (0x2000, 0x1000, Target::SysCoherent),
        ],
    );
    pramin_wr64(
        &v,
        inst_a + inst::PDB_LO,
        inst::pdb_encode(pd, Target::Vram),
    );
    pramin_wr64(&v, inst_a + inst::LIMIT_LO, gf100::pci::BAR3_SIZE - 1);
    wr(
        &v,
        pbus::BAR3_INST,
        pbus::bar_inst_encode(inst_a, Target::Vram),
    );
    v.bar_write(Bar::Bar3, 0x10, &0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(pramin_rd(&v, 0x80_0010), 0x5566_7788);
    let mut b = [0u8; 8];
    v.bar_read(Bar::Bar3, 0x10, &mut b);
    assert_eq!(u64::from_le_bytes(b), 0x1122_3344_5566_7788);
    // Guest RAM through a SYSRAM PTE.
    v.bar_write(Bar::Bar3, 0x2004, &9u32.to_le_bytes());
    let mut w = [0u8; 4];
    v.bar_read(Bar::Bar3, 0x2004, &mut w);
    assert_eq!(u32::from_le_bytes(w), 9);
    assert_eq!(v.stats().bar_faults, 0);
    // A PTE outside the slice: not present, a BAR3 fault on this VM, a violation.
    v.bar_read(Bar::Bar3, 0x1000, &mut w);
    assert_eq!(w, [0xff; 4]);
    let s = v.stats();
    assert_eq!((s.bar_faults, s.violations.vram_out_of_slice), (1, 1));
    assert_eq!(rd(&v, pfifo::VM_FAULT_SOURCE), 1 << fault::UNIT_BAR3);
    assert_ne!(rd(&v, pfifo::INTR) & pfifo::INTR_VM_FAULT, 0);
    let flags = FaultFlags::decode(rd(&v, pfifo::vm_fault(fault::UNIT_BAR3, 0xc)));
    assert_eq!(flags.reason, fault::REASON_PAGE_NOT_PRESENT);
    assert_eq!(flags.client, fault::HUB_CLIENT_BAR_READ);
    assert_eq!(
        rd(&v, pfifo::vm_fault(fault::UNIT_BAR3, pfifo::VM_FAULT_INST)),
        (inst_a >> 12) as u32
    );
    assert_eq!(rd(&v, pfifo::vm_fault(fault::UNIT_BAR3, 4)), 0x1000);
    wr(&v, pfifo::VM_FAULT_SOURCE, 1 << fault::UNIT_BAR3);
    assert_eq!(rd(&v, pfifo::INTR), 0);
    // Unmapped: PAGE_NOT_PRESENT for a write; nothing is written anywhere.
    v.bar_write(Bar::Bar3, 0x5000, &1u32.to_le_bytes());
    assert_eq!(v.stats().bar_faults, 2);
    // A remapped PTE takes effect only after the guest's TLB flush.
    pramin_wr64(&v, pt, Pte::new(0x90_0000, Target::Vram).encode());
    v.bar_read(Bar::Bar3, 0x10, &mut w);
    assert_eq!(u32::from_le_bytes(w), 0x5566_7788, "stale until flushed");
    wr(
        &v,
        pffb::TLB_FLUSH_VSPACE,
        pffb::vspace_encode(pd, Target::Vram),
    );
    wr(
        &v,
        pffb::TLB_FLUSH_TRIGGER,
        pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL | pffb::FLUSH_HUB_ONLY,
    );
    assert_ne!(rd(&v, pffb::VM_CFG) & pffb::VM_CFG_FLUSH_QUEUED, 0);
    v.bar_read(Bar::Bar3, 0x10, &mut w);
    assert_eq!(u32::from_le_bytes(w), 0);
    // A page table outside the slice.
    pramin_wr64(
        &v,
        pd,
        Pde {
            large: None,
            small: Some(PtRef {
                addr: (SLICE_MIB << 20) + 0x1000,
                target: Target::Vram,
                vol: false,
            }),
            size: PtSize::Full,
        }
        .encode(),
    );
    wr(
        &v,
        pffb::TLB_FLUSH_TRIGGER,
        pffb::FLUSH_TRIGGER | pffb::FLUSH_ALL_PDB,
    );
    v.bar_read(Bar::Bar3, 0x10, &mut w);
    assert_eq!(w, [0xff; 4]);
    assert_eq!(v.stats().violations.vram_out_of_slice, 2);
    // Beyond the BAR: all-ones without a fault.
    v.bar_read(Bar::Bar3, gf100::pci::BAR3_SIZE - 2, &mut w);
    assert_eq!(w, [0xff; 4]);
    assert_eq!(v.stats().bar_faults, 3);
    assert_eq!(
        r.gpu.stats().mmu_faults,
        0,
        "the physical GPU never saw any of it"
    );
}

/// A guest channel: instance block at 0x10000, PD at 0x20000 (its first PDE's small table at
/// 0x100000), USERD at 0x30000, GPFIFO ring at VA 0x4000_0000 (not mapped unless `ring` names
/// the guest page it lives in).
/// Binds and starts guest channel `g` as a guest driver does (page directory, instance block,
/// USERD poll area, channel table), its ring at `ring` if given.
pub(crate) fn guest_channel(v: &Vgpu, g: u32, ring: Option<u64>) {
    let (inst_a, pd, pt, userd_a) = (0x1_0000, 0x2_0000, 0x10_0000, 0x3_0000);
    let ib_va = 0x0400_0000;
    let maps: Vec<(u64, u64, Target)> =
        ring.map(|r| (ib_va, r, Target::Vram)).into_iter().collect();
    guest_vm(v, pd, pt, &maps);
    inst_block(v, inst_a, pd, userd_a, ib_va, 16);
    wr(
        v,
        pfifo::USERD_POLL_BASE,
        pfifo::userd_poll_encode(0x4_0000),
    );
    wr(
        v,
        pfifo::chan_table(g),
        pfifo::chan_encode(inst_a, Target::Vram),
    );
    wr(v, pfifo::chan_state(g), pfifo::STATE_START);
}

fn submit_runlist(v: &Vgpu, at: u64, chids: &[u32]) {
    for (i, c) in chids.iter().enumerate() {
        pramin_wr(v, at + i as u64 * 8, &c.to_le_bytes());
        pramin_wr(
            v,
            at + i as u64 * 8 + 4,
            &pfifo::RUNLIST_ENTRY_WORD1.to_le_bytes(),
        );
    }
    wr(
        v,
        pfifo::RUNLIST_BASE,
        pfifo::runlist_base_encode(at, Target::Vram),
    );
    wr(
        v,
        pfifo::RUNLIST_SUBMIT,
        pfifo::RUNLIST_SUBMIT_UNK20 | chids.len() as u32,
    );
}

fn doorbell(v: &Vgpu, g: u32, put: u32) {
    v.bar_write(
        Bar::Bar1,
        0x4_0000 + u64::from(g) * userd::SIZE + userd::GP_PUT,
        &put.to_le_bytes(),
    );
}

#[test]
fn channels_are_partitioned_and_shadowed() {
    let r = rig();
    let a = r.vm(ShadowMode::Incremental);
    let b = r.vm(ShadowMode::Incremental);
    let base_b = b.phys_channels().start;
    assert_eq!(base_b, 4);
    guest_channel(&b, 1, None);
    let phys = r.host.phys();
    let word = phys.read_reg(pfifo::chan_table(base_b + 1));
    let (shadow, t) = pfifo::chan_decode(word).expect("bound");
    assert_eq!(t, Target::Vram);
    assert!(
        shadow < HYP,
        "the GPU runs a hypervisor copy, not the guest block"
    );
    // The copy's USERD is the hypervisor's page; its PDB a shadow in hypervisor VRAM.
    let mut blk = [0u8; 8];
    phys.read_vram(HostVram(shadow + inst::RAMFC_USERD_LO), &mut blk);
    let (u, _) = inst::userd_decode(u64::from_le_bytes(blk)).unwrap();
    assert!(u < HYP);
    phys.read_vram(HostVram(shadow + inst::PDB_LO), &mut blk);
    let (spd, _) = inst::pdb_decode(u64::from_le_bytes(blk)).unwrap();
    assert!(spd < HYP && spd != 0x2_0000);
    assert_eq!(
        rd(&b, pfifo::chan_table(1)),
        pfifo::chan_encode(0x1_0000, Target::Vram)
    );
    assert_ne!(rd(&b, pfifo::chan_state(1)) & pfifo::STATE_RUNNABLE, 0);
    // A's view of the same guest id is its own (unbound) channel.
    assert_eq!(rd(&a, pfifo::chan_table(1)), 0);

    // Foreign channels: bind, enable, kick, USERD.
    wr(
        &b,
        pfifo::chan_table(4),
        pfifo::chan_encode(0x1_0000, Target::Vram),
    );
    wr(&b, pfifo::chan_state(100), pfifo::STATE_START);
    wr(&b, pfifo::KICK, 7);
    assert_eq!(rd(&b, pfifo::KICK), 7, "reads back, pending clear");
    doorbell(&b, 5, 1);
    assert_eq!(b.stats().violations.foreign_channel, 4);
    assert_eq!(
        phys.read_reg(pfifo::chan_table(base_b + 4)),
        0,
        "B's channel 4 does not exist"
    );
    assert_eq!(phys.read_reg(pfifo::chan_table(0)), 0);
    assert_eq!(phys.read_reg(pfifo::chan_state(100)), 0);

    // A runlist naming foreign and unbound channels keeps only the VM's bound ones.
    submit_runlist(&b, 0x5_0000, &[1, 9, 2, 1, 300]);
    assert_eq!(rd(&b, pfifo::RUNLIST_RD_LEN) & pfifo::RUNLIST_PENDING, 0);
    let intr = rd(&b, pfifo::INTR);
    assert_ne!(intr & pfifo::INTR_RUNLIST_DONE, 0);
    assert_ne!(
        intr & pfifo::INTR_SCHED_ERROR,
        0,
        "unbound entries, as hardware"
    );
    assert_eq!(
        rd(&b, pfifo::SCHED_ERROR),
        pfifo::SCHED_ERR_INACTIVE_CHANNEL
    );
    assert_eq!(b.stats().violations.runlist_entries, 2);
    let list = phys.read_reg(pfifo::RUNLIST_RD_BASE);
    let (addr, _) = pfifo::runlist_base_decode(list).unwrap();
    assert!(addr < HYP);
    assert_eq!(
        phys.read_reg(pfifo::RUNLIST_RD_LEN) & pfifo::RUNLIST_LEN_MASK,
        1
    );
    assert_eq!(r.phys_u32(HostVram(addr)), base_b + 1);
    wr(&b, pfifo::INTR_RUNLIST, pfifo::INTR_RUNLIST_EVENT);
    wr(&b, pfifo::INTR, pfifo::INTR_SCHED_ERROR);
    assert_eq!(rd(&b, pfifo::INTR), 0);

    // USERD emulation: GP_PUT is the virtual value; GP_GET the physical one.
    doorbell(&b, 1, 0);
    let mut w = [0u8; 4];
    b.bar_read(Bar::Bar1, 0x4_0000 + userd::SIZE + userd::GP_PUT, &mut w);
    assert_eq!(u32::from_le_bytes(w), 0);
    assert_eq!(b.stats().doorbells, 1);

    // Instance block outside the slice.
    wr(
        &a,
        pfifo::USERD_POLL_BASE,
        pfifo::userd_poll_encode(0x4_0000),
    );
    wr(
        &a,
        pfifo::chan_table(0),
        pfifo::chan_encode(SLICE_MIB << 20, Target::Vram),
    );
    assert_eq!(
        rd(&a, pfifo::CHAN_TABLE_ERROR),
        pfifo::CHAN_ERR_INVALID_TARGET
    );
    assert_eq!(phys.read_reg(pfifo::chan_table(0)), 0);
    assert_eq!(a.stats().violations.vram_out_of_slice, 1);
    // USERD pointer outside the slice.
    inst_block(&a, 0x1_0000, 0x2_0000, SLICE_MIB << 20, 0, 2);
    wr(
        &a,
        pfifo::chan_table(0),
        pfifo::chan_encode(0x1_0000, Target::Vram),
    );
    assert_eq!(phys.read_reg(pfifo::chan_table(0)), 0);
    assert_eq!(a.stats().violations.instance_block, 1);

    // Rewriting the guest's bound instance block refreshes the shadow copy.
    let refreshes = b.stats().instance_refreshes;
    pramin_wr(
        &b,
        0x1_0000 + inst::RAMFC_IB_BASE_LO,
        &0x1000u32.to_le_bytes(),
    );
    assert_eq!(b.stats().instance_refreshes, refreshes + 1);
    phys.read_vram(HostVram(shadow + inst::RAMFC_IB_BASE_LO), &mut w);
    assert_eq!(u32::from_le_bytes(w), 0x1000);

    // Unbinding frees the copy and its shadow page tables.
    let used = r.host.stats().hypervisor_vram_used;
    wr(&b, pfifo::chan_table(1), 0);
    assert_eq!(phys.read_reg(pfifo::chan_table(base_b + 1)), 0);
    assert!(r.host.stats().hypervisor_vram_used < used);
    assert_eq!(a.stats().violations.foreign_channel, 0);
}

#[test]
fn faults_and_errors_reach_only_the_vm_that_caused_them() {
    let r = rig();
    let a = r.vm(ShadowMode::Lazy);
    let b = r.vm(ShadowMode::Lazy);
    let flag_a = Arc::new(IrqFlag::new());
    let flag_b = Arc::new(IrqFlag::new());
    a.set_irq_line(flag_a.clone());
    b.set_irq_line(flag_b.clone());
    for v in [&a, &b] {
        wr(v, pfifo::INTR_EN, pfifo::INTR_EN_DEFAULT);
        wr(v, pmc::INTR_EN_HOST, pmc::INTR_EN_HARDWARE);
    }
    // B's GPFIFO ring is not mapped: the GPU faults fetching entry 0.
    guest_channel(&b, 2, None);
    submit_runlist(&b, 0x5_0000, &[2]);
    wr(&b, pfifo::INTR_RUNLIST, pfifo::INTR_RUNLIST_EVENT);
    assert!(!flag_b.is_asserted());
    doorbell(&b, 2, 1);
    r.run_for(100_000);
    assert!(flag_b.is_asserted(), "B's line");
    assert!(!flag_a.is_asserted(), "A sees nothing");
    assert_eq!(rd(&a, pfifo::INTR), 0);
    let src = rd(&b, pfifo::VM_FAULT_SOURCE);
    assert_eq!(src, 1 << fault::UNIT_PFIFO);
    assert_eq!(
        rd(&b, pfifo::vm_fault(fault::UNIT_PFIFO, pfifo::VM_FAULT_INST)),
        0x1_0000 >> 12,
        "the guest's own instance address, not the shadow's"
    );
    assert_eq!(rd(&b, pfifo::vm_fault(fault::UNIT_PFIFO, 4)), 0x0400_0000);
    assert_eq!(rd(&b, pfifo::chan_state(2)) & pfifo::STATE_RUNNABLE, 0);
    let s = b.stats();
    assert_eq!((s.faults_delivered, s.submissions, s.aborted), (1, 1, 1));
    wr(&b, pfifo::VM_FAULT_SOURCE, src);
    assert!(!flag_b.is_asserted());

    // A's ring is mapped but holds GP_PUT beyond the ring: a PBDMA error for A only.
    guest_channel(&a, 3, Some(0x6_0000));
    pramin_wr64(&a, 0x6_0000, GpEntry::new(0x0400_0000, 1).encode());
    submit_runlist(&a, 0x5_0000, &[3]);
    wr(&a, pfifo::INTR_RUNLIST, pfifo::INTR_RUNLIST_EVENT);
    doorbell(&a, 3, 99);
    r.run_for(100_000);
    assert!(flag_a.is_asserted());
    assert!(!flag_b.is_asserted());
    assert_eq!(rd(&a, pfifo::SUBFIFO_INTR_SOURCE), 1);
    assert_eq!(
        rd(&a, pfifo::pbdma(0, pfifo::PBDMA_INTR)),
        pfifo::PBDMA_INTR_IB_PUT_OVERFLOW
    );
    assert_eq!(
        rd(&a, pfifo::pbdma(0, pfifo::PBDMA_CHID)),
        3 | pfifo::PBDMA_CHID_ACTIVE,
        "the guest's channel id"
    );
    wr(
        &a,
        pfifo::pbdma(0, pfifo::PBDMA_INTR),
        pfifo::PBDMA_INTR_IB_PUT_OVERFLOW,
    );
    assert!(!flag_a.is_asserted());
    let h = r.host.stats();
    assert_eq!((h.phys_faults, h.phys_pbdma_errors, h.unrouted), (1, 1, 0));
    assert_eq!(
        (h.inflight, h.queued),
        (0, 0),
        "stopped channels do not hold the GPU"
    );
}

#[test]
fn work_runs_and_completes_through_the_scheduler() {
    let r = rig();
    let v = r.vm(ShadowMode::Eager);
    // Ring at VA 0x4000000 -> guest page 0x60000; a pushbuffer at VA 0x4001000 -> 0x61000 that
    // releases a semaphore at VA 0x4002000 -> 0x62000.
    let (inst_a, pd, pt, userd_a) = (0x1_0000, 0x2_0000, 0x10_0000, 0x3_0000);
    guest_vm(
        &v,
        pd,
        pt,
        &[
            (0x0400_0000, 0x6_0000, Target::Vram),
            (0x0400_1000, 0x6_1000, Target::Vram),
            (0x0400_2000, 0x6_2000, Target::Vram),
        ],
    );
    inst_block(&v, inst_a, pd, userd_a, 0x0400_0000, 16);
    let sem = 0x0400_2000u64;
    let push = [
        gf100::method::incr(0, gf100::host::SEMAPHORE_A, 4),
        (sem >> 32) as u32,
        sem as u32,
        0x77,
        gf100::host::SEM_OP_RELEASE | gf100::host::SEM_RELEASE_4BYTE,
        gf100::method::incr(0, gf100::host::MEM_OP_A, 2),
        gf100::host::mem_op_a(pd, Target::Vram),
        gf100::host::mem_op_b_tlb_invalidate(false),
    ];
    let bytes: Vec<u8> = push.iter().flat_map(|w| w.to_le_bytes()).collect();
    pramin_wr(&v, 0x6_1000, &bytes);
    pramin_wr64(
        &v,
        0x6_0000,
        GpEntry::new(0x0400_1000, push.len() as u32).encode(),
    );
    wr(
        &v,
        pfifo::USERD_POLL_BASE,
        pfifo::userd_poll_encode(0x4_0000),
    );
    wr(
        &v,
        pfifo::chan_table(0),
        pfifo::chan_encode(inst_a, Target::Vram),
    );
    wr(&v, pfifo::chan_state(0), pfifo::STATE_START);
    submit_runlist(&v, 0x5_0000, &[0]);
    let rebuilds = v.stats().shadow.rebuilds;
    doorbell(&v, 0, 1);
    r.run_for(1_000_000);
    assert_eq!(
        pramin_rd(&v, 0x6_2000),
        0x77,
        "the release reached the guest's page"
    );
    let mut w = [0u8; 4];
    v.bar_read(Bar::Bar1, 0x4_0000 + userd::GP_GET, &mut w);
    assert_eq!(
        u32::from_le_bytes(w),
        1,
        "GP_GET shows the physical progress"
    );
    let s = v.stats();
    assert_eq!((s.doorbells, s.submissions, s.completions), (1, 1, 1));
    assert_eq!(s.mem_op_flushes, 1, "the scan saw the MEM_OP invalidate");
    assert!(
        s.shadow.rebuilds > rebuilds,
        "eager: the invalidate rebuilt the shadow"
    );
    assert!(r.host.stats().gpu.busy_ns > 0);
    // Measured charges read the channels the VM ever bound (`VmState::ran_chans`): what its
    // channel ran is what it was charged.
    let ran = r.gpu.channel_busy_ns(v.phys_channels().start).unwrap();
    let charged = r
        .host
        .sched_stats()
        .vms
        .iter()
        .find(|s| s.vm == v.id())
        .unwrap()
        .busy_ns;
    assert!(ran > 0);
    assert_eq!(charged, ran);
}

#[test]
fn destroy_scrubs_and_frees_everything() {
    let r = rig();
    let before = r.host.stats();
    let a = r.vm(ShadowMode::Incremental);
    guest_channel(&a, 0, None);
    submit_runlist(&a, 0x5_0000, &[0]);
    pramin_wr(&a, 0x77_0000, &0xdead_beefu32.to_le_bytes());
    let mid = r.host.stats();
    assert!(mid.hypervisor_vram_used > before.hypervisor_vram_used);
    assert_eq!(mid.channels_free, 124);
    r.host.destroy_vgpu(&a).unwrap();
    assert!(matches!(
        r.host.destroy_vgpu(&a),
        Err(HostError::NoSuchVm(_))
    ));
    // The dead handle reads the bad-register code and all-ones; writes go nowhere.
    assert_eq!(rd(&a, pmc::BOOT_0), gf100::BAD_REGISTER);
    let mut w = [0u8; 4];
    a.bar_read(Bar::Bar3, 0, &mut w);
    assert_eq!(w, [0xff; 4]);
    assert_eq!(r.host.phys().read_reg(pfifo::chan_table(0)), 0);
    let after = r.host.stats();
    assert_eq!(after.vram_free, before.vram_free);
    assert_eq!(after.channels_free, 128);
    assert_eq!(after.hypervisor_vram_used, before.hypervisor_vram_used);
    assert_eq!(after.dma_windows_free, before.dma_windows_free);
    // The next VM gets the same slice, and reads zeros where A left data.
    let b = r.vm(ShadowMode::Lazy);
    assert_eq!(pramin_rd(&b, 0x77_0000), 0);
    assert!(
        r.gpu.vram_resident_bytes() < 4 << 20,
        "the scrub dropped the chunks"
    );
    drop(b);
    assert_eq!(
        r.host.stats().vms,
        0,
        "dropping the last handle destroys the VM"
    );
}

#[test]
fn local_stats_read_the_vms_own_counters_without_the_host_lock() {
    let r = rig();
    let a = r.vm(ShadowMode::Incremental);
    let b = r.vm(ShadowMode::Incremental);
    guest_channel(&a, 0, None);
    pramin_wr(&a, 0x77_0000, &0xdead_beefu32.to_le_bytes());
    let _ = rd(&a, pmc::BOOT_0);
    // The same counters as the serviced read: nothing of them is the host's.
    let local = a.stats_local();
    assert_eq!(local, a.stats());
    assert!(
        local.exits.bar0.writes > 0 && local.exits.bar0.reads > 0,
        "{local:?}"
    );
    // The other VM's counters are its own.
    assert_eq!(b.stats_local(), b.stats());
    assert_eq!(b.stats_local().exits.bar0.writes, 0);
    // No hold of the host lock: only the second host-stats read's own first one is counted.
    let holds = r.host.stats().lock_holds.count;
    for _ in 0..3 {
        assert_eq!(a.stats_local(), local);
    }
    assert_eq!(r.host.stats().lock_holds.count, holds + 1);
    // Zeros once destroyed, as the serviced read.
    r.host.destroy_vgpu(&a).unwrap();
    assert_eq!(a.stats_local(), VgpuStats::default());
    assert_eq!(a.stats(), VgpuStats::default());
}

#[test]
fn a_poll_during_another_vms_hold_waits_it_out_instead_of_taking_the_lock() {
    let r = rig();
    r.host.set_clock(r.clock.clone());
    let a = r.vm(ShadowMode::Incremental);
    // Nothing in flight: a serviced access leaves the host quiet, and a poll is idle.
    let before = a.stats();
    a.poll();
    let idle = a.stats_local().idle_polls;
    assert_eq!(idle, before.idle_polls + 1, "a quiet host's poll is idle");
    let holds = r.host.stats().lock_holds;
    // Another VM's access holds the host lock (which says nothing of whether this VM's poll has
    // anything to do): the poll waits for it to end and looks again, instead of queueing for
    // the lock behind it and servicing a GPU that has nothing to service.
    let polling = a.clone();
    let t = r
        .host
        .in_a_hold(|| crate::host::spawn_until_asleep(move || polling.poll()));
    t.join().unwrap();
    assert_eq!(a.stats_local().idle_polls, idle + 1, "the poll stayed idle");
    let d = r.host.stats().lock_holds.since(&holds);
    assert_eq!(d.fast_waits, 1, "it waited out the hold: {d:?}");
    assert_eq!(d.waits, 0, "nobody queued for the lock: {d:?}");
    // The hold itself and the first stats read's; none of the poll's.
    assert_eq!(d.count, 2, "{d:?}");
}

#[test]
fn the_hold_figures_are_read_without_a_hold() {
    let r = rig();
    let a = r.host.lock_holds();
    // Reading them again takes no hold and waits for nothing.
    assert_eq!(r.host.lock_holds(), a);
    // The host's stats read them inside a hold of its own, which the next read shows.
    assert_eq!(r.host.stats().lock_holds, a);
    assert_eq!(r.host.lock_holds().count, a.count + 1);
}

#[test]
fn a_long_hold_hands_the_lock_to_the_access_that_waited_for_it() {
    let host = Arc::new(rig().host);
    // Rounds back to back: the lock's own fairness timer (which hands over now and then, at
    // random, whatever the hold) has mostly not run out again by the next round's release,
    // so without the hand-off the holder would take the lock straight back in most rounds.
    for round in 0..20 {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        // A hold that lasts the hand-off threshold, with another thread parked on the lock.
        let waiter = {
            let (other, order) = (host.clone(), order.clone());
            host.in_a_hold(|| {
                let t0 = std::time::Instant::now();
                let t = crate::host::spawn_until_asleep(move || {
                    other.in_a_hold(|| order.lock().unwrap().push("waiter"))
                });
                let long = std::time::Duration::from_nanos(crate::host::FAIR_HANDOFF_AFTER_NS);
                while t0.elapsed() < long {
                    std::hint::spin_loop();
                }
                t
            })
        };
        // The holder wants the lock again at once, while the waiter is still waking up: the
        // lock was handed to the waiter, so the holder gets it only after the waiter's hold.
        host.in_a_hold(|| order.lock().unwrap().push("holder again"));
        waiter.join().unwrap();
        assert_eq!(
            *order.lock().unwrap(),
            ["waiter", "holder again"],
            "round {round}"
        );
    }
}

#[test]
fn partitions_are_refused_when_they_do_not_fit() {
    let r = rig();
    r.host
        .set_scheduler(Box::new(crate::sched::FifoScheduler::new()))
        .unwrap();
    let big = VgpuProfile {
        vram_mib: 1 << 10,
        ..profile(ShadowMode::Lazy)
    };
    assert!(matches!(
        r.host.create_vgpu(&big),
        Err(HostError::NoVram { .. })
    ));
    let many = VgpuProfile {
        channels: 100,
        ..profile(ShadowMode::Lazy)
    };
    let _x = r.host.create_vgpu(&many).unwrap();
    assert!(r
        .host
        .set_scheduler(Box::new(crate::sched::FifoScheduler::new()))
        .is_err());
    assert!(matches!(
        r.host.create_vgpu(&many),
        Err(HostError::NoChannels { .. })
    ));
    let bad = VgpuProfile {
        vram_mib: 1,
        ..profile(ShadowMode::Lazy)
    };
    assert!(matches!(
        r.host.create_vgpu(&bad),
        Err(HostError::Profile(_))
    ));
    // A DMA window too small for the RAM.
    let v = r.vm(ShadowMode::Lazy);
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 4096)]).unwrap();
    assert_eq!(
        v.attach_guest_memory(mem),
        Err(crate::vgpu::VgpuError::AlreadyAttached)
    );
    // Detached, it takes a new set (what a vfio-user server does on each DMA map), once.
    v.detach_guest_memory().unwrap();
    let two = GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), 4096),
        (GuestAddress(0x10_0000), 8192),
    ])
    .unwrap();
    v.attach_guest_memory(two.clone()).unwrap();
    assert_eq!(
        v.attach_guest_memory(two),
        Err(crate::vgpu::VgpuError::AlreadyAttached)
    );
    v.detach_guest_memory().unwrap();
    v.detach_guest_memory().unwrap();
    // Few DMA windows: with 2^38-byte windows there are 3 slots.
    let gpu: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: 1 << 30,
        ..SimConfig::default()
    }));
    let host = GpuHost::new(
        gpu,
        HostConfig {
            iova_window: 1 << 38,
            hypervisor_vram: HYP,
            ..HostConfig::default()
        },
    )
    .unwrap();
    let vms: Vec<_> = (0..3)
        .map(|_| host.create_vgpu(&profile(ShadowMode::Lazy)).unwrap())
        .collect();
    assert!(matches!(
        host.create_vgpu(&profile(ShadowMode::Lazy)),
        Err(HostError::NoDmaWindow { .. })
    ));
    drop(vms);
    assert!(host.create_vgpu(&profile(ShadowMode::Lazy)).is_ok());
    assert!(GpuHost::new(
        Arc::new(SimGpu::default()),
        HostConfig {
            max_inflight: 0,
            ..HostConfig::default()
        }
    )
    .is_err());
}

#[test]
fn dma_windows_sized_from_ram_let_64_vms_share_the_iova_space() {
    // With the default 32 GiB window only 31 VMs fit below 2^40; windows sized from a 4 MiB
    // RAM leave room for far more, and each VM's window is disjoint from the others'.
    let gpu: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: 8 << 30,
        ..SimConfig::default()
    }));
    let host = GpuHost::new(
        gpu,
        HostConfig {
            hypervisor_vram: 256 << 20,
            shadow_vram_per_vm: 1 << 20,
            ..HostConfig::default()
        },
    )
    .unwrap();
    assert_eq!(host.stats().dma_windows_free, 31);
    let small = VgpuProfile {
        channels: 2,
        ..profile(ShadowMode::Lazy)
    };
    let vms: Vec<_> = (0..64)
        .map(|i| {
            let v = host.create_vgpu_for_ram(&small, GUEST_RAM).unwrap();
            let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), GUEST_RAM as usize)])
                .unwrap();
            v.attach_guest_memory(mem)
                .unwrap_or_else(|e| panic!("vm {i}: {e}"));
            v
        })
        .collect();
    let s = host.stats();
    assert_eq!(s.vms, 64);
    assert_eq!(s.channels_free, 0);
    assert_eq!(
        (1u64 << 40) - (1 << 20) - s.iova_free,
        64 * GUEST_RAM,
        "each VM holds a window of its RAM's size"
    );
    // RAM larger than the window it was created for is refused with a clear error.
    host.destroy_vgpu(&vms[0]).unwrap();
    let v = host.create_vgpu_for_ram(&small, GUEST_RAM).unwrap();
    let big =
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 * GUEST_RAM as usize)]).unwrap();
    assert!(matches!(
        v.attach_guest_memory(big),
        Err(crate::vgpu::VgpuError::RamTooLarge { .. })
    ));
    drop(v);
    drop(vms);
    let s = host.stats();
    assert_eq!((s.vms, s.iova_free), (0, (1u64 << 40) - (1 << 20)));
    assert_eq!(s.dma_windows_free, 31);
}

#[test]
fn an_exhausted_iova_space_is_a_clear_error() {
    let gpu: Arc<dyn PhysicalGpu> = Arc::new(SimGpu::new(SimConfig {
        vram_size: 1 << 30,
        ..SimConfig::default()
    }));
    let host = GpuHost::new(
        gpu,
        HostConfig {
            hypervisor_vram: HYP,
            ..HostConfig::default()
        },
    )
    .unwrap();
    // Two 2^38-byte windows (RAM sized) and one default 32 GiB window; then a 2^39 window
    // no longer fits.
    let a = host
        .create_vgpu_for_ram(&profile(ShadowMode::Lazy), 1 << 38)
        .unwrap();
    let b = host
        .create_vgpu_for_ram(&profile(ShadowMode::Lazy), (1 << 37) + 1)
        .unwrap();
    let c = host.create_vgpu(&profile(ShadowMode::Lazy)).unwrap();
    let e = host
        .create_vgpu_for_ram(&profile(ShadowMode::Lazy), 1 << 39)
        .unwrap_err();
    assert!(matches!(e, HostError::NoDmaWindow { window, vms: 3, .. } if window == 1 << 39));
    let msg = e.to_string();
    assert!(
        msg.contains("no DMA window left") && msg.contains("create_vgpu_for_ram"),
        "{msg}"
    );
    assert!(matches!(
        host.create_vgpu_for_ram(&profile(ShadowMode::Lazy), (1 << 39) + 1),
        Err(HostError::Config(_))
    ));
    drop((a, b, c));
    assert!(host
        .create_vgpu_for_ram(&profile(ShadowMode::Lazy), 1 << 39)
        .is_ok());
}

#[test]
fn is_shareable_between_threads() {
    fn check<T: Send + Sync>() {}
    check::<Vgpu>();
    check::<GpuHost>();
}

mod fuzz {
    use super::*;
    use crate::mmio::regions::BAR0_REGIONS;
    use proptest::prelude::*;

    /// One hostile access.
    #[derive(Debug, Clone)]
    enum Access {
        Reg {
            region: usize,
            word: u32,
            value: u32,
            write: bool,
        },
        Aperture {
            bar3: bool,
            offset: u64,
            value: u64,
            width: u8,
            write: bool,
        },
        Poll,
    }

    fn value() -> impl Strategy<Value = u32> {
        prop_oneof![
            any::<u32>(),
            0u32..256,
            (0u32..0x8000).prop_map(|p| p << 12 >> 12 | 0xc000_0000),
            (0u32..0x2000).prop_map(|p| p << 4),
        ]
    }

    fn access() -> impl Strategy<Value = Access> {
        prop_oneof![
            6 => (0..BAR0_REGIONS.len(), any::<u32>(), value(), any::<bool>()).prop_map(
                |(region, word, value, write)| Access::Reg { region, word, value, write }
            ),
            3 => (any::<bool>(), 0u64..0x10_0000, any::<u64>(), 0u8..4, any::<bool>()).prop_map(
                |(bar3, offset, value, w, write)| Access::Aperture {
                    bar3, offset, value, width: 1 << w, write
                }
            ),
            1 => Just(Access::Poll),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

        /// Whatever a guest writes, the host does not panic, never forwards an unknown
        /// register, and the other VM's memory and channels are untouched.
        #[test]
        fn a_hostile_guest_hurts_only_itself(ops in proptest::collection::vec(access(), 1..600)) {
            let r = rig();
            let a = r.vm(ShadowMode::Incremental);
            let b = r.vm(ShadowMode::Lazy);
            guest_channel(&b, 0, None);
            pramin_wr(&b, 0x70_0000, &0x600d_600du32.to_le_bytes());
            let b_chan = r.host.phys().read_reg(pfifo::chan_table(b.phys_channels().start));
            let hyp_before = r.host.stats().hypervisor_vram_used;
            for op in ops {
                match op {
                    Access::Reg { region, word, value, write } => {
                        let reg = &BAR0_REGIONS[region];
                        let off = reg.offset + (word % (reg.size / 4)) * 4;
                        if write { wr(&a, off, value) } else { rd(&a, off); }
                    }
                    Access::Aperture { bar3, offset, value, width, write } => {
                        let bar = if bar3 { Bar::Bar3 } else { Bar::Bar1 };
                        let bytes = value.to_le_bytes();
                        if write {
                            a.bar_write(bar, offset, &bytes[..width as usize]);
                        } else {
                            let mut buf = vec![0u8; width as usize];
                            a.bar_read(bar, offset, &mut buf);
                        }
                    }
                    Access::Poll => r.run_for(10_000),
                }
            }
            r.run_for(100_000);
            prop_assert_eq!(pramin_rd(&b, 0x70_0000), 0x600d_600d);
            prop_assert_eq!(
                r.host.phys().read_reg(pfifo::chan_table(b.phys_channels().start)),
                b_chan
            );
            prop_assert_eq!(b.stats().violations.total, 0);
            prop_assert_eq!(b.stats().faults_delivered + b.stats().pbdma_errors_delivered, 0);
            let g = r.gpu.stats();
            prop_assert_eq!(g.bad_register_writes + g.bad_register_reads, 0);
            // Every physical channel bound belongs to one of the two partitions.
            for p in 8..128 {
                prop_assert_eq!(r.host.phys().read_reg(pfifo::chan_table(p)), 0);
            }
            r.host.destroy_vgpu(&a).unwrap();
            r.host.destroy_vgpu(&b).unwrap();
            let h = r.host.stats();
            prop_assert!(h.hypervisor_vram_used <= hyp_before);
            prop_assert_eq!(h.hypervisor_vram_used, h.hypervisor_vram_host);
            prop_assert_eq!((h.inflight, h.queued, h.channels_free), (0, 0, 128));
        }
    }
}

/// Each VM reserves `shadow_vram_per_vm` of hypervisor VRAM for its shadows: a VM whose
/// reservation no longer fits is refused (so no VM can starve another's shadow tables), and
/// destroying a VM gives its reservation back. Every admitted VM's shadows are capped.
#[test]
fn shadow_vram_is_reserved_per_vm_and_admission_is_refused_when_full() {
    let r = rig();
    let per_vm = HostConfig::default().shadow_vram_per_vm;
    let mut vms = Vec::new();
    let refused = loop {
        match r.host.create_vgpu(&profile(ShadowMode::Lazy)) {
            Ok(v) => vms.push(v),
            Err(e) => break e,
        }
        assert!(
            vms.len() <= 8,
            "the reservation should run out before 8 VMs in {HYP:#x}"
        );
    };
    assert!(
        matches!(refused, HostError::HypervisorVram { .. }),
        "{refused}"
    );
    assert!(!vms.is_empty());
    assert!(vms.len() as u64 * per_vm <= HYP);
    for v in &vms {
        assert_eq!(
            v.port.access(v.id, |cx| cx.vm.shadow.shadow_limit()),
            Some(per_vm)
        );
    }
    let last = vms.pop().unwrap();
    r.host.destroy_vgpu(&last).unwrap();
    assert!(
        r.host.create_vgpu(&profile(ShadowMode::Lazy)).is_ok(),
        "the reservation came back"
    );
}

#[test]
fn a_too_small_shadow_reservation_is_a_configuration_error() {
    let gpu = Arc::new(SimGpu::new(SimConfig {
        vram_size: 512 << 20,
        ..SimConfig::default()
    }));
    let e = GpuHost::new(
        gpu,
        HostConfig {
            shadow_vram_per_vm: 4096,
            ..HostConfig::default()
        },
    )
    .expect_err("refused");
    assert!(e.to_string().contains("shadow_vram_per_vm"), "{e}");
}

/// Binds `bar` (BAR1 or BAR3) to a guest VM built at `pd`/`pt` through an instance block at
/// `inst_a`, mapping `maps`; returns after the binding write.
fn bind_bar_vm(v: &Vgpu, bar: Bar, inst_a: u64, pd: u64, pt: u64, maps: &[(u64, u64, Target)]) {
    guest_vm(v, pd, pt, maps);
    pramin_wr64(v, inst_a + inst::PDB_LO, inst::pdb_encode(pd, Target::Vram));
    pramin_wr64(v, inst_a + inst::LIMIT_LO, bar.size() - 1);
    let reg = if bar == Bar::Bar1 {
        pbus::BAR1_INST
    } else {
        pbus::BAR3_INST
    };
    wr(v, reg, pbus::bar_inst_encode(inst_a, Target::Vram));
}

#[test]
fn direct_map_holds_only_the_vms_own_vram_and_never_userd() {
    let r = rig();
    let v = r.vm(ShadowMode::Lazy);
    let base = v.vram_slice().base.raw();
    wr(
        &v,
        pfifo::USERD_POLL_BASE,
        pfifo::userd_poll_encode(0x4_0000),
    );
    let mut maps = vec![
        (0x0000, 0x80_0000, Target::Vram),
        (0x1000, 0x80_1000, Target::Vram),
        // Beyond the slice: another VM's VRAM (or hypervisor VRAM) physically.
        (0x2000, SLICE_MIB << 20, Target::Vram),
        (0x3000, 0x4000_0000, Target::Vram),
        // Guest RAM.
        (0x5000, 0x1000, Target::SysCoherent),
        (0x6000, 0x90_0000, Target::Vram),
    ];
    // The USERD poll area (channels 0 and 1), mapped by the guest onto its own VRAM.
    maps.push((0x4_0000, 0xa0_0000, Target::Vram));
    maps.push((0x4_1000, 0xa0_1000, Target::Vram));
    bind_bar_vm(&v, Bar::Bar1, 0x1_0000, 0x2_0000, 0x10_0000, &maps);
    let m = v.direct_map(Bar::Bar1);
    let runs: Vec<(u64, u64, u64, bool)> = m
        .runs
        .iter()
        .map(|r| (r.offset, r.len, r.host.raw() - base, r.read_only))
        .collect();
    assert_eq!(
        runs,
        vec![
            (0x0000, 0x2000, 0x80_0000, false),
            (0x6000, 0x1000, 0x90_0000, false)
        ],
        "only pages in the VM's slice, outside the poll area"
    );
    assert_eq!(m.pages(), 3);
    for run in &m.runs {
        let end = run.host.raw() + run.len;
        assert!(run.host.raw() >= base && end <= base + (SLICE_MIB << 20));
    }
    // The mapping agrees with the trapped path: what BAR1 offset 0x1008 reads is at the host
    // address the plan gives.
    v.bar_write(Bar::Bar1, 0x1008, &0xdead_beefu32.to_le_bytes());
    assert_eq!(r.phys_u32(HostVram(base + 0x80_1008)), 0xdead_beef);
    assert_eq!(
        m.run_at(0x1008).map(|r| r.host.raw() + 0x1008 - r.offset),
        Some(base + 0x80_1008)
    );
    // BAR0 has no plan; a destroyed vGPU has none either.
    assert!(v.direct_map(Bar::Bar0).runs.is_empty());
    assert_eq!(
        v.stats().violations.total,
        0,
        "planning is not a guest access"
    );
}

#[test]
fn direct_map_marks_tracked_instance_and_read_only_pages() {
    for mode in [ShadowMode::Lazy, ShadowMode::Incremental] {
        let r = rig();
        let v = r.vm(mode);
        // A channel: instance block 0x10000, PD 0x20000, its table 0x100000, USERD poll area
        // at BAR1 0x40000.
        guest_channel(&v, 0, None);
        let mut ro = Pte::new(0x80_2000, Target::Vram);
        ro.read_only = true;
        bind_bar_vm(
            &v,
            Bar::Bar3,
            0x5_0000,
            0x6_0000,
            0x20_0000,
            &[
                (0x0000, 0x1_0000, Target::Vram),  // the channel's instance block
                (0x1000, 0x10_0000, Target::Vram), // its page table
                (0x2000, 0x80_0000, Target::Vram), // data
            ],
        );
        pramin_wr64(&v, 0x20_0000 + 3 * mmu::ENTRY_SIZE, ro.encode());
        wr(
            &v,
            pffb::TLB_FLUSH_TRIGGER,
            pffb::FLUSH_TRIGGER | pffb::FLUSH_ALL_PDB,
        );
        let m = v.direct_map(Bar::Bar3);
        let flags: Vec<(u64, bool)> = (0..4)
            .map(|i| {
                let run = m.run_at(i * 0x1000).expect("page in the plan");
                (i * 0x1000, run.read_only)
            })
            .collect();
        let tracked = mode == ShadowMode::Incremental;
        assert_eq!(
            flags,
            vec![
                (0, true),
                (0x1000, tracked),
                (0x2000, false),
                (0x3000, true)
            ],
            "{mode:?}: instance blocks and guest read-only pages always, page tables when tracked"
        );
    }
}

#[test]
fn direct_map_generation_moves_when_the_plan_may() {
    let r = rig();
    let v = r.vm(ShadowMode::Lazy);
    let g0 = v.direct_map_generation();
    bind_bar_vm(
        &v,
        Bar::Bar1,
        0x1_0000,
        0x2_0000,
        0x10_0000,
        &[(0, 0x80_0000, Target::Vram)],
    );
    let g1 = v.direct_map_generation();
    assert_ne!(g0, g1, "binding");
    assert_eq!(v.direct_map(Bar::Bar1).generation, g1);
    // Data accesses and a PTE write without a flush change nothing.
    v.bar_write(Bar::Bar1, 0x10, &1u32.to_le_bytes());
    pramin_wr64(
        &v,
        0x10_0000 + 8,
        Pte::new(0x80_1000, Target::Vram).encode(),
    );
    // (A VMM keeps its old mapping until the guest flushes, as the hardware's TLB would.)
    assert_eq!(v.direct_map_generation(), g1);
    wr(
        &v,
        pffb::TLB_FLUSH_TRIGGER,
        pffb::FLUSH_TRIGGER | pffb::FLUSH_ALL_PDB,
    );
    let g2 = v.direct_map_generation();
    assert_ne!(g1, g2, "TLB flush");
    assert_eq!(v.direct_map(Bar::Bar1).pages(), 2);
    // A flush of some other page directory (a channel's) leaves the BAR plans alone.
    wr(
        &v,
        pffb::TLB_FLUSH_VSPACE,
        pffb::vspace_encode(0x30_0000, Target::Vram),
    );
    wr(
        &v,
        pffb::TLB_FLUSH_TRIGGER,
        pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL,
    );
    assert_eq!(v.direct_map_generation(), g2);
    wr(
        &v,
        pffb::TLB_FLUSH_VSPACE,
        pffb::vspace_encode(0x2_0000, Target::Vram),
    );
    wr(
        &v,
        pffb::TLB_FLUSH_TRIGGER,
        pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL,
    );
    let g2b = v.direct_map_generation();
    assert_ne!(g2b, g2, "a flush of BAR1's page directory");
    let g2 = g2b;
    wr(&v, pfifo::USERD_POLL_BASE, pfifo::userd_poll_encode(0));
    let g3 = v.direct_map_generation();
    assert_ne!(g2, g3, "poll area");
    assert!(
        v.direct_map(Bar::Bar1).runs.is_empty(),
        "USERD now covers BAR1 0..512 KiB"
    );
    // Binding a channel (instance pages) and, in incremental mode, tracking its tables.
    let w = r.vm(ShadowMode::Incremental);
    let h0 = w.direct_map_generation();
    guest_channel(&w, 0, None);
    assert_ne!(
        w.direct_map_generation(),
        h0,
        "channel bound, tables tracked"
    );
    assert!(w.stats().shadow.tracked_pages > 0);
}

mod grctx;
mod pci;

/// Submits `ops` as one para-virtual batch from guest RAM at 0x1000; (applied, error).
fn pv_batch(v: &Vgpu, mem: &GuestMemoryMmap, ops: &[pv::Op]) -> (u32, u32) {
    use vm_memory::Bytes;
    let bytes: Vec<u8> = ops.iter().flat_map(|o| o.to_bytes()).collect();
    mem.write_slice(&bytes, GuestAddress(0x1000)).unwrap();
    wr(v, pv::BATCH_LO, 0x1000);
    wr(v, pv::BATCH_HI, 0);
    wr(v, pv::BATCH_COUNT, ops.len() as u32);
    wr(v, pv::SUBMIT, 1);
    (rd(v, pv::STATUS), rd(v, pv::ERROR))
}

#[test]
fn a_pv_batch_moves_the_direct_map_generation_only_when_it_names_a_bar_table() {
    let r = rig();
    let v = r.host.create_vgpu(&profile(ShadowMode::Pv)).unwrap();
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), GUEST_RAM as usize)]).unwrap();
    v.attach_guest_memory(mem.clone()).unwrap();
    // A channel whose VM is at PD 0x2_0000 / PT 0x10_0000, and BAR1 through PD 0x6_0000 /
    // PT 0x20_0000.
    guest_channel(&v, 0, None);
    bind_bar_vm(
        &v,
        Bar::Bar1,
        0x5_0000,
        0x6_0000,
        0x20_0000,
        &[(0, 0x80_0000, Target::Vram)],
    );
    let g = v.direct_map_generation();
    let pte = |table: u64, op: u32| pv::Op {
        op,
        target: Target::Vram.bits(),
        table,
        index: 3,
        value: Pte::new(0x81_0000, Target::Vram).encode(),
    };
    // The channel's own page table: applied, and the BAR plans cannot have changed.
    assert_eq!(
        pv_batch(&v, &mem, &[pte(0x10_0000, pv::OP_WRITE_PTE)]),
        (1, pv::ERR_NONE)
    );
    assert_eq!(
        v.direct_map_generation(),
        g,
        "a channel's table is no BAR's"
    );
    // BAR1's page table, its page directory (a flush of it), or a table of an unknown target:
    // the plan may have changed.
    let mut last = g;
    for op in [
        pte(0x20_0000, pv::OP_WRITE_PTE),
        pte(0x6_0000, pv::OP_FLUSH),
        pv::Op {
            target: 1,
            ..pte(0x10_0000, pv::OP_WRITE_PTE)
        },
    ] {
        pv_batch(&v, &mem, &[op]);
        let now = v.direct_map_generation();
        assert_ne!(
            now, last,
            "{op:?} names a BAR table (or cannot be told apart)"
        );
        last = now;
    }
}
