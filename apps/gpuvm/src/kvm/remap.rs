//! BAR remap under KVM (GPUvm's BAR-remap optimization, `--scheme fv` and `pv`): the pages of
//! the guest's BAR1/BAR3 windows that the device model's direct-map plan
//! ([`gpuvm::vgpu::Vgpu::direct_map`]) allows are KVM memory slots over the simulated GPU's VRAM
//! mapping ([`gpuvm::phys::PhysicalGpu::vram_backing`]), so guest loads and stores there never
//! exit. Pages the model must see writes to (instance blocks, write-tracked page tables,
//! read-only PTEs) are `KVM_MEM_READONLY` slots: reads stay in the guest, a write exits as MMIO
//! and is handled by the model as before. Everything else in the windows (the USERD poll area,
//! unmapped or foreign pages) keeps trapping.
//!
//! After every exit the VMM calls [`Remap::update`]: a cheap generation check, and when the
//! plan's generation or the BAR windows moved, the slots are re-read and changed (stale slots
//! deleted first, so slots never overlap). Slots are limited by `KVM_CAP_NR_MEMSLOTS`; runs
//! beyond the limit keep trapping and are counted. Without `KVM_CAP_READONLY_MEM` the
//! read-only runs keep trapping (counted too).

use gpuvm::phys::{Bar, VramBacking};
use gpuvm::vgpu::{DirectMap, Vgpu};
use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_READONLY};
use kvm_ioctls::{Cap, Kvm, VmFd};
use serde::Serialize;

use super::mmio::BarWindows;

/// Memory slot 0 is guest RAM; remap slots start here.
const FIRST_SLOT: u32 = 1;

/// Counters of one VM's BAR remap.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct RemapStats {
    /// Times the slots were re-applied (plan generation or BAR windows moved).
    pub remaps: u64,
    /// Memory slots in use at the last remap.
    pub slots: u64,
    /// Most slots in use at once.
    pub max_slots: u64,
    /// Pages mapped at the last remap (read-only ones included).
    pub pages_mapped: u64,
    /// Of those, pages mapped read-only (writes exit).
    pub pages_read_only: u64,
    /// Most pages mapped at once.
    pub max_pages_mapped: u64,
    /// Most pages mapped read-only at once.
    pub max_pages_read_only: u64,
    /// Pages the plan allowed that kept trapping because the slot limit was reached (last
    /// remap).
    pub pages_over_slot_limit: u64,
    /// Read-only pages that kept trapping because KVM lacks `KVM_CAP_READONLY_MEM` (last
    /// remap).
    pub pages_readonly_unsupported: u64,
    /// KVM_SET_USER_MEMORY_REGION calls that failed (the run then keeps trapping there).
    pub slot_errors: u64,
    /// Wall time spent re-reading plans and changing slots, ns.
    pub remap_ns: u64,
    /// Slots created or deleted (KVM_SET_USER_MEMORY_REGION calls).
    pub slot_changes: u64,
    /// Slot limit of this KVM (`KVM_CAP_NR_MEMSLOTS`).
    pub slot_limit: u64,
    /// KVM supports read-only slots.
    pub readonly_supported: bool,
    /// Guest writes that exited from a page mapped by a read-only slot (and went to the device
    /// model): proof that such a write traps instead of landing in VRAM behind the model's back.
    pub read_only_write_exits: u64,
}

/// One KVM memory slot over VRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    gpa: u64,
    len: u64,
    host: u64,
    read_only: bool,
}

/// The remap state of one VM.
pub struct Remap {
    vram: VramBacking,
    readonly_ok: bool,
    limit: u32,
    /// (plan generation, BAR1 base, BAR3 base) last applied.
    applied: Option<(u64, Option<u64>, Option<u64>)>,
    /// Slot id -> slot, for the slots in use.
    slots: Vec<(u32, Slot)>,
    /// The counters.
    pub stats: RemapStats,
}

impl Remap {
    /// Remap for one VM over `vram`, with this KVM's slot limit and read-only support.
    pub fn new(kvm: &Kvm, vram: VramBacking) -> Remap {
        let readonly_ok = kvm.check_extension(Cap::ReadonlyMem);
        let limit = u32::try_from(kvm.get_nr_memslots()).unwrap_or(u32::MAX);
        Remap {
            vram,
            readonly_ok,
            limit,
            applied: None,
            slots: Vec::new(),
            stats: RemapStats {
                slot_limit: u64::from(limit),
                readonly_supported: readonly_ok,
                ..RemapStats::default()
            },
        }
    }

