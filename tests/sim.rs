//! Acceptance tests of the simulated GF100 (issue #2), driven only through its hardware
//! interface: BAR0 registers, the BAR1/BAR3 apertures, and `write_vram` / `read_vram` as the
//! hypervisor's backdoor for laying out page tables, instance blocks and pushbuffers.

use std::sync::Arc;

use gpuvm::addr::{Gpa, HostVram, Iova};
use gpuvm::clock::{Clock, RealClock, SimClock};
use gpuvm::gf100::compute::{self as cc, Kernel};
use gpuvm::gf100::fault::{self, FaultFlags};
use gpuvm::gf100::gpfifo::GpEntry;
use gpuvm::gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gpuvm::gf100::{copy as ce, host, inst, pbus, pfb, pffb, pfifo, pmc, ptimer, userd, Target};
use gpuvm::irq::IrqFlag;
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm_sim::*;
use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

// The test rig (a tiny "driver" programming the GPU through registers and the VRAM backdoor)
// lives in `tests/support/sim_rig.rs`, shared with `benches/sim.rs`.
mod support;

use support::sim_rig::*;

// ------------------------------------------------------------------------------------------------
// Registers
// ------------------------------------------------------------------------------------------------

#[test]
fn boot_registers_and_vram_sizing() {
    let g = SimGpu::new(SimConfig::default());
    assert_eq!(g.read_reg(pmc::BOOT_0), pmc::BOOT_0_QUADRO_6000);
    assert!(pmc::boot0_is_fermi(g.read_reg(pmc::BOOT_0)));
    let fbps = g.read_reg(pfb::FBP_COUNT);
    let disabled = g.read_reg(pfb::FBP_DISABLE_MASK);
    let mib: u64 = (0..fbps)
        .filter(|i| disabled & (1 << i) == 0)
        .map(|i| g.read_reg(pfb::fbpa_amount(i)) as u64)
        .sum();
    assert_eq!(mib << 20, 6 << 30);
    assert_eq!(g.vram_size(), 6 << 30);
    assert_eq!(
        g.vram_resident_bytes(),
        0,
        "6 GiB of VRAM is allocated lazily"
    );
    assert_eq!(
        g.read_reg(pffb::VM_CFG) & pffb::VM_CFG_FLUSH_SLOTS_MASK,
        pffb::VM_CFG_FLUSH_SLOTS_MASK
    );
    assert_eq!(g.read_reg(pbus::PFLUSH) & pbus::PFLUSH_BUSY, 0);
    g.write_reg(pmc::SPOON_ENABLE, u32::MAX);
    g.write_reg(pfifo::SUBFIFO_ENABLE, u32::MAX);
    assert_eq!(
        g.read_reg(pfifo::SUBFIFO_ENABLE).count_ones(),
        pfifo::PBDMAS
    );
    g.write_reg(pfifo::KICK, 0x25);
    assert_eq!(
        g.read_reg(pfifo::KICK),
        0x25,
        "old nouveau polls for the chid, new nouveau for bit 20 clear"
    );

    let small = SimGpu::new(SimConfig {
        vram_size: 1 << 30,
        ..SimConfig::default()
    });
    let mib: u64 = (0..small.read_reg(pfb::FBP_COUNT))
        .map(|i| small.read_reg(pfb::fbpa_amount(i)) as u64)
        .sum();
    assert_eq!(mib << 20, 1 << 30);
}

#[test]
fn unknown_registers_read_bad_and_writes_are_dropped_and_counted() {
    let g = SimGpu::new(SimConfig::default());
    for off in [
        0x00_0008u32,
        0x40_0000,
        0x61_0000,
        0x00_26fc,
        0x1f_fffc,
        0x123_4568,
    ] {
        assert_eq!(g.read_reg(off), gpuvm::gf100::BAD_REGISTER, "{off:#x}");
        g.write_reg(off, 0xdead_beef);
        assert_eq!(g.read_reg(off), gpuvm::gf100::BAD_REGISTER);
    }
    let s = g.stats();
    assert_eq!((s.bad_register_reads, s.bad_register_writes), (12, 6));
}

#[test]
fn ptimer_is_monotonic_nanoseconds_with_the_sim_clock() {
    let clock = Arc::new(SimClock::new());
    let g = SimGpu::new(SimConfig {
        clock: clock.clone(),
        ..SimConfig::default()
    });
    let read = |g: &SimGpu| loop {
        let hi = g.read_reg(ptimer::TIME_HIGH);
        let lo = g.read_reg(ptimer::TIME_LOW);
        if hi == g.read_reg(ptimer::TIME_HIGH) {
            return (hi as u64) << 32 | lo as u64;
        }
    };
    assert_eq!(read(&g), 0);
    clock.advance(0x1_0000_0040);
    assert_eq!(read(&g), 0x1_0000_0040, "the counter is in nanoseconds");
    clock.advance(31);
    assert_eq!(
        read(&g),
        0x1_0000_0040,
        "32 ns steps: TIME_LOW bits 0-4 read 0"
    );
    clock.advance(1);
    assert_eq!(read(&g), 0x1_0000_0060);
    g.write_reg(ptimer::TIME_LOW, 0);
    g.write_reg(ptimer::TIME_HIGH, 0);
    assert_eq!(read(&g), 0x1_0000_0060, "writes cannot move time backwards");
}

#[test]
fn ptimer_is_monotonic_with_the_real_clock() {
    let g = SimGpu::new(SimConfig {
        clock: Arc::new(RealClock::new()),
        ..SimConfig::default()
    });
    let read =
        || (g.read_reg(ptimer::TIME_HIGH) as u64) << 32 | g.read_reg(ptimer::TIME_LOW) as u64;
    let mut last = read();
    for _ in 0..1000 {
        let t = read();
        assert!(
            t >= last || (t >> 32) < (last >> 32),
            "{t:#x} after {last:#x}"
        );
        last = last.max(t);
    }
    g.clock().wait_ns(1_000);
    assert!(read() > 0);
}

// ------------------------------------------------------------------------------------------------
// MMU faults, TLB, BARs
// ------------------------------------------------------------------------------------------------

#[test]
fn unmapped_va_faults_and_stops_only_that_channel() {
    let mut r = Rig::new();
    let irq = Arc::new(IrqFlag::new());
    r.gpu.set_irq_line(irq.clone());
    let mut a = r.channel(0);
    let mut b = r.channel(1);
    r.runlist(&[0, 1]);
    r.gpu
        .write_reg(pfifo::INTR_RUNLIST, pfifo::INTR_RUNLIST_EVENT);
    assert!(!irq.is_asserted());

    // A: a release to a VA whose PDE exists but whose PTE is empty, then a marker release.
    let bad_va = 0x12_3456_7000u64;
    r.spt(&mut a.vm, bad_va);
    let marker_a = r.buffer(&mut a, DATA_VA, 0x1000);
    let mut pa = release4(bad_va + 0x10, 1);
    pa.extend(release4(DATA_VA, 0xaaaa));
    r.submit(&mut a, &pa);
    r.submit(&mut a, &release4(DATA_VA + 4, 0xbbbb));
    // B: a kernel and a release.
    let out_b = r.buffer(&mut b, DATA_VA, 0x1000);
    let mut pb = bind_compute();
    pb.extend(launch_kernel(&Kernel::Memset {
        dst: DATA_VA,
        bytes: 64,
        value: 0x5a5a_5a5a,
    }));
    pb.extend(release4(DATA_VA + 0x100, 1));
    r.submit(&mut b, &pb);
    r.settle();

    assert!(irq.is_asserted());
    assert_ne!(r.reg(pmc::INTR_HOST) & pmc::INTR_PFIFO, 0);
    assert_ne!(r.reg(pfifo::INTR) & pfifo::INTR_VM_FAULT, 0);
    let unit = fault::UNIT_PFIFO;
    assert_eq!(r.reg(pfifo::VM_FAULT_SOURCE), 1 << unit);
    assert_eq!(
        r.reg(pfifo::vm_fault(unit, 0)),
        (a.inst >> 12) as u32,
        "the channel's instance block"
    );
    assert_eq!(r.reg(pfifo::vm_fault(unit, 4)), 0x3456_7010);
    assert_eq!(r.reg(pfifo::vm_fault(unit, 8)), 0x12);
    let flags = FaultFlags::decode(r.reg(pfifo::vm_fault(unit, 0xc)));
    assert_eq!(flags.reason, fault::REASON_PAGE_NOT_PRESENT);
    assert!(flags.write && flags.hub);
    assert_eq!(flags.client, fault::HUB_CLIENT_PFIFO);
    assert_eq!(r.gpu.stats().mmu_faults, 1);

    // A stopped: nothing after the fault ran, GP_GET did not move past the entry.
    assert!(!r.runnable(&a));
    assert_eq!((r.r32(marker_a), r.r32(marker_a + 4)), (0, 0));
    assert_eq!(r.gp_get(&a), 0);
    // B ran to completion.
    assert!(r.runnable(&b));
    assert_eq!(r.r32(out_b), 0x5a5a_5a5a);
    assert_eq!(r.r32(out_b + 0x100), 1);
    assert_eq!(r.gp_get(&b), b.put);

    // Ack: the level drops.
    r.gpu.write_reg(pfifo::VM_FAULT_SOURCE, 1 << unit);
    assert_eq!(r.reg(pfifo::INTR) & pfifo::INTR_VM_FAULT, 0);
    assert!(!irq.is_asserted());

    // Another doorbell does not restart A; re-enabling it resumes after the faulting method.
    r.doorbell(&a);
    r.settle();
    assert_eq!(r.r32(marker_a), 0);
    r.gpu.write_reg(pfifo::chan_state(0), pfifo::STATE_START);
    r.settle();
    assert_eq!((r.r32(marker_a), r.r32(marker_a + 4)), (0xaaaa, 0xbbbb));
    assert_eq!(r.gp_get(&a), a.put);
}

