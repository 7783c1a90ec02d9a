//! The para-virtual page-table path against a tiny in-test vGPU: a mock `Mmio + Dma + Platform`
//! with VRAM as a map of words (reached through PRAMIN and through a software walk of the BAR3
//! VM), guest RAM as a byte vector, and the `gf100::pv` registers. On SUBMIT it reads the batch
//! from guest RAM, records it and applies the ops to its VRAM, so the tables the driver builds
//! through the interface can be compared with the ones it writes itself with the interface off.
//! Like the device model, it accepts ops only for page directories a bound channel uses (it
//! watches the channel table) and for page tables their PDEs name.

extern crate std;

use std::collections::{HashMap, HashSet};
use std::string::ToString;
use std::vec;
use std::vec::Vec;

use gf100::mmu::{self, Pde, Pte};
use gf100::pv::{self as iface, Op};
use gf100::{inst, pbus, pfb, pffb, pfifo, pmc, Target};

use crate::hal::{Bar, Dma, Mmio, Platform};
use crate::instmem::InstObj;
use crate::vm::{AddressSpace, Backing, PageSize};
use crate::{DriverConfig, DriverError, Gpu, InstAccess, MemLocation, Paravirt};

const RAM_BASE: u64 = 0x10_0000;
const RAM_SIZE: usize = 1 << 20;

struct Mock {
    /// Answer ID with MAGIC.
    offer: bool,
    /// Registers as last written.
    regs: HashMap<u32, u32>,
    /// VRAM, by 32-bit word; absent words are zero.
    vram: HashMap<u64, u32>,
    ram: Vec<u8>,
    /// Reads of the ID register.
    id_reads: u32,
    /// Every batch received, as read from guest RAM.
    batches: Vec<Vec<Op>>,
    /// Ops received so far (over all batches).
    ops_seen: u64,
    /// Reject the op with this ordinal (over all batches) with this error code.
    reject: Option<(u64, u32)>,
    /// Report `STATUS` this much lower than the ops applied (a lying device).
    status_short: u32,
    status: u32,
    error: u32,
    /// TLB_FLUSH_TRIGGER writes without and with HUB_ONLY.
    tlb_flushes: u32,
    tlb_flushes_hub: u32,
    /// Page directories named by OP_FLUSH.
    pv_flushed: Vec<u64>,
    /// Page directory of each bound channel.
    attached: HashMap<u32, u64>,
    /// Page tables named by the PDEs of attached directories.
    tables: HashSet<u64>,
    mmio_reads: u64,
    mmio_writes: u64,
}

impl Mock {
    fn new(offer: bool) -> Mock {
        Mock {
            offer,
            regs: HashMap::new(),
            vram: HashMap::new(),
            ram: vec![0; RAM_SIZE],
            id_reads: 0,
            batches: Vec::new(),
            ops_seen: 0,
            reject: None,
            status_short: 0,
            status: 0,
            error: 0,
            tlb_flushes: 0,
            tlb_flushes_hub: 0,
            pv_flushed: Vec::new(),
            attached: HashMap::new(),
            tables: HashSet::new(),
            mmio_reads: 0,
            mmio_writes: 0,
        }
    }

    fn reg(&self, r: u32) -> u32 {
        self.regs.get(&r).copied().unwrap_or(0)
    }

    fn vram_rd32(&self, addr: u64) -> u32 {
        self.vram.get(&addr).copied().unwrap_or(0)
    }

    fn vram_wr32(&mut self, addr: u64, v: u32) {
        if v == 0 {
            self.vram.remove(&addr);
        } else {
            self.vram.insert(addr, v);
        }
    }

    fn vram_rd64(&self, addr: u64) -> u64 {
        u64::from(self.vram_rd32(addr)) | u64::from(self.vram_rd32(addr + 4)) << 32
    }

    fn vram_wr64(&mut self, addr: u64, v: u64) {
        self.vram_wr32(addr, v as u32);
        self.vram_wr32(addr + 4, (v >> 32) as u32);
    }

