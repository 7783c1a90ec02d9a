//! The attacks of the threat model (`docs/isolation.md`), each made by a VM running the real
//! guest driver (plus raw register and PRAMIN writes where the driver would not misbehave on its
//! own), next to a victim VM running the same driver. For each attack: the attacker gets a fault
//! or an error, the violation (or, for memory the attacker merely left unmapped, the fault) is
//! counted in the attacker's stats, the victim's VRAM slice and guest RAM are bit-identical
//! before and after, the victim's workloads still verify and its counters stay at zero, and the
//! host does not panic.
//!
//! The attacker's slice is placed right below the victim's, so "one byte beyond the attacker's
//! slice" is the victim's memory if anything let it through.

use gpuvm::clock::Clock;
use gpuvm::gf100::gpfifo::GpEntry;
use gpuvm::gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gpuvm::gf100::{fault, host as hm, inst, pbus, pffb, pfifo, userd, Target};
use gpuvm::host::HostConfig;
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm::profile::ShadowMode;
use gpuvm::vgpu::VgpuStats;
use gpuvm_guest::hal::Mmio;
use gpuvm_guest::push::SUBC_HOST;
use gpuvm_guest::{Backing, Channel, DriverError, MemLocation, PageSize, PushBuf};
use vm_memory::{Bytes, GuestAddress};

mod support;
use support::vgpu_rig::{run_suite, world as rig_world, Vm, World, RAM, SLICE};

/// A VA far from anything the driver maps (PDE 0xe00).
const EVIL_VA: u64 = 0x0070_0000_0000;

fn world() -> World {
    rig_world(HostConfig::default())
}

impl World {
    fn vm(&self, shadow: ShadowMode) -> Vm {
        self.vm_with("iso", shadow, 1_000_000_000)
    }
}

/// Runs `attack` in an attacker VM next to a victim VM and checks the victim is untouched.
/// Returns the attacker's counters.
fn isolated(shadow: ShadowMode, attack: impl FnOnce(&World, &mut Vm, &Vm)) -> VgpuStats {
    let w = world();
    let mut attacker = w.vm(shadow);
    let mut victim = w.vm(shadow);
    assert_eq!(
        attacker.vgpu.vram_slice().base.raw() + SLICE,
        victim.vgpu.vram_slice().base.raw(),
        "the victim's slice follows the attacker's"
    );
    run_suite(&mut victim);
    w.settle();
    let before = w.fingerprint(&victim);
    attack(&w, &mut attacker, &victim);
    w.settle();
    assert_eq!(
        w.fingerprint(&victim),
        before,
        "{shadow}: the victim's memory changed"
    );
    run_suite(&mut victim);
    let v = victim.vgpu.stats();
    assert_eq!(v.violations.total, 0, "{shadow}: {:?}", v.violations);
    assert_eq!(
        v.faults_delivered + v.bar_faults + v.pbdma_errors_delivered,
        0
    );
    attacker.vgpu.stats()
}

fn raw_wr(vm: &mut Vm, reg: u32, v: u32) {
    vm.drv.hal_mut().write32(Bar::Bar0, u64::from(reg), v);
}

fn raw_rd(vm: &mut Vm, reg: u32) -> u32 {
    vm.drv.hal_mut().read32(Bar::Bar0, u64::from(reg))
}

fn pramin_wr64(vm: &mut Vm, addr: u64, v: u64) {
    vm.drv.pramin_wr32(addr, v as u32);
    vm.drv.pramin_wr32(addr + 4, (v >> 32) as u32);
}

fn expect_fault(r: Result<(), DriverError>, what: &str) {
    match r {
        Err(DriverError::MmuFault { .. }) => {}
        other => panic!("{what}: expected an MMU fault, got {other:?}"),
    }
}

/// Maps one 4 KiB page of the attacker's channel VM at a fresh VA to `backing`, then has the copy
/// engine write guest-RAM data there and read it back; both must fault.
fn copy_through(vm: &mut Vm, backing: Backing) -> Result<(), DriverError> {
    let mut ch = vm.drv.channel_new()?;
    let va = vm.drv.vm_alloc_va(ch.vm_mut(), 4096, PageSize::Small)?;
    vm.drv
        .vm_map(ch.vm_mut(), va, backing, 4096, PageSize::Small)?;
    let src = vm
        .drv
        .buffer_new(ch.vm_mut(), 4096, MemLocation::Sysram, true)?;
    vm.drv.buffer_write_words(&src, 0, &[0x6666_6666; 1024])?;
    let mut pb = PushBuf::new();
    pb.copy(src.va(), va, 4096);
    let f = vm.drv.submit(&mut ch, &pb)?;
    vm.drv.fence_wait(&mut ch, f)
}

