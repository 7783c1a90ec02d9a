//! Per-VM counters (`VgpuStats`, serde): exits by BAR and by trap class, violations by kind,
//! doorbells and submissions, interrupts delivered, and the VM's shadow page-table counters —
//! the "Events/metrics" side of the device in vm-superio's terms, and what `gpuvm run` reports.

use serde::Serialize;

use crate::guest_mem::Violation;
use crate::mmio::regions::Policy;
use crate::shadow_pt::ShadowStats;

/// Reads and writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RwCount {
    /// Reads.
    pub reads: u64,
    /// Writes.
    pub writes: u64,
}

impl RwCount {
    /// Counts one access.
    pub fn count(&mut self, write: bool) {
        if write {
            self.writes += 1;
        } else {
            self.reads += 1;
        }
    }

    /// Reads plus writes.
    pub fn total(&self) -> u64 {
        self.reads + self.writes
    }
}

/// Exits (trapped accesses) by BAR.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BarExits {
    /// BAR0 registers (and the PRAMIN window).
    pub bar0: RwCount,
    /// BAR1 aperture.
    pub bar1: RwCount,
    /// BAR3 aperture.
    pub bar3: RwCount,
}

impl BarExits {
    /// All exits.
    pub fn total(&self) -> u64 {
        self.bar0.total() + self.bar1.total() + self.bar3.total()
    }
}

/// Exits by what the device model did with them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ExitsByClass {
    /// BAR0 registers emulated from per-VM state.
    #[serde(rename = "virtual")]
    pub virtual_: RwCount,
    /// BAR0 registers translated and applied (channel table, runlist, TLB flush, PRAMIN, ...).
    pub shadowed: RwCount,
    /// BAR0 registers passed to the GPU (the time).
    pub forwarded: RwCount,
    /// BAR0 registers known and refused.
    pub denied: RwCount,
    /// BAR0 offsets the model does not know (deny by default).
    pub unknown: RwCount,
    /// BAR1/BAR3 accesses translated through the guest's BAR page tables into its memory.
    pub aperture: RwCount,
    /// BAR1 accesses to the emulated USERD pages (the poll area: doorbells, GP_GET).
    pub userd: RwCount,
}

impl ExitsByClass {
    /// The counter of a BAR0 policy class.
    pub fn policy_mut(&mut self, p: Policy) -> &mut RwCount {
        match p {
            Policy::Virtual => &mut self.virtual_,
            Policy::Shadowed => &mut self.shadowed,
            Policy::Forwarded => &mut self.forwarded,
            Policy::Denied => &mut self.denied,
        }
    }
}

/// What kind of bad value a guest supplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViolationKind {
    /// A guest VRAM address outside the VM's slice.
    VramOutOfSlice,
    /// A system-memory address outside the VM's RAM.
    SysramOutOfRam,
    /// System memory used before guest RAM was attached.
    NoGuestRam,
    /// The invalid memory target (1) or an undecodable pointer.
    InvalidTarget,
    /// A channel id outside the VM's partition (channel table, kick, USERD, runlist).
    ForeignChannel,
    /// A runlist entry dropped (foreign or out of range).
    RunlistEntry,
    /// A write to a denied register.
    DeniedRegister,
    /// An access of a width or alignment the register file does not support.
    BadAccess,
    /// A para-virtual batch that is too large or not in guest RAM.
    PvBatch,
    /// An instance block whose page-directory base or USERD pointer is invalid.
    InstanceBlock,
    /// A write the model drops: a USERD word other than GP_PUT (GP_GET, REFERENCE, ...), the
    /// bytes of a BAR fill beyond the end of the BAR.
    DroppedWrite,
    /// A channel bind refused (e.g. with POLL_ENABLE before the guest set its poll area).
    RefusedBind,
}

impl From<Violation> for ViolationKind {
    fn from(v: Violation) -> Self {
        match v {
            Violation::VramOutOfSlice { .. } => ViolationKind::VramOutOfSlice,
            Violation::SysramOutOfRam { .. } => ViolationKind::SysramOutOfRam,
            Violation::NoGuestRam => ViolationKind::NoGuestRam,
            Violation::InvalidTarget => ViolationKind::InvalidTarget,
        }
    }
}

