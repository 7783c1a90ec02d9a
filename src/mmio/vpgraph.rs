//! The per-VM virtual PGRAPH: a stand-in for the graphics engine and its context-switch
//! falcons (FECS at 0x409000, GPCCS at 0x41a000) that answers nouveau's GR bring-up at its
//! interface — **high-level emulation of the FECS/GPCCS firmware interface**, not a falcon
//! interpreter and not the physical engine.
//!
//! What a guest writes anywhere in 0x400000-0x5fffff (init lists, ICMD, method lists, ZBC,
//! exception enables, falcon uploads, `0x409100` start, the golden-context handshake) is
//! absorbed into this VM's copy and never reaches the shared physical GR. What it reads
//! describes the GR this VM is given: one GPC with one TPC and one ROP, idle status, a started
//! FECS with a context size, and the handshakes of `shared/research/gf100-pgraph-ctxsw.md` §6:
//!
//! - `0x409100` = 2 (start) → mailbox 0 (`0x409800`) bit 31 set, mailbox 1 (`0x409804`) =
//!   [`CONTEXT_SIZE`];
//! - `0x409840` clears mailbox-0 bits (write-1-to-clear); `0x409504` (method) sets bit 31
//!   (done) again;
//! - `0x409000` = 0x100 (unload) → `0x409b00` bit 31 reads clear;
//! - `0x400700`, `0x40060c` read idle; `0x404170` bit 4 (power-mode change) reads clear;
//! - the falcons' DMEM ports (`+0x1c0` control, `+0x1c4` data) keep what was uploaded, with
//!   the auto-increment of the real ports, so the register-list read-back works; IMEM uploads
//!   are counted and dropped (nothing executes them).
//!
//! Reads of registers the guest wrote return the written value; others read 0. GR contexts
//! are not yet host-owned: that is the next step (docs/nouveau.md).

use std::collections::BTreeMap;

use gf100::board::pgraph::*;

/// Context image size the virtual FECS reports (MODEL: a plausible size, bytes; nouveau
/// allocates this per channel and does not check it).
pub const CONTEXT_SIZE: u32 = 0x20000;
/// GPCs, TPCs per GPC and ROPs the VM is given (MODEL).
pub const GPCS: u32 = 1;
/// TPCs per GPC.
pub const TPCS: u32 = 1;
/// ROPs.
pub const ROPS: u32 = 1;
/// Stored registers kept per VM at most; further new addresses are dropped (counted).
pub const MAX_STORED: usize = 1 << 16;
/// DMEM words kept per falcon (16 KiB, more than nouveau's built-in GF100 ucode data).
pub const DMEM_WORDS: usize = 4096;

const GPCCS: u32 = 0x41a000;

/// One falcon's upload ports.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Ports {
    dmemc: u32,
    dmem: Vec<u32>,
    imem_words: u64,
}

impl Ports {
    fn dmem_index(&self) -> usize {
        ((self.dmemc >> 2) & 0x3fff) as usize % DMEM_WORDS
    }

    fn write_data(&mut self, v: u32) {
        // Any other length (an empty port, or a restored snapshot's) becomes the full port.
        if self.dmem.len() != DMEM_WORDS {
            self.dmem.resize(DMEM_WORDS, 0);
        }
        let i = self.dmem_index();
        self.dmem[i] = v;
        if self.dmemc & (1 << 24) != 0 {
            self.advance();
        }
    }

    fn read_data(&mut self) -> u32 {
        let v = self.dmem.get(self.dmem_index()).copied().unwrap_or(0);
        if self.dmemc & (1 << 25) != 0 {
            self.advance();
        }
        v
    }

    fn advance(&mut self) {
        let off = ((self.dmemc & 0xfffc) + 4) & 0xfffc;
        self.dmemc = (self.dmemc & !0xfffc) | off;
    }
}

/// One VM's virtual PGRAPH.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct VPgraph {
    stored: BTreeMap<u32, u32>,
    fecs: Ports,
    gpccs: Ports,
    started: bool,
    mailbox0: u32,
    /// Writes absorbed (never forwarded).
    pub absorbed: u64,
    /// Writes dropped because [`MAX_STORED`] addresses were already kept.
    pub dropped: u64,
}

impl VPgraph {
    /// True for offsets this stand-in answers.
    pub fn contains(off: u32) -> bool {
        (BASE..END).contains(&off)
    }

