//! PBUS host-memory windows: the PRAMIN window (BAR0 0x700000-0x7fffff onto the physical memory
//! selected by PMEM 0x1700) and the BAR1 / BAR3 apertures, each translated through the VM of the
//! instance block bound by 0x1704 / 0x1714.
//!
//! A BAR binding in VM mode (bit 31) loads the page directory and limit from its instance block
//! (+0x200 / +0x208) when it is written, and again on every TLB flush (nouveau flushes the BAR VM
//! with HUB_ONLY after changing its page tables). Translations go through the shared TLB. A
//! binding with bit 31 clear maps the aperture straight onto VRAM (offset = VRAM address). An
//! access that faults reports an MMU fault for unit BAR1 (4) or BAR3 (5) with client BAR_READ /
//! BAR_WRITE; a faulting or out-of-range read returns all-ones bytes, such a write is dropped.

use gf100::fault::{self, FaultFlags};
use gf100::pci::Bar;
use gf100::{pbus, Target};

use super::intr::FaultReport;
use super::mmu::{page_piece, Vspace};
use super::Core;

/// How a BAR reaches memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BarMode {
    /// Bit 31 clear: offset = VRAM address.
    Direct,
    /// Bit 31 set with a valid instance block: through its VM.
    Vm(Vspace),
    /// Bit 31 set but the instance target is invalid: every access faults NO_CHANNEL.
    NoInstance,
}

/// One BAR binding register and what it loaded.
#[derive(Debug, Clone, Copy)]
struct Binding {
    reg: u32,
    mode: BarMode,
}

impl Binding {
    fn load(core: &mut Core, reg: u32) -> Binding {
        let mode = if reg & pbus::BAR_INST_VM_MODE == 0 {
            BarMode::Direct
        } else {
            match pbus::bar_inst_decode(reg) {
                Some((inst, target)) => BarMode::Vm(Vspace::load(&mut core.mem, inst, target)),
                None => BarMode::NoInstance,
            }
        };
        Binding { reg, mode }
    }
}

/// A physical range written through a window (for the doorbell snoop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    /// Memory written.
    pub target: Target,
    /// Physical address.
    pub addr: u64,
    /// Bytes written.
    pub len: u64,
}

/// The PBUS window registers and their loaded state.
#[derive(Debug)]
pub(crate) struct Bars {
    pmem: u32,
    bar1: Binding,
    bar3: Binding,
    /// `Core::flush_epoch` when the bindings were last loaded.
    epoch: u64,
}

impl Default for Bars {
    fn default() -> Self {
        let off = Binding {
            reg: 0,
            mode: BarMode::Direct,
        };
        Bars {
            pmem: 0,
            bar1: off,
            bar3: off,
            epoch: 0,
        }
    }
}

impl Bars {
    /// Reads PMEM / BAR1 / BAR3 binding registers.
    pub(crate) fn read_reg(&self, offset: u32) -> Option<u32> {
        match offset {
            pbus::PMEM => Some(self.pmem),
            pbus::BAR1_INST => Some(self.bar1.reg),
            pbus::BAR3_INST => Some(self.bar3.reg),
            _ => None,
        }
    }

    /// Writes PMEM / BAR1 / BAR3 binding registers; false if `offset` is not one.
    pub(crate) fn write_reg(&mut self, core: &mut Core, offset: u32, value: u32) -> bool {
        match offset {
            pbus::PMEM => self.pmem = value & 0x03ff_ffff,
            pbus::BAR1_INST => self.bar1 = Binding::load(core, value),
            pbus::BAR3_INST => self.bar3 = Binding::load(core, value),
            _ => return false,
        }
        true
    }

    /// Reloads both BAR VMs from their instance blocks if a TLB flush happened since they were
    /// last loaded.
    pub(crate) fn sync(&mut self, core: &mut Core) {
        if self.epoch != core.flush_epoch {
            self.epoch = core.flush_epoch;
            self.bar1 = Binding::load(core, self.bar1.reg);
            self.bar3 = Binding::load(core, self.bar3.reg);
        }
    }