#[test]
fn pte_into_vram_outside_the_slice() {
    for shadow in ShadowMode::ALL {
        let s = isolated(shadow, |_, a, _| {
            expect_fault(
                copy_through(a, Backing::Vram(SLICE)),
                "write beyond the slice",
            );
        });
        assert!(s.faults_delivered >= 1, "{shadow}");
        assert!(s.violations.page_table >= 1, "{shadow}: {:?}", s.violations);
    }
}

#[test]
fn sysram_pte_outside_guest_ram() {
    for shadow in ShadowMode::ALL {
        let s = isolated(shadow, |_, a, _| {
            expect_fault(
                copy_through(a, Backing::Sysram(RAM)),
                "write beyond guest RAM",
            );
        });
        assert!(s.faults_delivered >= 1, "{shadow}");
        assert!(s.violations.page_table >= 1, "{shadow}: {:?}", s.violations);
    }
}

#[test]
fn page_table_outside_the_slice() {
    for shadow in ShadowMode::ALL {
        let s = isolated(shadow, |_, a, _| {
            let r = (|| {
                let mut ch = a.drv.channel_new()?;
                let pd = ch.vm_mut().pd_addr();
                let pde = Pde {
                    large: None,
                    small: Some(PtRef {
                        addr: SLICE + 0x10_0000,
                        target: Target::Vram,
                        vol: false,
                    }),
                    size: PtSize::Full,
                };
                pramin_wr64(a, pd + mmu::pde_index(EVIL_VA) * 8, pde.encode());
                // Any mapping makes the driver flush the TLB of the address space.
                let src = a
                    .drv
                    .buffer_new(ch.vm_mut(), 4096, MemLocation::Sysram, true)?;
                let mut pb = PushBuf::new();
                pb.copy(src.va(), EVIL_VA, 4096);
                let f = a.drv.submit(&mut ch, &pb)?;
                a.drv.fence_wait(&mut ch, f)
            })();
            expect_fault(r, "through a page table beyond the slice");
        });
        assert!(s.faults_delivered >= 1, "{shadow}");
        assert!(s.violations.page_table >= 1, "{shadow}: {:?}", s.violations);
    }
}

/// Where the driver put channel `ch`'s structures, read back from them as a hostile driver
/// would (the channel-table word, then RAMFC through PRAMIN): (guest instance block, pushbuffer
/// ring VA, GPFIFO ring VA). The driver puts the GPFIFO ring right after the pushbuffer ring.
fn channel_rings(vm: &mut Vm, ch: &Channel) -> (u64, u64, u64) {
    let word = raw_rd(vm, pfifo::chan_table(ch.chid()));
    let (inst_addr, _) = pfifo::chan_decode(word).expect("a bound channel");
    let lo = vm.drv.pramin_rd32(inst_addr + inst::RAMFC_IB_BASE_LO);
    let cfg = vm.drv.pramin_rd32(inst_addr + inst::RAMFC_IB_CONFIG);
    let (ib_va, _) = inst::ib_config_decode(lo, cfg);
    let pb_bytes = vm.drv.config().pushbuf_bytes;
    (inst_addr, ib_va - pb_bytes, ib_va)
}

fn pramin_rd64(vm: &mut Vm, addr: u64) -> u64 {
    u64::from(vm.drv.pramin_rd32(addr)) | u64::from(vm.drv.pramin_rd32(addr + 4)) << 32
}

/// The guest-RAM address small-page VA `va` of the address space at `pd` maps, walked through
/// PRAMIN.
fn sysram_behind(vm: &mut Vm, pd: u64, va: u64) -> u64 {
    let pde = Pde::decode(pramin_rd64(vm, pd + mmu::pde_index(va) * mmu::ENTRY_SIZE));
    let spt = pde.small.expect("a small-page table").addr;
    let raw = pramin_rd64(vm, spt + mmu::spt_index(va) * mmu::ENTRY_SIZE);
    let pte = Pte::decode(raw).unwrap().expect("a present PTE");
    assert_eq!(
        pte.target,
        Target::SysCoherent,
        "the driver's rings are in guest RAM"
    );
    pte.addr + va % mmu::SMALL_PAGE_SIZE
}

