//! PCI configuration mechanism 1 (ports 0xCF8-0xCFF): a host bridge at 00:00.0 and the vGPU at
//! 00:01.0, whose configuration space is the device's ([`VgpuDevice`], in-process or over
//! vfio-user, or the GPU itself under `--scheme native`). Every other function reads all-ones
//! (no device), and writes to it are dropped. The same functions are reachable through the
//! memory-mapped ECAM window ([`super::ecam`]) via [`PciBus::function_read`] /
//! [`PciBus::function_write`].

use std::sync::Arc;

use super::device::VgpuDevice;

/// Configuration address register.
pub const PORT_ADDR: u16 = 0xcf8;
/// Configuration data window (0xCFC-0xCFF).
pub const PORT_DATA: u16 = 0xcfc;
/// Device number of the vGPU on bus 0.
pub const VGPU_DEV: u8 = 1;

/// Identity of the host bridge: Intel 440FX (8086:1237), class 06/00/00, header type 0.
fn host_bridge_read(offset: u8) -> u32 {
    match offset & 0xfc {
        0x00 => 0x1237_8086,
        0x04 => 0x0000_0000,
        0x08 => 0x0600_0002,
        _ => 0,
    }
}

/// The configuration-space decoder of bus 0.
pub struct PciBus {
    vgpu: Arc<dyn VgpuDevice>,
    addr: u32,
    /// Configuration writes to the vGPU since the last [`PciBus::take_dirty`].
    dirty: bool,
}

impl PciBus {
    /// A bus with the vGPU at 00:01.0.
    pub fn new(vgpu: Arc<dyn VgpuDevice>) -> PciBus {
        PciBus {
            vgpu,
            addr: 0,
            dirty: true,
        }
    }

    /// True (once) if the vGPU's configuration space was written since the last call: the BAR
    /// windows must be recomputed.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// The function the address register selects and the register offset, if enabled, on bus 0.
    fn target(&self, port: u16) -> Option<(u8, u8)> {
        if self.addr & 0x8000_0000 == 0 {
            return None;
        }
        let bus = (self.addr >> 16) & 0xff;
        let dev = ((self.addr >> 11) & 0x1f) as u8;
        let func = (self.addr >> 8) & 0x7;
        if bus != 0 || func != 0 {
            return None;
        }
        let offset = (self.addr & 0xfc) as u8 + (port - PORT_DATA) as u8;
        Some((dev, offset))
    }

    /// An `in` from port `port` (0xCF8-0xCFF).
    pub fn io_read(&mut self, port: u16, data: &mut [u8]) {
        if port == PORT_ADDR && data.len() == 4 {
            data.copy_from_slice(&self.addr.to_le_bytes());
            return;
        }
        if port < PORT_DATA {
            data.fill(0xff);
            return;
        }
        match self.target(port) {
            Some((dev, offset)) => self.function_read(dev, 0, offset as u16, data),
            None => data.fill(0xff),
        }
    }

    /// Reads `data.len()` bytes (within one dword) at `offset` of function `dev.func` on bus 0.
    /// Offsets from 0x100 (PCI Express extended space) read zero on the two functions present
    /// (no extended capabilities); absent functions read all-ones.
    pub fn function_read(&self, dev: u8, func: u8, offset: u16, data: &mut [u8]) {
        let fits = (offset as usize & 3) + data.len() <= 4;
        match (dev, func) {
            (0 | VGPU_DEV, 0) if !fits => data.fill(0xff),
            (0 | VGPU_DEV, 0) if offset >= 0x100 => data.fill(0),
            (0, 0) => {
                let v = host_bridge_read(offset as u8).to_le_bytes();
                let start = (offset & 3) as usize;
                for (i, b) in data.iter_mut().enumerate() {
                    *b = v.get(start + i).copied().unwrap_or(0xff);
                }
            }
            (VGPU_DEV, 0) => self.vgpu.config_read(offset, data),
            _ => data.fill(0xff),
        }
    }

    /// Writes `data` (within one dword) at `offset` of function `dev.func` on bus 0; only the
    /// vGPU's first 256 bytes take writes.
    pub fn function_write(&mut self, dev: u8, func: u8, offset: u16, data: &[u8]) {
        if (dev, func) == (VGPU_DEV, 0) && offset < 0x100 && (offset as usize & 3) + data.len() <= 4
        {
            self.vgpu.config_write(offset, data);
            self.dirty = true;
        }
    }

    /// An `out` to port `port` (0xCF8-0xCFF).
    pub fn io_write(&mut self, port: u16, data: &[u8]) {
        if port == PORT_ADDR && data.len() == 4 {
            let mut v = [0u8; 4];
            v.copy_from_slice(data);
            self.addr = u32::from_le_bytes(v);
            return;
        }
        if port < PORT_DATA {
            return;
        }
        if let Some((dev, offset)) = self.target(port) {
            self.function_write(dev, 0, offset as u16, data);
        }
    }

    /// The configuration-address latch (port 0xCF8), which a snapshot keeps.
    pub fn address(&self) -> u32 {
        self.addr
    }

    /// Restores the configuration-address latch.
    pub fn set_address(&mut self, addr: u32) {
        self.addr = addr;
    }

    /// Reads a dword of the vGPU's configuration space.
    pub fn vgpu_dword(&self, offset: u16) -> u32 {
        let mut b = [0u8; 4];
        self.vgpu.config_read(offset, &mut b);
        u32::from_le_bytes(b)
    }
}