    /// VRAM address behind a BAR3 offset, by walking the BAR3 VM the driver set up.
    fn bar3_translate(&self, off: u64) -> Option<u64> {
        let (inst_addr, _) = pbus::bar_inst_decode(self.reg(pbus::BAR3_INST))?;
        let (pd, _) = inst::pdb_decode(self.vram_rd64(inst_addr + inst::PDB_LO))?;
        let pde = Pde::decode(self.vram_rd64(pd + mmu::pde_index(off) * mmu::ENTRY_SIZE));
        let spt = pde.small?;
        let pte = Pte::decode(self.vram_rd64(spt.addr + mmu::spt_index(off) * mmu::ENTRY_SIZE))
            .ok()??;
        Some(pte.addr + (off & (mmu::SMALL_PAGE_SIZE - 1)))
    }

    /// The tables a PDE names become valid op targets.
    fn learn_pde(&mut self, raw: u64) {
        let pde = Pde::decode(raw);
        for t in [pde.small, pde.large].into_iter().flatten() {
            self.tables.insert(t.addr);
        }
    }

    /// A write to the CHAN word of channel `chid`: a binding attaches the page directory its
    /// instance block names (and learns the tables already linked), an unbinding detaches it.
    fn chan_write(&mut self, chid: u32, value: u32) {
        let pd = pfifo::chan_decode(value)
            .and_then(|(i, _)| inst::pdb_decode(self.vram_rd64(i + inst::PDB_LO)));
        match pd {
            Some((pd, _)) => {
                for i in 0..mmu::PD_ENTRIES {
                    let raw = self.vram_rd64(pd + i * mmu::ENTRY_SIZE);
                    self.learn_pde(raw);
                }
                self.attached.insert(chid, pd);
            }
            None => {
                self.attached.remove(&chid);
            }
        }
    }

    fn is_attached(&self, pd: u64) -> bool {
        self.attached.values().any(|&a| a == pd)
    }

    fn pramin_addr(&self, off: u32) -> u64 {
        let base = pbus::pmem_decode(self.reg(pbus::PMEM)).map_or(0, |(a, _)| a);
        base + u64::from(off - pbus::PRAMIN_BASE)
    }

    /// SUBMIT: read the batch from guest RAM and apply it, stopping at the first rejected op.
    fn submit(&mut self) {
        let addr =
            u64::from(self.reg(iface::BATCH_LO)) | u64::from(self.reg(iface::BATCH_HI)) << 32;
        let count = self.reg(iface::BATCH_COUNT);
        self.status = 0;
        self.error = iface::ERR_NONE;
        if count > iface::MAX_BATCH {
            self.error = iface::ERR_BAD_BATCH;
            return;
        }
        let mut ops = Vec::new();
        for i in 0..u64::from(count) {
            let mut b = [0u8; iface::OP_SIZE as usize];
            self.read(addr + i * iface::OP_SIZE, &mut b);
            ops.push(Op::from_bytes(&b));
        }
        self.batches.push(ops.clone());
        for op in ops {
            let ordinal = self.ops_seen;
            self.ops_seen += 1;
            if let Some((at, code)) = self.reject {
                if at == ordinal {
                    self.error = code;
                    break;
                }
            }
            let known = match op.op {
                iface::OP_WRITE_PDE | iface::OP_FLUSH => self.is_attached(op.table),
                iface::OP_WRITE_PTE => self.tables.contains(&op.table),
                _ => true,
            };
            if op.target != Target::Vram.bits() || !known {
                self.error = iface::ERR_BAD_TABLE;
                break;
            }
            match op.op {
                iface::OP_WRITE_PDE if op.index < mmu::PD_ENTRIES => {
                    self.vram_wr64(op.table + op.index * mmu::ENTRY_SIZE, op.value);
                    self.learn_pde(op.value);
                }
                iface::OP_WRITE_PTE if op.index < mmu::SPT_ENTRIES => {
                    self.vram_wr64(op.table + op.index * mmu::ENTRY_SIZE, op.value)
                }
                iface::OP_WRITE_PDE | iface::OP_WRITE_PTE => {
                    self.error = iface::ERR_BAD_INDEX;
                    break;
                }
                iface::OP_FLUSH => self.pv_flushed.push(op.table),
                _ => {
                    self.error = iface::ERR_BAD_OP;
                    break;
                }
            }
            self.status += 1;
        }
        self.status = self.status.saturating_sub(self.status_short);
    }
}

