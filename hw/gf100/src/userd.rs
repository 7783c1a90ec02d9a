//! USERD: the 4 KiB per-channel control area (GF100: in VRAM, CPU-visible through BAR1 at the
//! poll area). PFIFO reacts to writes of GP_PUT there: that is the doorbell.
//!
//! Sources: OGD/NV-906F `Nv906fControl`; ENVY `docs/hw/fifo/dma-pusher.rst`; NV-DMA
//! `nv50_dma_push`; GXEN `context_bar1.cc` (offset 0x8c = "FIRE"). Offsets checked against the
//! `Nv906fControl` struct in `cl906f.h` and nouveau `gf100_chan_userd_clear`. How the GP_PUT write
//! reaches PFIFO (BAR1 snoop vs. polling the VRAM copy) is **(UNCERTAIN)**.

/// Size of one channel's USERD page.
pub const SIZE: u64 = 0x1000;
/// DMA PUT (non-IB mode only).
pub const PUT: u64 = 0x40;
/// DMA GET (read-only).
pub const GET: u64 = 0x44;
/// Reference counter, set by the host SET_REFERENCE method (read-only).
pub const REFERENCE: u64 = 0x48;
/// DMA PUT high bits.
pub const PUT_HI: u64 = 0x4c;
/// TopLevelGet.
pub const TOP_LEVEL_GET: u64 = 0x58;
/// DMA GET high bits.
pub const GET_HI: u64 = 0x60;
/// GP_GET: index of the next GPFIFO entry PFIFO will fetch (read-only).
pub const GP_GET: u64 = 0x88;
/// GP_PUT: index one past the last GPFIFO entry the driver has written; writing it rings the
/// doorbell.
pub const GP_PUT: u64 = 0x8c;
