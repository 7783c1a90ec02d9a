//! Board-level registers nouveau 6.12 reads while it probes a GF100, and the values a real,
//! POSTed Quadro 6000 answers (sources per constant; the walk-through is the research note
//! `shared/research/nouveau-bringup.md` §0, §3–5).

/// PEXTDEV strap (NV-`engine/device/base.c:nvkm_device_ctor`: bits 22 and 6 pick the crystal).
pub const STRAP: u32 = 0x101000;
/// Strap value: bit 22 set, bit 6 clear = 27 MHz crystal (real GF100 boards); RAM-type index
/// (bits 5:2) 0.
pub const STRAP_27MHZ: u32 = 1 << 22;
/// "Has been POSTed" word: bit 1 set = the VBIOS init scripts already ran and nouveau's devinit
/// skips them (NV-`subdev/devinit/gf100.c`, research note §7 rung 2).
pub const POSTED: u32 = 0x02240c;
/// Bit 1 of [`POSTED`].
pub const POSTED_BIT: u32 = 1 << 1;
/// Units fused off (NV-`subdev/devinit/gf100.c:gf100_devinit_disable`): bit 0 DISP, bit 1
/// MSPDEC+MSPPP, bit 2 MSVLD, bit 3 MSENC, bit 8 CE0, bit 9 CE1.
pub const UNITS_DISABLED: u32 = 0x022500;
/// GPIO/PLL block (NV-`subdev/clk/gf100.c:read_pll`: `0x00e800`, `0x00e820`; therm fan tach at
/// `0x00e720`).
pub const PGPIO_BASE: u32 = 0x00e000;
/// PTHERM (NV-`subdev/therm/gt215.c`, `g84.c`).
pub const PTHERM_BASE: u32 = 0x020000;
/// Fuses (NV-`subdev/fuse/gf100.c`: `0x021000 + offset`; speedo `0x1cc`, therm enable `0x1a8`).
pub const FUSE_BASE: u32 = 0x021000;
/// LTC flush / invalidate triggers (NV-`subdev/ltc/gf100.c:gf100_ltc_flush/invalidate`: write 1,
/// poll bits 1:0 clear).
pub const LTC_INVALIDATE: u32 = 0x070004;
/// See [`LTC_INVALIDATE`].
pub const LTC_FLUSH: u32 = 0x070010;
/// Privileged register ring (NV-`subdev/privring/gf100.c`: interrupt status `0x121c58`,
/// `0x1200xx` master control).
pub const PRIVRING_BASE: u32 = 0x120000;
/// Memory PLLs (NV-`subdev/clk/gf100.c`: `0x132000`, `0x132020`).
pub const MPLL_BASE: u32 = 0x132000;
/// Clock domains (NV-`subdev/clk/gf100.c`: `0x137100`, `0x137250 + i*4`, `0x1370xx` PLLs).
pub const PCLOCK_BASE: u32 = 0x137000;
/// LTC broadcast block (NV-`subdev/ltc/gf100.c:gf100_ltc_oneinit`: `0x17e8dc` bits 31:28 =
/// slices per LTC; init writes `0x17e820`, `0x17e8d8`, `0x17e8d4`, `0x17e8c0`).
pub const LTC_BASE: u32 = 0x17e000;
/// LTC slices register.
pub const LTC_SLICES: u32 = 0x17e8dc;
/// Engine status words (NV-`engine/gr/gf100.c:gf100_gr_wait_idle` polls `0x002640`; a busy
/// engine keeps the wait going). 0 = idle.
pub const ENGINE_STATUS: u32 = 0x002640;
/// Page size of each block above.
pub const BLOCK: u32 = 0x1000;