impl Mmio for Mock {
    fn read32(&mut self, bar: Bar, offset: u64) -> u32 {
        self.mmio_reads += 1;
        match bar {
            Bar::Bar0 => {}
            Bar::Bar3 => return self.bar3_translate(offset).map_or(0, |a| self.vram_rd32(a)),
            Bar::Bar1 => return 0,
        }
        let reg = offset as u32;
        match reg {
            pmc::BOOT_0 => pmc::BOOT_0_QUADRO_6000,
            pfb::FBP_COUNT => 1,
            r if r == pfb::fbpa_amount(0) => 256,
            pffb::VM_CFG => pffb::VM_CFG_FLUSH_SLOTS_MASK | pffb::VM_CFG_FLUSH_QUEUED,
            pfifo::SUBFIFO_ENABLE => 7,
            iface::ID => {
                self.id_reads += 1;
                if self.offer {
                    iface::MAGIC
                } else {
                    gf100::BAD_REGISTER
                }
            }
            iface::STATUS if self.offer => self.status,
            iface::ERROR if self.offer => self.error,
            r if (pbus::PRAMIN_BASE..pbus::PRAMIN_BASE + pbus::PRAMIN_SIZE).contains(&r) => {
                self.vram_rd32(self.pramin_addr(r))
            }
            r => self.reg(r),
        }
    }

    fn write32(&mut self, bar: Bar, offset: u64, value: u32) {
        self.mmio_writes += 1;
        match bar {
            Bar::Bar0 => {}
            Bar::Bar3 => {
                if let Some(a) = self.bar3_translate(offset) {
                    self.vram_wr32(a, value);
                }
                return;
            }
            Bar::Bar1 => return,
        }
        let reg = offset as u32;
        match reg {
            r if (pbus::PRAMIN_BASE..pbus::PRAMIN_BASE + pbus::PRAMIN_SIZE).contains(&r) => {
                let a = self.pramin_addr(r);
                self.vram_wr32(a, value);
            }
            pffb::TLB_FLUSH_TRIGGER => {
                if value & pffb::FLUSH_HUB_ONLY != 0 {
                    self.tlb_flushes_hub += 1;
                } else {
                    self.tlb_flushes += 1;
                }
            }
            iface::SUBMIT if self.offer && value == 1 => self.submit(),
            r if (pfifo::CHAN_TABLE..pfifo::chan_table(pfifo::CHANNELS)).contains(&r)
                && (r - pfifo::CHAN_TABLE).is_multiple_of(pfifo::CHAN_TABLE_STRIDE) =>
            {
                self.chan_write((r - pfifo::CHAN_TABLE) / pfifo::CHAN_TABLE_STRIDE, value);
                self.regs.insert(r, value);
            }
            r => {
                self.regs.insert(r, value);
            }
        }
    }
}

impl Dma for Mock {
    fn base(&self) -> u64 {
        RAM_BASE
    }
    fn size(&self) -> u64 {
        RAM_SIZE as u64
    }
    fn read(&mut self, addr: u64, buf: &mut [u8]) {
        let o = (addr - RAM_BASE) as usize;
        buf.copy_from_slice(&self.ram[o..o + buf.len()]);
    }
    fn write(&mut self, addr: u64, data: &[u8]) {
        let o = (addr - RAM_BASE) as usize;
        self.ram[o..o + data.len()].copy_from_slice(data);
    }
}

impl Platform for Mock {
    fn delay_ns(&mut self, _ns: u64) {}
}

fn init(offer: bool, paravirt: Paravirt, inst_access: InstAccess) -> Gpu<Mock> {
    let cfg = DriverConfig {
        paravirt,
        inst_access,
        timeout_ns: 1_000_000,
        ..DriverConfig::default()
    };
    Gpu::init(Mock::new(offer), cfg).unwrap_or_else(|e| panic!("init: {e}"))
}

/// Binds `vm` to hardware channel `chid` the way `channel_new` does (instance block with the
/// PDB, then the CHAN word), without the rest of the channel.
fn bind(g: &mut Gpu<Mock>, vm: &mut AddressSpace, chid: u32) -> InstObj {
    let blk = g.inst_new(inst::SIZE, inst::SIZE).unwrap();
    g.vm_join(vm, &blk);
    g.inst_done().unwrap();
    g.channel_bind(chid, &blk, vm);
    blk
}