/// Submits `pb` with the driver and waits for its fence; expects an MMU fault of the pushbuffer
/// fetch (unit PFIFO, a read) reported with the guest's own instance block, and returns its VA.
fn fetch_fault(vm: &mut Vm, ch: &mut Channel, pb: &PushBuf, inst_addr: u64) -> u64 {
    let r = vm.drv.submit(ch, pb).and_then(|f| vm.drv.fence_wait(ch, f));
    match r {
        Err(DriverError::MmuFault {
            va,
            unit,
            write,
            inst,
            ..
        }) => {
            assert_eq!(unit, fault::UNIT_PFIFO, "the fetch faulted");
            assert!(!write);
            assert_eq!(
                inst, inst_addr,
                "the guest's instance block, not the shadow"
            );
            assert!(ch.is_broken());
            va
        }
        other => panic!("expected an MMU fault of the fetch, got {other:?}"),
    }
}

#[test]
fn gpfifo_entry_or_pushbuffer_at_unmapped_memory() {
    // Three submissions whose command stream the GPU cannot fetch, each on its own channel of
    // the attacker: (1) the driver's own GPFIFO entry after the attacker unmapped the whole
    // pushbuffer ring, (2) a segment that starts in the one page left mapped and runs into the
    // unmapped rest, (3) a GPFIFO entry naming a VA nothing maps, written straight into the ring
    // with the doorbell rung by hand. The GPU faults in the attacker's channel each time; the
    // pushbuffer scan on the submission path stops at the unmapped memory.
    for shadow in ShadowMode::ALL {
        let s = isolated(shadow, |w, a, _| {
            let pb_bytes = a.drv.config().pushbuf_bytes;
            let mut nop = PushBuf::new();
            nop.method(SUBC_HOST, hm::NOP, &[0]);

            // (1) The pushbuffer VA is unmapped.
            let mut ch = a.drv.channel_new().unwrap();
            let (inst_addr, push_va, _) = channel_rings(a, &ch);
            a.drv
                .vm_unmap(ch.vm_mut(), push_va, pb_bytes, PageSize::Small)
                .unwrap();
            let va = fetch_fault(a, &mut ch, &nop, inst_addr);
            assert!(
                (push_va..push_va + mmu::SMALL_PAGE_SIZE).contains(&va),
                "{shadow}: fault at {va:#x}, the ring is at {push_va:#x}"
            );
            a.drv.channel_free(ch).unwrap();

            // (2) The segment runs past mapped memory: 6 KiB of NOPs from the ring's first
            // (still mapped) page into its second (unmapped) one.
            let mut ch = a.drv.channel_new().unwrap();
            let (inst_addr, push_va, _) = channel_rings(a, &ch);
            a.drv
                .vm_unmap(
                    ch.vm_mut(),
                    push_va + mmu::SMALL_PAGE_SIZE,
                    pb_bytes - mmu::SMALL_PAGE_SIZE,
                    PageSize::Small,
                )
                .unwrap();
            let mut long = PushBuf::new();
            long.method_ni(SUBC_HOST, hm::NOP, &[0; 1536]);
            let va = fetch_fault(a, &mut ch, &long, inst_addr);
            assert_eq!(
                va,
                push_va + mmu::SMALL_PAGE_SIZE,
                "{shadow}: the fetch faults at the first unmapped byte"
            );
            a.drv.channel_free(ch).unwrap();

            // (3) A GPFIFO entry naming a VA nothing maps, written into the driver's ring
            // behind its back (found by walking the channel's page tables through PRAMIN), and
            // the doorbell: GP_PUT one past it in the channel's USERD page in BAR1.
            let mut ch = a.drv.channel_new().unwrap();
            let (inst_addr, _, ib_va) = channel_rings(a, &ch);
            let pd = ch.vm_mut().pd_addr();
            let poll = pfifo::userd_poll_decode(raw_rd(a, pfifo::USERD_POLL_BASE)).unwrap();
            let gp_put = poll + u64::from(ch.chid()) * userd::SIZE + userd::GP_PUT;
            let put = a.drv.hal_mut().read32(Bar::Bar1, gp_put);
            let slot = sysram_behind(a, pd, ib_va + u64::from(put) * 8);
            let entry = GpEntry::new(EVIL_VA, 16).encode().to_le_bytes();
            a.ram.write_slice(&entry, GuestAddress(slot)).unwrap();
            a.drv.hal_mut().write32(Bar::Bar1, gp_put, put + 1);
            w.settle();
            let src = raw_rd(a, pfifo::VM_FAULT_SOURCE);
            assert_eq!(src, 1 << fault::UNIT_PFIFO, "{shadow}");
            let reg = |r| pfifo::vm_fault(fault::UNIT_PFIFO, r);
            assert_eq!(
                raw_rd(a, reg(pfifo::VM_FAULT_INST)),
                (inst_addr >> 12) as u32,
                "{shadow}: the guest's instance block"
            );
            let va = u64::from(raw_rd(a, reg(pfifo::VM_FAULT_ADDR_LO)))
                | u64::from(raw_rd(a, reg(pfifo::VM_FAULT_ADDR_HI))) << 32;
            assert_eq!(va, EVIL_VA, "{shadow}");
            assert_eq!(
                raw_rd(a, pfifo::chan_state(ch.chid())) & pfifo::STATE_RUNNABLE,
                0,
                "{shadow}: the faulting channel stopped"
            );
            raw_wr(a, pfifo::VM_FAULT_SOURCE, src);
            assert_eq!(raw_rd(a, pfifo::INTR) & pfifo::INTR_VM_FAULT, 0);
            a.drv.channel_free(ch).unwrap();

            let h = w.host.stats();
            assert_eq!((h.phys_faults, h.unrouted), (3, 0), "{shadow}");
            // Only the faulting channels stopped: a new channel of the attacker works.
            let mut ch = a.drv.channel_new().unwrap();
            let f = a.drv.submit(&mut ch, &nop).unwrap();
            a.drv.fence_wait(&mut ch, f).unwrap();
        });
        // Faults, not violations: the attacker only used VAs of its own address space that map
        // nothing. The three submissions ended without completing.
        assert_eq!((s.faults_delivered, s.aborted), (3, 3), "{shadow}");
        assert_eq!(s.violations.total, 0, "{shadow}: {:?}", s.violations);
    }
}