#[test]
fn engine_faults_name_their_unit() {
    let mut r = Rig::new();
    let mut c = r.channel(3);
    r.runlist(&[3]);
    let mut p = bind_copy();
    p.extend(copy(0x0700_0000, DATA_VA, 0, 0, 16, 1, 0));
    r.submit(&mut c, &p);
    r.settle();
    assert_eq!(r.reg(pfifo::VM_FAULT_SOURCE), 1 << fault::UNIT_PCOPY0);
    let flags = FaultFlags::decode(r.reg(pfifo::vm_fault(fault::UNIT_PCOPY0, 0xc)));
    assert_eq!(
        (flags.reason, flags.client, flags.write),
        (
            fault::REASON_PAGE_NOT_PRESENT,
            fault::HUB_CLIENT_PCOPY0,
            false
        )
    );
    r.gpu.write_reg(pfifo::VM_FAULT_SOURCE, u32::MAX);

    let mut d = r.channel(4);
    r.runlist(&[3, 4]);
    let mut p = bind_compute();
    p.extend(launch_kernel(&Kernel::Memset {
        dst: 0x0700_0000,
        bytes: 4,
        value: 1,
    }));
    r.submit(&mut d, &p);
    r.settle();
    assert_eq!(r.reg(pfifo::VM_FAULT_SOURCE), 1 << fault::UNIT_PGRAPH);
    let flags = FaultFlags::decode(r.reg(pfifo::vm_fault(fault::UNIT_PGRAPH, 0xc)));
    assert_eq!(
        (flags.hub, flags.client, flags.write),
        (false, fault::GPC_CLIENT_CTXCTL, true)
    );
    assert_eq!(
        r.reg(pfifo::vm_fault(fault::UNIT_PGRAPH, 0)),
        (d.inst >> 12) as u32
    );
    assert_eq!(r.gpu.stats().mmu_faults, 2);
}

/// Maps `va` to a fresh page in `ch`'s VM and writes `tag` there; returns the page.
fn tagged_page(r: &mut Rig, ch: &mut Chan, va: u64, tag: u32) -> u64 {
    let p = r.buffer(ch, va, 0x1000);
    r.w32(p, tag);
    p
}

/// Copies the word at `src` to `dst` with the copy engine.
fn copy_word(r: &mut Rig, ch: &mut Chan, src: u64, dst: u64) {
    let p = copy(src, dst, 0, 0, 4, 1, 0);
    r.submit(ch, &p);
    r.settle();
}

#[test]
fn stale_translation_is_used_until_a_register_tlb_flush() {
    let mut r = Rig::new();
    let mut c = r.channel(0);
    r.runlist(&[0]);
    r.submit(&mut c, &bind_copy());
    let src = DATA_VA;
    let dst = DATA_VA + 0x1_0000;
    let out = r.buffer(&mut c, dst, 0x1000);
    let _old = tagged_page(&mut r, &mut c, src, 111);
    copy_word(&mut r, &mut c, src, dst);
    assert_eq!(r.r32(out), 111);

    // Remap src to another page without flushing: the TLB still has the old translation.
    let new = r.alloc(0x1000, 0x1000);
    r.w32(new, 222);
    r.set_pte(&mut c.vm, src, Pte::new(new, Target::Vram).encode());
    copy_word(&mut r, &mut c, src, dst + 4);
    assert_eq!(r.r32(out + 4), 111, "stale translation until the flush");

    // nouveau's sequence: wait for free slots, VSPACE, trigger PAGE_ALL, wait for "queued".
    assert_ne!(r.reg(pffb::VM_CFG) & pffb::VM_CFG_FLUSH_SLOTS_MASK, 0);
    r.gpu.write_reg(
        pffb::TLB_FLUSH_VSPACE,
        pffb::vspace_encode(c.vm.pd, Target::Vram),
    );
    r.gpu.write_reg(
        pffb::TLB_FLUSH_TRIGGER,
        pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL,
    );
    assert_ne!(r.reg(pffb::VM_CFG) & pffb::VM_CFG_FLUSH_QUEUED, 0);
    copy_word(&mut r, &mut c, src, dst + 8);
    assert_eq!(r.r32(out + 8), 222, "the flush drops the stale translation");
    assert_eq!(r.gpu.stats().tlb_flushes, 1);
}

#[test]
fn stale_translation_is_used_until_a_mem_op_tlb_invalidate() {
    let mut r = Rig::new();
    let mut c = r.channel(0);
    r.runlist(&[0]);
    let sem = DATA_VA;
    let old = tagged_page(&mut r, &mut c, sem, 0);
    r.submit(&mut c, &release4(sem, 1));
    r.settle();
    assert_eq!(r.r32(old), 1);

    let new = r.alloc(0x1000, 0x1000);
    r.set_pte(&mut c.vm, sem, Pte::new(new, Target::Vram).encode());
    r.submit(&mut c, &release4(sem, 2));
    r.settle();
    assert_eq!(
        (r.r32(old), r.r32(new)),
        (2, 0),
        "stale translation without an invalidate"
    );

    let mut p = mthd(
        0,
        host::MEM_OP_A,
        &[
            host::mem_op_a(c.vm.pd, Target::Vram),
            host::mem_op_b_tlb_invalidate(false),
        ],
    );
    p.extend(release4(sem, 3));
    r.submit(&mut c, &p);
    r.settle();
    assert_eq!(
        (r.r32(old), r.r32(new)),
        (2, 3),
        "MEM_OP_B MMU_TLB_INVALIDATE from the pushbuffer"
    );
    assert_eq!(r.gpu.stats().tlb_flushes, 1);
}

#[test]
fn instance_block_is_reread_when_the_channel_is_loaded() {
    let mut r = Rig::new();
    let mut c = r.channel(2);
    r.runlist(&[2]);
    let first = tagged_page(&mut r, &mut c, DATA_VA, 0);
    r.submit(&mut c, &release4(DATA_VA, 1));
    r.settle();
    assert_eq!(r.r32(first), 1);

    // A device model swaps in another page directory (a copy mapping DATA_VA elsewhere) and
    // kicks the channel: the next entry runs in the new VM.
    let second = r.alloc(0x1000, 0x1000);
    let mut vm2 = r.vm();
    for (&i, &spt) in &c.vm.spts {
        let copy = r.alloc(mmu::SPT_SIZE, 0x1000);
        let mut buf = vec![0u8; mmu::SPT_SIZE as usize];
        r.gpu.read_vram(HostVram(spt), &mut buf);
        r.gpu.write_vram(HostVram(copy), &buf);
        let pde = Pde {
            small: Some(PtRef {
                addr: copy,
                target: Target::Vram,
                vol: false,
            }),
            large: None,
            size: PtSize::Full,
        };
        r.w64(vm2.pd + i * 8, pde.encode());
        vm2.spts.insert(i, copy);
    }
    r.set_pte(&mut vm2, DATA_VA, Pte::new(second, Target::Vram).encode());
    r.w64(
        c.inst + inst::PDB_LO,
        inst::pdb_encode(vm2.pd, Target::Vram),
    );
    r.push_entry(&mut c, &release4(DATA_VA, 2));
    r.gpu.write_aperture(
        Bar::Bar1,
        2 * userd::SIZE + userd::GP_PUT,
        &c.put.to_le_bytes(),
    );
    r.settle();
    assert_eq!((r.r32(first), r.r32(second)), (1, 2));
}

#[test]
fn bar1_and_bar3_reach_vram_through_their_page_tables() {
    let mut r = Rig::new();
    // BAR1: map BAR1 VA 1 MiB onto a fresh page.
    let page = r.alloc(0x1000, 0x1000);
    let vm = r.bar1.clone();
    r.bar1 = r.map_range(&vm, 0x10_0000, page, 0x1000, Target::Vram);
    r.gpu.write_aperture(
        Bar::Bar1,
        0x10_0010,
        &0x1122_3344_5566_7788u64.to_le_bytes(),
    );
    assert_eq!(r.r64(page + 0x10), 0x1122_3344_5566_7788);
    r.w32(page + 0x20, 0xcafe);
    let mut b = [0u8; 4];
    r.gpu.read_aperture(Bar::Bar1, 0x10_0020, &mut b);
    assert_eq!(u32::from_le_bytes(b), 0xcafe);

    // BAR3: its own instance block and page tables, bound through 0x1714.
    let bar3_vm = r.vm();
    let page3 = r.alloc(0x2000, 0x1000);
    let bar3_vm = r.map_range(&bar3_vm, 0x4000, page3, 0x2000, Target::Vram);
    let bar3_inst = r.inst_block(&bar3_vm, Bar::Bar3.size() - 1);
    r.gpu.write_reg(
        pbus::BAR3_INST,
        pbus::bar_inst_encode(bar3_inst, Target::Vram),
    );
    r.gpu
        .write_aperture(Bar::Bar3, 0x4ffc, &0xa1b2_c3d4_e5f6_0718u64.to_le_bytes());
    assert_eq!(
        r.r32(page3 + 0xffc),
        0xe5f6_0718,
        "crosses a page: both halves land"
    );
    assert_eq!(r.r32(page3 + 0x1000), 0xa1b2_c3d4);
    r.gpu.read_aperture(Bar::Bar3, 0x5000, &mut b);
    assert_eq!(u32::from_le_bytes(b), 0xa1b2_c3d4);

    // Unmapped BAR3 VA: all-ones, MMU fault for unit BAR3 naming the BAR3 instance block.
    r.gpu.read_aperture(Bar::Bar3, 0x8000, &mut b);
    assert_eq!(b, [0xff; 4]);
    assert_eq!(r.reg(pfifo::VM_FAULT_SOURCE), 1 << fault::UNIT_BAR3);
    assert_eq!(
        r.reg(pfifo::vm_fault(fault::UNIT_BAR3, 0)),
        (bar3_inst >> 12) as u32
    );
    assert_eq!(
        FaultFlags::decode(r.reg(pfifo::vm_fault(fault::UNIT_BAR3, 0xc))).client,
        fault::HUB_CLIENT_BAR_READ
    );
    // Beyond the BAR: dropped, reads all-ones, no fault.
    r.gpu
        .write_aperture(Bar::Bar1, Bar::Bar1.size() - 2, &[1, 2, 3, 4]);
    r.gpu.read_aperture(Bar::Bar1, Bar::Bar1.size(), &mut b);
    assert_eq!(b, [0xff; 4]);
    let s = r.gpu.stats();
    assert_eq!(s.mmu_faults, 1);
    assert!(s.aperture_reads >= 4 && s.aperture_writes >= 3);

    // PRAMIN window onto the same page.
    let word = page3 + 0x1000;
    r.gpu.write_reg(
        pbus::PMEM,
        pbus::pmem_encode(word & !0xf_ffff, Target::Vram),
    );
    assert_eq!(
        r.reg(pbus::PRAMIN_BASE + (word & 0xf_ffff) as u32),
        0xa1b2_c3d4
    );
}

