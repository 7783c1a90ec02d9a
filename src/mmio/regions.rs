//! The BAR0 region table: for every register or range the device model knows, its name, its
//! trap policy and the handler that implements it. Deny by default: an offset that no region
//! covers reads as the hardware's bad-register code and writes to it are dropped and counted —
//! never forwarded (GPUvm forwarded unknown registers to the GPU, an isolation hole we close).
//!
//! The table is data: `gpuvm regs` prints it, tests check it against the `gf100` facts, and the
//! BAR0 dispatcher looks offsets up in it (binary search over sorted, non-overlapping ranges).

use gf100::{pbus, pfb, pffb, pfifo, pmc, ptimer};

/// What the device model does with accesses to a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Emulated entirely from per-VM state; the physical GPU is never touched.
    Virtual,
    /// Translated (channel ids, addresses) and validated, then applied to the physical GPU or to
    /// shadow structures the device model owns.
    Shadowed,
    /// Safe to pass to the physical GPU as is (read-only global state such as the time).
    Forwarded,
    /// Known to the model but refused: reads return the bad-register code, writes are dropped
    /// and counted as violations.
    Denied,
}

/// Which handler implements a region (the BAR0 dispatcher matches on this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Handler {
    /// PMC BOOT_0: the Quadro 6000's identity.
    Boot0,
    /// PMC ENDIAN.
    Endian,
    /// PMC INTR_HOST / INTR_NRHOST: the VM's aggregated virtual interrupt status.
    PmcIntr,
    /// PMC INTR_EN_HOST / INTR_EN_NRHOST.
    PmcIntrEn,
    /// PMC ENABLE / SPOON_ENABLE: stored per VM.
    PmcEnable,
    /// PMC INTR_MASK_HOST.
    PmcIntrMask,
    /// PMC MSI re-arm: accepted, no effect (virtual interrupts are re-evaluated on every access).
    MsiRearm,
    /// PPCI, configuration space mirrored in BAR0: reads the VM's configuration space; writes
    /// are ignored (config writes go through the transport's configuration path, where the
    /// command register and BARs are enforced; nouveau's mirror writes — the ROM shadow toggle
    /// and ASPM masks — mean nothing to the model).
    PciMirror,
    /// PBUS PMEM: the VM's PRAMIN window base (guest VRAM or guest RAM).
    PraminBase,
    /// PBUS BAR1_INST / BAR3_INST: the guest's BAR1/BAR3 VM bindings (walked in software).
    BarInst,
    /// The PRAMIN window: translated into the VM's VRAM slice (write-tracked pages noticed).
    Pramin,
    /// PFLUSH: BAR write flush; completes at once (the model's VRAM writes are synchronous).
    Pflush,
    /// PFB FBP count / disable mask / per-FBP amount: report the VM's slice size.
    FbSize,
    /// PFFB sysmem flush page: stored per VM.
    SysmemFlushPage,
    /// PFFB VM_CFG: page-size bit stored; flush-status bits emulated.
    VmCfg,
    /// PFFB TLB_FLUSH_PAGE / TLB_FLUSH_VSPACE: stored per VM.
    TlbFlushArgs,
    /// PFFB TLB_FLUSH_TRIGGER: a guest TLB flush — drives the shadow page tables.
    TlbFlushTrigger,
    /// PTIMER TIME_LOW / TIME_HIGH (and PFIFO's copy): the physical time, read-only.
    Time,
    /// PTIMER interrupt, alarm and divider registers: stored per VM.
    TimerMisc,
    /// PFIFO INTR / INTR_EN: the VM's virtual PFIFO interrupts.
    FifoIntr,
    /// PFIFO CTRL, SUBFIFO_ENABLE, ENG_SUBFIFO_MASK, ENGINE_INTR_ENABLE: stored per VM.
    FifoConfig,
    /// PFIFO USERD poll base: the guest's poll area in its BAR1 (where its doorbells are).
    UserdPollBase,
    /// PFIFO runlist base: stored per VM.
    RunlistBase,
    /// PFIFO runlist submit: the guest list is validated, translated and merged.
    RunlistSubmit,
    /// PFIFO runlist read-back registers (pending bit).
    RunlistStatus,
    /// PFIFO channel-table and scheduler error codes: the VM's own.
    FifoErrorCodes,
    /// PFIFO `VM_FAULT_SOURCE` and `VM_FAULT[u]`: the VM's own fault reports.
    FaultReports,
    /// PFIFO SUBFIFO / ENGINE interrupt sources and `ENGINE_INTR[e]`: the VM's own.
    FifoIntrSources,
    /// PFIFO KICK: guest channel id translated to the physical one.
    Kick,
    /// PFIFO INTR_RUNLIST: the VM's runlist-done event.
    RunlistIntr,
    /// PFIFO channel table (CHAN and STATE words of the guest's channels).
    ChannelTable,
    /// PBDMA register blocks: the VM's view of PBDMA interrupts.
    Pbdma,
    /// The gpuvm para-virtual interface (page-table batches), present in `pv` profiles.
    Paravirt,
    /// The PROM window: the generated VBIOS, read-only (`vgpu::vbios`).
    Prom,
    /// Board registers a driver reads at probe, answered as a POSTed board (`vgpu::vboard`).
    Board,
    /// VGA CRTC ports (byte accesses), stored per VM.
    VgaPorts,
    /// The PMU falcon's host interface, emulated at high level (`vgpu::vpmu`).
    Pmu,
    /// The virtual PGRAPH: FECS/GPCCS interface emulated at high level, writes absorbed per VM
    /// (`vgpu::vpgraph`).
    Pgraph,
}