#[test]
fn stale_shadow_after_a_mem_op_invalidate() {
    // The attacker has the *GPU* write a PDE (pointing at a table it prepared, whose PTE names
    // the victim's memory) into its own page directory, invalidates with MEM_OP, and uses the
    // VA. The shadow cannot follow a GPU write, but it only ever maps the attacker's memory.
    for shadow in ShadowMode::ALL {
        let s = isolated(shadow, |_, a, _| {
            let r = (|| {
                let mut ch = a.drv.channel_new()?;
                let pd = ch.vm_mut().pd_addr();
                let fake_pt = SLICE - (1 << 20);
                pramin_wr64(a, fake_pt, Pte::new(SLICE, Target::Vram).encode());
                let pde = Pde {
                    large: None,
                    small: Some(PtRef {
                        addr: fake_pt,
                        target: Target::Vram,
                        vol: false,
                    }),
                    size: PtSize::Full,
                }
                .encode();
                let slot = pd + mmu::pde_index(EVIL_VA) * 8;
                let pd_va = a.drv.vm_alloc_va(ch.vm_mut(), 4096, PageSize::Small)?;
                a.drv.vm_map(
                    ch.vm_mut(),
                    pd_va,
                    Backing::Vram(slot & !0xfff),
                    4096,
                    PageSize::Small,
                )?;
                let src = a
                    .drv
                    .buffer_new(ch.vm_mut(), 4096, MemLocation::Sysram, true)?;
                a.drv
                    .buffer_write_words(&src, 0, &[pde as u32, (pde >> 32) as u32])?;
                let mut pb = PushBuf::new();
                pb.copy(src.va(), pd_va + (slot & 0xfff), 8);
                pb.method(
                    SUBC_HOST,
                    hm::MEM_OP_A,
                    &[
                        hm::mem_op_a(pd, Target::Vram),
                        hm::mem_op_b_tlb_invalidate(false),
                    ],
                );
                pb.copy(src.va(), EVIL_VA, 4096);
                let f = a.drv.submit(&mut ch, &pb)?;
                a.drv.fence_wait(&mut ch, f)
            })();
            expect_fault(r, "through a PDE the GPU wrote");
        });
        assert!(
            s.mem_op_flushes >= 1,
            "{shadow}: the scan saw the invalidate"
        );
        assert!(s.faults_delivered >= 1, "{shadow}");
    }
}