#[test]
fn bar_page_table_changes_need_a_flush() {
    let mut r = Rig::new();
    let (p1, p2) = (r.alloc(0x1000, 0x1000), r.alloc(0x1000, 0x1000));
    r.w32(p1, 1);
    r.w32(p2, 2);
    let vm = r.bar1.clone();
    r.bar1 = r.map_range(&vm, 0x20_0000, p1, 0x1000, Target::Vram);
    let read = |r: &Rig| {
        let mut b = [0u8; 4];
        r.gpu.read_aperture(Bar::Bar1, 0x20_0000, &mut b);
        u32::from_le_bytes(b)
    };
    assert_eq!(read(&r), 1);
    let mut vm = r.bar1.clone();
    r.set_pte(&mut vm, 0x20_0000, Pte::new(p2, Target::Vram).encode());
    assert_eq!(read(&r), 1);
    r.gpu.write_reg(
        pffb::TLB_FLUSH_VSPACE,
        pffb::vspace_encode(vm.pd, Target::Vram),
    );
    r.gpu.write_reg(
        pffb::TLB_FLUSH_TRIGGER,
        pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL | pffb::FLUSH_HUB_ONLY,
    );
    assert_eq!(read(&r), 2);
}

// ------------------------------------------------------------------------------------------------
// Semaphores, interrupts, time
// ------------------------------------------------------------------------------------------------

#[test]
fn acquire_blocks_until_another_channel_releases() {
    let mut r = Rig::new();
    let mut a = r.channel(0);
    let mut b = r.channel(1);
    r.runlist(&[0, 1]);
    let sem = r.buffer(&mut a, DATA_VA, 0x1000);
    b.vm = r.map_range(&b.vm, DATA_VA, sem, 0x1000, Target::Vram);

    let mut pa = semaphore(DATA_VA, 1, host::SEM_OP_ACQ_GEQ | host::SEM_ACQUIRE_SWITCH);
    pa.extend(release4(DATA_VA + 0x10, 7));
    r.submit(&mut a, &pa);
    r.settle();
    assert_ne!(
        r.reg(pfifo::chan_state(0)) & pfifo::STATE_ACQUIRE_PENDING,
        0
    );
    assert_eq!(r.r32(sem + 0x10), 0);
    assert_eq!(
        r.gpu.next_event_ns(),
        None,
        "a blocked channel is not an event"
    );

    // B runs while A waits, and its release frees A.
    let mut pb = release4(DATA_VA + 0x20, 5);
    pb.extend(release4(DATA_VA, 1));
    r.submit(&mut b, &pb);
    r.settle();
    assert_eq!(r.r32(sem + 0x20), 5);
    assert_eq!(r.r32(sem + 0x10), 7);
    assert_eq!(
        r.reg(pfifo::chan_state(0)) & pfifo::STATE_ACQUIRE_PENDING,
        0
    );
    assert_eq!(r.gp_get(&a), a.put);

    // EQ and AND acquires; the hypervisor's backdoor write also releases a waiter.
    let mut pa = semaphore(DATA_VA + 0x30, 3, host::SEM_OP_ACQUIRE);
    pa.extend(semaphore(DATA_VA + 0x34, 4, host::SEM_OP_ACQ_AND));
    pa.extend(release4(DATA_VA + 0x10, 8));
    r.submit(&mut a, &pa);
    r.settle();
    r.w32(sem + 0x30, 2);
    r.settle();
    assert_eq!(r.r32(sem + 0x10), 7, "2 != 3");
    r.w32(sem + 0x30, 3);
    r.w32(sem + 0x34, 0xb);
    r.settle();
    assert_eq!(r.r32(sem + 0x10), 7, "0xb & 4 == 0");
    r.w32(sem + 0x34, 0xc);
    r.gpu.poll();
    r.settle();
    assert_eq!(r.r32(sem + 0x10), 8);
}

#[test]
fn releases_write_four_or_sixteen_bytes_with_a_timestamp() {
    let mut r = Rig::new();
    let mut c = r.channel(0);
    r.runlist(&[0]);
    let sem = r.buffer(&mut c, DATA_VA, 0x1000);
    r.gpu.write_vram(HostVram(sem), &[0xaa; 32]);
    r.clock.advance(1_000_000);
    let before = r.clock.now_ns();
    let mut p = release4(DATA_VA, 0x1234);
    p.extend(semaphore(DATA_VA + 0x10, 0x5678, host::SEM_OP_RELEASE));
    r.submit(&mut c, &p);
    r.settle();
    assert_eq!(r.r32(sem), 0x1234);
    assert_eq!(
        r.r32(sem + 4),
        0xaaaa_aaaa,
        "a 4-byte release writes only the payload"
    );
    assert_eq!(r.r32(sem + 0x10), 0x5678);
    assert_eq!(r.r32(sem + 0x14), 0);
    let ts = r.r64(sem + 0x18);
    assert!(
        ts > before && ts <= r.clock.now_ns(),
        "timestamp {ts} in ({before}, {}]",
        r.clock.now_ns()
    );
}

#[test]
fn non_stall_interrupts_assert_the_line_until_acknowledged() {
    let mut r = Rig::new();
    let mut c = r.channel(0);
    r.runlist(&[0]);
    r.gpu.write_reg(pfifo::INTR_RUNLIST, u32::MAX);
    r.gpu.write_reg(pfifo::INTR_EN, pfifo::INTR_EN_DEFAULT);
    let irq = Arc::new(IrqFlag::new());
    r.gpu.set_irq_line(irq.clone());
    assert!(!irq.is_asserted());

    r.submit(&mut c, &mthd(0, host::NON_STALL_INTERRUPT, &[0]));
    r.settle();
    assert_eq!(r.reg(pfifo::ENGINE_INTR_SOURCE), 1 << host::ENGINE_PGRAPH);
    assert!(
        !irq.is_asserted(),
        "INTR_EN bit 31 is off (nouveau enables it per event)"
    );
    r.gpu.write_reg(pfifo::INTR_EN, u32::MAX);
    assert!(irq.is_asserted());
    assert_eq!(r.reg(pmc::INTR_HOST), pmc::INTR_PFIFO);
    assert_ne!(r.reg(pfifo::INTR) & pfifo::INTR_NON_STALL, 0);

    // nouveau's gf100_fifo_intr_engine: for each source bit, read ENGINE_INTR[e] and write it back.
    let ack = |r: &Rig| {
        let mut mask = r.reg(pfifo::ENGINE_INTR_SOURCE);
        while mask != 0 {
            let e = mask.trailing_zeros();
            let v = r.reg(pfifo::ENGINE_INTR + e * 4);
            r.gpu.write_reg(pfifo::ENGINE_INTR + e * 4, v);
            mask &= !(1 << e);
        }
    };
    ack(&r);
    assert!(!irq.is_asserted());
    assert_eq!(r.reg(pfifo::INTR) & pfifo::INTR_NON_STALL, 0);

    // The copy engine's non-blocking interrupt is reported for PCOPY0, when the copy completes.
    let src = r.buffer(&mut c, DATA_VA, 0x1000);
    r.w32(src, 9);
    let mut p = bind_copy();
    p.extend(copy(
        DATA_VA,
        DATA_VA + 0x100,
        0,
        0,
        4,
        1,
        ce::LAUNCH_INTERRUPT_NON_BLOCKING,
    ));
    r.submit(&mut c, &p);
    r.settle();
    assert_eq!(r.reg(pfifo::ENGINE_INTR_SOURCE), 1 << host::ENGINE_PCOPY0);
    assert!(irq.is_asserted());
    ack(&r);
    assert!(!irq.is_asserted());
    assert_eq!(irq.rising_edges(), 2);
}

#[test]
fn work_completes_only_when_the_clock_reaches_its_end() {
    let mut r = Rig::new();
    let mut c = r.channel(7);
    r.runlist(&[7]);
    let out = r.buffer(&mut c, DATA_VA, 0x1000);
    let mut p = bind_compute();
    let iterations = 1_000_000;
    p.extend(launch_kernel(&Kernel::Loop {
        dst: DATA_VA,
        iterations,
        seed: 1,
    }));
    p.extend(release4(DATA_VA + 8, 1));
    let start = r.clock.now_ns();
    r.submit(&mut c, &p);
    // The fetch first, then the kernel: its one result word lands at its end...
    let fetch_end = r.gpu.next_event_ns().expect("the fetch is in flight");
    assert_eq!(
        fetch_end,
        start + CostModel::default().gpfifo_entry(p.len() as u32)
    );
    r.clock.advance_to(fetch_end);
    let end = r.gpu.next_event_ns().expect("the kernel is in flight");
    let cost = CostModel::default().loop_kernel(iterations);
    assert_eq!(end, fetch_end + cost);
    // ...and the release after it waits for the kernel to end, and GP_GET with it.
    r.clock.advance_to(end - 1);
    r.gpu.poll();
    assert_eq!(r.r32(out), 0);
    assert_eq!(r.r32(out + 8), 0);
    assert_eq!(r.gp_get(&c), 0);
    r.clock.advance_to(end);
    r.gpu.poll();
    assert_eq!(r.r32(out), cc::loop_result(1, iterations));
    assert_eq!(r.r32(out + 8), 1);
    assert_eq!(r.gp_get(&c), 1);
    assert_eq!(r.gpu.next_event_ns(), None);
    let s = r.gpu.stats();
    assert_eq!(s.busy_ns, end - start);
    assert_eq!(r.gpu.channel_busy_ns(7), Some(end - start));
    assert_eq!(r.gpu.channel_busy_ns(128), None);
    assert_eq!(s.engine_ops, 1);
}

