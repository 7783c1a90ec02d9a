//! The merged physical runlist (GPUvm's runlist merge): the physical channels of every VM's
//! accepted, bound guest channels, in VM order, written to one of two alternating buffers and
//! submitted whenever a VM's runlist changes or a VM goes away.

use crate::phys::PhysicalGpu;

use super::HostState;

/// Builds the merged physical runlist from every VM's accepted channels and submits it.
pub(crate) fn submit_physical(st: &mut HostState, phys: &dyn PhysicalGpu) {
    let mut entries = Vec::new();
    for vm in st.vms.values() {
        for &g in &vm.runlist {
            if vm.chans.get(g as usize).is_some_and(|c| c.bound.is_some()) {
                entries.push(vm.phys_chid(g));
            }
        }
    }
    let buf = st.layout.runlists[st.runlist_next & 1];
    st.runlist_next ^= 1;
    crate::phys_driver::submit_runlist(phys, buf, &entries);
    st.counters.runlist_submits += 1;
}
