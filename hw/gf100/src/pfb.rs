//! Memory-controller registers nouveau reads to size VRAM (the ones GPUvm fakes per VM).
//!
//! Source: NV-FB `nvkm/subdev/fb/ramgf100.c` / `gf100.c` (`gf100_fb_vidmem_probe_fbp`,
//! `gf100_fb_vidmem_probe_fbpa_amount`): VRAM = sum over enabled FBPs of
//! `rd32(0x11020c + fbp*0x1000)` MiB; GXEN `context_bar0.cc` fakes 0x022438 and 0x11020c.
//! Checked against nouveau (`gf100_fb_vidmem_size`: `fbps = rd32(0x022438)`,
//! `gf100_fb_vidmem_probe_fbp`: `fbpao = rd32(0x022554)`, `_probe_fbpa_amount`:
//! `rd32(0x11020c + fbpa * 0x1000)`) and the 3.x `nvc0_vram_init` (same registers, `psize << 20`).

/// Number of frame-buffer partitions (FBPs).
pub const FBP_COUNT: u32 = 0x022438;
/// FBP disable mask: bit n set = FBP n disabled.
pub const FBP_DISABLE_MASK: u32 = 0x022554;
/// Amount of VRAM behind FBP 0, in MiB; FBP n is at `FBPA_AMOUNT + n * FBPA_STRIDE`.
pub const FBPA_AMOUNT: u32 = 0x11020c;
/// Stride between the per-FBP amount registers.
pub const FBPA_STRIDE: u32 = 0x1000;
/// Largest FBP count we model (GF100 has 6: ENVY `ssot/gpu.py` `fbpart_count=6`).
pub const MAX_FBP: u32 = 6;

/// Offset of the amount register of partition `fbp`.
pub const fn fbpa_amount(fbp: u32) -> u32 {
    FBPA_AMOUNT + fbp * FBPA_STRIDE
}
