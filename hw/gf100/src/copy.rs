//! The copy engine class 0x90B5 (GF100_DMA_COPY), run by PCOPY0/PCOPY1.
//!
//! Source: OGD `classes/dma-copy/cl90b5.h` (method offsets and LAUNCH_DMA fields); nouveau/NVK
//! `nouveau_copy_linear` (pitch copies of up to 128 KiB per line). Every method offset and
//! LAUNCH_DMA field value below was checked against the text of `cl90b5.h` (GF100_DMA_COPY).

/// Class number.
pub const CLASS: u32 = 0x90b5;

/// SET_SEMAPHORE_A: semaphore VA bits 39:32.
pub const SET_SEMAPHORE_A: u32 = 0x240;
/// SET_SEMAPHORE_B: semaphore VA bits 31:0.
pub const SET_SEMAPHORE_B: u32 = 0x244;
/// SET_SEMAPHORE_PAYLOAD.
pub const SET_SEMAPHORE_PAYLOAD: u32 = 0x248;
/// LAUNCH_DMA: starts the copy described by the OFFSET/PITCH/LINE methods.
pub const LAUNCH_DMA: u32 = 0x300;
/// OFFSET_IN_UPPER: source VA bits 39:32.
pub const OFFSET_IN_UPPER: u32 = 0x400;
/// OFFSET_IN_LOWER: source VA bits 31:0.
pub const OFFSET_IN_LOWER: u32 = 0x404;
/// OFFSET_OUT_UPPER: destination VA bits 39:32.
pub const OFFSET_OUT_UPPER: u32 = 0x408;
/// OFFSET_OUT_LOWER: destination VA bits 31:0.
pub const OFFSET_OUT_LOWER: u32 = 0x40c;
/// PITCH_IN: bytes between source lines.
pub const PITCH_IN: u32 = 0x410;
/// PITCH_OUT: bytes between destination lines.
pub const PITCH_OUT: u32 = 0x414;
/// LINE_LENGTH_IN: bytes per line.
pub const LINE_LENGTH_IN: u32 = 0x418;
/// LINE_COUNT: number of lines (used when MULTI_LINE_ENABLE).
pub const LINE_COUNT: u32 = 0x41c;

/// LAUNCH_DMA bits 1:0 DATA_TRANSFER_TYPE: 1 pipelined, 2 non-pipelined (0 none).
pub const LAUNCH_TRANSFER_NON_PIPELINED: u32 = 2;
/// LAUNCH_DMA bits 1:0 value for a pipelined transfer.
pub const LAUNCH_TRANSFER_PIPELINED: u32 = 1;
/// LAUNCH_DMA bit 2: flush enable.
pub const LAUNCH_FLUSH_ENABLE: u32 = 1 << 2;
/// LAUNCH_DMA bits 4:3 SEMAPHORE_TYPE: 1 one-word release.
pub const LAUNCH_SEMAPHORE_ONE_WORD: u32 = 1 << 3;
/// LAUNCH_DMA bits 4:3 SEMAPHORE_TYPE: 2 four-word release (cl90b5.h
/// RELEASE_FOUR_WORD_SEMAPHORE; the payload / 0 / 64-bit timestamp layout is the usual one but
/// **(UNCERTAIN)**: cl90b5.h does not spell it out).
pub const LAUNCH_SEMAPHORE_FOUR_WORD: u32 = 2 << 3;
/// LAUNCH_DMA bits 6:5 INTERRUPT_TYPE: 2 non-blocking (raises the non-stall interrupt).
pub const LAUNCH_INTERRUPT_NON_BLOCKING: u32 = 2 << 5;
/// LAUNCH_DMA bits 6:5 INTERRUPT_TYPE: 1 blocking.
pub const LAUNCH_INTERRUPT_BLOCKING: u32 = 1 << 5;
/// LAUNCH_DMA bit 7: source layout pitch (0 = block linear).
pub const LAUNCH_SRC_PITCH: u32 = 1 << 7;
/// LAUNCH_DMA bit 8: destination layout pitch.
pub const LAUNCH_DST_PITCH: u32 = 1 << 8;
/// LAUNCH_DMA bit 9: multi-line enable.
pub const LAUNCH_MULTI_LINE: u32 = 1 << 9;
/// LAUNCH_DMA bit 10: remap enable.
pub const LAUNCH_REMAP: u32 = 1 << 10;

/// Field extractors for LAUNCH_DMA.
pub const fn launch_transfer_type(v: u32) -> u32 {
    v & 3
}
/// SEMAPHORE_TYPE field (bits 4:3).
pub const fn launch_semaphore_type(v: u32) -> u32 {
    (v >> 3) & 3
}
/// INTERRUPT_TYPE field (bits 6:5).
pub const fn launch_interrupt_type(v: u32) -> u32 {
    (v >> 5) & 3
}