#[test]
fn channels_share_one_timeline_round_robin_at_entry_boundaries() {
    let mut r = Rig::new();
    let mut a = r.channel(0);
    let mut b = r.channel(1);
    r.runlist(&[0, 1]);
    let shared = r.buffer(&mut a, DATA_VA, 0x1000);
    b.vm = r.map_range(&b.vm, DATA_VA, shared, 0x1000, Target::Vram);
    // Each entry: a kernel, then append its tag to a log through a counter semaphore.
    let kernel = |tag: u32| {
        let mut p = bind_compute();
        p.extend(launch_kernel(&Kernel::Loop {
            dst: DATA_VA + 0x800 + tag as u64 * 4,
            iterations: 10_000,
            seed: tag,
        }));
        p.extend(release4(DATA_VA + tag as u64 * 4, 1));
        p
    };
    r.push_entry(&mut a, &kernel(1));
    r.push_entry(&mut a, &kernel(2));
    r.push_entry(&mut b, &kernel(3));
    r.push_entry(&mut b, &kernel(4));
    r.doorbell(&a);
    r.doorbell(&b);
    // Run event by event and record the order in which releases appear.
    let mut order = Vec::new();
    while let Some(t) = r.gpu.next_event_ns() {
        r.clock.advance_to(t);
        r.gpu.poll();
        for tag in 1..=4u32 {
            if r.r32(shared + tag as u64 * 4) == 1 && !order.contains(&tag) {
                order.push(tag);
            }
        }
    }
    assert_eq!(order, vec![1, 3, 2, 4]);
    let (ba, bb) = (
        r.gpu.channel_busy_ns(0).unwrap_or(0),
        r.gpu.channel_busy_ns(1).unwrap_or(0),
    );
    assert_eq!(ba, bb, "identical work costs identical GPU time");
    assert_eq!(r.gpu.stats().busy_ns, ba + bb);
}

// ------------------------------------------------------------------------------------------------
// Engines produce correct data
// ------------------------------------------------------------------------------------------------

/// Runs `k` on a fresh channel whose VM maps [DATA_VA, DATA_VA + len) to the returned VRAM.
fn run_kernel(r: &mut Rig, k: &Kernel, len: u64, setup: impl FnOnce(&Rig, u64)) -> u64 {
    let mut c = r.channel(9);
    r.runlist(&[9]);
    let pa = r.buffer(&mut c, DATA_VA, len);
    setup(r, pa);
    let mut p = bind_compute();
    p.extend(launch_kernel(k));
    r.submit(&mut c, &p);
    r.settle();
    assert!(r.runnable(&c), "kernel {k:?} stopped the channel");
    assert_eq!(r.gp_get(&c), c.put);
    pa
}

#[test]
fn compute_kernels_produce_correct_data() {
    let n = 2000u32; // spans pages
    let a: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let b: Vec<u32> = (0..n).map(|i| i ^ 0xdead_beef).collect();
    let (va, vb, vc) = (DATA_VA, DATA_VA + 0x4000, DATA_VA + 0x8000);

    let mut r = Rig::new();
    let pa = run_kernel(
        &mut r,
        &Kernel::Madd {
            a: va,
            b: vb,
            c: vc,
            n,
        },
        0xc000,
        |r, pa| {
            put_words(r, pa, &a);
            put_words(r, pa + 0x4000, &b);
        },
    );
    let want: Vec<u32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
    assert_eq!(get_words(&r, pa + 0x8000, n as usize), want);

    let fa: Vec<u32> = (0..n).map(|i| (i as f32 * 0.37).to_bits()).collect();
    let fb: Vec<u32> = (0..n).map(|i| (1.0 / (i as f32 + 1.0)).to_bits()).collect();
    let mut r = Rig::new();
    let pa = run_kernel(
        &mut r,
        &Kernel::Fmadd {
            a: va,
            b: vb,
            c: vc,
            n,
        },
        0xc000,
        |r, pa| {
            put_words(r, pa, &fa);
            put_words(r, pa + 0x4000, &fb);
        },
    );
    let want: Vec<u32> = fa
        .iter()
        .zip(&fb)
        .map(|(x, y)| (f32::from_bits(*x) + f32::from_bits(*y)).to_bits())
        .collect();
    assert_eq!(get_words(&r, pa + 0x8000, n as usize), want);

    let m = 24usize;
    let ma: Vec<u32> = (0..m * m)
        .map(|i| (i as u32).wrapping_mul(0x9e37_79b9))
        .collect();
    let mb: Vec<u32> = (0..m * m).map(|i| (i as u32) + 7).collect();
    let mut r = Rig::new();
    let pa = run_kernel(
        &mut r,
        &Kernel::Mmul {
            a: va,
            b: vb,
            c: vc,
            n: m as u32,
        },
        0xc000,
        |r, pa| {
            put_words(r, pa, &ma);
            put_words(r, pa + 0x4000, &mb);
        },
    );
    let mut want = vec![0u32; m * m];
    for i in 0..m {
        for j in 0..m {
            want[i * m + j] = (0..m).fold(0u32, |acc, k| {
                acc.wrapping_add(ma[i * m + k].wrapping_mul(mb[k * m + j]))
            });
        }
    }
    assert_eq!(get_words(&r, pa + 0x8000, m * m), want);

    let fma: Vec<u32> = (0..m * m)
        .map(|i| ((i % 17) as f32 * 0.5 - 3.0).to_bits())
        .collect();
    let fmb: Vec<u32> = (0..m * m)
        .map(|i| ((i % 13) as f32 * 0.25 + 0.1).to_bits())
        .collect();
    let mut r = Rig::new();
    let pa = run_kernel(
        &mut r,
        &Kernel::Fmmul {
            a: va,
            b: vb,
            c: vc,
            n: m as u32,
        },
        0xc000,
        |r, pa| {
            put_words(r, pa, &fma);
            put_words(r, pa + 0x4000, &fmb);
        },
    );
    for i in 0..m {
        for j in 0..m {
            let mut acc = 0f32;
            for k in 0..m {
                acc += f32::from_bits(fma[i * m + k]) * f32::from_bits(fmb[k * m + j]);
            }
            want[i * m + j] = acc.to_bits();
        }
    }
    assert_eq!(get_words(&r, pa + 0x8000, m * m), want);

    let mut r = Rig::new();
    let pa = run_kernel(
        &mut r,
        &Kernel::Memset {
            dst: va + 4,
            bytes: 0x3000,
            value: 0x0102_0304,
        },
        0x4000,
        |_, _| {},
    );
    let got = get_words(&r, pa, 0xc02);
    assert_eq!((got[0], got[0xc01]), (0, 0));
    assert!(got[1..0xc01].iter().all(|&w| w == 0x0102_0304));

    let mut r = Rig::new();
    let it = 123_456_789_012u64;
    let pa = run_kernel(
        &mut r,
        &Kernel::Loop {
            dst: va,
            iterations: it,
            seed: 42,
        },
        0x1000,
        |_, _| {},
    );
    assert_eq!(get_words(&r, pa, 1)[0], cc::loop_result(42, it));
    assert!(r.gpu.stats().busy_ns >= CostModel::default().loop_kernel(it));
}

#[test]
fn copy_engine_moves_pitch_linear_data_with_semaphores() {
    let mut r = Rig::new();
    let mut c = r.channel(5);
    r.runlist(&[5]);
    let src = r.buffer(&mut c, DATA_VA, 0x4000);
    let dst = r.buffer(&mut c, DATA_VA + 0x10_0000, 0x4000);
    let sem = r.buffer(&mut c, DATA_VA + 0x20_0000, 0x1000);
    let data: Vec<u8> = (0..0x4000u32).map(|i| (i * 7 + 3) as u8).collect();
    r.gpu.write_vram(HostVram(src), &data);
    // 5 lines of 1000 bytes, source pitch 3000, destination pitch 1024.
    let mut p = bind_copy();
    p.extend(mthd(
        SUBC_COPY,
        ce::SET_SEMAPHORE_A,
        &[0, (DATA_VA + 0x20_0000) as u32, 0x77],
    ));
    p.extend(copy(
        DATA_VA + 10,
        DATA_VA + 0x10_0000,
        3000,
        1024,
        1000,
        5,
        ce::LAUNCH_SEMAPHORE_FOUR_WORD,
    ));
    r.submit(&mut c, &p);
    r.settle();
    let mut out = vec![0u8; 0x4000];
    r.gpu.read_vram(HostVram(dst), &mut out);
    for line in 0..5usize {
        assert_eq!(
            &out[line * 1024..line * 1024 + 1000],
            &data[10 + line * 3000..10 + line * 3000 + 1000],
            "line {line}"
        );
        assert!(out[line * 1024 + 1000..line * 1024 + 1024]
            .iter()
            .all(|&b| b == 0));
    }
    assert_eq!((r.r32(sem), r.r32(sem + 4)), (0x77, 0));
    assert!(r.r64(sem + 8) > 0 && r.r64(sem + 8) <= r.clock.now_ns());
    assert_eq!(r.gpu.stats().engine_ops, 1);

    // Single-line copy ignores LINE_COUNT; one-word semaphore.
    let mut p = mthd(
        SUBC_COPY,
        ce::SET_SEMAPHORE_A,
        &[0, (DATA_VA + 0x20_0010) as u32, 0x78],
    );
    let regs = [
        0,
        DATA_VA as u32,
        0,
        (DATA_VA + 0x10_3000) as u32,
        0,
        0,
        64,
        1000,
    ];
    p.extend(mthd(SUBC_COPY, ce::OFFSET_IN_UPPER, &regs));
    let launch = ce::LAUNCH_TRANSFER_PIPELINED
        | ce::LAUNCH_SRC_PITCH
        | ce::LAUNCH_DST_PITCH
        | ce::LAUNCH_SEMAPHORE_ONE_WORD;
    p.extend(mthd(SUBC_COPY, ce::LAUNCH_DMA, &[launch]));
    r.submit(&mut c, &p);
    r.settle();
    r.gpu.read_vram(HostVram(dst + 0x3000), &mut out[..128]);
    assert_eq!(&out[..64], &data[..64]);
    assert!(out[64..128].iter().all(|&b| b == 0));
    assert_eq!((r.r32(sem + 0x10), r.r32(sem + 0x14)), (0x78, 0));
}

