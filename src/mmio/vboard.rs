//! Board-level registers a real driver (nouveau) reads while it probes, answered per VM as a
//! POSTed Quadro 6000 would (facts and sources in `gf100::board`), plus the per-VM PMU
//! ([`super::vpmu`]) and virtual PGRAPH ([`super::vpgraph`]) stand-ins and the VBIOS window.
//! Nothing here touches the physical GPU; every write is absorbed into this VM's state.
//!
//! | registers | answer |
//! |---|---|
//! | PROM window 0x300000-0x3fffff | the generated VBIOS ([`super::vbios`]), read-only |
//! | strap 0x101000 | 27 MHz crystal |
//! | 0x02240c | bit 1: POSTed (devinit skips the VBIOS scripts) |
//! | 0x022500 | display, video decoders and PCOPY1 fused off (the model has none of them); PCOPY0 present |
//! | PCOPY0 falcon 0x104000 | [`super::vce`]: firmware upload accepted (high-level emulation) |
//! | engine status 0x002640.. | idle |
//! | PLL/clock blocks 0x00e000, 0x132000, 0x137000 | 0 (PLLs off: nouveau reads no coefficient it could divide by) |
//! | therm 0x020000, fuses 0x021000, PUNITS fuse access 0x022400, privring 0x120000-0x122fff, LTC 0x17e000 | written values, else 0; LTC slices 1 |
//! | PUNITS GPC/TPC maxima 0x022430/4 | the VM's topology (1 GPC, 1 TPC: [`super::vpgraph`]) |
//! | LTC count 0x100800, privring FBP count 0x121c74 | 1 (the VM's one FBP with one LTC) |
//! | PBUS interrupt 0x001100 / enable 0x001140 | no bus error pending (write-1-to-clear absorbed) / stored |
//! | PMC 0x000260, 0x000644; PFIFO runlist-interrupt enable 0x002a04; PTIMER divider 0x009220 | stored (no effect on the model: its interrupts, runlists and time are the host's) |
//! | PUNITS PCIe 0x02241c | 0: PCIe 1.x, not full-speed capable, as the VM's PCIe capability says; writes ignored |
//! | LTC flush/invalidate 0x070004/0x070010 | done at once (read 0) |
//! | VGA CRTC ports 0x601000 (byte access) | written values, else 0 |

use std::collections::BTreeMap;

use gf100::board::*;

use super::vce::VCe;
use super::vpgraph::VPgraph;
use super::vpmu::VPmu;

/// Units fused off in [`UNITS_DISABLED`]: DISP (0), MSPDEC+MSPPP (1), MSVLD (2), CE1 (9). CE0
/// is present: nouveau brings its falcon up through [`super::vce`] and then moves buffers with
/// class 0x90b5 on it ("MM: using COPY0"), which the simulated GPU's copy engine executes. CE1
/// stays off: its class 0x90b8 (FERMI_DECOMPRESS) is not executed by the model, and with it
/// present nouveau would pick it first ("COPY1").
pub const FUSED_OFF: u32 = 0x0000_0207;
/// FBPs (and LTCs, one per FBP) the VM is given: what `0x121c74` and `0x100800` read; the
/// VM's PFB FBP count (`vgpu::bar0`) reports the same one.
pub const VIRTUAL_LTCS: u32 = 1;
/// Stored board registers kept per VM at most.
const MAX_STORED: usize = 4096;

/// One VM's board state.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct VBoard {
    /// The generated VBIOS: not state (the same image for every VM), regenerated on restore.
    #[serde(skip, default = "vbios_image")]
    vbios: std::sync::Arc<Vec<u8>>,
    stored: BTreeMap<u32, u32>,
    pub pmu: VPmu,
    pub pgraph: VPgraph,
    #[serde(default)]
    pub ce0: VCe,
}

fn vbios_image() -> std::sync::Arc<Vec<u8>> {
    std::sync::Arc::new(super::vbios::image())
}

impl Default for VBoard {
    fn default() -> Self {
        VBoard {
            vbios: std::sync::Arc::new(super::vbios::image()),
            stored: BTreeMap::new(),
            pmu: VPmu::default(),
            pgraph: VPgraph::default(),
            ce0: VCe::default(),
        }
    }
}

fn in_block(off: u32, base: u32) -> bool {
    (base..base + BLOCK).contains(&off)
}

impl VBoard {
    /// A read of the PROM window at `rel`.
    pub fn prom(&self, rel: u32) -> u32 {
        super::vbios::prom_word(&self.vbios, rel)
    }

    /// Bytes of the expansion ROM at `off` (the same image; zero past it).
    pub fn rom(&self, off: usize, out: &mut [u8]) {
        for (i, b) in out.iter_mut().enumerate() {
            *b = off
                .checked_add(i)
                .and_then(|a| self.vbios.get(a))
                .copied()
                .unwrap_or(0);
        }
    }

