//! PFIFO: init, the shared USERD area, channel ids and the runlist. Mirrors nouveau's
//! `engine/fifo/gf100.c` of the 4.x era (`gf100_fifo_oneinit`, `gf100_fifo_init`,
//! `gf100_fifo_runlist_insert`/`_remove`/`_commit`):
//!
//! ```text
//! init:   wr 0x000204 = 0xffffffff; wr 0x002204 = 0xffffffff; n = popcount(rd 0x002204)
//!         if n >= 3: wr 0x002208.. 0x00221c = ~1, ~2, ~2, ~2, ~4, ~2
//!         for each PBDMA i: mask 0x04013c+i*0x2000 &= ~0x10000100; wr 0x040108 = ~0; wr 0x04010c = 0xfffffeff
//!         mask 0x002200 |= 1
//!         wr 0x002254 = 0x10000000 | userd_bar1_va >> 12
//!         wr 0x002100 = ~0; wr 0x002140 = 0x7fffffff (| 0x80000000 for interrupt fences)
//!         wr 0x002628 = 1
//! commit: write (chid, 4) per runnable channel into the inactive of two runlist buffers
//!         wr 0x002270 = addr >> 12 (VRAM); wr 0x002274 = 0x01f00000 | count
//!         wait !(rd 0x00227c & 0x00100000); ack wr 0x002a00 = 0x10000000
//! ```
//!
//! USERD is one instance-memory object of 128 x 4 KiB (reached through BAR3 for clearing),
//! mapped into BAR1 at the poll area, where the CPU reads GP_GET and writes GP_PUT.

use alloc::vec::Vec;

use gf100::{pfifo, pmc, userd, Target};

use crate::config::FenceMode;
use crate::device::Gpu;
use crate::error::DriverError;
use crate::hal::Bar;
use crate::instmem::InstObj;
use crate::Hal;

/// Bytes of one runlist buffer (128 entries of 8 bytes fit in one page).
const RUNLIST_BYTES: u64 = gf100::PAGE_SIZE;

/// PFIFO state.
#[derive(Debug)]
pub(crate) struct Fifo {
    /// 128 USERD pages.
    pub(crate) userd: InstObj,
    /// Where the USERD area is mapped in BAR1 (the poll area).
    pub(crate) userd_bar1: u64,
    /// Two runlist buffers, used alternately.
    pub(crate) runlists: [InstObj; 2],
    pub(crate) runlist_next: usize,
    /// Channel ids in use.
    pub(crate) chids: u128,
    /// Channels on the runlist, in insertion order.
    pub(crate) runnable: Vec<u32>,
}

impl<H: Hal> Gpu<H> {
    /// `gf100_fifo_oneinit` + `gf100_fifo_init`.
    pub(crate) fn fifo_init(&mut self) -> Result<(), DriverError> {
        // Not zeroed here: each channel's page is cleared when the channel is created.
        let userd = self.inst_new_with(
            pfifo::CHANNELS as u64 * userd::SIZE,
            gf100::PAGE_SIZE,
            false,
        )?;
        let userd_bar1 = self.bar_map_vram(Bar::Bar1, userd.addr(), userd.size())?;
        let rl0 = self.inst_new(RUNLIST_BYTES, gf100::PAGE_SIZE)?;
        let rl1 = self.inst_new(RUNLIST_BYTES, gf100::PAGE_SIZE)?;
        self.fifo = Some(Fifo {
            userd,
            userd_bar1,
            runlists: [rl0, rl1],
            runlist_next: 0,
            chids: 0,
            runnable: Vec::new(),
        });

        // Enable the PBDMAs and count them.
        self.wr32(pmc::SPOON_ENABLE, pfifo::SUBFIFO_ENABLE_ALL);
        self.wr32(pfifo::SUBFIFO_ENABLE, pfifo::SUBFIFO_ENABLE_ALL);
        let mask = self.rd32(pfifo::SUBFIFO_ENABLE) & ((1 << pfifo::PBDMAS) - 1);
        self.pbdmas = mask.count_ones();
        if self.pbdmas >= pfifo::PBDMAS {
            for (e, v) in pfifo::ENG_SUBFIFO_MASK_NOUVEAU.iter().enumerate() {
                self.wr32(pfifo::ENG_SUBFIFO_MASK + e as u32 * 4, *v);
            }
        }
        for i in 0..self.pbdmas {
            self.mask32(
                pfifo::pbdma(i, pfifo::PBDMA_INTR_HALT_MASK),
                pfifo::PBDMA_HALT_MASK_NOUVEAU_CLEAR,
                0,
            );
            self.wr32(pfifo::pbdma(i, pfifo::PBDMA_INTR), pfifo::INTR_CLEAR_ALL);
            self.wr32(
                pfifo::pbdma(i, pfifo::PBDMA_INTR_EN),
                pfifo::PBDMA_INTR_EN_NOUVEAU,
            );
        }

        self.mask32(pfifo::CTRL, pfifo::CTRL_ENABLE, pfifo::CTRL_ENABLE);
        self.wr32(pfifo::USERD_POLL_BASE, pfifo::userd_poll_encode(userd_bar1));

        self.wr32(pfifo::INTR, pfifo::INTR_CLEAR_ALL);
        let nonstall = if self.fence_mode == FenceMode::Interrupt {
            pfifo::INTR_NON_STALL
        } else {
            0
        };
        self.wr32(pfifo::INTR_EN, pfifo::INTR_EN_DEFAULT | nonstall);
        self.wr32(pfifo::ENGINE_INTR_ENABLE, pfifo::ENGINE_INTR_ENABLE_NOUVEAU);

        // Interrupt delivery (nouveau `gf100_mc_intr_rearm`) only when the driver sleeps on it;
        // a polling driver leaves the line masked.
        if self.fence_mode == FenceMode::Interrupt {
            self.wr32(pmc::INTR_EN_HOST, pmc::INTR_EN_HARDWARE);
        }
        Ok(())
    }