    /// Physical location of PRAMIN window offset `off` (0..1 MiB); `None` for an invalid target.
    fn pramin(&self, off: u32) -> Option<(u64, Target)> {
        let (base, target) = pbus::pmem_decode(self.pmem)?;
        Some((base + (off & (pbus::PRAMIN_SIZE - 1)) as u64, target))
    }

    /// Reads a 32-bit word through the PRAMIN window.
    pub(crate) fn pramin_read(&self, core: &mut Core, off: u32) -> u32 {
        match self.pramin(off) {
            Some((addr, target)) => core.mem.read_u32(target, addr).unwrap_or(u32::MAX),
            None => {
                core.mem.errors += 1;
                u32::MAX
            }
        }
    }

    /// Writes a 32-bit word through the PRAMIN window; returns what was written.
    pub(crate) fn pramin_write(&self, core: &mut Core, off: u32, value: u32) -> Option<Written> {
        let Some((addr, target)) = self.pramin(off) else {
            core.mem.errors += 1;
            return None;
        };
        core.mem.write_u32(target, addr, value).then_some(Written {
            target,
            addr,
            len: 4,
        })
    }

    fn binding(&self, bar: Bar) -> Option<(Binding, u32)> {
        match bar {
            Bar::Bar1 => Some((self.bar1, fault::UNIT_BAR1)),
            Bar::Bar3 => Some((self.bar3, fault::UNIT_BAR3)),
            Bar::Bar0 => None,
        }
    }

    /// Reads through BAR1/BAR3. Out-of-range, faulting or BAR0 accesses read all-ones.
    pub(crate) fn aperture_read(&self, core: &mut Core, bar: Bar, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        let Some((b, unit)) = self
            .binding(bar)
            .filter(|_| in_bar(bar, offset, data.len()))
        else {
            return;
        };
        let mut done = 0usize;
        while done < data.len() {
            let va = offset + done as u64;
            let Some((pa, target, n)) = resolve(core, b, unit, va, data.len() - done, false) else {
                return;
            };
            core.mem.read(target, pa, &mut data[done..done + n]);
            done += n;
        }
    }

    /// Writes through BAR1/BAR3; calls `written` for every physical piece that was written.
    /// Out-of-range or BAR0 writes are dropped; a fault drops the rest of the write.
    pub(crate) fn aperture_write(
        &self,
        core: &mut Core,
        bar: Bar,
        offset: u64,
        data: &[u8],
        written: &mut dyn FnMut(Written),
    ) {
        let Some((b, unit)) = self
            .binding(bar)
            .filter(|_| in_bar(bar, offset, data.len()))
        else {
            return;
        };
        let mut done = 0usize;
        while done < data.len() {
            let va = offset + done as u64;
            let Some((pa, target, n)) = resolve(core, b, unit, va, data.len() - done, true) else {
                return;
            };
            if core.mem.write(target, pa, &data[done..done + n]) {
                written(Written {
                    target,
                    addr: pa,
                    len: n as u64,
                });
            }
            done += n;
        }
    }
}

/// True if `[offset, offset + len)` lies inside the BAR.
fn in_bar(bar: Bar, offset: u64, len: usize) -> bool {
    offset
        .checked_add(len as u64)
        .is_some_and(|end| end <= bar.size())
}