    /// Brings the slots in line with the vGPU's plan and the decoded BAR windows; a no-op (one
    /// generation read) when neither moved.
    pub fn update(&mut self, vm: &VmFd, vgpu: &Vgpu, windows: &BarWindows) {
        let key = (
            vgpu.direct_map_generation(),
            windows.base(Bar::Bar1),
            windows.base(Bar::Bar3),
        );
        if self.applied == Some(key) {
            return;
        }
        self.applied = Some(key);
        self.stats.remaps += 1;
        let t0 = std::time::Instant::now();
        let mut want = Vec::new();
        let (mut pages, mut ro_pages, mut ro_unsupported) = (0u64, 0u64, 0u64);
        for (bar, base) in [(Bar::Bar1, key.1), (Bar::Bar3, key.2)] {
            let Some(base) = base else { continue };
            let plan: DirectMap = vgpu.direct_map(bar);
            for run in &plan.runs {
                let n = run.len / gf100::PAGE_SIZE;
                if run.read_only && !self.readonly_ok {
                    ro_unsupported += n;
                    continue;
                }
                // The plan only names the VM's own slice; check it against the mapping anyway.
                let inside = run
                    .host
                    .raw()
                    .checked_add(run.len)
                    .is_some_and(|end| end <= self.vram.len)
                    && run
                        .offset
                        .checked_add(run.len)
                        .is_some_and(|e| e <= bar.size());
                if !inside {
                    log::warn!("remap: run {run:?} of {bar:?} is outside VRAM: kept trapping");
                    continue;
                }
                want.push(Slot {
                    gpa: base + run.offset,
                    len: run.len,
                    host: self.vram.host_addr + run.host.raw(),
                    read_only: run.read_only,
                });
                pages += n;
                if run.read_only {
                    ro_pages += n;
                }
            }
        }
        // Delete the slots no longer wanted (before adding any: slots must never overlap).
        let mut kept = Vec::new();
        for (id, s) in std::mem::take(&mut self.slots) {
            if want.contains(&s) {
                kept.push((id, s));
            } else {
                self.set(vm, id, None);
            }
        }
        self.slots = kept;
        let budget = self.limit.saturating_sub(FIRST_SLOT) as usize;
        let mut over = 0u64;
        for s in want {
            if self.slots.iter().any(|(_, k)| *k == s) {
                continue;
            }
            if self.slots.len() >= budget {
                over += s.len / gf100::PAGE_SIZE;
                continue;
            }
            let id = (FIRST_SLOT..)
                .find(|i| self.slots.iter().all(|(k, _)| k != i))
                .unwrap_or(FIRST_SLOT);
            if self.set(vm, id, Some(s)) {
                self.slots.push((id, s));
            } else {
                over += s.len / gf100::PAGE_SIZE;
            }
        }
        self.stats.slots = self.slots.len() as u64;
        self.stats.max_slots = self.stats.max_slots.max(self.stats.slots);
        self.stats.pages_mapped = pages - over;
        self.stats.pages_read_only = ro_pages;
        self.stats.max_pages_mapped = self.stats.max_pages_mapped.max(pages - over);
        self.stats.max_pages_read_only = self.stats.max_pages_read_only.max(ro_pages);
        self.stats.pages_over_slot_limit = over;
        self.stats.pages_readonly_unsupported = ro_unsupported;
        self.stats.remap_ns += t0.elapsed().as_nanos() as u64;
    }

    /// Counts a guest MMIO write exit at `gpa` that falls in one of the read-only slots in use.
    pub fn note_write(&mut self, gpa: u64) {
        if self
            .slots
            .iter()
            .any(|(_, s)| s.read_only && gpa >= s.gpa && gpa - s.gpa < s.len)
        {
            self.stats.read_only_write_exits += 1;
        }
    }

    /// Removes every slot (the VM's BARs are gone or the VM ends).
    pub fn clear(&mut self, vm: &VmFd) {
        for (id, _) in std::mem::take(&mut self.slots) {
            self.set(vm, id, None);
        }
        self.applied = None;
    }

