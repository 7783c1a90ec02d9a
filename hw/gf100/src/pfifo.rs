//! PFIFO on GF100 (BAR0 0x002000-0x003fff, PBDMAs at 0x040000): the channel table, runlist
//! ("playlist") submission, the USERD poll area, channel kick, interrupts and MMU fault reports.
//!
//! Sources: ENVY `fifo/gf100_pfifo.xml`; NV-FIFO-OLD/NEW `engine/fifo/gf100.c`;
//! GXEN `tools/a3/pfifo.cc`, `playlist.cc`. Every offset and bit here was re-checked against the
//! text of envytools `rnndb/fifo/gf100_pfifo.xml` and both nouveau versions of
//! `nvkm/engine/fifo/gf100.c` (channel bind/start, runlist commit, interrupt handlers, init);
//! the few that are inferences or where sources disagree say so.

/// Number of hardware channels (ENVY `CHAN_TABLE length="128"`, nouveau, GXEN `A3_CHANNELS`).
pub const CHANNELS: u32 = 128;
/// Number of PBDMAs ("subfifos") on GF100 (ENVY `docs/hw/gpu.rst`).
pub const PBDMAS: u32 = 3;

/// PFIFO INTR: pending interrupt bits (write 1 to clear the edge-type bits).
pub const INTR: u32 = 0x002100;
/// PFIFO INTR_EN.
pub const INTR_EN: u32 = 0x002140;
/// CTRL: bit 0 enable.
pub const CTRL: u32 = 0x002200;
/// SUBFIFO_ENABLE: PBDMA enables (nouveau writes 0xffffffff and popcounts the read-back).
pub const SUBFIFO_ENABLE: u32 = 0x002204;
/// `ENG_SUBFIFO_MASK[e]` at 0x2208 + e*4, e = 0..5.
pub const ENG_SUBFIFO_MASK: u32 = 0x002208;
/// USERD poll area (ENVY `POLL_AREA`): bits 0-27 BAR1 VA >> 12, bit 28 (ENVY `UNK28`), bit 31
/// (ENVY `UNK31`, GF100 only). nouveau writes `0x10000000 | (userd_bar1_va >> 12)`
/// (NV-FIFO-OLD `gf100_fifo_init`). That bit 28 is the enable is **(INFERRED)** (ENVY
/// CHAN_TABLE_ERROR 2 NO_POLL: "validated a channel with POLL_ENABLE, but poll area is disabled").
pub const USERD_POLL_BASE: u32 = 0x002254;
/// PLAYLIST_WR: runlist base, bits 0-27 address >> 12, bits 28-29 target (ENVY; NV-FIFO-NEW
/// `gf100_runl_commit`: `(target << 28) | (addr >> 12)`, target 0 VRAM or 3 NCOH).
pub const RUNLIST_BASE: u32 = 0x002270;
/// PLAYLIST_WR_LEN: bits 0-11 entry count, bits 20-24 unknown (nouveau 0x1f). A write submits
/// (ENVY; nouveau `0x01f00000 | count`).
pub const RUNLIST_SUBMIT: u32 = 0x002274;
/// PLAYLIST_RD: the runlist base in use (read-only copy).
pub const RUNLIST_RD_BASE: u32 = 0x002278;
/// PLAYLIST_RD_LEN: bit 20 = update pending.
pub const RUNLIST_RD_LEN: u32 = 0x00227c;
/// CHAN_TABLE_ERROR code (PFIFO INTR bit 0).
pub const CHAN_TABLE_ERROR: u32 = 0x00252c;
/// SCHED_ERROR code (PFIFO INTR bit 8).
pub const SCHED_ERROR: u32 = 0x00254c;
/// VM_FAULT_SOURCE: bit x = fault unit x has a pending fault; write the bit to acknowledge.
pub const VM_FAULT_SOURCE: u32 = 0x00259c;
/// SUBFIFO_INTR_SOURCE: bit i = PBDMA i has a pending interrupt.
pub const SUBFIFO_INTR_SOURCE: u32 = 0x0025a0;
/// ENGINE_INTR_SOURCE: bit e = engine e has a pending non-stall interrupt.
pub const ENGINE_INTR_SOURCE: u32 = 0x0025a4;
/// `ENGINE_INTR[e]` at 0x25a8 + e*4: 4 bits per engine (bit 0 NOTIFY).
pub const ENGINE_INTR: u32 = 0x0025a8;
/// ENGINE_INTR_ENABLE (nouveau writes 1).
pub const ENGINE_INTR_ENABLE: u32 = 0x002628;
/// KICK_CHID / preempt: write a channel id; bit 20 reads 1 while pending (NV-FIFO-NEW
/// `gf100_runl_preempt_pending`). Old nouveau (`gf100_fifo_context_detach`) instead polls until
/// the register reads back exactly the chid, so a model must return the chid with bit 20 clear
/// once the preempt is done to satisfy both.
pub const KICK: u32 = 0x002634;
/// `ENG_STATE[e]` at 0x2640 + e*4, chid in bits 0-6. **(UNCERTAIN)** busy bit: new nouveau
/// (`gf100_engn_status`) reads busy as 0x10000000 and unk0 as 0x00004000; old nouveau
/// (`gf100_fifo_intr_sched_ctxsw`) reads busy as 0x80000000 and unk0 as 0x00040000; both read
/// save 0x00100000 and unk1 0x00001000. ENVY only names bit 24 FAULTED.
pub const ENG_STATE: u32 = 0x002640;
/// `ENG_STATE[e]`.
pub const fn eng_state(e: u32) -> u32 {
    ENG_STATE + e * 4
}
/// ENG_STATE busy bit as old nouveau's CTXSW-timeout handler (`gf100_fifo_intr_sched_ctxsw`)
/// reads it (see the uncertainty above); the simulator sets it while the engine runs an
/// operation.
pub const ENG_STATE_BUSY: u32 = 1 << 31;
/// ENG_STATE channel id field.
pub const ENG_STATE_CHID_MASK: u32 = 0x7f;
/// `VM_FAULT[u]` at 0x2800 + u*0x10: +0 instance, +4 VA low, +8 VA high, +0xc flags.
pub const VM_FAULT: u32 = 0x002800;
/// Stride of the VM_FAULT array.
pub const VM_FAULT_STRIDE: u32 = 0x10;
/// Number of VM_FAULT units.
pub const VM_FAULT_UNITS: u32 = 32;
/// INTR_RUNLIST: bit 28 = runlist update done; write 1 to clear (nouveau
/// `gf100_fifo_intr_runlist`; ENVY `UNKINTR30_INTR` bit 28 "playlist related... walk done?").
pub const INTR_RUNLIST: u32 = 0x002a00;
/// PFIFO's copy of PTIMER TIME_LOW / TIME_HIGH.
pub const TIME_LOW: u32 = 0x002a10;
/// See [`TIME_LOW`].
pub const TIME_HIGH: u32 = 0x002a14;
/// Channel table: CHAN word of channel c at `CHAN_TABLE + c*8`, STATE word at `+4`.
pub const CHAN_TABLE: u32 = 0x003000;
/// Stride of the channel table.
pub const CHAN_TABLE_STRIDE: u32 = 8;