#[test]
fn copy_between_system_memory_and_vram_is_pcie_bound() {
    let mut r = Rig::new();
    let guest =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0x4000_0000), 0x10_0000)]).expect("guest RAM");
    r.gpu
        .map_dma(
            Iova(0x1_0000_0000),
            0x10_0000,
            guest.clone(),
            Gpa(0x4000_0000),
        )
        .expect("DMA window");
    let mut c = r.channel(6);
    r.runlist(&[6]);
    let sys_va = DATA_VA;
    for off in (0..0x10_0000u64).step_by(0x1000) {
        r.set_pte(
            &mut c.vm,
            sys_va + off,
            Pte::new(0x1_0000_0000 + off, Target::SysNonCoherent).encode(),
        );
    }
    let vram = r.buffer(&mut c, DATA_VA + 0x100_0000, 0x10_0000);
    let data: Vec<u8> = (0..0x10_0000u32).map(|i| (i % 251) as u8).collect();
    guest
        .write_slice(&data, GuestAddress(0x4000_0000))
        .expect("fill guest RAM");
    let mut p = bind_copy();
    p.extend(copy(sys_va, DATA_VA + 0x100_0000, 0, 0, 0x10_0000, 1, 0));
    p.extend(release4(sys_va + 0x10_0000 - 0x10, 1)); // into system memory
    let t0 = r.clock.now_ns();
    r.submit(&mut c, &p);
    r.settle();
    let mut out = vec![0u8; 0x10_0000];
    r.gpu.read_vram(HostVram(vram), &mut out);
    assert!(out == data, "the copy reached VRAM");
    let mut sem = [0u8; 4];
    guest
        .read_slice(&mut sem, GuestAddress(0x4000_0000 + 0x10_0000 - 0x10))
        .expect("read guest RAM");
    assert_eq!(u32::from_le_bytes(sem), 1);
    let cost = CostModel::default();
    let pcie = (0x10_0000u64 * 1_000_000_000).div_ceil(cost.pcie_bytes_per_s);
    assert_eq!(r.gpu.stats().busy_ns, r.clock.now_ns() - t0);
    assert!(r.gpu.stats().busy_ns >= pcie + cost.copy_launch_ns);

    // A page that points outside every DMA window reads as all-ones and is counted.
    r.set_pte(
        &mut c.vm,
        DATA_VA + 0x20_0000,
        Pte::new(0x9_0000_0000, Target::SysCoherent).encode(),
    );
    r.submit(
        &mut c,
        &copy(DATA_VA + 0x20_0000, DATA_VA + 0x100_0000, 0, 0, 8, 1, 0),
    );
    r.settle();
    assert_eq!(r.r64(vram), u64::MAX);
    assert!(r.gpu.stats().dma_errors >= 1);
}

// ------------------------------------------------------------------------------------------------
// Bad input: documented errors, counted, never a panic
// ------------------------------------------------------------------------------------------------

/// Asserts a PBDMA error `bit` for channel `ch`, that the channel stopped, and acknowledges it.
fn expect_pbdma_error(r: &Rig, ch: &Chan, bit: u32) {
    assert_eq!(
        r.reg(pfifo::pbdma(0, pfifo::PBDMA_INTR)) & bit,
        bit,
        "PBDMA INTR {bit:#x}"
    );
    assert_eq!(r.reg(pfifo::SUBFIFO_INTR_SOURCE), 1);
    assert_ne!(r.reg(pfifo::INTR) & pfifo::INTR_PBDMA, 0);
    assert_eq!(r.reg(pfifo::pbdma(0, pfifo::PBDMA_CHID)) & 0x7f, ch.chid);
    assert!(!r.runnable(ch));
    r.gpu
        .write_reg(pfifo::pbdma(0, pfifo::PBDMA_INTR), u32::MAX);
    assert_eq!(r.reg(pfifo::INTR) & pfifo::INTR_PBDMA, 0);
}

#[test]
fn zero_length_gpfifo_entry_and_gp_put_beyond_the_ring() {
    let mut r = Rig::new();
    let mut c = r.channel(0);
    let mut ok = r.channel(1);
    r.runlist(&[0, 1]);
    let out = r.buffer(&mut ok, DATA_VA, 0x1000);
    r.w64(
        c.ib_pa,
        GpEntry::new(PB_VA, 1).encode() & !(0x1f_ffffu64 << 42),
    );
    c.put = 1;
    r.doorbell(&c);
    r.submit(&mut ok, &release4(DATA_VA, 1));
    r.settle();
    expect_pbdma_error(&r, &c, pfifo::PBDMA_INTR_IB_ENTRY_INVALID);
    assert_eq!(r.gp_get(&c), 1, "the invalid entry is consumed");
    assert_eq!(r.r32(out), 1, "the other channel keeps running");

    r.gpu.write_reg(pfifo::chan_state(0), pfifo::STATE_START);
    r.gpu
        .write_aperture(Bar::Bar1, userd::GP_PUT, &IB_ENTRIES.to_le_bytes());
    r.settle();
    expect_pbdma_error(&r, &c, pfifo::PBDMA_INTR_IB_PUT_OVERFLOW);

    // A USERD pointer with the invalid target 1: GP_PUT cannot be read, same error.
    r.gpu
        .write_aperture(Bar::Bar1, userd::GP_PUT, &1u32.to_le_bytes());
    r.w32(
        c.inst + inst::RAMFC_USERD_LO,
        r.r32(c.inst + inst::RAMFC_USERD_LO) | 1,
    );
    r.gpu.write_reg(pfifo::chan_state(0), pfifo::STATE_START);
    r.settle();
    expect_pbdma_error(&r, &c, pfifo::PBDMA_INTR_IB_PUT_OVERFLOW);
    assert_eq!(r.gpu.stats().pbdma_errors, 3);
}

#[test]
fn reserved_header_opcode_and_illegal_methods() {
    let mut r = Rig::new();
    let mut c = r.channel(0);
    r.runlist(&[0]);
    let out = r.buffer(&mut c, DATA_VA, 0x1000);
    let restart = |r: &mut Rig, c: &Chan| {
        r.gpu
            .write_reg(pfifo::chan_state(c.chid), pfifo::STATE_START);
        r.settle();
    };

    // SEC_OP 6 is reserved: ILLEGAL_CMD; the rest of the segment runs after a restart.
    let mut p = vec![6 << 29 | 0x1234];
    p.extend(release4(DATA_VA, 1));
    r.submit(&mut c, &p);
    r.settle();
    expect_pbdma_error(&r, &c, pfifo::PBDMA_INTR_ILLEGAL_CMD);
    assert_eq!(r.reg(pfifo::pbdma(0, pfifo::PBDMA_DATA0)), 6 << 29 | 0x1234);
    assert_eq!(r.r32(out), 0);
    restart(&mut r, &c);
    assert_eq!(r.r32(out), 1);

    // A class method on a subchannel with no object.
    r.submit(&mut c, &mthd(2, 0x400, &[5]));
    r.settle();
    expect_pbdma_error(&r, &c, pfifo::PBDMA_INTR_ILLEGAL_MTHD);
    assert_eq!(
        r.reg(pfifo::pbdma(0, pfifo::PBDMA_METHOD0)),
        2 << 16 | 0x400
    );
    restart(&mut r, &c);

    // SET_OBJECT of a class the model does not implement (3D), an unknown host method, a
    // method the copy class does not have, block-linear copies, an unknown semaphore operation.
    let bad: Vec<(Vec<u32>, u32)> = vec![
        (
            mthd(3, host::SET_OBJECT, &[0x9097]),
            pfifo::PBDMA_INTR_ILLEGAL_MTHD,
        ),
        (mthd(0, 0x0c, &[0]), pfifo::PBDMA_INTR_ILLEGAL_MTHD),
        (
            [bind_copy(), mthd(SUBC_COPY, 0x500, &[0])].concat(),
            pfifo::PBDMA_INTR_ILLEGAL_MTHD,
        ),
        (
            mthd(
                SUBC_COPY,
                ce::LAUNCH_DMA,
                &[ce::LAUNCH_TRANSFER_NON_PIPELINED],
            ),
            pfifo::PBDMA_INTR_ILLEGAL_MTHD,
        ),
        (semaphore(DATA_VA, 0, 3), pfifo::PBDMA_INTR_ILLEGAL_SEM),
    ];
    for (words, bit) in bad {
        r.submit(&mut c, &words);
        r.settle();
        expect_pbdma_error(&r, &c, bit);
        restart(&mut r, &c);
    }
    assert_eq!(r.gpu.stats().pbdma_errors, 7);
    r.submit(&mut c, &release4(DATA_VA, 2));
    r.settle();
    assert_eq!(r.r32(out), 2, "the channel works after the errors");
}

