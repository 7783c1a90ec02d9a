//! Host methods of class 0x906F (GF100_CHANNEL_GPFIFO): object binding, semaphores, non-stall
//! interrupts, TLB invalidation from the command stream (MEM_OP_A/B). Host methods are the ones
//! below 0x100 and are valid on every subchannel.
//!
//! Sources: OGD `classes/host/cl906f.h`; nouveau `nvc0_fence_emit32` (fence sequence); ENVY
//! `docs/hw/fifo/intro.rst` (engine ids of SET_OBJECT).

/// Class number of the GF100 GPFIFO channel.
pub const CLASS: u32 = 0x906f;
/// Methods below this byte offset are host methods.
pub const HOST_METHOD_LIMIT: u32 = 0x100;

/// SET_OBJECT: bits 15:0 class, bits 20:16 engine.
pub const SET_OBJECT: u32 = 0x000;
/// ILLEGAL.
pub const ILLEGAL: u32 = 0x004;
/// NOP.
pub const NOP: u32 = 0x008;
/// SEMAPHOREA: bits 7:0 semaphore VA bits 39:32.
pub const SEMAPHORE_A: u32 = 0x010;
/// SEMAPHOREB: bits 31:2 semaphore VA bits 31:2.
pub const SEMAPHORE_B: u32 = 0x014;
/// SEMAPHOREC: payload.
pub const SEMAPHORE_C: u32 = 0x018;
/// SEMAPHORED: operation trigger.
pub const SEMAPHORE_D: u32 = 0x01c;
/// NON_STALL_INTERRUPT: raises PFIFO ENGINE_INTR NOTIFY (PFIFO INTR bit 31, PMC bit 8).
pub const NON_STALL_INTERRUPT: u32 = 0x020;
/// FB_FLUSH.
pub const FB_FLUSH: u32 = 0x024;
/// MEM_OP_A: bits 29:2 TLB_INVALIDATE_ADDR (page directory >> 12), bits 31:30 target.
pub const MEM_OP_A: u32 = 0x028;
/// MEM_OP_B: bits 31:27 operation; for TLB invalidate bit 0 PDB (0 one, 1 all), bit 1 GPC.
pub const MEM_OP_B: u32 = 0x02c;
/// SET_REFERENCE: sets USERD REFERENCE.
pub const SET_REFERENCE: u32 = 0x050;
/// CRC_CHECK.
pub const CRC_CHECK: u32 = 0x07c;
/// YIELD.
pub const YIELD: u32 = 0x080;

/// SEMAPHORED operation 1: acquire, wait until the value equals the payload.
pub const SEM_OP_ACQUIRE: u32 = 1;
/// SEMAPHORED operation 2: release, write the payload.
pub const SEM_OP_RELEASE: u32 = 2;
/// SEMAPHORED operation 4: acquire, wait until value >= payload.
pub const SEM_OP_ACQ_GEQ: u32 = 4;
/// SEMAPHORED operation 8: acquire, wait until value & payload != 0.
pub const SEM_OP_ACQ_AND: u32 = 8;
/// Mask of the operation field.
pub const SEM_OP_MASK: u32 = 0xf;
/// SEMAPHORED bit 12: acquire may switch channels (yield).
pub const SEM_ACQUIRE_SWITCH: u32 = 1 << 12;
/// SEMAPHORED bit 20: 1 = release without waiting for idle (WFI disabled).
pub const SEM_RELEASE_WFI_DISABLE: u32 = 1 << 20;
/// SEMAPHORED bit 24: 1 = 4-byte release (payload only); 0 = 16-byte (payload, 0, timestamp).
pub const SEM_RELEASE_4BYTE: u32 = 1 << 24;

/// MEM_OP_B operation (bits 31:27) 9: MMU TLB invalidate.
pub const MEM_OP_MMU_TLB_INVALIDATE: u32 = 9;
/// MEM_OP_B TLB invalidate bit 0: all page directories.
pub const MEM_OP_TLB_PDB_ALL: u32 = 1 << 0;

/// SET_OBJECT engine 0: PGRAPH (ENVY `fifo/intro.rst`).
pub const ENGINE_PGRAPH: u32 = 0x00;
/// SET_OBJECT engine 4: PCOPY0.
pub const ENGINE_PCOPY0: u32 = 0x04;
/// SET_OBJECT engine 5: PCOPY1.
pub const ENGINE_PCOPY1: u32 = 0x05;
/// SET_OBJECT engine 0x1f: software.
pub const ENGINE_SW: u32 = 0x1f;

/// Encodes SET_OBJECT data.
pub const fn set_object(class: u32, engine: u32) -> u32 {
    (class & 0xffff) | (engine & 0x1f) << 16
}

/// Encodes MEM_OP_A for an invalidate of the page directory at `pd`.
pub const fn mem_op_a(pd: u64, target: crate::Target) -> u32 {
    ((pd >> 12) as u32 & 0x0fff_ffff) << 2 | target.bits() << 30
}

/// Decodes MEM_OP_A into (page-directory address, target); `None` for target 1.
pub const fn mem_op_a_decode(value: u32) -> Option<(u64, crate::Target)> {
    match crate::Target::from_bits(value >> 30) {
        Some(t) => Some(((((value >> 2) & 0x0fff_ffff) as u64) << 12, t)),
        None => None,
    }
}

/// Encodes MEM_OP_B for a TLB invalidate (`all_pdb`: every page directory).
pub const fn mem_op_b_tlb_invalidate(all_pdb: bool) -> u32 {
    MEM_OP_MMU_TLB_INVALIDATE << 27 | if all_pdb { MEM_OP_TLB_PDB_ALL } else { 0 }
}