/// PBDMA register block of PBDMA i at `PBDMA_BASE + i*PBDMA_STRIDE`.
pub const PBDMA_BASE: u32 = 0x040000;
/// Stride of the PBDMA register blocks.
pub const PBDMA_STRIDE: u32 = 0x2000;
/// PBDMA INTR (write 1 to clear), relative to a PBDMA block.
pub const PBDMA_INTR: u32 = 0x108;
/// PBDMA INTR_EN, relative to a PBDMA block.
pub const PBDMA_INTR_EN: u32 = 0x10c;
/// PBDMA CH: bits 0-6 the channel id that caused the last error, bit 8 active.
pub const PBDMA_CHID: u32 = 0x120;

/// PFIFO INTR bit 0: channel table error (code in [`CHAN_TABLE_ERROR`]).
pub const INTR_CHAN_TABLE_ERROR: u32 = 1 << 0;
/// PFIFO INTR bit 8: scheduling error (code in [`SCHED_ERROR`]).
pub const INTR_SCHED_ERROR: u32 = 1 << 8;
/// PFIFO INTR bit 28: MMU fault (level; sources in [`VM_FAULT_SOURCE`]).
pub const INTR_VM_FAULT: u32 = 1 << 28;
/// PFIFO INTR bit 29: PBDMA interrupt (level; sources in [`SUBFIFO_INTR_SOURCE`]).
pub const INTR_PBDMA: u32 = 1 << 29;
/// PFIFO INTR bit 30: runlist update done (level; see [`INTR_RUNLIST`]).
pub const INTR_RUNLIST_DONE: u32 = 1 << 30;
/// PFIFO INTR bit 31: non-stall engine interrupt (level; see [`ENGINE_INTR_SOURCE`]).
pub const INTR_NON_STALL: u32 = 1 << 31;
/// INTR_EN value nouveau writes at init (everything but the non-stall interrupt).
pub const INTR_EN_DEFAULT: u32 = 0x7fff_ffff;