#[test]
fn bad_kernel_arguments_are_illegal_methods() {
    let mut r = Rig::new();
    let mut c = r.channel(0);
    r.runlist(&[0]);
    r.buffer(&mut c, DATA_VA, 0x1000);
    let cases: Vec<Vec<u32>> = vec![
        mthd(SUBC_COMPUTE, cc::KERNEL, &[99]),
        launch_kernel(&Kernel::Madd {
            a: DATA_VA,
            b: DATA_VA,
            c: DATA_VA,
            n: 0,
        }),
        launch_kernel(&Kernel::Mmul {
            a: DATA_VA,
            b: DATA_VA,
            c: DATA_VA,
            n: cc::MAX_MATRIX_DIM + 1,
        }),
        launch_kernel(&Kernel::Memset {
            dst: DATA_VA,
            bytes: 6,
            value: 0,
        }),
        launch_kernel(&Kernel::Fmadd {
            a: DATA_VA,
            b: DATA_VA,
            c: DATA_VA,
            n: u32::MAX,
        }),
    ];
    r.submit(&mut c, &bind_compute());
    for (i, mut words) in cases.into_iter().enumerate() {
        if i == 0 {
            words.extend(mthd(SUBC_COMPUTE, cc::LAUNCH, &[0]));
        }
        r.submit(&mut c, &words);
        r.settle();
        expect_pbdma_error(&r, &c, pfifo::PBDMA_INTR_ILLEGAL_MTHD);
        assert_eq!(
            r.reg(pfifo::pbdma(0, pfifo::PBDMA_METHOD0)),
            SUBC_COMPUTE << 16 | cc::LAUNCH
        );
        r.gpu.write_reg(pfifo::chan_state(0), pfifo::STATE_START);
    }
    assert_eq!(r.gpu.stats().pbdma_errors, 5);
    assert_eq!(r.gpu.stats().engine_ops, 0);
}

#[test]
fn malformed_pte_and_page_table_errors_fault() {
    let mut r = Rig::new();
    let mut c = r.channel(0);
    r.runlist(&[0]);
    r.set_pte(
        &mut c.vm,
        DATA_VA,
        Pte::new(0x20_0000, Target::Vram).encode() | 1 << 33,
    ); // target 1
    let mut ro = Pte::new(r.alloc(0x1000, 0x1000), Target::Vram);
    ro.read_only = true;
    r.set_pte(&mut c.vm, DATA_VA + 0x1000, ro.encode());
    let short = 3 * mmu::PDE_COVERAGE;
    let spt = r.alloc(0x1000, 0x1000);
    let pde = Pde {
        small: Some(PtRef {
            addr: spt,
            target: Target::Vram,
            vol: false,
        }),
        large: None,
        size: PtSize::Eighth,
    };
    r.w64(c.vm.pd + mmu::pde_index(short) * 8, pde.encode());
    let cases = [
        (DATA_VA, fault::REASON_INVALID_STORAGE_TYPE),
        (DATA_VA + 0x1000, fault::REASON_PAGE_READ_ONLY),
        (short + (64 << 20), fault::REASON_PT_TOO_SHORT),
        (2 * mmu::PDE_COVERAGE, fault::REASON_PT_NOT_PRESENT),
    ];
    for (va, reason) in cases {
        r.submit(&mut c, &release4(va, 1));
        r.settle();
        let flags = FaultFlags::decode(r.reg(pfifo::vm_fault(fault::UNIT_PFIFO, 0xc)));
        assert_eq!(flags.reason, reason, "va {va:#x}");
        assert_eq!(r.reg(pfifo::vm_fault(fault::UNIT_PFIFO, 4)), va as u32);
        r.gpu.write_reg(pfifo::VM_FAULT_SOURCE, u32::MAX);
        r.gpu.write_reg(pfifo::chan_state(0), pfifo::STATE_START);
    }
    // A VM limit below the ring: the GPFIFO fetch itself faults VM_LIMIT_EXCEEDED.
    r.w64(c.inst + inst::LIMIT_LO, 0xf_ffff);
    r.submit(&mut c, &release4(DATA_VA, 1));
    r.settle();
    let flags = FaultFlags::decode(r.reg(pfifo::vm_fault(fault::UNIT_PFIFO, 0xc)));
    assert_eq!(
        (flags.reason, flags.write),
        (fault::REASON_VM_LIMIT_EXCEEDED, false)
    );
    assert_eq!(
        r.reg(pfifo::vm_fault(fault::UNIT_PFIFO, 4)),
        IB_VA as u32 + 4 * 8
    );
    assert_eq!(r.gpu.stats().mmu_faults, 5);
}

#[test]
fn runlists_naming_unknown_or_unbound_channels_are_sched_errors() {
    let mut r = Rig::new();
    let irq = Arc::new(IrqFlag::new());
    r.gpu.set_irq_line(irq.clone());
    let mut c = r.channel(0);
    let out = r.buffer(&mut c, DATA_VA, 0x1000);
    r.runlist(&[200, 0, 5]);
    assert_eq!(r.reg(pfifo::SCHED_ERROR), pfifo::SCHED_ERR_INACTIVE_CHANNEL);
    assert_ne!(r.reg(pfifo::INTR) & pfifo::INTR_SCHED_ERROR, 0);
    assert!(irq.is_asserted());
    assert_eq!(r.gpu.stats().sched_errors, 2);
    r.gpu.write_reg(
        pfifo::INTR,
        pfifo::INTR_SCHED_ERROR | pfifo::INTR_RUNLIST_DONE,
    );
    r.gpu
        .write_reg(pfifo::INTR_RUNLIST, pfifo::INTR_RUNLIST_EVENT);
    assert!(!irq.is_asserted());
    assert_eq!(r.reg(pfifo::RUNLIST_RD_LEN) & pfifo::RUNLIST_PENDING, 0);
    // The valid entry still runs.
    r.submit(&mut c, &release4(DATA_VA, 1));
    r.settle();
    assert_eq!(r.r32(out), 1);
    // A channel that is bound but not in the runlist does not run.
    let mut d = r.channel(1);
    let out_d = r.buffer(&mut d, DATA_VA, 0x1000);
    r.submit(&mut d, &release4(DATA_VA, 1));
    r.settle();
    assert_eq!(r.r32(out_d), 0);
    r.runlist(&[0, 1]);
    r.settle();
    assert_eq!(r.r32(out_d), 1, "submitting the runlist lets it run");
}

// ------------------------------------------------------------------------------------------------
// Random input never panics
// ------------------------------------------------------------------------------------------------