    /// Creates (`Some`) or deletes (`None`) slot `id`; false if KVM refused.
    fn set(&mut self, vm: &VmFd, id: u32, s: Option<Slot>) -> bool {
        self.stats.slot_changes += 1;
        let r = match s {
            Some(s) => kvm_userspace_memory_region {
                slot: id,
                flags: if s.read_only { KVM_MEM_READONLY } else { 0 },
                guest_phys_addr: s.gpa,
                memory_size: s.len,
                userspace_addr: s.host,
            },
            None => kvm_userspace_memory_region {
                slot: id,
                ..Default::default()
            },
        };
        // SAFETY: a new slot maps `[s.host, s.host + s.len)`, which lies inside the simulated
        // GPU's VRAM mapping (checked against `vram.len` above); that mapping lives as long as
        // the `SimGpu`, which outlives every VM thread (`run_kvm` joins them before dropping it)
        // and every slot is deleted (`clear`) before the VM ends. Deleting a slot (size 0) maps
        // nothing.
        match unsafe { vm.set_user_memory_region(r) } {
            Ok(()) => true,
            Err(e) => {
                self.stats.slot_errors += 1;
                log::warn!("remap: KVM_SET_USER_MEMORY_REGION slot {id} {s:?}: {e}");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpuvm::host::{GpuHost, HostConfig};
    use gpuvm::phys::PhysicalGpu;
    use gpuvm::profile::{ShadowMode, VgpuProfile};
    use gpuvm_sim::{SimConfig, SimGpu};

    use super::*;
    use crate::kvm::device::LocalVgpu;
    use crate::kvm::pci::PciBus;

    fn cfg32(v: &Vgpu, off: u16, val: u32) {
        v.config_write(off, &val.to_le_bytes());
    }

    /// Places BAR0/BAR1/BAR3 like the guest does (BAR1 at `bar1`) with memory decoding on or
    /// off, and returns the decoded windows.
    fn place(v: &Arc<Vgpu>, sim: &Arc<SimGpu>, bar1: u32, memory: bool) -> BarWindows {
        cfg32(v, 0x10, 0xcc00_0000);
        cfg32(v, 0x14, bar1);
        cfg32(v, 0x18, 0);
        cfg32(v, 0x1c, 0xc800_0000);
        cfg32(v, 0x20, 0);
        cfg32(v, 0x04, if memory { 0x6 } else { 0 });
        BarWindows::from_config(&PciBus::new(Arc::new(LocalVgpu::new(
            v.clone(),
            sim.clone(),
        ))))
    }

    // BAR moves and memory decoding turned off must drop the slots at the old addresses.
    #[test]
    fn slots_follow_the_bar_windows() {
        let Ok(kvm) = crate::kvm::open_kvm() else {
            println!("SKIPPED: /dev/kvm not available: slots_follow_the_bar_windows");
            return;
        };
        let vm = kvm.create_vm().expect("KVM_CREATE_VM");
        let sim = Arc::new(SimGpu::new(SimConfig {
            vram_size: 1 << 30,
            ..SimConfig::default()
        }));
        let host = GpuHost::new(sim.clone(), HostConfig::default()).expect("host");
        let v = host
            .create_vgpu(&VgpuProfile {
                name: "t".into(),
                vram_mib: 256,
                channels: 4,
                weight: 1,
                shadow: ShadowMode::Lazy,
            })
            .expect("vgpu");
        let mut r = Remap::new(
            &kvm,
            sim.vram_backing().expect("simulated VRAM is mappable"),
        );
        let slice = v.vram_slice().base.raw();
        let slots = |r: &Remap| -> Vec<(u64, u64, u64)> {
            let mut s: Vec<_> = r
                .slots
                .iter()
                .map(|(_, s)| (s.gpa, s.len, s.host - r.vram.host_addr - slice))
                .collect();
            s.sort();
            s
        };
        // Unbound BARs are in direct mode: the whole windows map the start of the slice.
        r.update(&vm, &v, &place(&v, &sim, 0xc000_0000, true));
        assert_eq!(
            slots(&r),
            [(0xc000_0000, 128 << 20, 0), (0xc800_0000, 64 << 20, 0)]
        );
        assert_eq!(r.stats.slot_errors, 0);
        let remaps = r.stats.remaps;
        r.update(&vm, &v, &place(&v, &sim, 0xc000_0000, true));
        assert_eq!(r.stats.remaps, remaps, "nothing moved: no remap");
        // The guest moves BAR1.
        r.update(&vm, &v, &place(&v, &sim, 0xd000_0000, true));
        assert_eq!(
            slots(&r),
            [(0xc800_0000, 64 << 20, 0), (0xd000_0000, 128 << 20, 0)]
        );
        // Memory decoding off: nothing stays mapped.
        r.update(&vm, &v, &place(&v, &sim, 0xd000_0000, false));
        assert!(slots(&r).is_empty());
        assert_eq!(r.stats.slot_errors, 0);
        assert_eq!(r.stats.max_slots, 2);
        r.clear(&vm);
        host.destroy_vgpu(&v).expect("destroy");
    }
}
