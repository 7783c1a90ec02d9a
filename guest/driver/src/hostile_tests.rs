//! The driver against a hostile or broken "GPU": every register and memory read returns garbage
//! (zeros, all-ones, the bad-register code, random values), while the status registers the
//! driver polls behave or not. Whatever comes back, init and the workloads must return (an error,
//! or a report that did not verify) without panicking and without an unbounded wait.

extern crate std;

use crate::hal::{Bar, Dma, Mmio, Platform};
use crate::workloads::{self, Workload};
use crate::{DriverConfig, FenceMode, Gpu, MemLocation};
use gf100::{pbus, pfb, pffb, pfifo, pmc};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Garbage {
    Zeros,
    Ones,
    BadRegister,
    Random,
}

struct Fake {
    garbage: Garbage,
    /// Status registers (flush, runlist, kick) read as "done" and PFIFO INTR as 0.
    sane_status: bool,
    rng: u64,
    delayed_ns: u64,
    irq: bool,
}

impl Fake {
    fn value(&mut self) -> u32 {
        match self.garbage {
            Garbage::Zeros => 0,
            Garbage::Ones => u32::MAX,
            Garbage::BadRegister => gf100::BAD_REGISTER,
            Garbage::Random => {
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                self.rng as u32
            }
        }
    }
}

impl Mmio for Fake {
    fn read32(&mut self, bar: Bar, offset: u64) -> u32 {
        if bar == Bar::Bar0 {
            let reg = offset as u32;
            match reg {
                pmc::BOOT_0 => return pmc::BOOT_0_QUADRO_6000,
                pfb::FBP_COUNT => return 1,
                pfb::FBP_DISABLE_MASK => return 0,
                r if r == pfb::fbpa_amount(0) => return 256,
                _ => {}
            }
            if self.sane_status {
                match reg {
                    pffb::VM_CFG => {
                        return pffb::VM_CFG_FLUSH_SLOTS_MASK | pffb::VM_CFG_FLUSH_QUEUED
                    }
                    pbus::PFLUSH | pfifo::RUNLIST_RD_LEN | pfifo::KICK | pfifo::INTR => return 0,
                    _ => {}
                }
            }
        }
        self.value()
    }
    fn write32(&mut self, _bar: Bar, _offset: u64, _value: u32) {}
}

impl Dma for Fake {
    fn base(&self) -> u64 {
        0x10_0000
    }
    fn size(&self) -> u64 {
        32 << 20
    }
    fn read(&mut self, _addr: u64, buf: &mut [u8]) {
        for b in buf.iter_mut() {
            *b = self.value() as u8;
        }
    }
    fn write(&mut self, _addr: u64, _data: &[u8]) {}
}

impl Platform for Fake {
    fn delay_ns(&mut self, ns: u64) {
        self.delayed_ns += ns;
    }
    fn wait_for_interrupt(&mut self, timeout_ns: u64) -> bool {
        if self.irq {
            true
        } else {
            self.delayed_ns += timeout_ns;
            false
        }
    }
    fn has_interrupts(&self) -> bool {
        true
    }
}

#[test]
fn garbage_from_the_hardware_never_panics_or_hangs() {
    let timeout = 200_000;
    for garbage in [
        Garbage::Zeros,
        Garbage::Ones,
        Garbage::BadRegister,
        Garbage::Random,
    ] {
        for sane_status in [false, true] {
            for (fence_mode, irq) in [
                (FenceMode::Poll, false),
                (FenceMode::Interrupt, false),
                (FenceMode::Interrupt, true),
            ] {
                for loc in [MemLocation::Vram, MemLocation::Sysram] {
                    let fake = Fake {
                        garbage,
                        sane_status,
                        rng: 0x1234_5678,
                        delayed_ns: 0,
                        irq,
                    };
                    let cfg = DriverConfig {
                        fence_mode,
                        timeout_ns: timeout,
                        semaphore_mem: loc,
                        ..DriverConfig::default()
                    };
                    let mut gpu = match Gpu::init(fake, cfg) {
                        Ok(g) => g,
                        Err(e) => {
                            assert!(!std::format!("{e}").is_empty());
                            continue;
                        }
                    };
                    for w in Workload::ALL {
                        match workloads::run(&mut gpu, w, 8) {
                            // Garbage may even look like success, but never like a verified result.
                            Ok(r) => assert!(r.workload == w && !r.verified, "{garbage:?}: {r:?}"),
                            Err(e) => assert!(!std::format!("{e}").is_empty()),
                        }
                    }
                    // Every wait is bounded by the budget: a few hundred waits at most here.
                    let waited = gpu.hal().delayed_ns;
                    assert!(
                        waited < 1000 * timeout,
                        "{garbage:?} {sane_status} {fence_mode:?}: {waited}"
                    );
                }
            }
        }
    }
}