#[test]
fn instance_pointer_or_userd_outside_the_slice() {
    let s = isolated(ShadowMode::Lazy, |w, a, _| {
        // Instance block beyond the slice.
        raw_wr(
            a,
            pfifo::chan_table(3),
            pfifo::chan_encode(SLICE, Target::Vram),
        );
        assert_eq!(
            raw_rd(a, pfifo::CHAN_TABLE_ERROR),
            pfifo::CHAN_ERR_INVALID_TARGET
        );
        assert_ne!(raw_rd(a, pfifo::INTR) & pfifo::INTR_CHAN_TABLE_ERROR, 0);
        let p = a.vgpu.phys_channels().start + 3;
        assert_eq!(w.host.phys().read_reg(pfifo::chan_table(p)), 0);
        // An instance block inside, whose USERD is beyond the slice.
        let blk = SLICE - (2 << 20);
        pramin_wr64(
            a,
            blk + inst::RAMFC_USERD_LO,
            inst::userd_encode(SLICE + 0x1000, Target::Vram),
        );
        raw_wr(
            a,
            pfifo::chan_table(4),
            pfifo::chan_encode(blk, Target::Vram),
        );
        assert_eq!(w.host.phys().read_reg(pfifo::chan_table(p + 1)), 0);
    });
    assert_eq!(s.violations.vram_out_of_slice, 1);
    assert_eq!(s.violations.instance_block, 1);
}

#[test]
fn runlist_naming_channels_the_vm_does_not_own() {
    let s = isolated(ShadowMode::Incremental, |w, a, v| {
        let mut ch = a.drv.channel_new().unwrap();
        let own = ch.chid();
        let list = SLICE - (3 << 20);
        for (i, c) in [own, 16, 100, own].iter().enumerate() {
            a.drv.pramin_wr32(list + i as u64 * 8, *c);
            a.drv
                .pramin_wr32(list + i as u64 * 8 + 4, pfifo::RUNLIST_ENTRY_WORD1);
        }
        raw_wr(
            a,
            pfifo::RUNLIST_BASE,
            pfifo::runlist_base_encode(list, Target::Vram),
        );
        raw_wr(a, pfifo::RUNLIST_SUBMIT, pfifo::RUNLIST_SUBMIT_UNK20 | 4);
        assert_eq!(
            raw_rd(a, pfifo::SCHED_ERROR),
            pfifo::SCHED_ERR_INACTIVE_CHANNEL
        );
        raw_wr(a, pfifo::INTR, pfifo::INTR_SCHED_ERROR);
        raw_wr(a, pfifo::INTR_RUNLIST, pfifo::INTR_RUNLIST_EVENT);
        // The physical runlist: the attacker's own channel and the victim's, nothing else.
        let phys = w.host.phys();
        let (base, _) = pfifo::runlist_base_decode(phys.read_reg(pfifo::RUNLIST_RD_BASE)).unwrap();
        let n = phys.read_reg(pfifo::RUNLIST_RD_LEN) & pfifo::RUNLIST_LEN_MASK;
        let mut entries = Vec::new();
        for i in 0..u64::from(n) {
            let mut b = [0u8; 4];
            phys.read_vram(gpuvm::addr::HostVram(base + i * 8), &mut b);
            entries.push(u32::from_le_bytes(b));
        }
        entries.sort();
        let mut want = vec![
            a.vgpu.phys_channels().start + own,
            v.vgpu.phys_channels().start,
        ];
        want.sort();
        assert_eq!(entries, want);
        // The attacker's own channel still works.
        let pb = PushBuf::new();
        let f = a.drv.submit(&mut ch, &pb).unwrap();
        a.drv.fence_wait(&mut ch, f).unwrap();
    });
    assert_eq!(s.violations.runlist_entries, 2);
}