#[test]
fn paravirt_selection() {
    // Auto: on iff offered.
    let g = init(true, Paravirt::Auto, InstAccess::Bar3);
    assert!(g.paravirt_active());
    assert_eq!(g.hal().id_reads, 1);
    let dma_pv = g.dma_free();
    let g = init(false, Paravirt::Auto, InstAccess::Bar3);
    assert!(!g.paravirt_active());
    assert_eq!(g.hal().id_reads, 1);
    assert_eq!(
        g.dma_free(),
        dma_pv + crate::pv::PvQueue::BYTES,
        "the batch buffer is allocated only when the interface is used"
    );
    // Off: never even looks.
    let g = init(true, Paravirt::Off, InstAccess::Bar3);
    assert!(!g.paravirt_active());
    assert_eq!(g.hal().id_reads, 0);
    // Required.
    let g = init(true, Paravirt::Required, InstAccess::Bar3);
    assert!(g.paravirt_active());
    assert_eq!(g.pv_stats(), crate::PvStats::default());
    let cfg = DriverConfig {
        paravirt: Paravirt::Required,
        ..DriverConfig::default()
    };
    match Gpu::init(Mock::new(false), cfg) {
        Err(e @ DriverError::ParavirtUnavailable { id }) => {
            assert_eq!(id, gf100::BAD_REGISTER);
            let s = e.to_string();
            assert!(s.contains("0x1f00000") && s.contains("0xbad00100"), "{s}");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("Required without the interface must fail"),
    }
    assert_eq!(DriverConfig::default().paravirt, Paravirt::Auto);
}

/// The same sequence of address-space operations, deterministic in VRAM use. Two register TLB
/// flushes even with PV: the first mapping (before `vm` is bound) and the last unmapping (after
/// `vm2` is unbound).
fn scenario(g: &mut Gpu<Mock>) {
    let small = PageSize::Small;
    let large = PageSize::Large;
    let mut vm = g.vm_new().unwrap();
    let mut vm2 = g.vm_new().unwrap();
    // Before a channel uses `vm`: written directly (as channel_new maps its rings).
    let a = g.vm_alloc_va(&mut vm, 5 << 12, small).unwrap();
    g.vm_map(&mut vm, a, Backing::Vram(0x200_0000), 5 << 12, small)
        .unwrap();
    let _blk = bind(g, &mut vm, 3);
    let _blk2 = bind(g, &mut vm2, 9);
    // More than a batch of PTEs, system memory, straddling a PDE boundary.
    let b = g.vm_alloc_va(&mut vm, 200 << 20, small).unwrap();
    let start = (b / mmu::PDE_COVERAGE + 1) * mmu::PDE_COVERAGE - (1000 << 12);
    g.vm_map(
        &mut vm,
        start,
        Backing::Sysram(0x4000_0000),
        3000 << 12,
        small,
    )
    .unwrap();
    let c = g.vm_alloc_va(&mut vm, 4 << 17, large).unwrap();
    g.vm_map(&mut vm, c, Backing::Vram(0x800_0000), 4 << 17, large)
        .unwrap();
    let d = g.vm_alloc_va(&mut vm2, 2 << 12, small).unwrap();
    g.vm_map(&mut vm2, d, Backing::Vram(0x300_0000), 2 << 12, small)
        .unwrap();
    // Partial and complete unmaps: the large table empties and goes, its PDE is rewritten.
    g.vm_unmap(&mut vm, a + (1 << 12), 2 << 12, small).unwrap();
    g.vm_unmap(&mut vm, c, 4 << 17, large).unwrap();
    // Buffers through the public buffer API (VRAM: same addresses with and without PV).
    let buf = g
        .buffer_new(&mut vm2, 3 << 17, MemLocation::Vram, false)
        .unwrap();
    let buf2 = g
        .buffer_new(&mut vm2, 3 << 12, MemLocation::Vram, false)
        .unwrap();
    g.buffer_free(&mut vm2, buf).unwrap();
    // Unbound (as channel_free does before freeing the rings): written directly again.
    g.channel_unbind(9, &mut vm2);
    g.buffer_free(&mut vm2, buf2).unwrap();
    let _ = (vm, vm2);
}

#[test]
fn pv_tables_equal_the_tables_written_without_pv() {
    for access in [InstAccess::Bar3, InstAccess::Pramin] {
        let mut native = init(true, Paravirt::Off, access);
        scenario(&mut native);
        let mut pv = init(true, Paravirt::Required, access);
        scenario(&mut pv);
        let (n, p) = (native.hal(), pv.hal());

        assert!(n.batches.is_empty());
        assert!(n.tlb_flushes > 0);
        assert_eq!(native.pv_stats(), crate::PvStats::default());
        assert_eq!(
            p.tlb_flushes, 2,
            "register TLB flushes only for address spaces no bound channel uses"
        );
        assert_eq!(p.pv_flushed.len() as u32 + p.tlb_flushes, n.tlb_flushes);
        assert_eq!(
            p.tlb_flushes_hub, n.tlb_flushes_hub,
            "BAR VMs are flushed through registers either way"
        );

        // Same VRAM contents, word for word: PDs, PTs, and everything else.
        let mut diff: Vec<_> = n
            .vram
            .iter()
            .filter(|(a, v)| p.vram.get(a) != Some(v))
            .map(|(a, v)| (*a, *v, p.vram.get(a).copied()))
            .collect();
        diff.extend(
            p.vram
                .iter()
                .filter(|(a, _)| !n.vram.contains_key(a))
                .map(|(a, v)| (*a, 0, Some(*v))),
        );
        diff.sort();
        assert!(
            diff.is_empty(),
            "{access:?}: {} words differ, first {:x?}",
            diff.len(),
            &diff[..diff.len().min(8)]
        );

        // Every batch fits, each flush point ends a batch with OP_FLUSH.
        let st = pv.pv_stats();
        assert_eq!(st.batches, p.batches.len() as u64);
        assert_eq!(
            st.ops,
            p.batches.iter().map(|b| b.len() as u64).sum::<u64>()
        );
        assert_eq!(st.ops, st.pde_ops + st.pte_ops + st.flushes);
        assert_eq!(st.flushes, p.pv_flushed.len() as u64);
        assert!(
            st.full_batches >= 1,
            "the 3000-page mapping needs two batches"
        );
        assert_eq!(st.failed_batches, 0);
        for b in &p.batches {
            assert!(!b.is_empty() && b.len() <= iface::MAX_BATCH as usize);
            let flushes = b.iter().filter(|o| o.op == iface::OP_FLUSH).count();
            assert!(flushes <= 1);
            if flushes == 1 {
                assert_eq!(b.last().map(|o| o.op), Some(iface::OP_FLUSH));
            }
        }
    }
}

/// A fresh VM, bound to channel 0, with one PDE's small table in place (one page mapped); the
/// mock's records cleared.
fn one_table(g: &mut Gpu<Mock>) -> (crate::AddressSpace, u64) {
    let mut vm = g.vm_new().unwrap();
    let _blk = bind(g, &mut vm, 0);
    let va = g.vm_alloc_va(&mut vm, 16 << 20, PageSize::Small).unwrap();
    g.vm_map(
        &mut vm,
        va,
        Backing::Vram(0x100_0000),
        1 << 12,
        PageSize::Small,
    )
    .unwrap();
    let h = g.hal_mut();
    h.batches.clear();
    h.pv_flushed.clear();
    (vm, va + (1 << 12))
}

#[test]
fn batches_are_split_at_max_batch() {
    let max = iface::MAX_BATCH as u64;
    // n PTEs + 1 flush.
    for (pages, want) in [
        (1u64, vec![2usize]),
        (max - 1, vec![max as usize]),
        (max, vec![max as usize, 1]),
        (2 * max + 5, vec![max as usize, max as usize, 6]),
    ] {
        let mut g = init(true, Paravirt::Required, InstAccess::Bar3);
        let (mut vm, va) = one_table(&mut g);
        let before = g.pv_stats();
        g.vm_map(
            &mut vm,
            va,
            Backing::Sysram(0x1_0000_0000),
            pages << 12,
            PageSize::Small,
        )
        .unwrap();
        let h = g.hal();
        let lens: Vec<usize> = h.batches.iter().map(Vec::len).collect();
        assert_eq!(lens, want, "{pages} pages");
        // Only the last batch flushes, at its end; the PTEs are in order.
        let all: Vec<Op> = h.batches.concat();
        assert_eq!(all.last().map(|o| o.op), Some(iface::OP_FLUSH));
        assert_eq!(all.last().map(|o| o.table), Some(vm.pd_addr()));
        assert_eq!(h.pv_flushed, vec![vm.pd_addr()]);
        let first = mmu::spt_index(va);
        for (i, op) in all[..all.len() - 1].iter().enumerate() {
            assert_eq!(op.op, iface::OP_WRITE_PTE);
            assert_eq!(op.target, Target::Vram.bits());
            assert_eq!(op.index, first + i as u64);
            let pte = Pte::new(0x1_0000_0000 + ((i as u64) << 12), Target::SysCoherent);
            assert_eq!(op.value, pte.encode());
        }
        let st = g.pv_stats();
        assert_eq!(st.batches - before.batches, want.len() as u64);
        assert_eq!(st.ops - before.ops, pages + 1);
        assert_eq!(st.pte_ops - before.pte_ops, pages);
        assert_eq!(st.full_batches - before.full_batches, want.len() as u64 - 1);
    }
}

#[test]
fn no_per_entry_mmio_in_pv_mode() {
    let mut g = init(true, Paravirt::Required, InstAccess::Bar3);
    let (mut vm, va) = one_table(&mut g);
    let (r0, w0) = (g.hal().mmio_reads, g.hal().mmio_writes);
    g.vm_map(
        &mut vm,
        va,
        Backing::Vram(0x200_0000),
        100 << 12,
        PageSize::Small,
    )
    .unwrap();
    g.vm_unmap(&mut vm, va, 100 << 12, PageSize::Small).unwrap();
    let h = g.hal();
    // Two submissions: BATCH_LO/HI/COUNT + SUBMIT, then STATUS + ERROR each.
    assert_eq!(h.mmio_writes - w0, 8);
    assert_eq!(h.mmio_reads - r0, 4);
    assert_eq!(h.tlb_flushes, 0);

    // Without PV the same calls write every entry (and flush through registers).
    let mut g = init(true, Paravirt::Off, InstAccess::Bar3);
    let (mut vm, va) = one_table(&mut g);
    let w0 = g.hal().mmio_writes;
    g.vm_map(
        &mut vm,
        va,
        Backing::Vram(0x200_0000),
        100 << 12,
        PageSize::Small,
    )
    .unwrap();
    assert!(g.hal().mmio_writes - w0 >= 200);
}

#[test]
fn rejected_ops_are_driver_errors() {
    let mut g = init(true, Paravirt::Required, InstAccess::Bar3);
    let (mut vm, va) = one_table(&mut g);
    // Reject the 4th op of the next batch.
    let seen = g.hal().ops_seen;
    g.hal_mut().reject = Some((seen + 3, iface::ERR_BAD_TABLE));
    let e = g
        .vm_map(
            &mut vm,
            va,
            Backing::Vram(0x200_0000),
            10 << 12,
            PageSize::Small,
        )
        .unwrap_err();
    assert_eq!(
        e,
        DriverError::ParavirtBatch {
            error: iface::ERR_BAD_TABLE,
            op_index: 3,
            op: Some(iface::OP_WRITE_PTE),
            count: 11,
        }
    );
    let s = e.to_string();
    assert!(
        s.contains("ERR_BAD_TABLE") && s.contains("op 3 of 11"),
        "{s}"
    );
    assert_eq!(g.pv_stats().failed_batches, 1);

    // The driver goes on: the next batch is a fresh one, applied in full.
    g.hal_mut().reject = None;
    let va2 = va + (64 << 12);
    g.vm_map(
        &mut vm,
        va2,
        Backing::Vram(0x300_0000),
        2 << 12,
        PageSize::Small,
    )
    .unwrap();
    assert_eq!(g.hal().batches.last().map(Vec::len), Some(3));

    // A device that reports fewer ops applied without an error code is not believed either.
    g.hal_mut().status_short = 1;
    let e = g
        .vm_unmap(&mut vm, va2, 2 << 12, PageSize::Small)
        .unwrap_err();
    assert!(
        matches!(
            e,
            DriverError::ParavirtBatch {
                error: iface::ERR_NONE,
                op_index: 2,
                op: Some(iface::OP_FLUSH),
                count: 3
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("ERR_NONE"), "{e}");
}

#[test]
fn garbage_status_is_an_error_not_a_panic() {
    for (status, error) in [
        (u32::MAX, 0),
        (0, u32::MAX),
        (gf100::BAD_REGISTER, gf100::BAD_REGISTER),
        (iface::MAX_BATCH + 7, iface::ERR_NONE),
    ] {
        let mut g = init(true, Paravirt::Required, InstAccess::Bar3);
        let mut vm = g.vm_new().unwrap();
        let _blk = bind(&mut g, &mut vm, 0);
        let va = g.vm_alloc_va(&mut vm, 1 << 12, PageSize::Small).unwrap();
        // The device applies nothing and answers with garbage.
        g.hal_mut().offer = false;
        g.hal_mut().regs.insert(iface::STATUS, status);
        g.hal_mut().regs.insert(iface::ERROR, error);
        let e = g
            .vm_map(
                &mut vm,
                va,
                Backing::Vram(0x200_0000),
                1 << 12,
                PageSize::Small,
            )
            .unwrap_err();
        match e {
            DriverError::ParavirtBatch {
                op_index, count, ..
            } => {
                assert_eq!(op_index, status);
                assert_eq!(count, 3);
            }
            e => panic!("{e:?}"),
        }
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn only_bound_address_spaces_go_through_pv() {
    let mut g = init(true, Paravirt::Required, InstAccess::Bar3);
    let small = PageSize::Small;
    let mut vm = g.vm_new().unwrap();
    assert!(!vm.is_bound());
    let va = g.vm_alloc_va(&mut vm, 8 << 12, small).unwrap();
    g.vm_map(&mut vm, va, Backing::Vram(0x200_0000), 4 << 12, small)
        .unwrap();
    assert!(g.hal().batches.is_empty());
    assert_eq!(g.hal().tlb_flushes, 1);
    assert_eq!(g.pv_stats(), crate::PvStats::default());

    // Bound: the device has read the entries written so far; the rest is batched.
    let _blk = bind(&mut g, &mut vm, 7);
    assert!(vm.is_bound());
    assert_eq!(g.hal().tables.len(), 1, "the mock learnt the linked table");
    g.vm_map(
        &mut vm,
        va + (4 << 12),
        Backing::Vram(0x300_0000),
        4 << 12,
        small,
    )
    .unwrap();
    assert_eq!(g.hal().batches.len(), 1);
    assert_eq!(g.hal().tlb_flushes, 1);
    assert_eq!(g.pv_stats().pte_ops, 4);

    // Unbound: direct again (the device no longer accepts ops for this directory).
    g.channel_unbind(7, &mut vm);
    assert!(!vm.is_bound() && g.hal().attached.is_empty());
    g.vm_unmap(&mut vm, va, 8 << 12, small).unwrap();
    assert_eq!(g.hal().batches.len(), 1);
    assert_eq!(g.hal().tlb_flushes, 2);
    let t = g.hal().tables.iter().next().copied().unwrap();
    let first = mmu::spt_index(va);
    for i in 0..8 {
        let pte = g.hal().vram_rd64(t + (first + i) * mmu::ENTRY_SIZE);
        assert_eq!(pte, 0, "PTE {i}");
    }
}

#[test]
fn ops_for_an_unbound_directory_are_refused_by_the_mock() {
    // The mock enforces what the device model does, so the other tests would catch a driver
    // that sent ops for an address space no channel uses.
    let mut g = init(true, Paravirt::Required, InstAccess::Bar3);
    let mut vm = g.vm_new().unwrap();
    vm.pv_bound = true; // a lie: no channel table entry names it
    let va = g.vm_alloc_va(&mut vm, 1 << 12, PageSize::Small).unwrap();
    let e = g
        .vm_map(
            &mut vm,
            va,
            Backing::Vram(0x200_0000),
            1 << 12,
            PageSize::Small,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            DriverError::ParavirtBatch {
                error: iface::ERR_BAD_TABLE,
                op_index: 0,
                op: Some(iface::OP_WRITE_PDE),
                count: 3
            }
        ),
        "{e:?}"
    );
}