/// INTR_RUNLIST bit 28: runlist update done.
pub const INTR_RUNLIST_EVENT: u32 = 1 << 28;
/// RUNLIST_RD_LEN bit 20: update pending.
pub const RUNLIST_PENDING: u32 = 1 << 20;
/// RUNLIST_SUBMIT bits 20-24 as nouveau writes them (`0x01f00000 | count`).
pub const RUNLIST_SUBMIT_UNK20: u32 = 0x01f0_0000;
/// Mask of the entry count in RUNLIST_SUBMIT.
pub const RUNLIST_LEN_MASK: u32 = 0xfff;
/// Size of one runlist entry (word0 = chid, word1 = 4).
pub const RUNLIST_ENTRY_SIZE: u64 = 8;
/// Word 1 of a runlist entry as nouveau writes it (`gf100_runl_insert_chan`).
pub const RUNLIST_ENTRY_WORD1: u32 = 0x0000_0004;

/// KICK bit 20: preempt pending.
pub const KICK_PENDING: u32 = 1 << 20;

/// CHAN word bit 30: poll (USERD) enable.
pub const CHAN_POLL_ENABLE: u32 = 1 << 30;
/// CHAN word bit 31: valid (bound).
pub const CHAN_VALID: u32 = 1 << 31;
/// STATE word bit 0: runnable (enabled).
pub const STATE_RUNNABLE: u32 = 1 << 0;
/// STATE word bit 4: semaphore acquire pending.
pub const STATE_ACQUIRE_PENDING: u32 = 1 << 4;
/// STATE word bit 12: loaded on a PBDMA.
pub const STATE_LOADED: u32 = 1 << 12;
/// STATE word bit 28: work pending.
pub const STATE_PENDING: u32 = 1 << 28;
/// STATE value nouveau writes to start a channel (`0x001f0001`: RUNNABLE, ENGINE = 0x1f none).
pub const STATE_START: u32 = 0x001f_0001;

/// USERD_POLL_BASE bit 28: poll area enabled (**(INFERRED)**, see [`USERD_POLL_BASE`]).
pub const USERD_POLL_ENABLE: u32 = 1 << 28;

/// CHAN_TABLE_ERROR code 2: a channel was validated with POLL_ENABLE but no poll area.
pub const CHAN_ERR_NO_POLL: u32 = 2;
/// CHAN_TABLE_ERROR code 6: invalid target.
pub const CHAN_ERR_INVALID_TARGET: u32 = 6;
/// SCHED_ERROR code 1: the runlist names an inactive (unbound) channel.
pub const SCHED_ERR_INACTIVE_CHANNEL: u32 = 1;
/// SCHED_ERROR code 0x0a: context-switch timeout (used by the watchdog for a hung engine).
pub const SCHED_ERR_CTXSW_TIMEOUT: u32 = 0x0a;

