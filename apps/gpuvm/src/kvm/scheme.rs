//! The virtualization schemes of GPUvm's overhead figure as the KVM VMM runs them
//! (`gpuvm run --kvm --scheme ...`, `gpuvm exp overhead --kvm`):
//!
//! - `native`: one VM, the device in pass-through mode: the guest's BAR accesses go straight to
//!   the physical (simulated) GPU, guest RAM is mapped for DMA at IOVA = GPA; no device model,
//!   no shadowing, no scheduler ([`super::passthrough`]).
//! - `fv-naive`: every BAR access traps, eager shadowing (GPUvm's "FV naive").
//! - `fv`: BAR remap ([`super::remap`]) + lazy shadowing.
//! - `pv`: BAR remap + the para-virtual page-table interface.

use gpuvm::profile::ShadowMode;

/// A scheme (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvmScheme {
    /// Pass-through baseline: no device model.
    Native,
    /// Every BAR access traps; eager shadow page tables.
    FvNaive,
    /// BAR remap; lazy shadow page tables.
    Fv,
    /// BAR remap; para-virtual page-table updates.
    Pv,
}

impl KvmScheme {
    /// Every scheme, in the order reported.
    pub const ALL: [KvmScheme; 4] = [
        KvmScheme::Native,
        KvmScheme::FvNaive,
        KvmScheme::Fv,
        KvmScheme::Pv,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            KvmScheme::Native => "native",
            KvmScheme::FvNaive => "fv-naive",
            KvmScheme::Fv => "fv",
            KvmScheme::Pv => "pv",
        }
    }

    /// The shadow mode of the vGPU (`None` for native: there is no vGPU).
    pub fn shadow(self) -> Option<ShadowMode> {
        match self {
            KvmScheme::Native => None,
            KvmScheme::FvNaive => Some(ShadowMode::Eager),
            KvmScheme::Fv => Some(ShadowMode::Lazy),
            KvmScheme::Pv => Some(ShadowMode::Pv),
        }
    }

    /// True if BAR1/BAR3 pages are mapped into the guest with KVM memory slots.
    pub fn remaps(self) -> bool {
        matches!(self, KvmScheme::Fv | KvmScheme::Pv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_are_what_the_issue_says() {
        assert_eq!(KvmScheme::FvNaive.shadow(), Some(ShadowMode::Eager));
        assert!(!KvmScheme::FvNaive.remaps() && !KvmScheme::Native.remaps());
        assert!(KvmScheme::Fv.remaps() && KvmScheme::Pv.remaps());
        assert_eq!(KvmScheme::Pv.shadow(), Some(ShadowMode::Pv));
        assert_eq!(KvmScheme::Native.shadow(), None);
        let names: Vec<_> = KvmScheme::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["native", "fv-naive", "fv", "pv"]);
    }
}
