//! The per-VM PMU (PDAEMON falcon at 0x10a000): **high-level emulation of the PMU firmware's
//! host interface** as nouveau 6.12 drives it on GF100 (`nvkm/subdev/pmu/gt215.c`; research note
//! `nouveau-bringup.md` §5) — not a falcon, and nothing reaches the physical PMU.
//!
//! - idle (`0x10a04c` = 0), scrubbing done (`0x10a10c` bits 2:1 read 0);
//! - IMEM/DMEM uploads (`0x10a180/184/188`, `0x10a1c0/1c4`) accepted and counted (the code
//!   is not run);
//! - after start (`0x10a100` bit 1) the two queue descriptors (`0x10a4d0`, `0x10a4dc`) read
//!   as the real firmware announces them: 128-byte queues at fixed DMEM offsets;
//! - the DMEM mutex (`0x10a580`) is taken by a non-zero token when free and released by 0;
//! - host→PMU messages are consumed at once (GET follows PUT); the stand-in never sends one
//!   (on GF100 at boot nouveau sends nothing: MEMX is only used for memory reclocking).
//!
//! Other registers store what the guest writes.

use std::collections::BTreeMap;

use gf100::board::pmu::*;

/// One VM's PMU.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct VPmu {
    stored: BTreeMap<u32, u32>,
    started: bool,
    mutex: u32,
    send_put: u32,
    /// Code words uploaded to IMEM (dropped: not executed).
    pub imem_words: u64,
    /// Data words uploaded to DMEM (dropped).
    pub dmem_words: u64,
}

impl VPmu {
    /// True for offsets this stand-in answers.
    pub fn contains(off: u32) -> bool {
        (BASE..BASE + 0x1000).contains(&off)
    }

    /// A guest read.
    pub fn read(&mut self, off: u32) -> u32 {
        match off {
            IDLE_STATUS | IRQSTAT | DMEMD => 0,
            DMACTL => self.stored.get(&off).copied().unwrap_or(0) & !0x6,
            SEND_QUEUE if self.started => (QUEUE_SIZE << 16) | SEND_QUEUE_BASE,
            RECV_QUEUE if self.started => (QUEUE_SIZE << 16) | RECV_QUEUE_BASE,
            SEND_QUEUE | RECV_QUEUE => 0,
            MUTEX => self.mutex,
            SEND_PUT | SEND_GET => self.send_put,
            // Nothing is ever queued towards the host.
            RECV_PUT | RECV_GET => self.stored.get(&RECV_GET).copied().unwrap_or(0),
            _ => self.stored.get(&off).copied().unwrap_or(0),
        }
    }

    /// A guest write.
    pub fn write(&mut self, off: u32, v: u32) {
        match off {
            IMEMD => self.imem_words += 1,
            DMEMD => self.dmem_words += 1,
            CPUCTL if v & 2 != 0 => self.started = true,
            MUTEX => {
                if v == 0 {
                    self.mutex = 0;
                } else if self.mutex == 0 {
                    self.mutex = v;
                }
            }
            SEND_PUT => self.send_put = v & 0xf,
            _ => {
                if self.stored.len() < 1024 || self.stored.contains_key(&off) {
                    self.stored.insert(off, v);
                }
            }
        }
    }

    /// A PMC reset of the unit (PMC ENABLE bit 13 cleared): the falcon stops.
    pub fn reset(&mut self) {
        *self = VPmu {
            imem_words: self.imem_words,
            dmem_words: self.dmem_words,
            ..VPmu::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nouveau_gt215_pmu_init_sequence() {
        let mut p = VPmu::default();
        p.write(IRQMCLR, 0xffff);
        assert_eq!(p.read(IDLE_STATUS), 0);
        p.write(DMACTL, 0x6);
        assert_eq!(p.read(DMACTL) & 0x6, 0, "scrub done");
        p.write(DMEMC, 0x0100_0000);
        for i in 0..100 {
            p.write(DMEMD, i);
        }
        p.write(IMEMC, 0x0100_0000);
        for i in 0..200 {
            if i % 64 == 0 {
                p.write(IMEMT, i >> 6);
            }
            p.write(IMEMD, i);
        }
        assert_eq!((p.dmem_words, p.imem_words), (100, 200));
        assert_eq!(p.read(SEND_QUEUE), 0, "not started yet");
        p.write(DMACTL, 0);
        p.write(BOOTVEC, 0);
        p.write(CPUCTL, 2);
        assert_ne!(p.read(SEND_QUEUE), 0);
        assert_ne!(p.read(RECV_QUEUE), 0);
        assert_eq!(p.read(SEND_QUEUE) >> 16, QUEUE_SIZE);
        // Mutex: taken by a token, refused to another, released by 0.
        p.write(MUTEX, 1);
        assert_eq!(p.read(MUTEX), 1);
        p.write(MUTEX, 2);
        assert_eq!(p.read(MUTEX), 1);
        p.write(MUTEX, 0);
        p.write(MUTEX, 2);
        assert_eq!(p.read(MUTEX), 2);
        // A message sent is consumed at once.
        p.write(SEND_PUT, 1);
        assert_eq!(p.read(SEND_GET), 1);
        p.reset();
        assert_eq!(p.read(SEND_QUEUE), 0);
    }
}
