//! Video BIOS image structures and where nouveau finds the image, as nouveau 6.12 reads them
//! (`nvkm/subdev/bios/{shadow,shadowrom,image,pcir,bit,base}.c`, `nouveau_bios.c`; the research
//! note `shared/research/nouveau-bringup.md` §1–2 has the walk-through). The device model builds
//! its VBIOS from these (`gpuvm::vgpu::vbios`).

/// BAR0 offset of the PROM window (NV-`bios/shadowrom.c:nvbios_prom_read`: `0x300000 + offset`).
pub const PROM_BASE: u32 = 0x300000;
/// Size of the PROM window nouveau reads through (NV-`shadowrom.c`: at most 1 MiB).
pub const PROM_SIZE: u32 = 0x100000;
/// Size of the Quadro 6000's expansion ROM BAR (PCI config 0x30), 512 KiB (lspci of the board:
/// "Expansion ROM at ... [disabled] [size=512K]").
pub const EXPANSION_ROM_SIZE: u32 = 512 << 10;

/// PC option-ROM signature bytes at image offset 0 (NV-`bios/image.c:nvbios_imagen`: 0xAA55).
pub const ROM_SIGNATURE: [u8; 2] = [0x55, 0xaa];
/// Image offset of the u16 pointer to the PCI data structure (NV-`image.c`: `image + 0x18`).
pub const PCIR_POINTER: usize = 0x18;
/// Image offset of the u16 DCB pointer; 0 = no DCB (NV-`bios/dcb.c:dcb_table`).
pub const DCB_POINTER: usize = 0x36;
/// PCI data structure signature (NV-`bios/pcir.c:nvbios_pcirTe`).
pub const PCIR_SIGNATURE: [u8; 4] = *b"PCIR";
/// PCIR: image length in 512-byte units at +0x10, code type at +0x14, indicator at +0x15
/// (bit 7 = last image) (NV-`pcir.c`).
pub const PCIR_IMAGE_LEN: usize = 0x10;
/// PCIR code type offset.
pub const PCIR_CODE_TYPE: usize = 0x14;
/// PCIR indicator offset.
pub const PCIR_INDICATOR: usize = 0x15;
/// Code type 0: x86 PC-AT image, byte-sum checksum checked (NV-`bios/shadow.c:shadow_image`).
pub const CODE_TYPE_X86: u8 = 0x00;

/// BIT table signature (NV-`bios/base.c:nvkm_bios_new` searches for `FF B8 'B' 'I' 'T'`).
pub const BIT_SIGNATURE: [u8; 5] = [0xff, 0xb8, b'B', b'I', b'T'];
/// BIT header: +9 entry size, +10 entry count, entries from +12 (NV-`bios/bit.c:bit_entry`).
pub const BIT_HEADER_LEN: usize = 12;
/// BIT entry: id, version, u16 length, u16 data offset (NV-`bit.c:bit_entry`).
pub const BIT_ENTRY_LEN: usize = 6;
/// BIT 'i' (information) must be at least 15 bytes long for the DRM layer
/// (NV-`nouveau_bios.c:parse_bit_i_tbl_entry`).
pub const BIT_I_MIN_LEN: u16 = 15;
/// BIT 'I' (init tables) must be at least 14 bytes long (NV-`nouveau_bios.c:parse_bit_init_tbl_entry`);
/// 16 to include the "unknown script" pointer nvkm reads at +14 (NV-`bios/init.c`).
pub const BIT_INIT_LEN: u16 = 16;