    fn ports(&mut self, off: u32) -> Option<(&mut Ports, u32)> {
        match off {
            o if (FECS..FECS + 0x1000).contains(&o) => Some((&mut self.fecs, o - FECS)),
            o if (GPCCS..GPCCS + 0x1000).contains(&o) => Some((&mut self.gpccs, o - GPCCS)),
            _ => None,
        }
    }

    /// A guest read.
    pub fn read(&mut self, off: u32) -> u32 {
        if let Some((p, rel)) = self.ports(off) {
            match rel {
                0x1c0 => return p.dmemc,
                0x1c4 => return p.read_data(),
                // Code/data limits (`+0x108`) large enough for the built-in ucode; version 3.
                0x108 => return 0x0002_0080,
                0x12c => return 0x3,
                _ => {}
            }
        }
        match off {
            STATUS | STATUS2 => 0,
            PWR_MODE => self.stored.get(&off).copied().unwrap_or(0) & !0x10,
            UNIT_COUNTS => GPCS | (ROPS << 16),
            FECS_MAILBOX0 => self.mailbox0,
            FECS_MAILBOX1 if self.started => CONTEXT_SIZE,
            // The unload the golden-context handshake waits for is done at once.
            FECS_UNLOAD => self.stored.get(&off).copied().unwrap_or(0) & !(1 << 31),
            o if o >= 0x500000 && (o - 0x500000) % GPC_STRIDE == 0x2608 => {
                if (o - 0x500000) / GPC_STRIDE < GPCS {
                    TPCS
                } else {
                    0
                }
            }
            _ => self.stored.get(&off).copied().unwrap_or(0),
        }
    }

    /// A guest write: absorbed.
    pub fn write(&mut self, off: u32, v: u32) {
        self.absorbed += 1;
        if let Some((p, rel)) = self.ports(off) {
            match rel {
                0x1c0 => {
                    p.dmemc = v;
                    return;
                }
                0x1c4 => {
                    p.write_data(v);
                    return;
                }
                0x184 => {
                    p.imem_words += 1;
                    return;
                }
                _ => {}
            }
        }
        match off {
            FECS_CPUCTL if v & 2 != 0 => {
                self.started = true;
                self.mailbox0 |= 1 << 31;
            }
            FECS_CLEAR => self.mailbox0 &= !v,
            FECS_METHOD => self.mailbox0 |= 1 << 31,
            _ => {}
        }
        if self.stored.len() >= MAX_STORED && !self.stored.contains_key(&off) {
            self.dropped += 1;
            return;
        }
        self.stored.insert(off, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bring_up_handshakes() {
        let mut g = VPgraph::default();
        assert_eq!(g.read(UNIT_COUNTS) & 0x1f, GPCS);
        assert_eq!(g.read(GPC0_TPC_COUNT), TPCS);
        assert_eq!(g.read(GPC0_TPC_COUNT + GPC_STRIDE), 0);
        assert_eq!(g.read(STATUS), 0);
        g.write(PWR_MODE, 0x10);
        assert_eq!(g.read(PWR_MODE) & 0x10, 0);
        assert_eq!(g.read(FECS_MAILBOX0) >> 31, 0, "not started");
        g.write(FECS_CPUCTL, 2);
        assert_eq!(g.read(FECS_MAILBOX0) >> 31, 1);
        assert_eq!(g.read(FECS_MAILBOX1), CONTEXT_SIZE);
        g.write(FECS_CLEAR, 0x8000_0000);
        assert_eq!(g.read(FECS_MAILBOX0) >> 31, 0);
        g.write(FECS_CHAN, 0x8000_1234);
        g.write(FECS_METHOD, 1);
        assert_eq!(g.read(FECS_MAILBOX0) >> 31, 1);
        g.write(FECS, 0x100);
        assert_eq!(g.read(FECS_UNLOAD) >> 31, 0);
        // Absorbed registers read back.
        g.write(0x404154, 0x1234);
        assert_eq!(g.read(0x404154), 0x1234);
    }

    #[test]
    fn dmem_port_auto_increments_both_ways() {
        let mut g = VPgraph::default();
        g.write(FECS + 0x1c0, 1 << 24);
        for w in [11, 22, 33] {
            g.write(FECS + 0x1c4, w);
        }
        g.write(FECS + 0x1c0, 1 << 25);
        let back: Vec<u32> = (0..3).map(|_| g.read(FECS + 0x1c4)).collect();
        assert_eq!(back, vec![11, 22, 33]);
        // A huge offset wraps inside the array instead of indexing out of it.
        g.write(FECS + 0x1c0, (1 << 24) | 0xfffc);
        g.write(FECS + 0x1c4, 7);
    }
}