/// Violations by kind. Page-table entries the shadow code rejected are counted in
/// `shadow.violations` and included in `total`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Violations {
    /// All violations, page-table ones included.
    pub total: u64,
    /// Guest VRAM addresses outside the slice.
    pub vram_out_of_slice: u64,
    /// System-memory addresses outside guest RAM.
    pub sysram_out_of_ram: u64,
    /// System memory used without guest RAM.
    pub no_guest_ram: u64,
    /// Invalid targets.
    pub invalid_target: u64,
    /// Channel ids outside the partition.
    pub foreign_channel: u64,
    /// Runlist entries dropped.
    pub runlist_entries: u64,
    /// Writes to denied registers.
    pub denied_register: u64,
    /// Unsupported access widths / alignments.
    pub bad_access: u64,
    /// Bad para-virtual batches.
    pub pv_batch: u64,
    /// Instance blocks with an invalid page-directory base or USERD pointer.
    pub instance_block: u64,
    /// Writes the model dropped (USERD words other than GP_PUT, BAR fills beyond the BAR).
    pub dropped_writes: u64,
    /// Channel binds refused.
    pub refused_binds: u64,
    /// Page-table entries rejected by the shadow page tables.
    pub page_table: u64,
}

impl Violations {
    /// Counts `n` violations of `kind`.
    pub fn add(&mut self, kind: ViolationKind, n: u64) {
        let c = match kind {
            ViolationKind::VramOutOfSlice => &mut self.vram_out_of_slice,
            ViolationKind::SysramOutOfRam => &mut self.sysram_out_of_ram,
            ViolationKind::NoGuestRam => &mut self.no_guest_ram,
            ViolationKind::InvalidTarget => &mut self.invalid_target,
            ViolationKind::ForeignChannel => &mut self.foreign_channel,
            ViolationKind::RunlistEntry => &mut self.runlist_entries,
            ViolationKind::DeniedRegister => &mut self.denied_register,
            ViolationKind::BadAccess => &mut self.bad_access,
            ViolationKind::PvBatch => &mut self.pv_batch,
            ViolationKind::InstanceBlock => &mut self.instance_block,
            ViolationKind::DroppedWrite => &mut self.dropped_writes,
            ViolationKind::RefusedBind => &mut self.refused_binds,
        };
        *c += n;
        self.total += n;
    }
}

/// What the PCI command register and the expansion ROM BAR did to the VM's accesses
/// (`crate::mmio::pci`: decoding and bus mastering as the guest programmed them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PciCounts {
    /// BAR accesses while memory decoding was off (reads answered all-ones, writes dropped).
    pub decode_off: RwCount,
    /// Expansion ROM reads answered with the VBIOS.
    pub rom_reads: u64,
    /// Expansion ROM reads while the ROM BAR was not decoding (answered all-ones).
    pub rom_refused: u64,
    /// Times the guest turned bus mastering off (its DMA windows unmapped: the GPU's accesses
    /// to the VM's RAM master-abort until it is turned on again).
    pub bus_master_off: u64,
}