    /// A read of a board register; `None` if this module does not implement it.
    pub fn read(&mut self, off: u32) -> Option<u32> {
        if VPmu::contains(off) {
            return Some(self.pmu.read(off));
        }
        if VPgraph::contains(off) {
            return Some(self.pgraph.read(off));
        }
        if VCe::contains(off) {
            return Some(self.ce0.read(off));
        }
        Some(match off {
            STRAP => STRAP_27MHZ,
            POSTED => POSTED_BIT,
            UNITS_DISABLED => FUSED_OFF,
            LTC_FLUSH | LTC_INVALIDATE => 0,
            PBUS_INTR | PUNITS_PCIE => 0,
            PMC_UNK260 | PMC_INTR_MASK_NRHOST | PFIFO_RUNLIST_INTR_EN | PTIMER_SOURCE_DIV => {
                self.stored.get(&off).copied().unwrap_or(0)
            }
            PUNITS_GPC_MAX => super::vpgraph::GPCS,
            PUNITS_TPC_MAX => super::vpgraph::TPCS,
            LTC_COUNT | PRIVRING_FBP_COUNT => VIRTUAL_LTCS,
            PBUS_INTR_EN => self.stored.get(&off).copied().unwrap_or(0),
            LTC_SLICES => 1 << 28,
            o if (ENGINE_STATUS..ENGINE_STATUS + 0x40).contains(&o) => 0,
            o if in_block(o, PGPIO_BASE) || in_block(o, MPLL_BASE) || in_block(o, PCLOCK_BASE) => 0,
            o if in_block(o, PTHERM_BASE)
                || in_block(o, FUSE_BASE)
                || (PRIVRING_BASE..PRIVRING_BASE + PRIVRING_BLOCKS * BLOCK).contains(&o)
                || o == PUNITS_BASE
                || in_block(o, LTC_BASE)
                || in_block(o, VGA_CRTC_BASE) =>
            {
                self.stored.get(&o).copied().unwrap_or(0)
            }
            _ => return None,
        })
    }

    /// A write of a board register (absorbed); false if this module does not implement it.
    pub fn write(&mut self, off: u32, v: u32) -> bool {
        if VPmu::contains(off) {
            self.pmu.write(off, v);
            return true;
        }
        if VPgraph::contains(off) {
            self.pgraph.write(off, v);
            return true;
        }
        if VCe::contains(off) {
            self.ce0.write(off, v);
            return true;
        }
        if self.read(off).is_none() {
            return false;
        }
        if self.stored.len() < MAX_STORED || self.stored.contains_key(&off) {
            self.stored.insert(off, v);
        }
        true
    }

    /// A byte or halfword write (VGA CRTC ports): merged into the containing word.
    pub fn write_partial(&mut self, off: u32, data: &[u8]) -> bool {
        let word = off & !3;
        let Some(mut b) = self.read(word).map(u32::to_le_bytes) else {
            return false;
        };
        let at = (off % 4) as usize;
        if at + data.len() > 4 {
            return false;
        }
        b[at..at + data.len()].copy_from_slice(data);
        self.write(word, u32::from_le_bytes(b))
    }
}

/// VGA CRTC I/O ports mirrored in BAR0 (nouveau's `nvkm_rdvgac/wrvgac`: 8-bit at 0x6013d4/5).
pub const VGA_CRTC_BASE: u32 = 0x601000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posted_quadro_answers() {
        let mut b = VBoard::default();
        assert_eq!(b.read(STRAP).unwrap() & 0x0040_0040, 0x0040_0000);
        assert_eq!(b.read(POSTED).unwrap() & 2, 2);
        assert_eq!(b.read(UNITS_DISABLED), Some(FUSED_OFF));
        // PLL control reads 0 whatever was written (no division by a zero coefficient).
        assert!(b.write(0x137100, 1));
        assert_eq!(b.read(0x137100), Some(0));
        // Therm keeps what was written.
        assert!(b.write(0x020008, 5));
        assert_eq!(b.read(0x020008), Some(5));
        // CRTC byte writes.
        assert!(b.write_partial(0x6013d4, &[0x1f]));
        assert!(b.write_partial(0x6013d5, &[0x57]));
        assert_eq!(b.read(0x6013d4), Some(0x571f));
        // The VM's topology and counts; PBUS reads no error and keeps its enable.
        assert_eq!(b.read(PUNITS_GPC_MAX), Some(1));
        assert_eq!(b.read(PUNITS_TPC_MAX), Some(1));
        assert_eq!(b.read(LTC_COUNT), Some(VIRTUAL_LTCS));
        assert_eq!(b.read(PRIVRING_FBP_COUNT), Some(VIRTUAL_LTCS));
        assert!(b.write(PBUS_INTR, u32::MAX) && b.write(PBUS_INTR_EN, 0xe));
        assert_eq!(
            (b.read(PBUS_INTR), b.read(PBUS_INTR_EN)),
            (Some(0), Some(0xe))
        );
        // The PCIe version cannot be raised: the VM's capability is PCIe 1.x.
        assert!(b.write(PUNITS_PCIE, 1));
        assert_eq!(b.read(PUNITS_PCIE), Some(0));
        assert!(b.write(PFIFO_RUNLIST_INTR_EN, 0xbfff_ffff));
        assert_eq!(b.read(PFIFO_RUNLIST_INTR_EN), Some(0xbfff_ffff));
        // The fuse-access bit and privring timeouts keep what was written.
        assert!(b.write(0x022400, 0x800) && b.write(0x12232c, 0x0010_0064));
        assert_eq!(
            (b.read(0x022400), b.read(0x12232c)),
            (Some(0x800), Some(0x0010_0064))
        );
        // Not a board register.
        assert_eq!(b.read(0x800000), None);
        assert!(!b.write(0x800000, 1));
        assert_eq!(b.prom(0) & 0xffff, 0xaa55);
    }
}
