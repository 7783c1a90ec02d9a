//! Host methods of class 0x906F (GF100_CHANNEL_GPFIFO): object binding, semaphores, non-stall
//! interrupts, TLB invalidation from the command stream (MEM_OP_A/B). Host methods are the ones
//! below 0x100 and are valid on every subchannel.
//!
//! Sources: OGD `classes/host/cl906f.h`; nouveau `nvc0_fence_emit32` (fence sequence); ENVY
//! `docs/hw/fifo/intro.rst` (engine ids of SET_OBJECT). Every method offset and field below was
//! checked against the text of `NVIDIA/open-gpu-doc:classes/host/cl906f.h` (identical to
//! nouveau's `include/nvhw/class/cl906f.h`).

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
/// MEM_OP_A: bits 29:2 TLB_INVALIDATE_ADDR, bits 31:30 TLB_INVALIDATE_TARGET (0 VID_MEM,
/// 2 SYS_MEM_COHERENT, 3 SYS_MEM_NONCOHERENT) (OGD `cl906f.h`). The address field holds the
/// page-directory address >> 12 (28 bits = a 40-bit, 4 KiB-aligned PDB): cl906f.h does not say
/// so, but NVIDIA's UVM driver fills the identical A06F/A16F field with `pdb.address >>= 12`
/// (`open-gpu-kernel-modules:kernel-open/nvidia-uvm/uvm_maxwell_host.c`,
/// `uvm_hal_maxwell_host_tlb_invalidate_all_a16f`). The same 31:2 bits are OPERAND_LOW for other
/// operations.
pub const MEM_OP_A: u32 = 0x028;
/// MEM_OP_B: bits 31:27 OPERATION, bits 7:0 OPERAND_HIGH; for MMU_TLB_INVALIDATE bit 0 PDB
/// (0 ONE, 1 ALL) and bit 1 GPC (0 ENABLE, 1 DISABLE) (OGD `cl906f.h`). The operation executes
/// on the MEM_OP_B write, using the MEM_OP_A value written before it (**(INFERRED)**: UVM always
/// pushes A then B).
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

/// True if a semaphore holding `value` satisfies an acquire of operation `op` (one of the
/// `SEM_OP_ACQ*` values) with `payload`: ACQUIRE waits for equality, ACQ_GEQ for
/// `value >= payload`, ACQ_AND for a common bit (envytools PBDMA SEMAPHORED; nouveau
/// `NV84_SUBCHAN_SEMAPHORE_TRIGGER_ACQUIRE_*`). What PBDMA re-checks while a channel waits, and
/// what a device model checks to decide that a parked channel may run again.
pub const fn acquire_satisfied(op: u32, payload: u32, value: u32) -> bool {
    match op {
        SEM_OP_ACQUIRE => value == payload,
        SEM_OP_ACQ_GEQ => value >= payload,
        _ => value & payload != 0,
    }
}
/// SEMAPHORED bit 12: acquire may switch channels (yield).
pub const SEM_ACQUIRE_SWITCH: u32 = 1 << 12;
/// SEMAPHORED bit 20: 1 = release without waiting for idle (WFI disabled).
pub const SEM_RELEASE_WFI_DISABLE: u32 = 1 << 20;
/// SEMAPHORED bit 24 RELEASE_SIZE: 1 = 4BYTE (payload only); 0 = 16BYTE (OGD `cl906f.h`). The
/// 16-byte layout (payload at +0, zero at +4, 64-bit PTIMER timestamp at +8) is the usual NVIDIA
/// semaphore layout but is not spelled out in cl906f.h — **(UNCERTAIN)** in its details for GF100.
pub const SEM_RELEASE_4BYTE: u32 = 1 << 24;

/// MEM_OP_B operation (bits 31:27) 9: MMU TLB invalidate (OGD `cl906f.h`).
pub const MEM_OP_MMU_TLB_INVALIDATE: u32 = 9;
/// MEM_OP_B TLB invalidate bit 0: all page directories (OGD `MMU_TLB_INVALIDATE_PDB_ALL`).
pub const MEM_OP_TLB_PDB_ALL: u32 = 1 << 0;
/// MEM_OP_B TLB invalidate bit 1: do not invalidate the GPC TLBs (OGD
/// `MMU_TLB_INVALIDATE_GPC_DISABLE`; 0 = ENABLE, the hub and GPC TLBs are both invalidated).
pub const MEM_OP_TLB_GPC_DISABLE: u32 = 1 << 1;
/// MEM_OP_B operation 5: SYSMEMBAR_FLUSH (OGD `cl906f.h`).
pub const MEM_OP_SYSMEMBAR_FLUSH: u32 = 5;
/// MEM_OP_B operation 6: SOFT_FLUSH (OGD `cl906f.h`).
pub const MEM_OP_SOFT_FLUSH: u32 = 6;
/// MEM_OP_B operation 0xd: L2_PEERMEM_INVALIDATE (OGD `cl906f.h`).
pub const MEM_OP_L2_PEERMEM_INVALIDATE: u32 = 0xd;
/// MEM_OP_B operation 0xe: L2_SYSMEM_INVALIDATE (OGD `cl906f.h`).
pub const MEM_OP_L2_SYSMEM_INVALIDATE: u32 = 0xe;
/// MEM_OP_B operation 0xf: L2_CLEAN_COMPTAGS (OGD `cl906f.h`).
pub const MEM_OP_L2_CLEAN_COMPTAGS: u32 = 0xf;
/// MEM_OP_B operation 0x10: L2_FLUSH_DIRTY (OGD `cl906f.h`).
pub const MEM_OP_L2_FLUSH_DIRTY: u32 = 0x10;

/// The OPERATION field (bits 31:27) of a MEM_OP_B value.
pub const fn mem_op_b_operation(value: u32) -> u32 {
    value >> 27
}

/// SET_OBJECT engine 0: PGRAPH (ENVY `fifo/intro.rst`, `gf100_pfifo_engine` in
/// `fifo/gf100_pfifo.xml`).
pub const ENGINE_PGRAPH: u32 = 0x00;
/// SET_OBJECT engine 4: PCOPY0.
pub const ENGINE_PCOPY0: u32 = 0x04;
/// SET_OBJECT engine 5: PCOPY1.
pub const ENGINE_PCOPY1: u32 = 0x05;
/// SET_OBJECT engine 0x1f: software (OGD `NV906F_SET_OBJECT_ENGINE_SW`).
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