/// Counters of one vGPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VgpuStats {
    /// PCI command-register and ROM BAR effects.
    pub pci: PciCounts,
    /// Exits by BAR.
    pub exits: BarExits,
    /// Exits by trap class.
    pub by_class: ExitsByClass,
    /// Writes done on the fast path, under the VM's own lock alone (`host::local`): memory
    /// writes through BAR1, BAR3 or the PRAMIN window (page-table, instance-memory and data
    /// writes) and register writes that only store a value; also counted in `exits`.
    pub local_writes: u64,
    /// Polls (`Vgpu::poll`) that found the host with nothing to service and so did nothing,
    /// under the VM's own lock alone (`host::local`).
    pub idle_polls: u64,
    /// Values the guest supplied that were rejected.
    pub violations: Violations,
    /// GP_PUT writes (doorbells) to the guest's USERD pages.
    pub doorbells: u64,
    /// Submissions dispatched to the physical GPU.
    pub submissions: u64,
    /// Submissions the GPU finished (GP_GET reached PUT).
    pub completions: u64,
    /// Submissions that ended otherwise (channel stopped by an error, unbound, parked on a
    /// semaphore acquire, or taken off the GPU by a time slice, a cap or the watchdog with work
    /// left, which is queued again).
    pub aborted: u64,
    /// Submissions held back because their channel was not runnable or not on the runlist
    /// when the scheduler picked them (queued again when the guest enables or lists it).
    pub held_submissions: u64,
    /// Submissions the host preempted: at the end of the VM's time slice while another VM
    /// waited, or because its cap was used up (`crate::host::dispatch`).
    pub preemptions: u64,
    /// Submissions that left the GPU with work left (parked on a semaphore acquire, preempted,
    /// disabled or taken off the runlist) and were queued again when they could run.
    pub resumes: u64,
    /// Engine operations of this VM's channels aborted (engine reset) because the channel was
    /// unbound or the VM destroyed while they ran: nothing of them lands afterwards.
    pub inflight_aborts: u64,
    /// Channels of this VM the host's watchdog killed: a submission was still running
    /// `HostConfig::watchdog_ns` after dispatch (a hung engine).
    pub watchdog_kills: u64,
    /// Guest TLB flushes through the register (0x100cbc).
    pub guest_tlb_flushes: u64,
    /// Guest TLB invalidates found in pushbuffers (host method MEM_OP_B).
    pub mem_op_flushes: u64,
    /// Physical TLB flushes issued for this VM's shadow page directories.
    pub phys_tlb_flushes: u64,
    /// Channel binds accepted.
    pub channel_binds: u64,
    /// Shadow instance blocks refreshed after a guest write to the guest's block.
    pub instance_refreshes: u64,
    /// Host-owned GR contexts created for the VM's channels (`crate::channels::grctx`).
    pub gr_contexts: u64,
    /// Guest runlist submissions.
    pub runlist_submits: u64,
    /// Para-virtual batches submitted.
    pub pv_batches: u64,
    /// MMU faults of the VM's channels delivered to it.
    pub faults_delivered: u64,
    /// MMU faults of the VM's own BAR1/BAR3 accesses (raised by the device model).
    pub bar_faults: u64,
    /// PBDMA errors of the VM's channels delivered to it.
    pub pbdma_errors_delivered: u64,
    /// Non-stall (completion) interrupts delivered.
    pub nonstall_delivered: u64,
    /// The VM's shadow page tables.
    pub shadow: ShadowStats,
}

/// Logs the first few events of a kind and then one in every thousand, so that a hostile guest
/// cannot flood the host's log.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RateLimit {
    seen: u64,
}

impl RateLimit {
    /// Events logged in full before rate limiting starts.
    const BURST: u64 = 16;
    /// After the burst, one event in this many is logged.
    const EVERY: u64 = 1000;

    /// Counts an event; true if it should be logged.
    pub(crate) fn hit(&mut self) -> bool {
        self.seen += 1;
        self.seen <= Self::BURST || self.seen.is_multiple_of(Self::EVERY)
    }

    /// Events seen.
    pub(crate) fn seen(&self) -> u64 {
        self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_add_up_and_classes_map() {
        let mut v = Violations::default();
        v.add(ViolationKind::ForeignChannel, 2);
        v.add(
            ViolationKind::from(Violation::SysramOutOfRam {
                gpa: crate::addr::Gpa(1),
                len: 1,
            }),
            1,
        );
        assert_eq!((v.total, v.foreign_channel, v.sysram_out_of_ram), (3, 2, 1));
        let mut c = ExitsByClass::default();
        c.policy_mut(Policy::Forwarded).count(false);
        c.policy_mut(Policy::Denied).count(true);
        assert_eq!(c.forwarded.reads, 1);
        assert_eq!(c.denied.writes, 1);
        let json = serde_json_like(&c);
        assert!(json.contains("virtual"));
    }

    fn serde_json_like(c: &ExitsByClass) -> String {
        // The crate has no JSON dependency; TOML shows the field names serde produces.
        toml::to_string(c).unwrap_or_default()
    }

    #[test]
    fn rate_limit_logs_a_burst_then_samples() {
        let mut r = RateLimit::default();
        let logged = (0..5000).filter(|_| r.hit()).count();
        assert_eq!(logged, 16 + 5);
        assert_eq!(r.seen(), 5000);
    }
}