    pub(crate) fn fifo(&mut self) -> Result<&mut Fifo, DriverError> {
        self.fifo.as_mut().ok_or(DriverError::Internal {
            what: "PFIFO not initialised",
        })
    }

    /// Reserves a free channel id.
    pub(crate) fn chid_alloc(&mut self) -> Result<u32, DriverError> {
        let fifo = self.fifo()?;
        let free = !fifo.chids;
        if free == 0 {
            return Err(DriverError::OutOfChannels);
        }
        let chid = free.trailing_zeros();
        fifo.chids |= 1 << chid;
        Ok(chid)
    }

    /// Returns a channel id.
    pub(crate) fn chid_free(&mut self, chid: u32) -> Result<(), DriverError> {
        let fifo = self.fifo()?;
        if chid >= pfifo::CHANNELS || fifo.chids & (1 << chid) == 0 {
            return Err(DriverError::Internal {
                what: "channel id double free",
            });
        }
        fifo.chids &= !(1 << chid);
        Ok(())
    }

    /// BAR1 offset of channel `chid`'s USERD page.
    pub(crate) fn userd_bar1(&mut self, chid: u32) -> Result<u64, DriverError> {
        Ok(self.fifo()?.userd_bar1 + chid as u64 * userd::SIZE)
    }

    /// VRAM address of channel `chid`'s USERD page.
    pub(crate) fn userd_vram(&mut self, chid: u32) -> Result<u64, DriverError> {
        Ok(self.fifo()?.userd.addr() + chid as u64 * userd::SIZE)
    }

    /// Zeroes channel `chid`'s USERD page (NV-FIFO-OLD `gf100_fifo_gpfifo_new`).
    pub(crate) fn userd_clear(&mut self, chid: u32) -> Result<(), DriverError> {
        let fifo = self.fifo.take().ok_or(DriverError::Internal {
            what: "PFIFO not initialised",
        })?;
        self.inst_fill(&fifo.userd, chid as u64 * userd::SIZE, userd::SIZE, 0);
        self.fifo = Some(fifo);
        self.inst_done()
    }

    /// Adds (`true`) or removes a channel from the runlist set (not yet committed).
    pub(crate) fn runlist_update(&mut self, chid: u32, runnable: bool) -> Result<(), DriverError> {
        let fifo = self.fifo()?;
        fifo.runnable.retain(|&c| c != chid);
        if runnable {
            fifo.runnable.push(chid);
        }
        Ok(())
    }

    /// Writes the runlist into the next buffer and submits it (`gf100_fifo_runlist_commit`).
    pub(crate) fn runlist_commit(&mut self) -> Result<(), DriverError> {
        let mut fifo = self.fifo.take().ok_or(DriverError::Internal {
            what: "PFIFO not initialised",
        })?;
        let idx = fifo.runlist_next & 1;
        fifo.runlist_next = idx ^ 1;
        let count = fifo.runnable.len() as u32;
        for (i, &chid) in fifo.runnable.iter().enumerate() {
            let off = i as u64 * pfifo::RUNLIST_ENTRY_SIZE;
            self.inst_wr32(&fifo.runlists[idx], off, chid);
            self.inst_wr32(&fifo.runlists[idx], off + 4, pfifo::RUNLIST_ENTRY_WORD1);
        }
        let addr = fifo.runlists[idx].addr();
        self.fifo = Some(fifo);
        self.inst_done()?;
        self.wr32(
            pfifo::RUNLIST_BASE,
            pfifo::runlist_base_encode(addr, Target::Vram),
        );
        self.wr32(
            pfifo::RUNLIST_SUBMIT,
            pfifo::RUNLIST_SUBMIT_UNK20 | (count & pfifo::RUNLIST_LEN_MASK),
        );
        self.wait_reg(pfifo::RUNLIST_RD_LEN, "runlist update (0x227c)", |v| {
            v & pfifo::RUNLIST_PENDING == 0
        })?;
        // The update-done interrupt, acknowledged as `gf100_fifo_intr_runlist` does.
        if self.rd32(pfifo::INTR) & pfifo::INTR_RUNLIST_DONE != 0 {
            self.wr32(pfifo::INTR_RUNLIST, pfifo::INTR_RUNLIST_EVENT);
        }
        Ok(())
    }
}