/// One region of BAR0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Region {
    /// First BAR0 offset.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    /// Name (envytools/nouveau names).
    pub name: &'static str,
    /// Trap policy.
    pub policy: Policy,
    /// Handler, `None` for denied regions.
    #[serde(skip)]
    pub handler: Option<Handler>,
}

impl Region {
    /// One past the last offset.
    pub const fn end(&self) -> u32 {
        self.offset + self.size
    }

    /// True if `offset` lies in the region.
    pub const fn contains(&self, offset: u32) -> bool {
        offset >= self.offset && offset < self.end()
    }
}

const fn reg(offset: u32, name: &'static str, policy: Policy, handler: Handler) -> Region {
    Region {
        offset,
        size: 4,
        name,
        policy,
        handler: Some(handler),
    }
}

const fn range(
    offset: u32,
    size: u32,
    name: &'static str,
    policy: Policy,
    handler: Handler,
) -> Region {
    Region {
        offset,
        size,
        name,
        policy,
        handler: Some(handler),
    }
}

const fn denied(offset: u32, size: u32, name: &'static str) -> Region {
    Region {
        offset,
        size,
        name,
        policy: Policy::Denied,
        handler: None,
    }
}

use Handler as H;
use Policy::{Forwarded as F, Shadowed as S, Virtual as V};

/// Base of the gpuvm para-virtual interface in BAR0 (see [`gf100::pv`]).
pub const PV_BASE: u32 = gf100::pv::BASE;