/// PBDMA INTR bit 14: IB_PUT beyond the ring.
pub const PBDMA_INTR_IB_PUT_OVERFLOW: u32 = 1 << 14;
/// PBDMA INTR bit 15: invalid GPFIFO (IB) entry.
pub const PBDMA_INTR_IB_ENTRY_INVALID: u32 = 1 << 15;
/// PBDMA INTR bit 18: illegal command (unknown method-header opcode).
pub const PBDMA_INTR_ILLEGAL_CMD: u32 = 1 << 18;
/// PBDMA INTR bit 21: illegal method (no such method on the bound class, or no class bound).
pub const PBDMA_INTR_ILLEGAL_MTHD: u32 = 1 << 21;
/// PBDMA INTR bit 25: illegal semaphore operation.
pub const PBDMA_INTR_ILLEGAL_SEM: u32 = 1 << 25;
/// PBDMA INTR bit 26: semaphore acquire timed out.
pub const PBDMA_INTR_SEM_TIMEOUT: u32 = 1 << 26;

/// Offset of the CHAN word of channel `chid`.
pub const fn chan_table(chid: u32) -> u32 {
    CHAN_TABLE + chid * CHAN_TABLE_STRIDE
}

/// Offset of the STATE word of channel `chid`.
pub const fn chan_state(chid: u32) -> u32 {
    CHAN_TABLE + chid * CHAN_TABLE_STRIDE + 4
}

/// The channel a CHAN_TABLE / STATE register offset names, and whether it is the STATE word;
/// `None` outside the table.
pub const fn chan_table_index(offset: u32) -> Option<(u32, bool)> {
    let Some(rel) = offset.checked_sub(CHAN_TABLE) else {
        return None;
    };
    let chid = rel / CHAN_TABLE_STRIDE;
    if chid < CHANNELS {
        Some((chid, rel % CHAN_TABLE_STRIDE != 0))
    } else {
        None
    }
}

/// Offset of VM_FAULT register `reg` (0 instance, 4 VA low, 8 VA high, 0xc flags) of unit `unit`.
pub const fn vm_fault(unit: u32, reg: u32) -> u32 {
    VM_FAULT + unit * VM_FAULT_STRIDE + reg
}

/// Offset of register `reg` of PBDMA `i`.
pub const fn pbdma(i: u32, reg: u32) -> u32 {
    PBDMA_BASE + i * PBDMA_STRIDE + reg
}

/// Encodes a CHAN word binding an instance block at `inst` (`0xc0000000 | inst >> 12` for VRAM).
pub const fn chan_encode(inst: u64, target: crate::Target) -> u32 {
    CHAN_VALID | CHAN_POLL_ENABLE | ((inst >> 12) as u32 & 0x0fff_ffff) | (target.bits() << 28)
}

/// Decodes a CHAN word: `Some((instance address, target))` when VALID is set and the target is
/// valid, `None` otherwise.
pub const fn chan_decode(value: u32) -> Option<(u64, crate::Target)> {
    if value & CHAN_VALID == 0 {
        return None;
    }
    match crate::Target::from_bits(value >> 28) {
        Some(t) => Some((((value & 0x0fff_ffff) as u64) << 12, t)),
        None => None,
    }
}

/// Encodes RUNLIST_BASE for a runlist at `addr` in `target`.
pub const fn runlist_base_encode(addr: u64, target: crate::Target) -> u32 {
    ((addr >> 12) as u32 & 0x0fff_ffff) | (target.bits() << 28)
}

/// Decodes RUNLIST_BASE into (address, target); `None` for target 1.
pub const fn runlist_base_decode(value: u32) -> Option<(u64, crate::Target)> {
    match crate::Target::from_bits(value >> 28) {
        Some(t) => Some((((value & 0x0fff_ffff) as u64) << 12, t)),
        None => None,
    }
}

/// Encodes USERD_POLL_BASE for a poll area at BAR1 virtual address `bar1_va`.
pub const fn userd_poll_encode(bar1_va: u64) -> u32 {
    USERD_POLL_ENABLE | ((bar1_va >> 12) as u32 & 0x0fff_ffff)
}

/// Decodes USERD_POLL_BASE into the BAR1 virtual address of the poll area, if enabled.
pub const fn userd_poll_decode(value: u32) -> Option<u64> {
    if value & USERD_POLL_ENABLE == 0 {
        None
    } else {
        Some(((value & 0x0fff_ffff) as u64) << 12)
    }
}