#[test]
fn channel_table_or_kick_for_a_foreign_channel() {
    let s = isolated(ShadowMode::Eager, |w, a, v| {
        let victim_chan = v.vgpu.phys_channels().start;
        let phys = w.host.phys();
        let (chan, state) = (
            phys.read_reg(pfifo::chan_table(victim_chan)),
            phys.read_reg(pfifo::chan_state(victim_chan)),
        );
        // Guest ids 16 and up are outside the attacker's 16 channels (the victim's, physically).
        raw_wr(a, pfifo::chan_table(16), 0);
        raw_wr(a, pfifo::chan_state(16), 0);
        raw_wr(a, pfifo::KICK, 16);
        assert_eq!(raw_rd(a, pfifo::KICK) & pfifo::KICK_PENDING, 0);
        let mut b = [0u8; 4];
        a.vgpu
            .bar_write(Bar::Bar1, 16 * 4096 + 0x8c, &1u32.to_le_bytes());
        a.vgpu.bar_read(Bar::Bar1, 16 * 4096 + 0x88, &mut b);
        assert_eq!(phys.read_reg(pfifo::chan_table(victim_chan)), chan);
        assert_eq!(phys.read_reg(pfifo::chan_state(victim_chan)), state);
    });
    assert_eq!(s.violations.foreign_channel, 5);
}

#[test]
fn pramin_window_beyond_the_slice() {
    let s = isolated(ShadowMode::Lazy, |_, a, _| {
        a.drv.pramin_wr32(SLICE + 0x100, 0x6666_6666);
        assert_eq!(a.drv.pramin_rd32(SLICE + 0x100), u32::MAX);
        assert_eq!(a.drv.pramin_rd32(u64::from(u32::MAX) << 12), u32::MAX);
    });
    assert_eq!(s.violations.vram_out_of_slice, 3);
}

#[test]
fn bar_page_tables_reaching_beyond_the_slice() {
    let s = isolated(ShadowMode::Lazy, |_, a, _| {
        // A BAR1 VM of the attacker's making: PTE 0x100 -> beyond the slice, 0x101 -> its own.
        let (blk, pd, spt, own) = (
            SLICE - (8 << 20),
            SLICE - (7 << 20),
            SLICE - (6 << 20),
            SLICE - (4 << 20),
        );
        let pde = Pde {
            large: None,
            small: Some(PtRef {
                addr: spt,
                target: Target::Vram,
                vol: false,
            }),
            size: PtSize::Full,
        };
        pramin_wr64(a, pd, pde.encode());
        pramin_wr64(a, spt + 0x100 * 8, Pte::new(SLICE, Target::Vram).encode());
        pramin_wr64(a, spt + 0x101 * 8, Pte::new(own, Target::Vram).encode());
        pramin_wr64(a, blk + inst::PDB_LO, inst::pdb_encode(pd, Target::Vram));
        pramin_wr64(a, blk + inst::LIMIT_LO, gpuvm::gf100::pci::BAR1_SIZE - 1);
        raw_wr(a, pbus::BAR1_INST, pbus::bar_inst_encode(blk, Target::Vram));
        raw_wr(
            a,
            pffb::TLB_FLUSH_VSPACE,
            pffb::vspace_encode(pd, Target::Vram),
        );
        raw_wr(
            a,
            pffb::TLB_FLUSH_TRIGGER,
            pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL | pffb::FLUSH_HUB_ONLY,
        );
        let hal = a.drv.hal_mut();
        hal.write32(Bar::Bar1, 0x10_0000, 0x6666_6666);
        assert_eq!(hal.read32(Bar::Bar1, 0x10_0000), u32::MAX);
        hal.write32(Bar::Bar1, 0x10_1000, 0x1234);
        assert_eq!(
            hal.read32(Bar::Bar1, 0x10_1000),
            0x1234,
            "its own page works"
        );
        assert_ne!(raw_rd(a, pfifo::INTR) & pfifo::INTR_VM_FAULT, 0);
    });
    assert_eq!(s.bar_faults, 2);
    assert_eq!(s.violations.vram_out_of_slice, 2);
}

