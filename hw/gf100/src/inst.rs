//! The 4 KiB instance block of a channel (or of BAR1/BAR3): RAMFC at 0x000-0x1ff, then the page
//! directory base, VM limit and engine context pointers.
//!
//! Sources: NV-GPFIFO `engine/fifo/gpfifogf100.c` and NV-FIFO-NEW `gf100_chan_ramfc_write` (RAMFC
//! values), NV-VMM `gf100_vmm_join_` (PDB and limit), GXEN `channel.cc::shadow` (what GPUvm
//! rewrites). The RAMFC offsets coincide with PBDMA register offsets (an inference, see the
//! research notes §5.4).

use crate::Target;

/// Size and alignment of an instance block (NV-FIFO-NEW `gf100_chan_inst.size = 0x1000`; the
/// channel table and BAR registers hold `inst >> 12`).
pub const SIZE: u64 = 0x1000;

/// RAMFC: USERD address low word. nouveau writes the plain VRAM address of the channel's USERD
/// page (target bits 0). ENVY's PBDMA CTRL_ADDR_LOW at the same offset has bits 0-1 TARGET and
/// 12-31 ADDR_LOW, with "XXX: enum vals & confirm" — the target encoding here is **(UNCERTAIN)**.
pub const RAMFC_USERD_LO: u64 = 0x08;
/// RAMFC: USERD address high word (nouveau `upper_32_bits(userd)`).
pub const RAMFC_USERD_HI: u64 = 0x0c;
/// RAMFC: signature; the low 16 bits must read 0xface (PBDMA SIG_MISMATCH otherwise). nouveau
/// writes 0x0000face; ENVY PBDMA SIG: "only low 16 bits have to match".
pub const RAMFC_SIGNATURE: u64 = 0x10;
/// RAMFC: IB (GPFIFO) GET (ENVY PBDMA 0x14 IB_GET; offset correspondence inferred).
pub const RAMFC_IB_GET: u64 = 0x14;
/// RAMFC: semaphore configuration (ENVY PBDMA 0x30 SEMAPHORE_CONFIG; nouveau writes 0xfffff902).
pub const RAMFC_SEMAPHORE_CFG: u64 = 0x30;
/// RAMFC: GPFIFO ring base VA, low 32 bits (nouveau `lower_32_bits(ioffset)`; ENVY
/// IB_ADDRESS_LOW).
pub const RAMFC_IB_BASE_LO: u64 = 0x48;
/// RAMFC: bits 0-7 GPFIFO base VA bits 32-39; bits 16-31 log2(number of entries) (nouveau
/// `upper_32_bits(ioffset) | (ilog2(length / 8) << 16)`; ENVY IB_CONFIG ADDRESS_HIGH / ORDER).
pub const RAMFC_IB_CONFIG: u64 = 0x4c;
/// RAMFC 0x54 (nouveau writes 2; ENVY names the PBDMA register at this offset IB_ENTRY_LOW;
/// meaning of the value unknown).
pub const RAMFC_54: u64 = 0x54;
/// RAMFC 0x84, DMA_STATE (nouveau writes 0x20400000 = ENVY DMA_STATE_0 MODE 1 INCR, UNK22 1).
pub const RAMFC_DMA_STATE: u64 = 0x84;
/// RAMFC 0x94, SLI (old nouveau writes 0x30000001; current nouveau `0x30000000 | devm` with
/// devm 0xfff; ENVY: bits 0-11 MASK, 28 ACTIVE, 29 ENABLE).
pub const RAMFC_SLI: u64 = 0x94;
/// RAMFC 0x9c, FEATURE_ENABLE (nouveau writes 0x100; ENVY bits 8-9 CMD_TYPES 0 OLD, 1 NEW,
/// 2 BOTH). **(UNCERTAIN)** whether CMD_TYPES = NEW really rejects the legacy header formats:
/// the model accepts both, as `method::Header::decode` does.
pub const RAMFC_FEATURE_ENABLE: u64 = 0x9c;
/// RAMFC 0xa4, ENGINE (four 5-bit engine ids, 0x1f = none; ENVY PBDMA `ENGINE[0]`; nouveau
/// writes 0x1f1f1f1f).
pub const RAMFC_ENGINE_A4: u64 = 0xa4;
/// RAMFC 0xa8, ENGINE (ENVY PBDMA `ENGINE[1]`; nouveau writes 0x1f1f1f1f).
pub const RAMFC_ENGINE_A8: u64 = 0xa8;
/// RAMFC 0xac, CUR_ENGINE (ENVY; nouveau writes 0x1f).
pub const RAMFC_CUR_ENGINE: u64 = 0xac;
/// RAMFC 0xb8 (ENVY PBDMA UNKB8; nouveau writes 0xf8000000; meaning unknown).
pub const RAMFC_B8: u64 = 0xb8;
/// RAMFC 0xf8, copy of PFIFO 0x2310 (nouveau comment `/* 0x002310 */`; ENVY
/// ENG_RAMFC_UNKF8).
pub const RAMFC_F8: u64 = 0xf8;
/// RAMFC 0xfc, copy of PFIFO 0x2350 (nouveau comment `/* 0x002350 */`; ENVY
/// ENG_RAMFC_UNKFC).
pub const RAMFC_FC: u64 = 0xfc;