/// PBDMA METHOD0 (ENVY `CACHE[0].ADDR`), relative to a PBDMA block: the method the PBDMA stopped
/// on, bits 18:16 subchannel, bits 13:2 method byte offset (NV-FIFO-OLD `gf100_fifo_intr_pbdma`
/// reads `subc = (addr & 0x70000) >> 16`, `mthd = addr & 0x3ffc`, then writes 0x80600008 to
/// replace it with a NOP).
pub const PBDMA_METHOD0: u32 = 0x0c0;
/// PBDMA DATA0 (ENVY `CACHE[0].DATA`), relative to a PBDMA block: the data of [`PBDMA_METHOD0`]
/// (NV-FIFO-OLD `gf100_fifo_intr_pbdma`).
pub const PBDMA_DATA0: u32 = 0x0c4;
/// PBDMA CH bit 8: a channel is active on the PBDMA (ENVY; nouveau masks the chid with 0x7f).
pub const PBDMA_CHID_ACTIVE: u32 = 1 << 8;

/// Number of PFIFO engines, i.e. of ENGINE_INTR / ENG_STATE / ENG_SUBFIFO_MASK slots: 0 PGRAPH,
/// 1 PPDEC, 2 PPPP, 3 PVLD, 4 PCOPY0, 5 PCOPY1 (ENVY `docs/hw/fifo/intro.rst` and
/// `gf100_pfifo_engine`; NV-FIFO-OLD `gf100_fifo_engidx` swaps 1 and 3 — MSVLD 1, MSPDEC 3 —
/// although its own `gf100_fifo_init` comments follow ENVY's order, so ids 1 and 3 are
/// **(UNCERTAIN)**; NV-FIFO-OLD `gf100_fifo_intr_sched_ctxsw` and `gf100_fifo_init` loop over
/// 6 engines).
pub const ENGINES: u32 = 6;
/// `ENGINE_INTR[e]`: 8 groups of 4 bits; bit 0 of a group is NOTIFY, the non-stall interrupt.
/// Write the value back to acknowledge (NV-FIFO-OLD `gf100_fifo_intr_engine_unit`).
pub const ENGINE_INTR_NOTIFY: u32 = 1 << 0;

/// PBDMA 0x13c (research notes §6.4 "INTR_HALT_MASK"), relative to a PBDMA block. nouveau's
/// `gf100_fifo_init` clears [`PBDMA_HALT_MASK_NOUVEAU_CLEAR`] in it for every PBDMA
/// (`nvkm_mask(0x04013c + i*0x2000, 0x10000100, 0)`, NV-FIFO-OLD).
pub const PBDMA_INTR_HALT_MASK: u32 = 0x13c;
/// The bits of [`PBDMA_INTR_HALT_MASK`] nouveau clears at init (NV-FIFO-OLD `gf100_fifo_init`).
pub const PBDMA_HALT_MASK_NOUVEAU_CLEAR: u32 = 0x1000_0100;
/// PBDMA INTR_EN value nouveau writes at init: everything but bit 8 (ENGINE_PULL_TIMEOUT)
/// (NV-FIFO-OLD `gf100_fifo_init`: `wr32(0x04010c + i*0x2000, 0xfffffeff)`).
pub const PBDMA_INTR_EN_NOUVEAU: u32 = 0xffff_feff;
/// ENG_SUBFIFO_MASK values nouveau writes when at least 3 PBDMAs exist, for engines 0..6 in
/// order PGRAPH, PVP, PMSPP, PMSVLD, PCE0, PCE1: `~(1 << 0)`, `~(1 << 1)` x3, `~(1 << 2)`,
/// `~(1 << 1)` (NV-FIFO-OLD `gf100_fifo_init`, "assign engines to PBDMAs").
pub const ENG_SUBFIFO_MASK_NOUVEAU: [u32; 6] = [
    !(1 << 0),
    !(1 << 1),
    !(1 << 1),
    !(1 << 1),
    !(1 << 2),
    !(1 << 1),
];
/// ENGINE_INTR_ENABLE value nouveau writes at init (NV-FIFO-OLD `gf100_fifo_init`:
/// `wr32(0x002628, 1) /* ENGINE_INTR_EN */`).
pub const ENGINE_INTR_ENABLE_NOUVEAU: u32 = 0x0000_0001;
/// Value nouveau writes to INTR (and the PBDMA INTR registers) at init to clear everything
/// (NV-FIFO-OLD `gf100_fifo_init`).
pub const INTR_CLEAR_ALL: u32 = 0xffff_ffff;
/// CTRL bit 0: PFIFO enable (nouveau `nvkm_mask(0x002200, 1, 1)`).
pub const CTRL_ENABLE: u32 = 1 << 0;
/// Value nouveau writes to PMC SPOON_ENABLE and SUBFIFO_ENABLE at init before counting PBDMAs
/// by popcount of the read-back (NV-FIFO-OLD `gf100_fifo_init`).
pub const SUBFIFO_ENABLE_ALL: u32 = 0xffff_ffff;