/// PDAEMON, the PMU falcon (NV-`subdev/pmu/gt215.c`, research note §5).
pub mod pmu {
    /// Base of the falcon's registers.
    pub const BASE: u32 = 0x10a000;
    /// IRQ status; bit 6 = message ready (NV-`gt215_pmu_intr`).
    pub const IRQSTAT: u32 = 0x10a008;
    /// IRQ mode / enable set / clear.
    pub const IRQMSET: u32 = 0x10a010;
    /// IRQ enable clear.
    pub const IRQMCLR: u32 = 0x10a014;
    /// Falcon busy/idle status polled for 0 before reset.
    pub const IDLE_STATUS: u32 = 0x10a04c;
    /// CPU control: write 2 = start (NV-`gt215_pmu_init`).
    pub const CPUCTL: u32 = 0x10a100;
    /// Boot vector.
    pub const BOOTVEC: u32 = 0x10a104;
    /// DMA control; bits 2:1 = IMEM/DMEM scrubbing in progress.
    pub const DMACTL: u32 = 0x10a10c;
    /// IMEM port 0: control, data, tag.
    pub const IMEMC: u32 = 0x10a180;
    /// IMEM data.
    pub const IMEMD: u32 = 0x10a184;
    /// IMEM tag.
    pub const IMEMT: u32 = 0x10a188;
    /// DMEM port 0: control, data.
    pub const DMEMC: u32 = 0x10a1c0;
    /// DMEM data.
    pub const DMEMD: u32 = 0x10a1c4;
    /// Host→PMU queue PUT / GET.
    pub const SEND_PUT: u32 = 0x10a4a0;
    /// See [`SEND_PUT`].
    pub const SEND_GET: u32 = 0x10a4b0;
    /// PMU→host queue PUT / GET.
    pub const RECV_PUT: u32 = 0x10a4c8;
    /// See [`RECV_PUT`].
    pub const RECV_GET: u32 = 0x10a4cc;
    /// Host→PMU queue descriptor: DMEM base (15:0), size (31:16); nouveau polls it non-zero
    /// after start (NV-`gt215_pmu_init`, -EBUSY otherwise).
    pub const SEND_QUEUE: u32 = 0x10a4d0;
    /// PMU→host queue descriptor.
    pub const RECV_QUEUE: u32 = 0x10a4dc;
    /// DMEM mutex: a write takes it if it reads back the written token (NV-`gt215_pmu_send`).
    pub const MUTEX: u32 = 0x10a580;
    /// Queue size the real firmware announces (NV-`pmu/fuc/host.fuc:host_init`: 128 bytes).
    pub const QUEUE_SIZE: u32 = 128;
    /// DMEM base of the send queue the stand-in announces (a choice; any non-zero base works).
    pub const SEND_QUEUE_BASE: u32 = 0x0400;
    /// DMEM base of the receive queue the stand-in announces.
    pub const RECV_QUEUE_BASE: u32 = 0x0480;
}

/// PGRAPH and its context-switch falcons (NV-`engine/gr/gf100.c`, `ctxgf100.c`; research note
/// §5 and `gf100-pgraph-ctxsw.md`).
pub mod pgraph {
    /// Base of PGRAPH.
    pub const BASE: u32 = 0x400000;
    /// PGRAPH through the GPC broadcast space, end (exclusive).
    pub const END: u32 = 0x600000;
    /// GR status; 0 = idle (NV-`gf100_gr_wait_idle`; bit 2 = ICMD busy in ctxgf100).
    pub const STATUS: u32 = 0x400700;
    /// Another idle word nouveau polls (bit 0 clear = idle).
    pub const STATUS2: u32 = 0x40060c;
    /// Power mode; bit 4 = change in progress (NV-`ctxgf100.c:gf100_grctx_generate`).
    pub const PWR_MODE: u32 = 0x404170;
    /// FECS falcon base.
    pub const FECS: u32 = 0x409000;
    /// FECS CPU control (write 2 = start, NV-`gf100_gr_init_ctxctl_int`).
    pub const FECS_CPUCTL: u32 = 0x409100;
    /// FECS channel context pointer (`0x80000000 | inst >> 12`) and method.
    pub const FECS_CHAN: u32 = 0x409500;
    /// FECS method.
    pub const FECS_METHOD: u32 = 0x409504;
    /// GPC and ROP counts: bits 4:0 GPCs, bits 20:16 ROPs (NV-`gf100_gr_oneinit`).
    pub const UNIT_COUNTS: u32 = 0x409604;
    /// FECS status mailbox 0: bit 31 = firmware ready / method done (NV-`gf100_gr_init_ctxctl_int`).
    pub const FECS_MAILBOX0: u32 = 0x409800;
    /// FECS mailbox 1: the context image size nouveau reads after start.
    pub const FECS_MAILBOX1: u32 = 0x409804;
    /// FECS mailbox 2, cleared by nouveau before methods.
    pub const FECS_CLEAR: u32 = 0x409840;
    /// Context unload status: bit 31 set while busy (NV-`ctxgf100.c`, -EBUSY if it stays).
    pub const FECS_UNLOAD: u32 = 0x409b00;
    /// GPC 0 TPC count at `0x500000 + gpc * 0x8000 + 0x2608` (NV-`gf100_gr_oneinit`).
    pub const GPC0_TPC_COUNT: u32 = 0x502608;
    /// GPC stride.
    pub const GPC_STRIDE: u32 = 0x8000;
}
