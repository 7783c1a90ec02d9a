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
/// PMC `0x000260`: written 0 / 1 around GR context generation (NV-`subdev/mc/gf100.c:
/// gf100_mc_unk260`).
pub const PMC_UNK260: u32 = 0x000260;
/// PMC interrupt mask of the second (non-host) tree, next to INTR_MASK_HOST `0x000640`.
pub const PMC_INTR_MASK_NRHOST: u32 = 0x000644;
/// PFIFO runlist-interrupt enable (NV-`engine/fifo/gf100.c:gf100_fifo_init_pbdmas`:
/// `mask(0x002a04, 0xbfffffff, 0xbfffffff)`; status at `0x002a00`).
pub const PFIFO_RUNLIST_INTR_EN: u32 = 0x002a04;
/// PTIMER clock-source divider (NV-`subdev/timer/nv41.c:nv41_timer_init`: `m - 1`).
pub const PTIMER_SOURCE_DIV: u32 = 0x009220;
/// PUNITS PCIe: bit 0 version (0 = 1.x, 1 = 2.0), bit 7 full-speed capable
/// (NV-`subdev/pci/gf100.c`: `gf100_pcie_version`, `_set_version`, `_cap_speed`).
pub const PUNITS_PCIE: u32 = 0x02241c;
/// PBUS interrupt status, write-1-to-clear (NV-`subdev/bus/gf100.c`: init writes `0xffffffff`,
/// the handler reads it masked by [`PBUS_INTR_EN`] and reports bits 3:1 with `0x009084/88`).
pub const PBUS_INTR: u32 = 0x001100;
/// PBUS interrupt enable (init writes `0x0000000e`).
pub const PBUS_INTR_EN: u32 = 0x001140;
/// PUNITS block start: fuse access control at `0x022400` (NV-`subdev/fuse/gf100.c:gf100_fuse_read`
/// sets bit 11 around a fuse read and restores it).
pub const PUNITS_BASE: u32 = 0x022400;
/// PUNITS: most GPCs (NV-`engine/gr/ctxgf100.c:gf100_grctx_generate_r4060a8`: `gpcmax`).
pub const PUNITS_GPC_MAX: u32 = 0x022430;
/// PUNITS: most TPCs per GPC (same function: `tpcmax = rd32(0x022434) * gpcmax`).
pub const PUNITS_TPC_MAX: u32 = 0x022434;
/// Active LTC count (read by the GR init into `0x4188ac`; research note
/// `gf100-pgraph-ctxsw.md` §5.1).
pub const LTC_COUNT: u32 = 0x100800;
/// PRIVRING FBP count (NV-`engine/gr/ctxgf100.c`: `if rd32(0x121c74) == 1`, a special case
/// for one FBP; GPUvm's A3 fakes it as the VM's partition count).
pub const PRIVRING_FBP_COUNT: u32 = 0x121c74;
/// PRIVRING blocks nouveau touches: master `0x120000`, interrupts `0x121c58..0x121c78` (ack
/// `0x121c4c`), timeouts `0x122310..0x122348` (NV-`subdev/privring/gf100.c`).
pub const PRIVRING_BLOCKS: u32 = 3;
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

/// The copy engines' falcons (NV-`engine/ce/gf100.c:gf100_ce_new`: PCOPY0 at `0x104000`,
/// PCOPY1 at `0x105000`) and the falcon host-interface registers nouveau's generic falcon engine
/// uses on them (NV-`engine/falcon.c`: `nvkm_falcon_oneinit`, `_init`, `_fini`, `_intr`; ENVY
/// `rnndb/falcon.xml`).
pub mod pcopy {
    /// PCOPY0's falcon.
    pub const PCOPY0: u32 = 0x104000;
    /// PCOPY1's falcon.
    pub const PCOPY1: u32 = 0x105000;
    /// Interrupt clear (write 1s; NV-`nvkm_falcon_intr` acks 0x10/0x40 here).
    pub const IRQSCLR: u32 = 0x004;
    /// Interrupt status.
    pub const IRQSTAT: u32 = 0x008;
    /// Interrupt mask clear (`nvkm_falcon_init`/`_fini` write `0xffffffff`).
    pub const IRQMCLR: u32 = 0x014;
    /// Interrupt destination.
    pub const IRQDEST: u32 = 0x01c;
    /// FIFO/channel-switch enables (`init` writes 3: FIFO | CHSW; `fini` clears them).
    pub const FIFO_CTRL: u32 = 0x048;
    /// Current channel instance (`nvkm_falcon_intr` reads bits 29:0).
    pub const CHAN_INST: u32 = 0x050;
    /// The engine's index (NV-`gf100_ce_init` writes the CE instance here).
    pub const CE_INDEX: u32 = 0x084;
    /// CPU control: write 2 = start (`nvkm_falcon_init` "TRIGGER").
    pub const CPUCTL: u32 = 0x100;
    /// Boot vector ("ENTRY").
    pub const BOOTVEC: u32 = 0x104;
    /// Hardware config: bits 8:0 code limit / 256, bits 17:9 data limit / 256
    /// (`nvkm_falcon_oneinit`: `code.limit = (caps & 0x1ff) << 8`,
    /// `data.limit = (caps & 0x3fe00) >> 1`).
    pub const HWCFG: u32 = 0x108;
    /// DMA control ("BLOCK_ON_FIFO" = 1).
    pub const DMACTL: u32 = 0x10c;
    /// Capabilities: bits 3:0 falcon version, bits 5:4 secret level (read on chipsets from
    /// 0xa3 on, GF100 included).
    pub const CAPS: u32 = 0x12c;
    /// IMEM port control / data / tag (version 3 upload: `0x180 = 0x01000000`, data at
    /// `0x184`, tag `i >> 6` at `0x188` every 64 words).
    pub const IMEMC: u32 = 0x180;
    /// IMEM data port.
    pub const IMEMD: u32 = 0x184;
    /// IMEM tag.
    pub const IMEMT: u32 = 0x188;
    /// DMEM port control / data (`0x1c0 = 0x01000000`, data at `0x1c4`, zero-filled to the
    /// data limit).
    pub const DMEMC: u32 = 0x1c0;
    /// DMEM data port.
    pub const DMEMD: u32 = 0x1c4;
    /// PMC ENABLE bit of PCOPY0 (NV-`subdev/mc/gf100.c:gf100_mc_reset`: `0x00000040` CE0,
    /// `0x00000080` CE1).
    pub const PMC_ENABLE_CE0: u32 = 1 << 6;
}