/// VM_FAULT register +0x0: the faulting context's instance block, `g80_channel` layout (nouveau
/// `gf100_fifo_intr_mmu_fault_unit`: `inst = rd32(0x2800 + unit*0x10) << 12`).
pub const VM_FAULT_INST: u32 = 0x0;
/// VM_FAULT register +0x4: faulting VA bits 0-31 (nouveau reads it as `valo`).
pub const VM_FAULT_ADDR_LO: u32 = 0x4;
/// VM_FAULT register +0x8: faulting VA bits 32-63 (nouveau reads it as `vahi`).
pub const VM_FAULT_ADDR_HI: u32 = 0x8;
/// VM_FAULT register +0xc: the flags word, see `fault::FaultFlags`.
pub const VM_FAULT_FLAGS: u32 = 0xc;
/// Mask of the error code in CHAN_TABLE_ERROR and SCHED_ERROR (nouveau `gf100_fifo_intr_bind` /
/// `_sched`: `code = intr & 0x000000ff`).
pub const ERROR_CODE_MASK: u32 = 0xff;
/// Mask of the channel id in PBDMA CH (nouveau `gf100_fifo_intr_pbdma`: `chid = rd32(0x040120 +
/// unit*0x2000) & 0x7f`).
pub const PBDMA_CHID_MASK: u32 = 0x7f;

/// STATE word bits 16-20: the engine field nouveau writes with RUNNABLE (`STATE_START` =
/// `0x001f0001`: RUNNABLE plus engine 0x1f "none"; NV-FIFO-OLD `gf100_fifo_gpfifo_init`). A
/// device model forwards only RUNNABLE and this field of a guest's STATE write.
pub const STATE_ENGINE_MASK: u32 = 0x001f_0000;

/// The source-register bitmask of a register array: bit i set when element i is nonzero (how
/// `SUBFIFO_INTR_SOURCE` summarises the PBDMA INTRs and `ENGINE_INTR_SOURCE` the
/// `ENGINE_INTR[e]`s).
pub fn source_mask(regs: impl IntoIterator<Item = u32>) -> u32 {
    regs.into_iter()
        .take(32)
        .enumerate()
        .filter(|&(_, v)| v != 0)
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// PFIFO INTR as read at 0x2100: the latched (write-1-to-clear) bits plus the level bits that
/// follow the source registers: VM_FAULT (bit 28) while `VM_FAULT_SOURCE` is nonzero, PBDMA
/// (29) while `SUBFIFO_INTR_SOURCE` is, RUNLIST_DONE (30) while `INTR_RUNLIST` has its event bit,
/// NON_STALL (31) while `ENGINE_INTR_SOURCE` is (ENVY `gf100_pfifo_intr`; nouveau's handler).
pub const fn intr_status(
    latched: u32,
    vm_fault_source: u32,
    subfifo_source: u32,
    runlist_intr: u32,
    engine_source: u32,
) -> u32 {
    let mut v = latched;
    if vm_fault_source != 0 {
        v |= INTR_VM_FAULT;
    }
    if subfifo_source != 0 {
        v |= INTR_PBDMA;
    }
    if runlist_intr & INTR_RUNLIST_EVENT != 0 {
        v |= INTR_RUNLIST_DONE;
    }
    if engine_source != 0 {
        v |= INTR_NON_STALL;
    }
    v
}
