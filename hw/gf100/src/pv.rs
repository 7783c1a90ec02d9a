//! The gpuvm para-virtual page-table interface. **MODEL, not hardware**: a GF100 has no such
//! registers. It is this project's version of GPUvm's BAR4 "multicall" interface (GXEN
//! `context_bar4.cc`, ops `MAP_BATCH`/`UNMAP_BATCH`/`VM_FLUSH`), placed in an unused part of BAR0
//! (a Quadro 6000's BAR4 slot is taken by the upper half of the 64-bit BAR3).
//!
//! A guest that finds [`MAGIC`] at [`ID`] may, instead of writing page-directory and page-table
//! entries to its own memory, put up to [`MAX_BATCH`] [`Op`]s (32 bytes each, little-endian) in
//! its RAM, write their guest-physical address to [`BATCH_LO`]/[`BATCH_HI`] and their count to
//! [`BATCH_COUNT`], and write 1 to [`SUBMIT`]. The device model applies every op — writes the
//! entry into the guest's table *and* updates the shadow entry — in one exit, with no scanning.
//! [`STATUS`] then reads the number of ops applied and [`ERROR`] the error of the first op
//! rejected (0 if none); ops after a rejected one are not applied.

/// First BAR0 offset of the interface.
pub const BASE: u32 = 0x01f0_0000;
/// Size of the interface's BAR0 range.
pub const SIZE: u32 = 0x1000;
/// Reads [`MAGIC`] when the vGPU offers the interface (otherwise the bad-register code).
pub const ID: u32 = BASE;
/// "GPV1".
pub const MAGIC: u32 = 0x4750_5631;
/// Guest-physical address of the op array, low 32 bits.
pub const BATCH_LO: u32 = BASE + 0x04;
/// Guest-physical address of the op array, high 32 bits.
pub const BATCH_HI: u32 = BASE + 0x08;
/// Number of ops in the batch.
pub const BATCH_COUNT: u32 = BASE + 0x0c;
/// Write 1 to apply the batch.
pub const SUBMIT: u32 = BASE + 0x10;
/// Ops applied by the last batch.
pub const STATUS: u32 = BASE + 0x14;
/// Error of the first rejected op of the last batch ([`ERR_NONE`] if none).
pub const ERROR: u32 = BASE + 0x18;

/// Largest batch (GPUvm's `scheduler` branch used 2048).
pub const MAX_BATCH: u32 = 2048;
/// Size of one op in bytes.
pub const OP_SIZE: u64 = 32;

/// Op code: write PDE `index` of the page directory at `table`.
pub const OP_WRITE_PDE: u32 = 1;
/// Op code: write PTE `index` of the page table at `table`.
pub const OP_WRITE_PTE: u32 = 2;
/// Op code: TLB flush of the address space whose page directory is at `table`.
pub const OP_FLUSH: u32 = 3;

/// No error.
pub const ERR_NONE: u32 = 0;
/// Unknown op code.
pub const ERR_BAD_OP: u32 = 1;
/// The table is not in the VM's memory, or is not a table the VM uses.
pub const ERR_BAD_TABLE: u32 = 2;
/// The index is beyond the table.
pub const ERR_BAD_INDEX: u32 = 3;
/// More than [`MAX_BATCH`] ops, or the batch is not in guest RAM.
pub const ERR_BAD_BATCH: u32 = 4;
/// The interface is not offered by this vGPU.
pub const ERR_NOT_AVAILABLE: u32 = 5;
/// The host's work budget for one batch ran out after STATUS ops (each applied): submit the
/// rest again. Not an error of the guest's; it bounds the time one exit holds the host.
pub const ERR_BUSY: u32 = 6;

/// One op of a batch, as laid out in guest RAM: `op` (u32), `target` (u32, the
/// [`crate::Target`] bits of the table), `table` (u64, guest address of the page directory or
/// table), `index` (u64), `value` (u64, the entry in guest format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// `OP_*`.
    pub op: u32,
    /// Memory target of the table (`Target::bits`).
    pub target: u32,
    /// Guest address of the page directory or page table.
    pub table: u64,
    /// Entry index.
    pub index: u64,
    /// Entry value.
    pub value: u64,
}

impl Op {
    /// Serializes the op.
    pub fn to_bytes(&self) -> [u8; OP_SIZE as usize] {
        let mut b = [0u8; OP_SIZE as usize];
        b[0..4].copy_from_slice(&self.op.to_le_bytes());
        b[4..8].copy_from_slice(&self.target.to_le_bytes());
        b[8..16].copy_from_slice(&self.table.to_le_bytes());
        b[16..24].copy_from_slice(&self.index.to_le_bytes());
        b[24..32].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    /// Parses an op.
    pub fn from_bytes(b: &[u8; OP_SIZE as usize]) -> Op {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | u64::from(u32_at(i + 4)) << 32;
        Op {
            op: u32_at(0),
            target: u32_at(4),
            table: u64_at(8),
            index: u64_at(16),
            value: u64_at(24),
        }
    }
}