/// The region table, sorted by offset, non-overlapping.
pub static BAR0_REGIONS: &[Region] = &[
    reg(pmc::BOOT_0, "PMC.BOOT_0", V, H::Boot0),
    reg(pmc::ENDIAN, "PMC.ENDIAN", V, H::Endian),
    reg(pmc::INTR_HOST, "PMC.INTR_HOST", V, H::PmcIntr),
    reg(pmc::INTR_NRHOST, "PMC.INTR_NRHOST", V, H::PmcIntr),
    reg(pmc::INTR_EN_HOST, "PMC.INTR_EN_HOST", V, H::PmcIntrEn),
    reg(pmc::INTR_EN_NRHOST, "PMC.INTR_EN_NRHOST", V, H::PmcIntrEn),
    reg(pmc::ENABLE, "PMC.ENABLE", V, H::PmcEnable),
    reg(pmc::SPOON_ENABLE, "PMC.SPOON_ENABLE", V, H::PmcEnable),
    reg(pmc::INTR_MASK_HOST, "PMC.INTR_MASK_HOST", V, H::PmcIntrMask),
    reg(pbus::PMEM, "PBUS.HOST_MEM.PMEM", V, H::PraminBase),
    reg(pbus::BAR1_INST, "PBUS.HOST_MEM.BAR1", S, H::BarInst),
    reg(pbus::BAR3_INST, "PBUS.HOST_MEM.BAR3", S, H::BarInst),
    reg(pfifo::INTR, "PFIFO.INTR", V, H::FifoIntr),
    reg(pfifo::INTR_EN, "PFIFO.INTR_EN", V, H::FifoIntr),
    reg(pfifo::CTRL, "PFIFO.CTRL", V, H::FifoConfig),
    reg(
        pfifo::SUBFIFO_ENABLE,
        "PFIFO.SUBFIFO_ENABLE",
        V,
        H::FifoConfig,
    ),
    range(
        pfifo::ENG_SUBFIFO_MASK,
        6 * 4,
        "PFIFO.ENG_SUBFIFO_MASK[6]",
        V,
        H::FifoConfig,
    ),
    reg(
        pfifo::USERD_POLL_BASE,
        "PFIFO.BAR1_BASE (USERD poll area)",
        V,
        H::UserdPollBase,
    ),
    reg(pfifo::RUNLIST_BASE, "PFIFO.PLAYLIST_WR", V, H::RunlistBase),
    reg(
        pfifo::RUNLIST_SUBMIT,
        "PFIFO.PLAYLIST_WR_LEN",
        S,
        H::RunlistSubmit,
    ),
    reg(
        pfifo::RUNLIST_RD_BASE,
        "PFIFO.PLAYLIST_RD",
        V,
        H::RunlistStatus,
    ),
    reg(
        pfifo::RUNLIST_RD_LEN,
        "PFIFO.PLAYLIST_RD_LEN",
        V,
        H::RunlistStatus,
    ),
    reg(
        pfifo::CHAN_TABLE_ERROR,
        "PFIFO.CHAN_TABLE_ERROR",
        V,
        H::FifoErrorCodes,
    ),
    reg(
        pfifo::SCHED_ERROR,
        "PFIFO.SCHED_ERROR",
        V,
        H::FifoErrorCodes,
    ),
    reg(
        pfifo::VM_FAULT_SOURCE,
        "PFIFO.VM_FAULT_SOURCE",
        V,
        H::FaultReports,
    ),
    reg(
        pfifo::SUBFIFO_INTR_SOURCE,
        "PFIFO.SUBFIFO_INTR_SOURCE",
        V,
        H::FifoIntrSources,
    ),
    reg(
        pfifo::ENGINE_INTR_SOURCE,
        "PFIFO.ENGINE_INTR_SOURCE",
        V,
        H::FifoIntrSources,
    ),
    range(
        pfifo::ENGINE_INTR,
        6 * 4,
        "PFIFO.ENGINE_INTR[6]",
        V,
        H::FifoIntrSources,
    ),
    reg(
        pfifo::ENGINE_INTR_ENABLE,
        "PFIFO.ENGINE_INTR_ENABLE",
        V,
        H::FifoConfig,
    ),
    reg(pfifo::KICK, "PFIFO.KICK_CHID", S, H::Kick),
    range(
        pfifo::VM_FAULT,
        pfifo::VM_FAULT_UNITS * pfifo::VM_FAULT_STRIDE,
        "PFIFO.VM_FAULT[32]",
        V,
        H::FaultReports,
    ),
    reg(pfifo::INTR_RUNLIST, "PFIFO.INTR_RUNLIST", V, H::RunlistIntr),
    reg(pfifo::TIME_LOW, "PFIFO.TIME_LOW", F, H::Time),
    reg(pfifo::TIME_HIGH, "PFIFO.TIME_HIGH", F, H::Time),
    range(
        pfifo::CHAN_TABLE,
        pfifo::CHANNELS * pfifo::CHAN_TABLE_STRIDE,
        "PFIFO.CHAN_TABLE[128]",
        S,
        H::ChannelTable,
    ),
    denied(0x005000, 0x1000, "PFIFO_BYPASS (direct method submission)"),
    reg(ptimer::INTR, "PTIMER.INTR", V, H::TimerMisc),
    reg(ptimer::INTR_EN, "PTIMER.INTR_EN", V, H::TimerMisc),
    reg(ptimer::CLOCK_DIV, "PTIMER.CLOCK_DIV", V, H::TimerMisc),
    reg(ptimer::CLOCK_MUL, "PTIMER.CLOCK_MUL", V, H::TimerMisc),
    reg(ptimer::TIME_LOW, "PTIMER.TIME_LOW", F, H::Time),
    reg(ptimer::TIME_HIGH, "PTIMER.TIME_HIGH", F, H::Time),
    reg(ptimer::ALARM, "PTIMER.ALARM", V, H::TimerMisc),
    reg(pfb::FBP_COUNT, "PBUS.FBP_COUNT", V, H::FbSize),
    reg(pfb::FBP_DISABLE_MASK, "PBUS.FBP_DISABLE_MASK", V, H::FbSize),
    range(
        pfifo::PBDMA_BASE,
        pfifo::PBDMAS * pfifo::PBDMA_STRIDE,
        "PSUBFIFO[3] (PBDMA)",
        V,
        H::Pbdma,
    ),
    reg(pbus::PFLUSH, "PFLUSH", V, H::Pflush),
    range(
        gf100::pci::BAR0_MIRROR,
        pmc::MSI_REARM - gf100::pci::BAR0_MIRROR,
        "PPCI (config-space mirror, read-only)",
        V,
        H::PciMirror,
    ),
    reg(pmc::MSI_REARM, "PPCI.MSI_REARM", V, H::MsiRearm),
    range(
        pmc::MSI_REARM + 4,
        gf100::pci::BAR0_MIRROR + gf100::pci::BAR0_MIRROR_SIZE - pmc::MSI_REARM - 4,
        "PPCI (config-space mirror, read-only)",
        V,
        H::PciMirror,
    ),
    reg(
        pffb::SYSMEM_FLUSH_PAGE,
        "PFFB.SYSMEM_FLUSH_PAGE",
        V,
        H::SysmemFlushPage,
    ),
    reg(pffb::VM_CFG, "PFFB.VM.CFG", V, H::VmCfg),
    reg(
        pffb::TLB_FLUSH_PAGE,
        "PFFB.VM.TLB_FLUSH_PAGE",
        V,
        H::TlbFlushArgs,
    ),
    reg(
        pffb::TLB_FLUSH_VSPACE,
        "PFFB.VM.TLB_FLUSH_VSPACE",
        V,
        H::TlbFlushArgs,
    ),
    reg(
        pffb::TLB_FLUSH_TRIGGER,
        "PFFB.VM.TLB_FLUSH_TRIGGER",
        S,
        H::TlbFlushTrigger,
    ),
    reg(pfb::fbpa_amount(0), "PBFB[0].AMOUNT", V, H::FbSize),
    reg(pfb::fbpa_amount(1), "PBFB[1].AMOUNT", V, H::FbSize),
    reg(pfb::fbpa_amount(2), "PBFB[2].AMOUNT", V, H::FbSize),
    reg(pfb::fbpa_amount(3), "PBFB[3].AMOUNT", V, H::FbSize),
    reg(pfb::fbpa_amount(4), "PBFB[4].AMOUNT", V, H::FbSize),
    reg(pfb::fbpa_amount(5), "PBFB[5].AMOUNT", V, H::FbSize),
    denied(0x610000, 0x10000, "PDISPLAY"),
    range(
        pbus::PRAMIN_BASE,
        pbus::PRAMIN_SIZE,
        "PMEM (PRAMIN window)",
        S,
        H::Pramin,
    ),
    range(
        PV_BASE,
        gf100::pv::SIZE,
        "GPUVM_PV (para-virtual interface)",
        V,
        H::Paravirt,
    ),
];