#[test]
fn a_new_vm_reads_zeros_where_a_destroyed_vm_left_data() {
    let w = world();
    let mut old = w.vm(ShadowMode::Incremental);
    run_suite(&mut old);
    for i in 0..64u64 {
        old.drv
            .pramin_wr32(i * (1 << 20) + 0x40, 0x5ec2_e700 + i as u32);
    }
    let slice = old.vgpu.vram_slice();
    w.host.destroy_vgpu(&old.vgpu).unwrap();
    drop(old);
    let mut new = w.vm(ShadowMode::Incremental);
    assert_eq!(
        new.vgpu.vram_slice(),
        slice,
        "the same slice is handed out again"
    );
    for i in 0..64u64 {
        assert_eq!(new.drv.pramin_rd32(i * (1 << 20) + 0x40), 0, "MiB {i}");
    }
    run_suite(&mut new);
    let h = w.host.stats();
    assert_eq!(h.vms, 1);
}

/// The guest driver writes its page tables through BAR3 and clears instance memory and tables
/// through PRAMIN. Those writes run beside the host lock (under the VM's lock alone), except
/// the ones reaching a page directory or a bound channel's instance block, and the shadows
/// follow them: every workload, whose buffers are mapped and unmapped that way, verifies through
/// the shadows, in each mode that tracks page tables and in those that rebuild them.
#[test]
fn page_table_writes_through_bar3_run_beside_the_host_lock_and_the_shadows_follow() {
    for mode in [ShadowMode::Incremental, ShadowMode::Lazy, ShadowMode::Eager] {
        let w = world();
        let mut vm = w.vm(mode);
        run_suite(&mut vm);
        run_suite(&mut vm);
        let s = vm.vgpu.stats();
        assert!(s.local_writes > 0, "{mode}");
        let writes = s.exits.bar0.writes + s.exits.bar1.writes + s.exits.bar3.writes;
        assert!(s.local_writes <= writes, "{mode}");
        if mode == ShadowMode::Incremental {
            assert!(s.shadow.entry_updates > 0);
        }
        assert_eq!(s.violations, gpuvm::stats::Violations::default(), "{mode}");
        // A register that only stores its value (the page directory of the next TLB flush)
        // is written on the same path and reads back.
        let reg = u64::from(pffb::TLB_FLUSH_VSPACE);
        vm.vgpu
            .bar_write(Bar::Bar0, reg, &0x0123_4560u32.to_le_bytes());
        let mut b = [0u8; 4];
        vm.vgpu.bar_read(Bar::Bar0, reg, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x0123_4560, "{mode}");
        assert_eq!(vm.vgpu.stats().local_writes, s.local_writes + 1, "{mode}");
        // A TLB flush of every address space: on the same path where the shadows are already
        // current (incremental), through the host where they are rebuilt (lazy, eager); the
        // guest sees it done either way, and the workloads after it verify.
        let before = vm.vgpu.stats();
        let trigger = pffb::FLUSH_TRIGGER | pffb::FLUSH_ALL_PDB | pffb::FLUSH_PAGE_ALL;
        vm.vgpu.bar_write(
            Bar::Bar0,
            u64::from(pffb::TLB_FLUSH_TRIGGER),
            &trigger.to_le_bytes(),
        );
        let after = vm.vgpu.stats();
        assert_eq!(after.guest_tlb_flushes, before.guest_tlb_flushes + 1);
        let local = u64::from(mode == ShadowMode::Incremental);
        assert_eq!(after.local_writes, before.local_writes + local, "{mode}");
        if mode == ShadowMode::Incremental {
            assert!(after.phys_tlb_flushes > before.phys_tlb_flushes);
        }
        run_suite(&mut vm);
    }
}

