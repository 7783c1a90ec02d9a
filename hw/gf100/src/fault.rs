//! MMU fault reporting: reasons, fault units ("engines"), clients, and the VM_FAULT flags word.
//!
//! Sources: NV-FIFO-OLD/NEW `gf100_fifo_mmu_fault_reason`, `_engine`, `_hubclient`,
//! `_gpcclient`; ENVY `fifo/gf100_pfifo.xml` (`VM_FAULT[32]` at 0x2800, stride 0x10). All values
//! checked against the nouveau enum tables, `gf100_fifo_intr_fault` (gpc `0x1f000000 >> 24`,
//! client `0x1f00 >> 8`, write 0x80, hub 0x40, reason 0xf) and ENVY `memory/gf100_vm.xml`
//! (`GF100_VM_ENGINE`, `_HUBCLIENT`, `_GPCCLIENT`, `_FAULT`).

/// Reason 0: the PDE has no page table for the address.
pub const REASON_PT_NOT_PRESENT: u32 = 0x0;
/// Reason 1: the page table is shorter than the address (PDE PT_SIZE).
pub const REASON_PT_TOO_SHORT: u32 = 0x1;
/// Reason 2: the PTE is not present.
pub const REASON_PAGE_NOT_PRESENT: u32 = 0x2;
/// Reason 3: the address is beyond the VM limit of the instance block.
pub const REASON_VM_LIMIT_EXCEEDED: u32 = 0x3;
/// Reason 4: no channel (no instance block bound).
pub const REASON_NO_CHANNEL: u32 = 0x4;
/// Reason 5: supervisor-only page accessed by a user client.
pub const REASON_PAGE_SYSTEM_ONLY: u32 = 0x5;
/// Reason 6: write to a read-only page.
pub const REASON_PAGE_READ_ONLY: u32 = 0x6;
/// Reason 0xc: invalid storage type (the model also uses it for a PTE with target value 1).
pub const REASON_INVALID_STORAGE_TYPE: u32 = 0xc;

/// Fault unit 0x00: PGRAPH.
pub const UNIT_PGRAPH: u32 = 0x00;
/// Fault unit 0x04: BAR1.
pub const UNIT_BAR1: u32 = 0x04;
/// Fault unit 0x05: BAR3.
pub const UNIT_BAR3: u32 = 0x05;
/// Fault unit 0x07: PFIFO (PBDMA 0; ENVY: 7/8/9 = PSUBFIFO0/1/2).
pub const UNIT_PFIFO: u32 = 0x07;
/// Fault unit 0x15: PCOPY0.
pub const UNIT_PCOPY0: u32 = 0x15;
/// Fault unit 0x16: PCOPY1.
pub const UNIT_PCOPY1: u32 = 0x16;

/// HUB client 0x01: PCOPY0.
pub const HUB_CLIENT_PCOPY0: u32 = 0x01;
/// HUB client 0x02: PCOPY1.
pub const HUB_CLIENT_PCOPY1: u32 = 0x02;
/// HUB client 0x06: PFIFO.
pub const HUB_CLIENT_PFIFO: u32 = 0x06;
/// HUB client 0x07: BAR read.
pub const HUB_CLIENT_BAR_READ: u32 = 0x07;
/// HUB client 0x08: BAR write.
pub const HUB_CLIENT_BAR_WRITE: u32 = 0x08;
/// GPC client 0x0e: CTXCTL (used by the model for compute-kernel accesses).
pub const GPC_CLIENT_CTXCTL: u32 = 0x0e;

/// The VM_FAULT flags word (+0xc): bits 0-3 reason, bit 6 hub (1) or GPC (0), bit 7 write,
/// bits 8-12 client, bits 24-28 GPC id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultFlags {
    /// Reason code (`REASON_*`).
    pub reason: u32,
    /// The client sits on the hub (else in a GPC).
    pub hub: bool,
    /// The faulting access was a write.
    pub write: bool,
    /// Client id (`HUB_CLIENT_*` / `GPC_CLIENT_*`).
    pub client: u32,
    /// GPC id for GPC clients.
    pub gpc: u32,
}

impl FaultFlags {
    /// Encodes the flags word.
    pub const fn encode(&self) -> u32 {
        (self.reason & 0xf)
            | if self.hub { 1 << 6 } else { 0 }
            | if self.write { 1 << 7 } else { 0 }
            | (self.client & 0x1f) << 8
            | (self.gpc & 0x1f) << 24
    }

    /// Decodes the flags word.
    pub const fn decode(v: u32) -> FaultFlags {
        FaultFlags {
            reason: v & 0xf,
            hub: v & (1 << 6) != 0,
            write: v & (1 << 7) != 0,
            client: (v >> 8) & 0x1f,
            gpc: (v >> 24) & 0x1f,
        }
    }
}