/// The regions a real driver (nouveau) needs at probe beyond the ones above: the VBIOS window,
/// board registers, the PMU and the virtual PGRAPH (`vgpu::vboard`). Sorted, non-overlapping,
/// and disjoint from [`BAR0_REGIONS`] (tested).
pub static BOARD_REGIONS: &[Region] = {
    use gf100::board::{self as b, pgraph, pmu};
    &[
        reg(
            b::PMC_UNK260,
            "PMC 0x260 (GR ctx generation, stored)",
            V,
            H::Board,
        ),
        reg(
            b::PMC_INTR_MASK_NRHOST,
            "PMC.INTR_MASK_NRHOST (stored)",
            V,
            H::Board,
        ),
        reg(b::PBUS_INTR, "PBUS.INTR (no bus error)", V, H::Board),
        reg(b::PBUS_INTR_EN, "PBUS.INTR_EN", V, H::Board),
        range(
            b::ENGINE_STATUS,
            0x40,
            "PFIFO.ENGINE_STATUS[16]",
            V,
            H::Board,
        ),
        reg(
            b::PFIFO_RUNLIST_INTR_EN,
            "PFIFO runlist interrupt enable (stored)",
            V,
            H::Board,
        ),
        reg(
            b::PTIMER_SOURCE_DIV,
            "PTIMER source divider (stored)",
            V,
            H::Board,
        ),
        range(
            b::PGPIO_BASE,
            b::BLOCK,
            "PGPIO / PLLs (read 0)",
            V,
            H::Board,
        ),
        range(b::PTHERM_BASE, b::BLOCK, "PTHERM", V, H::Board),
        range(b::FUSE_BASE, b::BLOCK, "FUSE", V, H::Board),
        reg(b::PUNITS_BASE, "PUNITS fuse access (stored)", V, H::Board),
        reg(b::POSTED, "PBUS.POSTED (devinit done)", V, H::Board),
        reg(b::PUNITS_PCIE, "PUNITS PCIe version (1.x)", V, H::Board),
        range(
            b::PUNITS_GPC_MAX,
            8,
            "PUNITS GPC/TPC maxima (the VM's topology)",
            V,
            H::Board,
        ),
        reg(b::UNITS_DISABLED, "FUSE.UNITS_DISABLED", V, H::Board),
        reg(b::LTC_INVALIDATE, "LTC.INVALIDATE", V, H::Board),
        reg(b::LTC_FLUSH, "LTC.FLUSH", V, H::Board),
        reg(b::LTC_COUNT, "PFFB LTC count", V, H::Board),
        reg(b::STRAP, "PEXTDEV.STRAP", V, H::Board),
        range(
            b::pcopy::PCOPY0,
            b::BLOCK,
            "PCOPY0 falcon (CE firmware interface, high-level)",
            V,
            H::Board,
        ),
        range(
            pmu::BASE,
            0x1000,
            "PDAEMON (PMU host interface, high-level)",
            V,
            H::Pmu,
        ),
        range(
            b::PRIVRING_BASE,
            b::PRIVRING_BLOCKS * b::BLOCK,
            "PRIVRING (master, interrupts, timeouts)",
            V,
            H::Board,
        ),
        range(b::MPLL_BASE, b::BLOCK, "MPLL (read 0)", V, H::Board),
        range(b::PCLOCK_BASE, b::BLOCK, "PCLOCK (read 0)", V, H::Board),
        range(b::LTC_BASE, b::BLOCK, "LTC broadcast", V, H::Board),
        range(
            gf100::vbios::PROM_BASE,
            gf100::vbios::PROM_SIZE,
            "PROM (generated VBIOS, read-only)",
            V,
            H::Prom,
        ),
        range(
            pgraph::BASE,
            pgraph::END - pgraph::BASE,
            "PGRAPH (virtual, per VM; FECS/GPCCS high-level)",
            V,
            H::Pgraph,
        ),
        range(0x601000, 0x1000, "PRMCIO (VGA CRTC ports)", V, H::VgaPorts),
    ]
};