/// The RAMFC words nouveau writes besides USERD and the IB base, as (offset, value) pairs.
/// Checked against NV-FIFO-OLD `gf100_fifo_chan_ctor` / NV-GPFIFO `gf100_fifo_gpfifo_new` and
/// NV-FIFO-NEW `gf100_chan_ramfc_write` (identical except 0x94, see [`RAMFC_SLI`]).
pub const RAMFC_NOUVEAU_DEFAULTS: [(u64, u32); 12] = [
    (RAMFC_SIGNATURE, 0x0000_face),
    (RAMFC_SEMAPHORE_CFG, 0xffff_f902),
    (RAMFC_54, 0x0000_0002),
    (RAMFC_DMA_STATE, 0x2040_0000),
    (RAMFC_SLI, 0x3000_0001),
    (RAMFC_FEATURE_ENABLE, 0x0000_0100),
    (RAMFC_ENGINE_A4, 0x1f1f_1f1f),
    (RAMFC_ENGINE_A8, 0x1f1f_1f1f),
    (RAMFC_CUR_ENGINE, 0x0000_001f),
    (RAMFC_B8, 0xf800_0000),
    (RAMFC_F8, 0x1000_3080),
    (RAMFC_FC, 0x1000_0010),
];

/// The value the low 16 bits of [`RAMFC_SIGNATURE`] must hold.
pub const SIGNATURE: u32 = 0xface;

/// Page-directory base, low word: bits 0-1 target, bit 2 VOL, bits 12-31 address bits 12-31
/// (NV-VMM `gf100_vmm_join_` writes `pd_addr | target | (HOST ? BIT(2) : 0)` as 64 bits here).
pub const PDB_LO: u64 = 0x200;
/// Page-directory base, high word: address bits 32-39 (upper half of the 64-bit write).
pub const PDB_HI: u64 = 0x204;
/// VM limit (highest valid VA), low word (NV-VMM `vmm->limit - 1`; old nouveau and GXEN
/// write 0xffffffff / 0xff).
pub const LIMIT_LO: u64 = 0x208;
/// VM limit, high word.
pub const LIMIT_HI: u64 = 0x20c;
/// PGRAPH context pointer (`lo = va | 4`, `hi`; NV-FIFO-OLD `gf100_fifo_context_attach`,
/// NV-FIFO-NEW `gf100_ectx_bind`; bit 2 as "valid" is inferred).
pub const GR_CTX: u64 = 0x210;
/// [`GR_CTX`] low word: the pointer is valid (bit 2, inferred as above).
pub const GR_CTX_VALID: u32 = 1 << 2;
/// GR context image header, built-in firmware layout (`shared/research/gf100-pgraph-ctxsw.md`
/// §4.1 step 4 and §4.3, from nouveau `gf100_gr_chan_new` and the HUB `ctx_load`): word 0 is
/// the number of (address, value) pairs of the patch ("mmio") list FECS writes on the next
/// load, word 1 the list's VA >> 8; the header is 256 bytes.
pub const GRCTX_MMIO_COUNT: u64 = 0x0;
/// GR context header word 1: patch-list VA >> 8.
pub const GRCTX_MMIO_LIST: u64 = 0x4;
/// Size of the GR context header.
pub const GRCTX_HEADER_SIZE: u64 = 0x100;
/// PCOPY0 context pointer (nouveau `0x230 + ce * 0x10`).
pub const CE0_CTX: u64 = 0x230;
/// PCOPY1 context pointer (nouveau `0x230 + ce * 0x10`).
pub const CE1_CTX: u64 = 0x240;

/// Encodes the 64-bit PDB (`PDB_LO` | `PDB_HI << 32`) for a page directory at `pd`, as NV-VMM
/// `gf100_vmm_join_` does: VOL (bit 2) only for the coherent HOST target, not for NCOH.
pub const fn pdb_encode(pd: u64, target: Target) -> u64 {
    let vol = if matches!(target, Target::SysCoherent) {
        4
    } else {
        0
    };
    (pd & 0xff_ffff_f000) | target.bits() as u64 | vol
}

/// Decodes the 64-bit PDB into (page-directory address, target); `None` for target 1. The VOL
/// bit is ignored.
pub const fn pdb_decode(value: u64) -> Option<(u64, Target)> {
    match Target::from_bits(value as u32) {
        Some(t) => Some((value & 0xff_ffff_f000, t)),
        None => None,
    }
}

/// Encodes RAMFC_IB_CONFIG for a ring at `ib_va` with `entries` entries (a power of two).
pub const fn ib_config_encode(ib_va: u64, entries: u32) -> u32 {
    ((ib_va >> 32) as u32 & 0xff) | (entries.trailing_zeros() << 16)
}

/// Encodes the 64-bit USERD pointer (`RAMFC_USERD_LO` | `HI << 32`) for a USERD page at `addr`
/// (4 KiB aligned: GF100 USERD pages are 0x1000 bytes, NV-FIFO-NEW `gf100_chan_userd.size`).
pub const fn userd_encode(addr: u64, target: Target) -> u64 {
    (addr & 0xff_ffff_f000) | target.bits() as u64
}

/// Decodes the 64-bit USERD pointer; `None` for target 1.
pub const fn userd_decode(value: u64) -> Option<(u64, Target)> {
    match Target::from_bits(value as u32) {
        Some(t) => Some((value & 0xff_ffff_f000, t)),
        None => None,
    }
}

/// Size of RAMFC, the FIFO context at the start of an instance block (0x000-0x1ff; the PDB
/// follows at [`PDB_LO`] = 0x200; NV-FIFO-NEW `gf100_chan_ramfc_write` writes only below 0x100).
pub const RAMFC_SIZE: u64 = 0x200;

/// Decodes RAMFC_IB_BASE_LO and RAMFC_IB_CONFIG into (GPFIFO ring base VA, log2 of the number of
/// entries); the inverse of [`ib_config_encode`] (ENVY IB_ADDRESS_HIGH bits 0-7, ORDER bits
/// 16-31).
pub const fn ib_config_decode(ib_lo: u32, ib_config: u32) -> (u64, u32) {
    (
        ((ib_config & 0xff) as u64) << 32 | ib_lo as u64,
        ib_config >> 16,
    )
}
