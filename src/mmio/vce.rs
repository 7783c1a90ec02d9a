//! The per-VM stand-in for PCOPY0's falcon (`0x104000`): **high-level emulation of the copy
//! engine's falcon firmware interface**, not a falcon interpreter. nouveau's generic falcon
//! engine (`nvkm_falcon_oneinit`/`_init`) reads the falcon's version and code/data limits,
//! uploads its built-in CE firmware word by word through the IMEM/DMEM ports, starts the
//! falcon and sets the FIFO/channel-switch enables; `gf100_ce_init` writes the engine index.
//! Here the upload is counted and dropped (nothing executes it: the copy-engine class 0x90b5
//! itself is executed by the simulated GPU's copy engine, reached through the VM's channels,
//! never through these registers); the limits read back are large enough for the firmware, the
//! falcon reads as running with no interrupt pending, and every other register keeps what was
//! written. Clearing PCOPY0's PMC ENABLE bit resets this state. PCOPY1 stays fused off
//! (`vboard`): its class 0x90b8 (FERMI_DECOMPRESS) is not executed by the model.

use std::collections::BTreeMap;

use gf100::board::pcopy::*;

/// What [`HWCFG`] reads (MODEL): code limit 0x40 * 256 = 16 KiB, data limit 0x10 * 256 =
/// 4 KiB (`(0x2000 & 0x3fe00) >> 1`); nouveau's GF100 CE firmware is smaller than both.
pub const HWCFG_VALUE: u32 = 0x0000_2040;
/// What [`CAPS`] reads: falcon version 3 (the IMEM/DMEM port upload), secret level 0.
pub const CAPS_VALUE: u32 = 3;
/// Registers kept at most (the falcon's block is 4 KiB: 1,024 words).
const MAX_STORED: usize = 1024;

/// PCOPY0's falcon, one VM's view.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct VCe {
    stored: BTreeMap<u32, u32>,
    /// The falcon was started (CPUCTL bit 1) since the last reset.
    pub started: bool,
    /// IMEM words uploaded (counted, dropped).
    pub imem_words: u64,
    /// DMEM words uploaded (counted, dropped).
    pub dmem_words: u64,
}

impl VCe {
    /// True for offsets this stand-in answers (PCOPY0's 4 KiB block).
    pub fn contains(off: u32) -> bool {
        (PCOPY0..PCOPY0 + 0x1000).contains(&off)
    }

    /// A guest read.
    pub fn read(&self, off: u32) -> u32 {
        match off - PCOPY0 {
            HWCFG => HWCFG_VALUE,
            CAPS => CAPS_VALUE,
            // Running, nothing pending; CPUCTL bit 4 (halted) reads clear.
            IRQSTAT => 0,
            CPUCTL => 0,
            IMEMD | DMEMD => 0,
            rel => self.stored.get(&rel).copied().unwrap_or(0),
        }
    }

    /// A guest write: absorbed.
    pub fn write(&mut self, off: u32, v: u32) {
        let rel = off - PCOPY0;
        match rel {
            IMEMD => {
                self.imem_words += 1;
                return;
            }
            DMEMD => {
                self.dmem_words += 1;
                return;
            }
            CPUCTL if v & 2 != 0 => self.started = true,
            IRQSCLR => return,
            _ => {}
        }
        if self.stored.len() < MAX_STORED || self.stored.contains_key(&rel) {
            self.stored.insert(rel, v);
        }
    }

    /// PMC ENABLE's PCOPY0 bit cleared: the falcon is reset.
    pub fn reset(&mut self) {
        *self = VCe::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `nvkm_falcon_oneinit` + `nvkm_falcon_init` + `gf100_ce_init`, as nouveau 6.12 does them.
    #[test]
    fn nouveau_falcon_bring_up() {
        let mut ce = VCe::default();
        let caps = ce.read(PCOPY0 + CAPS);
        assert_eq!(
            (caps & 0xf, (caps >> 4) & 3),
            (3, 0),
            "version 3, not secret"
        );
        let hw = ce.read(PCOPY0 + HWCFG);
        let (code_limit, data_limit) = ((hw & 0x1ff) << 8, (hw & 0x3fe00) >> 1);
        assert_eq!((code_limit, data_limit), (16 << 10, 4 << 10));
        ce.write(PCOPY0 + IRQMCLR, u32::MAX);
        ce.write(PCOPY0 + IMEMC, 0x0100_0000);
        for i in 0..600u32 {
            if i & 0x3f == 0 {
                ce.write(PCOPY0 + IMEMT, i >> 6);
            }
            ce.write(PCOPY0 + IMEMD, i);
        }
        ce.write(PCOPY0 + DMEMC, 0x0100_0000);
        for _ in 0..data_limit / 4 {
            ce.write(PCOPY0 + DMEMD, 0);
        }
        ce.write(PCOPY0 + DMACTL, 1);
        ce.write(PCOPY0 + BOOTVEC, 0);
        ce.write(PCOPY0 + CPUCTL, 2);
        ce.write(PCOPY0 + FIFO_CTRL, 3);
        ce.write(PCOPY0 + CE_INDEX, 0);
        assert!(ce.started);
        assert_eq!((ce.imem_words, ce.dmem_words), (600, 1024));
        assert_eq!(ce.read(PCOPY0 + FIFO_CTRL), 3);
        assert_eq!(ce.read(PCOPY0 + IRQSTAT), 0, "no interrupt pending");
        // nvkm_falcon_fini, then a PMC reset.
        ce.write(PCOPY0 + FIFO_CTRL, 0);
        assert_eq!(ce.read(PCOPY0 + FIFO_CTRL), 0);
        ce.reset();
        assert!(!ce.started);
        assert!(!VCe::contains(PCOPY1));
    }
}