/// Reads of BAR1 memory (what a guest polls a fence or reads results with) run beside the host
/// lock while the host is quiet, through the VM's BAR TLB into its own slice: the value is
/// the memory's as it is now (translations are cached, data is not), and a guest flush of its
/// BAR TLB is followed (an unmapped page then faults on the usual path, not on stale state).
#[test]
fn bar1_memory_reads_run_beside_the_host_lock_and_follow_the_bar_tlb() {
    let w = world();
    let mut vm = w.vm(ShadowMode::Lazy);
    let mut ch = vm.drv.channel_new().unwrap();
    let buf = vm
        .drv
        .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, true)
        .unwrap();
    let off = buf.bar1().expect("mapped in BAR1");
    vm.drv.buffer_wr32(&buf, 16, 0x1234_5678).unwrap();
    let read = |vm: &Vm| {
        let mut b = [0u8; 4];
        vm.vgpu.bar_read(Bar::Bar1, off + 16, &mut b);
        u32::from_le_bytes(b)
    };
    let fast = w.host.stats().fast_path_accesses;
    for _ in 0..100 {
        assert_eq!(read(&vm), 0x1234_5678);
    }
    assert_eq!(w.host.stats().fast_path_accesses - fast, 100);
    // The memory changes underneath (the GPU writes it): the next read sees it.
    let host_addr = vm.vgpu.vram_slice().base.raw() + buf.phys() + 16;
    w.gpu
        .write_vram(gpuvm::addr::HostVram(host_addr), &7u32.to_le_bytes());
    assert_eq!(read(&vm), 7);
    // The guest unmaps the page from BAR1 and flushes its BAR TLB: the read goes the usual
    // way and faults (all ones), it does not use the old translation.
    vm.drv.buffer_free(ch.vm_mut(), buf).unwrap();
    assert_eq!(read(&vm), u32::MAX);
    assert!(vm.vgpu.stats().bar_faults > 0);
}

/// A poll from a VM while the host has nothing due (the GPU busy with a long kernel, nothing
/// parked, its interrupt line low) does nothing under the VM's lock alone — no hold of the host
/// lock, counted as an idle poll — and the first poll once the kernel's end has come services
/// the GPU: the submission completes.
#[test]
fn polls_before_the_next_event_skip_the_host_and_the_first_after_it_services() {
    let w = world();
    let mut vm = w.vm(ShadowMode::Incremental);
    let mut ch = vm.drv.channel_new().unwrap();
    let buf = vm
        .drv
        .buffer_new(ch.vm_mut(), 4096, MemLocation::Vram, false)
        .unwrap();
    let mut pb = PushBuf::new();
    pb.kernel(&gpuvm::gf100::compute::Kernel::Loop {
        dst: buf.va(),
        iterations: 100_000_000, // 1.74 ms of modeled GPU time
        seed: 1,
    });
    let fence = vm.drv.submit(&mut ch, &pb).unwrap();
    // Through the fetch of the entry to the kernel's launch: then the next event is its end.
    let mut end = 0;
    for _ in 0..100 {
        end = w.host.next_event_ns().expect("the kernel's end is due");
        if end > w.clock.now_ns() + 1_000_000 {
            break;
        }
        w.clock.advance_to(end);
        vm.vgpu.poll();
    }
    let (idle, before) = {
        let s = vm.vgpu.stats();
        (s.idle_polls, s.completions)
    };
    // Reading counters takes the host lock, so it is done only before and after, and a
    // reading's own hold (counted when it ends) is measured.
    let holds = w.host.stats().lock_holds.count;
    let own = w.host.stats().lock_holds.count - holds;
    let holds = holds + own;
    let mut polls = 0;
    while w.clock.now_ns() + 100_000 < end {
        w.clock.advance(100_000);
        vm.vgpu.poll();
        polls += 1;
    }
    assert_eq!(
        w.host.stats().lock_holds.count,
        holds + own,
        "an idle poll held the host lock"
    );
    assert!(polls >= 10, "the kernel is long enough to poll during it");
    assert_eq!(vm.vgpu.stats().idle_polls - idle, polls);
    assert!(!vm.drv.fence_done(&ch, fence).unwrap());
    w.clock.advance_to(end);
    vm.vgpu.poll();
    assert_eq!(
        vm.vgpu.stats().idle_polls - idle,
        polls,
        "the due poll was idle"
    );
    // The rest of the entry (the fence's release) follows the kernel's end.
    for _ in 0..100 {
        if vm.drv.fence_done(&ch, fence).unwrap() {
            break;
        }
        if let Some(t) = w.host.next_event_ns() {
            w.clock.advance_to(t);
        }
        vm.vgpu.poll();
    }
    assert!(vm.drv.fence_done(&ch, fence).unwrap());
    assert_eq!(vm.vgpu.stats().completions, before + 1);
}