/// One pushbuffer item for the random-stream property: a real host, copy or compute method
/// with data that is often a mapped VA or a small size, or a raw random word.
fn pushbuffer_item() -> impl Strategy<Value = Vec<u32>> {
    let host_m = prop::sample::select(vec![
        0x0u32, 0x4, 0x8, 0x10, 0x14, 0x18, 0x1c, 0x20, 0x24, 0x28, 0x2c, 0x50, 0x80,
    ]);
    let copy_m = prop::sample::select(vec![
        0x240u32, 0x244, 0x248, 0x300, 0x400, 0x404, 0x408, 0x40c, 0x410, 0x414, 0x418, 0x41c,
    ]);
    let compute_m = prop::sample::select(vec![
        0x400u32, 0x404, 0x408, 0x40c, 0x410, 0x414, 0x418, 0x41c, 0x420, 0x480,
    ]);
    let data = || {
        prop_oneof![
            any::<u32>(),
            (0u32..0x1_0000).prop_map(|o| DATA_VA as u32 + o),
            0u32..64,
            Just(0u32),
        ]
    };
    // Raw words are rare: one that decodes as a header with a large count turns the rest of the
    // stream into its data.
    prop_oneof![
        12 => (host_m, 0u32..8, data()).prop_map(|(m, s, d)| mthd(s, m, &[d])),
        12 => (copy_m, data()).prop_map(|(m, d)| mthd(SUBC_COPY, m, &[d])),
        12 => (compute_m, data()).prop_map(|(m, d)| mthd(SUBC_COMPUTE, m, &[d])),
        1 => any::<u32>().prop_map(|w| vec![w]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_register_writes_never_panic(writes in prop::collection::vec((0u32..0x80_0000, any::<u32>()), 1..200)) {
        let r = Rig::with_cost(CostModel::instant());
        for (off, v) in writes {
            // Bias half the writes into the interesting blocks (PMC, PBUS, PFIFO, PFFB, PBDMA).
            let off = if v & 1 == 0 { [0x0, 0x1000, 0x2000, 0x3000, 0x4_0000, 0x10_0c00][(v as usize >> 1) % 6] + (off & 0xffc) } else { off };
            r.gpu.write_reg(off, v);
            let _ = r.gpu.read_reg(off);
        }
        r.gpu.write_aperture(Bar::Bar1, 0x8c, &1u32.to_le_bytes());
        r.settle();
        let s = r.gpu.stats();
        prop_assert!(s.mmio_writes > 0);
    }

    #[test]
    fn random_pushbuffer_words_never_panic(
        items in prop::collection::vec(pushbuffer_item(), 1..60),
        len0 in any::<bool>(),
    ) {
        let mut r = Rig::with_cost(CostModel::instant());
        let mut c = r.channel(0);
        let mut ok = r.channel(1);
        r.runlist(&[0, 1]);
        r.buffer(&mut c, DATA_VA, 0x1_0000);
        let out = r.buffer(&mut ok, DATA_VA, 0x1000);
        // Bind real objects first so random methods reach the engines too.
        r.submit(&mut c, &[bind_copy(), bind_compute()].concat());
        let words: Vec<u32> = items.concat();
        if len0 {
            r.w64(c.ib_pa + c.put as u64 * 8, words[0] as u64);
            c.put += 1;
        }
        r.submit(&mut c, &words);
        r.submit(&mut ok, &release4(DATA_VA, 1));
        // Acknowledge and restart after every error, so the rest of the stream runs too.
        for _ in 0..words.len() + 2 {
            r.settle();
            if r.runnable(&c) {
                break;
            }
            r.gpu.write_reg(pfifo::VM_FAULT_SOURCE, u32::MAX);
            r.gpu.write_reg(pfifo::pbdma(0, pfifo::PBDMA_INTR), u32::MAX);
            r.gpu.write_reg(pfifo::chan_state(0), pfifo::STATE_START);
        }
        prop_assert_eq!(r.r32(out), 1, "the other channel is unaffected");
    }
}

// ------------------------------------------------------------------------------------------------
// Work in flight: effects over the duration, resets, preempts, rebinding, per-call bound
// ------------------------------------------------------------------------------------------------

const MIB: u64 = 1 << 20;

/// A channel (chid `chid`) with a 4 MiB source at DATA_VA filled with a pattern, a 4 MiB
/// destination at DATA_VA + 16 MiB and a semaphore page at DATA_VA + 32 MiB. Returns (channel,
/// source, destination, semaphore) physical addresses.
fn copy_setup(r: &mut Rig, chid: u32) -> (Chan, Vec<u8>, u64, u64, u64) {
    let mut c = r.channel(chid);
    r.runlist(&[chid]);
    let src = r.buffer(&mut c, DATA_VA, 4 * MIB);
    let dst = r.buffer(&mut c, DATA_VA + 16 * MIB, 4 * MIB);
    let sem = r.buffer(&mut c, DATA_VA + 32 * MIB, 0x1000);
    let data: Vec<u8> = (0..4 * MIB as u32).map(|i| (i % 251 + 1) as u8).collect();
    r.gpu.write_vram(HostVram(src), &data);
    (c, data, dst, sem, src)
}

/// Bind copy, semaphore at DATA_VA + 32 MiB with payload 0x77, a 4 MiB one-line copy.
fn long_copy() -> Vec<u32> {
    let mut p = bind_copy();
    p.extend(mthd(
        SUBC_COPY,
        ce::SET_SEMAPHORE_A,
        &[0, (DATA_VA + 32 * MIB) as u32, 0x77],
    ));
    p.extend(copy(
        DATA_VA,
        DATA_VA + 16 * MIB,
        0,
        0,
        4 * MIB as u32,
        1,
        ce::LAUNCH_SEMAPHORE_ONE_WORD,
    ));
    p
}

/// Submits `p` and lets the fetch end: returns (copy start, copy end).
fn launch(r: &mut Rig, c: &mut Chan, p: &[u32]) -> (u64, u64) {
    r.submit(c, p);
    let fetch_end = r.gpu.next_event_ns().expect("the fetch is in flight");
    r.clock.advance_to(fetch_end);
    r.gpu.poll();
    let end = r.gpu.next_event_ns().expect("the operation is in flight");
    (fetch_end, end)
}

/// How many 64 KiB pieces of the destination equal the source (and that they are a prefix).
fn pieces_landed(r: &Rig, dst: u64, data: &[u8]) -> usize {
    let mut out = vec![0u8; data.len()];
    r.gpu.read_vram(HostVram(dst), &mut out);
    let chunks: Vec<bool> = out
        .chunks(64 * 1024)
        .zip(data.chunks(64 * 1024))
        .map(|(o, d)| {
            assert!(
                o == d || o.iter().all(|&b| b == 0),
                "a piece is whole or absent"
            );
            o == d
        })
        .collect();
    let n = chunks.iter().take_while(|&&x| x).count();
    assert!(chunks[n..].iter().all(|&x| !x), "pieces land in order");
    n
}

#[test]
fn copy_writes_land_progressively_over_the_duration() {
    let mut r = Rig::new();
    let (mut c, data, dst, sem, _) = copy_setup(&mut r, 3);
    let submitted = r.clock.now_ns();
    let (start, end) = launch(&mut r, &mut c, &long_copy());
    // Modeled duration unchanged: 8 MiB of VRAM traffic plus the launch.
    let traffic = 8 * MIB as u128 * 1_000_000_000;
    let bw = CostModel::default().vram_bytes_per_s as u128;
    assert_eq!(
        end - start,
        CostModel::default().copy_launch_ns + traffic.div_ceil(bw) as u64
    );
    assert_eq!(pieces_landed(&r, dst, &data), 0, "nothing at launch");
    r.clock.advance_to(start + (end - start) / 2);
    r.gpu.poll();
    let half = pieces_landed(&r, dst, &data);
    assert!(half > 0 && half < 64, "half-way: {half} of 64 pieces");
    assert_eq!(r.r32(sem), 0, "no completion semaphore before the end");
    assert_eq!(r.gp_get(&c), 0);
    // The channel's busy time grows while the copy runs.
    let busy_mid = r.gpu.channel_busy_ns(3).expect("a channel");
    assert_eq!(busy_mid, r.clock.now_ns() - submitted);
    r.clock.advance_to(end - 1);
    r.gpu.poll();
    assert!(pieces_landed(&r, dst, &data) > half);
    assert_eq!(r.r32(sem), 0);
    r.clock.advance_to(end);
    r.gpu.poll();
    assert_eq!(pieces_landed(&r, dst, &data), 64);
    assert_eq!(r.r32(sem), 0x77);
    assert_eq!(r.gp_get(&c), 1);
    assert_eq!(r.gpu.channel_busy_ns(3), Some(end - submitted));
    assert_eq!(r.gpu.stats().busy_ns, end - submitted);
}

#[test]
fn at_launch_mode_writes_everything_at_the_start_with_the_same_duration() {
    let clock = Arc::new(SimClock::new());
    let mut r = Rig::new();
    r.gpu = SimGpu::new(SimConfig {
        clock: clock.clone(),
        engine_writes: EngineWrites::AtLaunch,
        ..SimConfig::default()
    });
    r.clock = clock;
    r.next = 0x10_0000;
    r.init();
    let (mut c, data, dst, sem, _) = copy_setup(&mut r, 3);
    let (start, end) = launch(&mut r, &mut c, &long_copy());
    assert_eq!(pieces_landed(&r, dst, &data), 64);
    assert_eq!(r.r32(sem), 0);
    let mut o = Rig::new();
    let (mut oc, _, _, _, _) = copy_setup(&mut o, 3);
    let (ostart, oend) = launch(&mut o, &mut oc, &long_copy());
    assert_eq!(end - start, oend - ostart, "same modeled duration");
    r.clock.advance_to(end);
    r.gpu.poll();
    assert_eq!(r.r32(sem), 0x77);
}

#[test]
fn engine_reset_mid_copy_leaves_the_rest_unwritten() {
    let mut r = Rig::new();
    let (mut c, data, dst, sem, _) = copy_setup(&mut r, 3);
    let (start, end) = launch(&mut r, &mut c, &long_copy());
    r.clock.advance_to(start + (end - start) / 2);
    r.gpu.poll();
    let half = pieces_landed(&r, dst, &data);
    assert!(half > 0 && half < 64);
    r.gpu
        .write_reg(pmc::ENABLE, pmc::ENABLE_ALL & !pmc::ENABLE_PCOPY0);
    r.gpu.write_reg(pmc::ENABLE, pmc::ENABLE_ALL);
    r.clock.advance_to(end + 1_000_000);
    r.settle();
    assert_eq!(pieces_landed(&r, dst, &data), half, "the rest never lands");
    assert_eq!(r.r32(sem), 0, "no completion semaphore");
    assert_eq!(r.gpu.stats().engine_aborts, 1);
    assert!(!r.runnable(&c));
}

/// A channel ready for an `n`x`n` mmul of a (i + k) by b (3k + j) at DATA_VA.. .
fn mmul_setup(r: &mut Rig, chid: u32, n: u64) -> (Chan, Vec<u32>, u64) {
    let mut c = r.channel(chid);
    r.runlist(&[chid]);
    let bytes = n * n * 4;
    let a = r.buffer(&mut c, DATA_VA, bytes);
    let b = r.buffer(&mut c, DATA_VA + 8 * MIB, bytes);
    let out = r.buffer(&mut c, DATA_VA + 16 * MIB, bytes);
    let av: Vec<u32> = (0..n * n).map(|x| (x / n + x % n) as u32).collect();
    let bv: Vec<u32> = (0..n * n).map(|x| (3 * (x / n) + x % n) as u32).collect();
    put_words(r, a, &av);
    put_words(r, b, &bv);
    let mut p = bind_compute();
    p.extend(launch_kernel(&Kernel::Mmul {
        a: DATA_VA,
        b: DATA_VA + 8 * MIB,
        c: DATA_VA + 16 * MIB,
        n: n as u32,
    }));
    (c, p, out)
}

fn mmul_ref(n: u64, i: u64, j: u64) -> u32 {
    (0..n).fold(0u32, |acc, k| {
        acc.wrapping_add(((i + k) as u32).wrapping_mul((3 * k + j) as u32))
    })
}

#[test]
fn engine_reset_mid_kernel_leaves_the_remaining_rows_unwritten() {
    let n = 256u64;
    let mut r = Rig::new();
    let (mut c, p, out) = mmul_setup(&mut r, 2, n);
    // More than one call's budget: the next event is when one budget's worth of rows is due.
    let (_, first) = launch(&mut r, &mut c, &p);
    r.clock.advance_to(first);
    r.gpu.poll();
    r.gpu
        .write_reg(pmc::ENABLE, pmc::ENABLE_ALL & !pmc::ENABLE_PGRAPH);
    r.gpu.write_reg(pmc::ENABLE, pmc::ENABLE_ALL);
    r.clock.advance(1_000_000_000);
    r.settle();
    let rows: Vec<bool> = (0..n)
        .map(|i| get_words(&r, out + i * n * 4 + 4 * 5, 1)[0] == mmul_ref(n, i, 5))
        .collect();
    let done = rows.iter().take_while(|&&x| x).count();
    assert!(done > 0 && (done as u64) < n, "{done} of {n} rows");
    assert!(rows[done..].iter().all(|&x| !x));
    assert_eq!(get_words(&r, out + (n - 1) * n * 4, 1), vec![0]);
    assert_eq!(r.gpu.stats().engine_aborts, 1);
    assert_eq!(r.gpu.stats().engine_ops, 0);
}

#[test]
fn preempt_during_an_engine_operation_is_pending_until_its_end() {
    let mut r = Rig::new();
    let (mut c, data, dst, sem, _) = copy_setup(&mut r, 3);
    let (start, end) = launch(&mut r, &mut c, &long_copy());
    r.clock.advance_to(start + (end - start) / 2);
    r.gpu.write_reg(pfifo::KICK, 3);
    assert_eq!(r.reg(pfifo::KICK), 3 | pfifo::KICK_PENDING);
    let half = pieces_landed(&r, dst, &data);
    assert!(half > 0 && half < 64);
    // Idempotent; another channel's preempt (not resident, nothing in flight) is immediate.
    r.gpu.write_reg(pfifo::KICK, 3);
    assert_eq!(r.reg(pfifo::KICK), 3 | pfifo::KICK_PENDING);
    r.gpu.write_reg(pfifo::KICK, 9);
    assert_eq!(r.reg(pfifo::KICK), 9);
    r.gpu.write_reg(pfifo::KICK, 3);
    r.clock.advance_to(end - 1);
    assert_eq!(r.reg(pfifo::KICK), 3 | pfifo::KICK_PENDING);
    r.clock.advance_to(end);
    assert_eq!(r.reg(pfifo::KICK), 3);
    assert_eq!(pieces_landed(&r, dst, &data), 64);
    assert_eq!(r.r32(sem), 0x77);
    r.settle();
    assert_eq!(
        r.gp_get(&c),
        1,
        "the channel resumes and finishes its entry"
    );
}

#[test]
fn preempted_channel_reloads_its_instance_block_before_continuing() {
    let mut r = Rig::new();
    let (mut c, data, dst, _, src) = copy_setup(&mut r, 4);
    // A second page directory for the same channel: same ring and pushbuffer, but the second
    // copy's destination (DATA_VA + 24 MiB) goes to other memory.
    let d_old = r.buffer(&mut c, DATA_VA + 24 * MIB, 0x1000);
    let d_new = r.alloc(0x1000, 0x1000);
    let vm2 = r.vm();
    let mut vm2 = r.map_range(&vm2, IB_VA, c.ib_pa, IB_ENTRIES as u64 * 8, Target::Vram);
    vm2 = r.map_range(&vm2, PB_VA, c.pb_pa, PB_SIZE, Target::Vram);
    vm2 = r.map_range(&vm2, DATA_VA, src, 0x1000, Target::Vram);
    vm2 = r.map_range(&vm2, DATA_VA + 24 * MIB, d_new, 0x1000, Target::Vram);
    let mut p = long_copy();
    p.extend(copy(DATA_VA, DATA_VA + 24 * MIB, 0, 0, 256, 1, 0));
    let (start, end) = launch(&mut r, &mut c, &p);
    // The host stops the channel while the first copy runs; it stops after that copy, in the
    // middle of its entry, with nothing in flight.
    r.clock.advance_to(start + (end - start) / 2);
    r.gpu.write_reg(pfifo::chan_state(4), 0);
    r.clock.advance_to(end);
    r.gpu.poll();
    assert_eq!(pieces_landed(&r, dst, &data), 64);
    assert_eq!(r.gpu.next_event_ns(), None);
    assert_eq!(r.gp_get(&c), 0, "mid-entry");
    assert_eq!(r.r32(d_old), 0);
    // The preempt completes at once; the host then points the instance block at the new PD.
    r.gpu.write_reg(pfifo::KICK, 4);
    assert_eq!(r.reg(pfifo::KICK), 4);
    r.w64(
        c.inst + inst::PDB_LO,
        inst::pdb_encode(vm2.pd, Target::Vram),
    );
    r.gpu.write_reg(pfifo::chan_state(4), pfifo::STATE_START);
    r.settle();
    assert_eq!(r.gp_get(&c), 1);
    assert_eq!(r.r32(d_new), u32::from_le_bytes([1, 2, 3, 4]));
    assert_eq!(
        r.r32(d_old),
        0,
        "the rest of the entry used the reloaded PD"
    );
}

#[test]
fn fault_at_the_end_of_a_copy_names_the_instance_that_launched_it() {
    let mut r = Rig::new();
    let (mut c, data, dst, _, _) = copy_setup(&mut r, 3);
    let old_word = r.reg(pfifo::chan_table(3)) & 0x3fff_ffff;
    // The completion semaphore goes to an unmapped page.
    let mut p = bind_copy();
    let bad = DATA_VA + 40 * MIB;
    r.spt(&mut c.vm, bad);
    p.extend(mthd(SUBC_COPY, ce::SET_SEMAPHORE_A, &[0, bad as u32, 1]));
    p.extend(copy(
        DATA_VA,
        DATA_VA + 16 * MIB,
        0,
        0,
        4 * MIB as u32,
        1,
        ce::LAUNCH_SEMAPHORE_ONE_WORD,
    ));
    let (start, end) = launch(&mut r, &mut c, &p);
    r.clock.advance_to(start + (end - start) / 2);
    // Rebind chid 3 to another instance block (an idle channel) while the copy runs.
    let inst2 = r.inst_block(&c.vm, mmu::VA_LIMIT - 1);
    let userd2 = r.alloc(0x1000, 0x1000);
    r.w64(
        inst2 + inst::RAMFC_USERD_LO,
        inst::userd_encode(userd2, Target::Vram),
    );
    r.w32(
        inst2 + inst::RAMFC_IB_CONFIG,
        inst::ib_config_encode(IB_VA, IB_ENTRIES),
    );
    r.gpu.write_reg(
        pfifo::chan_table(3),
        pfifo::chan_encode(inst2, Target::Vram),
    );
    let new_word = r.reg(pfifo::chan_table(3)) & 0x3fff_ffff;
    assert_ne!(old_word, new_word);
    assert_eq!(r.gpu.stats().mmu_faults, 0);
    r.clock.advance_to(end);
    r.gpu.poll();
    assert_eq!(pieces_landed(&r, dst, &data), 64, "ran to its end");
    let unit = fault::UNIT_PCOPY0;
    assert_eq!(r.gpu.stats().mmu_faults, 1);
    assert_eq!(r.reg(pfifo::vm_fault(unit, 0)), old_word);
    assert_eq!(r.reg(pfifo::vm_fault(unit, 4)), bad as u32);
    assert!(
        r.runnable(&c),
        "the new binding is not stopped by the old context's fault"
    );
}

#[test]
fn a_batch_shares_one_budget_and_the_next_batch_renews_it() {
    let n = 1024u64;
    let mut r = Rig::new();
    let (mut c, p, _) = mmul_setup(&mut r, 1, n);
    launch(&mut r, &mut c, &p);
    // Every piece due at once: far more than one budget's worth.
    r.clock.advance(1_000_000_000);
    let pieces = |r: &Rig| r.gpu.engine_work().pieces;
    let before = pieces(&r);
    r.gpu.begin_batch();
    r.gpu.poll();
    let first = pieces(&r);
    assert!(first > before, "the batch's first call did work");
    // The rest of the batch has nothing left to spend: however many calls it makes.
    r.gpu.poll();
    r.gpu.poll();
    assert_eq!(pieces(&r), first, "calls of one batch share its budget");
    r.gpu.end_batch();
    // Ending a batch twice (or one never begun) is harmless.
    r.gpu.end_batch();
    r.gpu.begin_batch();
    r.gpu.poll();
    assert!(pieces(&r) > first, "a new batch has a new budget");
    r.gpu.end_batch();
}

#[test]
fn engine_work_per_call_is_bounded() {
    let n = 1024u64;
    let mut r = Rig::new();
    let (mut c, p, out) = mmul_setup(&mut r, 1, n);
    let (start, _) = launch(&mut r, &mut c, &p);
    // A poller that follows next_event_ns never has more than one budget due at once.
    let before = r.gpu.engine_work();
    let (mut t, mut events) = (start, 0);
    while let Some(e) = r.gpu.next_event_ns() {
        assert!(e >= t, "events move forward");
        t = e;
        events += 1;
        r.clock.advance_to(e);
        r.gpu.poll();
    }
    assert!(events > 16, "{events} events");
    assert_eq!(r.gpu.engine_work().deferred_calls, before.deferred_calls);
    assert_eq!(
        r.gpu.stats().busy_ns,
        t - (start - CostModel::default().gpfifo_entry(p.len() as u32))
    );
    assert_eq!(
        get_words(&r, out + (n - 1) * n * 4 + 4 * 7, 1),
        vec![mmul_ref(n, n - 1, 7)]
    );
    put_words(&r, out, &vec![0; (n * n) as usize]);

    // The same kernel with the clock jumped past its end: many calls, each within the budget.
    launch(&mut r, &mut c, &p);
    r.clock.advance(1_000_000_000);
    let mut calls = 0u64;
    let mut last = r.gpu.engine_work().pieces;
    let mut progressed = 0;
    while r.gpu.next_event_ns().is_some() {
        assert!(
            r.gpu.next_event_ns() <= Some(r.clock.now_ns()),
            "work is due now"
        );
        r.gpu.poll();
        calls += 1;
        let w = r.gpu.engine_work();
        if w.pieces > last {
            progressed += 1;
        }
        last = w.pieces;
        assert!(calls < 10_000);
    }
    let w = r.gpu.engine_work();
    assert!(w.max_call_units <= WORK_BUDGET);
    assert!(w.deferred_calls > before.deferred_calls);
    assert!(progressed >= 16, "{progressed} calls did rows");
    for (i, j) in [(0, 0), (511, 3), (1023, 1023)] {
        assert_eq!(
            get_words(&r, out + (i * n + j) * 4, 1),
            vec![mmul_ref(n, i, j)]
        );
    }
}
