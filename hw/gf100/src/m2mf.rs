//! The memory-to-memory format class 0x9039 (FERMI_MEMORY_TO_MEMORY_FORMAT_A), executed by
//! PGRAPH: pitch copies between GPU virtual addresses or from inline pushbuffer data, with a
//! semaphore release or a notifier after the transfer.
//!
//! Source: OGD `classes/twod/cl9039.h` (every method offset and LAUNCH_DMA field below was read
//! from its text); users: nouveau `nvc0_bo_move_m2mf` / `nvc0_bo_move_init`
//! (`drivers/gpu/drm/nouveau/nouveau_bo9039.c`: OFFSET_OUT_UPPER/OFFSET_OUT, OFFSET_IN_UPPER..
//! LINE_COUNT, LAUNCH_DMA with pitch layouts, FLUSH_DISABLE, no interrupt, one-word semaphore
//! size; lines of one page, at most 2047 per launch) and Mesa's `nvc0_m2mf_push_linear` (inline
//! data, `LAUNCH_DMA` 0x100111). ENVY `rnndb/graph/nvc0_m2mf.xml` names the same offsets
//! (OFFSET_OUT_HIGH, EXEC, DATA, ...).

/// Class number.
pub const CLASS: u32 = 0x9039;

/// NO_OPERATION.
pub const NO_OPERATION: u32 = 0x100;
/// SET_NOTIFY_A: notifier VA bits 39:32.
pub const SET_NOTIFY_A: u32 = 0x104;
/// SET_NOTIFY_B: notifier VA bits 31:0.
pub const SET_NOTIFY_B: u32 = 0x108;
/// NOTIFY: write the notifier (TYPE 0 write-only, 1 write-then-awaken).
pub const NOTIFY: u32 = 0x10c;
/// WAIT_FOR_IDLE.
pub const WAIT_FOR_IDLE: u32 = 0x110;
/// SEND_GO_IDLE.
pub const SEND_GO_IDLE: u32 = 0x13c;
/// PM_TRIGGER.
pub const PM_TRIGGER: u32 = 0x140;
/// SET_SPARE_NOOP00..15 except 11: no-op methods at 0x240-0x278 (0x27c-0x2f8 are the
/// SET_FALCON00..31 firmware methods).
pub const SPARE_NOOPS: core::ops::RangeInclusive<u32> = 0x240..=0x278;
/// SET_SPARE_NOOP11.
pub const SPARE_NOOP11: u32 = 0x2fc;
/// SET_SRC_BLOCK_SIZE .. SET_SRC_LAYER: block-linear source geometry (0x204-0x214).
pub const SRC_GEOMETRY: core::ops::RangeInclusive<u32> = 0x204..=0x214;
/// SET_DST_BLOCK_SIZE .. SET_DST_LAYER: block-linear destination geometry (0x220-0x230).
pub const DST_GEOMETRY: core::ops::RangeInclusive<u32> = 0x220..=0x230;
/// OFFSET_OUT_UPPER: destination VA bits 39:32 (field 7:0).
pub const OFFSET_OUT_UPPER: u32 = 0x238;
/// OFFSET_OUT: destination VA bits 31:0.
pub const OFFSET_OUT: u32 = 0x23c;
/// LAUNCH_DMA: starts the transfer.
pub const LAUNCH_DMA: u32 = 0x300;
/// LOAD_INLINE_DATA: one word of source data for an inline launch.
pub const LOAD_INLINE_DATA: u32 = 0x304;
/// OFFSET_IN_UPPER: source VA bits 39:32 (field 7:0).
pub const OFFSET_IN_UPPER: u32 = 0x30c;
/// OFFSET_IN: source VA bits 31:0.
pub const OFFSET_IN: u32 = 0x310;
/// PITCH_IN: bytes between source lines.
pub const PITCH_IN: u32 = 0x314;
/// PITCH_OUT: bytes between destination lines.
pub const PITCH_OUT: u32 = 0x318;
/// LINE_LENGTH_IN: bytes per line.
pub const LINE_LENGTH_IN: u32 = 0x31c;
/// LINE_COUNT: number of lines.
pub const LINE_COUNT: u32 = 0x320;
/// SET_SEMAPHORE_A: semaphore VA bits 39:32 (field 7:0).
pub const SET_SEMAPHORE_A: u32 = 0x32c;
/// SET_SEMAPHORE_B: semaphore VA bits 31:0.
pub const SET_SEMAPHORE_B: u32 = 0x330;
/// SET_SEMAPHORE_C: semaphore payload.
pub const SET_SEMAPHORE_C: u32 = 0x334;
/// SET_SRC_ORIGIN_BYTES_X .. SET_DST_ORIGIN_SAMPLES_Y: block-linear origins (0x344-0x350).
pub const ORIGINS: core::ops::RangeInclusive<u32> = 0x344..=0x350;

/// LAUNCH_DMA bit 0 SRC_INLINE: the source is LOAD_INLINE_DATA words.
pub const LAUNCH_SRC_INLINE: u32 = 1 << 0;
/// LAUNCH_DMA bit 4 SRC_MEMORY_LAYOUT: 1 pitch, 0 block linear.
pub const LAUNCH_SRC_PITCH: u32 = 1 << 4;
/// LAUNCH_DMA bit 8 DST_MEMORY_LAYOUT: 1 pitch, 0 block linear.
pub const LAUNCH_DST_PITCH: u32 = 1 << 8;
/// LAUNCH_DMA bits 13:12 COMPLETION_TYPE value RELEASE_SEMAPHORE (0 FLUSH_DISABLE, 1
/// FLUSH_ONLY, 3 undefined).
pub const COMPLETION_RELEASE_SEMAPHORE: u32 = 2;
/// LAUNCH_DMA bits 17:16 INTERRUPT_TYPE value INTERRUPT (0 NONE, 2 and 3 undefined).
pub const INTERRUPT_INTERRUPT: u32 = 1;
/// LAUNCH_DMA bit 20 SEMAPHORE_STRUCT_SIZE: 1 one word, 0 four words.
pub const LAUNCH_SEMAPHORE_ONE_WORD: u32 = 1 << 20;

/// Every LAUNCH_DMA bit cl9039.h defines (0, 4, 8, 13:12, 17:16, 20).
pub const LAUNCH_DEFINED: u32 = 1 | 1 << 4 | 1 << 8 | 3 << 12 | 3 << 16 | 1 << 20;

/// COMPLETION_TYPE field (bits 13:12).
pub const fn launch_completion_type(v: u32) -> u32 {
    (v >> 12) & 3
}
/// INTERRUPT_TYPE field (bits 17:16).
pub const fn launch_interrupt_type(v: u32) -> u32 {
    (v >> 16) & 3
}

/// Bytes of the notifier NOTIFY writes: a 64-bit timestamp, then info32, info16 and a 16-bit
/// status of zero (the NvNotification layout of NVIDIA's class headers, `nvtypes.h` era).
/// **(UNCERTAIN)**: cl9039.h does not spell the structure out; this is the layout every NVIDIA
/// notifier of the period uses.
pub const NOTIFIER_BYTES: usize = 16;