/// Resolves BAR offset `va` for up to `rest` bytes: (physical address, target, bytes in this
/// piece), or `None` after reporting a fault.
fn resolve(
    core: &mut Core,
    b: Binding,
    unit: u32,
    va: u64,
    rest: usize,
    write: bool,
) -> Option<(u64, Target, usize)> {
    let n = page_piece(va, rest);
    let reason = match b.mode {
        BarMode::Direct => return Some((va, Target::Vram, n)),
        BarMode::Vm(vs) => match core.translate(&vs, va, write) {
            Ok((pa, target)) => return Some((pa, target, n)),
            Err(f) => f.reason,
        },
        BarMode::NoInstance => fault::REASON_NO_CHANNEL,
    };
    let client = if write {
        fault::HUB_CLIENT_BAR_WRITE
    } else {
        fault::HUB_CLIENT_BAR_READ
    };
    core.report_fault(FaultReport {
        unit,
        inst: b.reg & 0x3fff_ffff,
        va,
        flags: FaultFlags {
            reason,
            hub: true,
            write,
            client,
            gpc: 0,
        },
    });
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostModel;
    use gf100::inst;
    use gf100::mmu::{Pde, PtRef, PtSize, Pte};

    const INST: u64 = 0x1_0000;
    const PD: u64 = 0x2_0000;
    const SPT: u64 = 0x4_0000;

    fn setup() -> (Core, Bars) {
        let mut c = Core::new(16 << 20, CostModel::instant());
        let w =
            |c: &mut Core, a: u64, v: u64| assert!(c.mem.write(Target::Vram, a, &v.to_le_bytes()));
        w(
            &mut c,
            INST + inst::PDB_LO,
            inst::pdb_encode(PD, Target::Vram),
        );
        w(&mut c, INST + inst::LIMIT_LO, (1 << 27) - 1);
        let spt = PtRef {
            addr: SPT,
            target: Target::Vram,
            vol: false,
        };
        w(
            &mut c,
            PD,
            Pde {
                small: Some(spt),
                large: None,
                size: PtSize::Full,
            }
            .encode(),
        );
        w(&mut c, SPT + 8, Pte::new(0x80_0000, Target::Vram).encode());
        let mut b = Bars::default();
        assert!(b.write_reg(
            &mut c,
            pbus::BAR1_INST,
            pbus::bar_inst_encode(INST, Target::Vram)
        ));
        (c, b)
    }

    #[test]
    fn bar1_reaches_vram_through_its_page_table() {
        let (mut c, b) = setup();
        let mut seen = Vec::new();
        b.aperture_write(&mut c, Bar::Bar1, 0x1010, &[1, 2, 3, 4], &mut |w| {
            seen.push(w)
        });
        assert_eq!(
            seen,
            vec![Written {
                target: Target::Vram,
                addr: 0x80_0010,
                len: 4
            }]
        );
        let mut back = [0u8; 4];
        b.aperture_read(&mut c, Bar::Bar1, 0x1010, &mut back);
        assert_eq!(back, [1, 2, 3, 4]);
    }

    #[test]
    fn unmapped_and_out_of_range_accesses_read_all_ones() {
        let (mut c, b) = setup();
        let mut d = [0u8; 4];
        b.aperture_read(&mut c, Bar::Bar1, 0x2000, &mut d);
        assert_eq!(d, [0xff; 4]);
        assert_eq!(c.stats.mmu_faults, 1);
        assert_eq!(
            c.intr.read(gf100::pfifo::VM_FAULT_SOURCE),
            Some(1 << fault::UNIT_BAR1)
        );
        let flags = FaultFlags::decode(
            c.intr
                .read(gf100::pfifo::vm_fault(fault::UNIT_BAR1, 0xc))
                .unwrap_or(0),
        );
        assert_eq!(
            (flags.reason, flags.client, flags.hub),
            (
                fault::REASON_PAGE_NOT_PRESENT,
                fault::HUB_CLIENT_BAR_READ,
                true
            )
        );
        b.aperture_read(&mut c, Bar::Bar1, Bar::Bar1.size() - 2, &mut d);
        assert_eq!(d, [0xff; 4]);
        assert_eq!(
            c.stats.mmu_faults, 1,
            "beyond the BAR is dropped, not a fault"
        );
    }

    #[test]
    fn direct_mode_and_pramin_reach_vram() {
        let (mut c, b) = setup();
        let mut d = [0u8; 8];
        b.aperture_read(&mut c, Bar::Bar3, INST + inst::PDB_LO, &mut d);
        assert_eq!(u64::from_le_bytes(d), inst::pdb_encode(PD, Target::Vram));
        let mut b2 = Bars::default();
        assert!(b2.write_reg(
            &mut c,
            pbus::PMEM,
            pbus::pmem_encode(0x80_0000, Target::Vram)
        ));
        assert_eq!(
            b2.pramin_write(&mut c, 0x10, 0xdead_beef),
            Some(Written {
                target: Target::Vram,
                addr: 0x80_0010,
                len: 4
            })
        );
        assert_eq!(b2.pramin_read(&mut c, 0x10), 0xdead_beef);
    }
}
