//! The driver's only view of the machine: BAR access ([`Mmio`]), guest RAM that the GPU reaches
//! by DMA ([`Dma`]), and waiting ([`Platform`]).

pub use gf100::pci::Bar;

/// Access to the GPU's BARs (BAR0 registers, BAR1 and BAR3 apertures) at a byte offset.
pub trait Mmio {
    /// Reads a 32-bit value.
    fn read32(&mut self, bar: Bar, offset: u64) -> u32;
    /// Writes a 32-bit value.
    fn write32(&mut self, bar: Bar, offset: u64, value: u32);

    /// Reads an 8-bit value.
    fn read8(&mut self, bar: Bar, offset: u64) -> u8 {
        let word = self.read32(bar, offset & !3);
        (word >> ((offset & 3) * 8)) as u8
    }
    /// Reads a 16-bit value (2-byte aligned).
    fn read16(&mut self, bar: Bar, offset: u64) -> u16 {
        let word = self.read32(bar, offset & !3);
        (word >> ((offset & 2) * 8)) as u16
    }
    /// Reads a 64-bit value as two 32-bit reads, low word first.
    fn read64(&mut self, bar: Bar, offset: u64) -> u64 {
        let lo = self.read32(bar, offset) as u64;
        let hi = self.read32(bar, offset + 4) as u64;
        hi << 32 | lo
    }
    /// Writes an 8-bit value (read-modify-write of the containing word unless overridden).
    fn write8(&mut self, bar: Bar, offset: u64, value: u8) {
        let shift = (offset & 3) * 8;
        let word = self.read32(bar, offset & !3);
        let word = (word & !(0xff << shift)) | (value as u32) << shift;
        self.write32(bar, offset & !3, word);
    }
    /// Writes a 16-bit value (read-modify-write of the containing word unless overridden).
    fn write16(&mut self, bar: Bar, offset: u64, value: u16) {
        let shift = (offset & 2) * 8;
        let word = self.read32(bar, offset & !3);
        let word = (word & !(0xffff << shift)) | (value as u32) << shift;
        self.write32(bar, offset & !3, word);
    }
    /// Writes a 64-bit value as two 32-bit writes, low word first.
    fn write64(&mut self, bar: Bar, offset: u64, value: u64) {
        self.write32(bar, offset, value as u32);
        self.write32(bar, offset + 4, (value >> 32) as u32);
    }
}

/// Guest RAM the driver may hand to the GPU. Addresses are guest-physical, which is also the bus
/// address the GPU uses (the device model or IOMMU translates).
pub trait Dma {
    /// First usable address of the DMA region.
    fn base(&self) -> u64;
    /// Size of the DMA region in bytes.
    fn size(&self) -> u64;
    /// Reads guest RAM.
    fn read(&mut self, addr: u64, buf: &mut [u8]);
    /// Writes guest RAM.
    fn write(&mut self, addr: u64, data: &[u8]);
}

/// Waiting, the way a kernel driver polls hardware (nouveau's `nvkm_usec` / `udelay`).
pub trait Platform {
    /// Lets `ns` nanoseconds pass.
    fn delay_ns(&mut self, ns: u64);

    /// Waits until the GPU's interrupt line is asserted or `timeout_ns` passed; returns true if
    /// an interrupt is pending. The default has no interrupt support: it delays and says no.
    fn wait_for_interrupt(&mut self, timeout_ns: u64) -> bool {
        self.delay_ns(timeout_ns);
        false
    }

    /// True if this platform can deliver interrupts (so the driver may wait for fences by
    /// interrupt instead of polling).
    fn has_interrupts(&self) -> bool {
        false
    }
}
