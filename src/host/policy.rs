//! Run-time scheduling settings of a running host: a VM's weight and cap, and the policy
//! itself (`docs/scheduling.md` §12-13; `gpuvm ctl weight|cap|policy`). Each takes effect from
//! the next service of the GPU, within one time slice.

use crate::host::{GpuHost, HostError};
use crate::sched::{Policy, SchedParams, VmId};

impl GpuHost {
    /// Changes a VM's scheduling weight (1-100) at run time: its share is recomputed with the
    /// others' from now on. Refused (nothing changed) for an unknown VM, a weight out of range
    /// or a policy without weights.
    pub fn set_vm_weight(&self, vm: VmId, weight: u32) -> Result<(), HostError> {
        if !(1..=100).contains(&weight) {
            return Err(HostError::Config(format!("weight {weight} must be 1-100")));
        }
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        let now = st.now(&*self.shared.phys);
        if !st.vms.contains_key(&vm) {
            return Err(HostError::NoSuchVm(vm));
        }
        if !st.sched.set_weight(vm, weight, now) {
            return Err(HostError::Config(format!(
                "the {} policy does not use weights",
                st.sched.name()
            )));
        }
        st.acct.set_weight(vm, weight);
        if let Some(mut v) = st.vms.get_mut(&vm) {
            v.profile.weight = weight;
        }
        Ok(())
    }

    /// Sets (parts per million of GPU time) or clears a VM's cap at run time. Refused (nothing
    /// changed) for an unknown VM, a cap out of range or a policy without caps.
    pub fn set_vm_cap(&self, vm: VmId, cap_ppm: Option<u32>) -> Result<(), HostError> {
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        let now = st.now(&*self.shared.phys);
        if !st.vms.contains_key(&vm) {
            return Err(HostError::NoSuchVm(vm));
        }
        st.sched
            .set_cap(vm, cap_ppm, now)
            .map_err(HostError::Config)?;
        if let Some(mut v) = st.vms.get_mut(&vm) {
            v.cap_ppm = cap_ppm;
        }
        Ok(())
    }

    /// Replaces the scheduling policy at run time, while VMs exist and run. The new policy
    /// gets every VM with its weight and the cap set for it; queued work is handed to it
    /// (each channel with work the GPU has not been given is queued again); work in flight
    /// stays and completes into the new policy. It decides from the next service on, so the
    /// change takes effect within one time slice. Refused (nothing changed) for invalid
    /// parameters.
    pub fn set_policy(&self, policy: Policy, params: &SchedParams) -> Result<(), HostError> {
        params.validate().map_err(HostError::Config)?;
        let mut guard = self.shared.lock();
        let st = &mut *guard;
        let phys = &*self.shared.phys;
        let now = st.now(phys);
        let mut sched = policy.create(params);
        for vm in st.vms.values() {
            sched.add_vm(vm.id, vm.profile.weight, now);
            if let Some(cap) = vm.cap_ppm {
                sched
                    .set_cap(vm.id, Some(cap), now)
                    .map_err(HostError::Config)?;
            }
        }
        let old = std::mem::replace(&mut st.sched, sched);
        st.sched_timer = None;
        let chans: Vec<(VmId, u32)> = st
            .vms
            .values()
            .flat_map(|vm| (0..vm.nchan()).map(move |g| (vm.id, g)))
            .collect();
        for (id, g) in chans {
            let in_flight = st
                .inflight
                .iter()
                .any(|f| f.sub.vm == id && f.sub.guest_chid == g);
            let newer = st.vms.get(&id).is_some_and(|vm| {
                vm.chans
                    .get(g as usize)
                    .is_some_and(|c| c.gp_put != c.phys_put)
            });
            if !in_flight || newer {
                crate::host::dispatch::doorbell(st, phys, id, g);
            }
        }
        log::info!(
            "scheduling policy {} -> {} ({} VMs)",
            old.name(),
            st.sched.name(),
            st.vms.len()
        );
        st.service(phys, &self.shared.irq, &self.shared.cfg);
        Ok(())
    }

    /// The cap in force for a VM (ppm) and whether its work is held back by it now.
    pub fn vm_cap(&self, vm: VmId) -> (Option<u32>, bool) {
        let st = self.shared.lock();
        (st.sched.cap_ppm(vm), st.sched.throttled(vm))
    }
}