/// Looks up the region containing `offset`, if any.
pub fn lookup(offset: u32) -> Option<&'static Region> {
    for table in [BAR0_REGIONS, BOARD_REGIONS] {
        let i = table.partition_point(|r| r.end() <= offset);
        if let Some(r) = table.get(i).filter(|r| r.contains(offset)) {
            return Some(r);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_non_overlapping() {
        for w in BAR0_REGIONS.windows(2) {
            assert!(
                w[0].end() <= w[1].offset,
                "{} overlaps {}",
                w[0].name,
                w[1].name
            );
        }
        for r in BAR0_REGIONS {
            assert!(
                r.size > 0 && r.size % 4 == 0 && r.offset % 4 == 0,
                "{}",
                r.name
            );
            assert!(u64::from(r.end()) <= gf100::pci::BAR0_SIZE, "{}", r.name);
            assert_eq!(
                r.handler.is_none(),
                r.policy == Policy::Denied,
                "{}",
                r.name
            );
        }
    }

    #[test]
    fn board_table_is_sorted_and_disjoint_from_the_main_one() {
        for w in BOARD_REGIONS.windows(2) {
            assert!(
                w[0].end() <= w[1].offset,
                "{} overlaps {}",
                w[0].name,
                w[1].name
            );
        }
        for b in BOARD_REGIONS {
            assert!(
                b.handler.is_some() && b.offset % 4 == 0 && b.size % 4 == 0,
                "{}",
                b.name
            );
            assert!(u64::from(b.end()) <= gf100::pci::BAR0_SIZE, "{}", b.name);
            for r in BAR0_REGIONS {
                assert!(
                    b.end() <= r.offset || r.end() <= b.offset,
                    "{} overlaps {}",
                    b.name,
                    r.name
                );
            }
        }
    }

    #[test]
    fn lookup_finds_registers_and_denies_the_rest() {
        assert_eq!(lookup(pmc::BOOT_0).unwrap().handler, Some(Handler::Boot0));
        assert_eq!(
            lookup(pfifo::chan_state(127)).unwrap().handler,
            Some(Handler::ChannelTable)
        );
        assert_eq!(
            lookup(pfifo::vm_fault(31, 0xc)).unwrap().handler,
            Some(Handler::FaultReports)
        );
        assert_eq!(
            lookup(pbus::PRAMIN_BASE + 0xffffc).unwrap().handler,
            Some(Handler::Pramin)
        );
        assert_eq!(
            lookup(pfb::fbpa_amount(5)).unwrap().handler,
            Some(Handler::FbSize)
        );
        // PGRAPH is the per-VM virtual PGRAPH: absorbed, never forwarded.
        assert_eq!(lookup(0x400700).unwrap().handler, Some(Handler::Pgraph));
        assert_eq!(lookup(0x300000).unwrap().handler, Some(Handler::Prom));
        assert_eq!(lookup(0x10a4d0).unwrap().handler, Some(Handler::Pmu));
        // Offsets between known registers are unknown, i.e. denied by default.
        assert!(lookup(0x000008).is_none());
        assert!(lookup(pfifo::CHAN_TABLE + pfifo::CHANNELS * 8).is_none());
        assert!(lookup(0x01ff_fffc).is_none());
    }
}
