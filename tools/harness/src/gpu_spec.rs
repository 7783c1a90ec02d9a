//! Which physical GPU a command runs on: a [`GpuSpec`] parsed from `sim` or a PCI address, and
//! [`open`], which builds the simulated GF100 or opens a real one through VFIO.

use std::sync::Arc;

use gpuvm_phys::PhysicalGpu;
use gpuvm_sim::SimConfig;
use gpuvm_vfio as vfio;

/// Which physical GPU to run on: `sim` (a simulated GF100) or `vfio:DOMAIN:BUS:DEV.FN` (a real
/// one bound to vfio-pci; the `vfio:` may be left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuSpec {
    /// The simulated GF100.
    Sim,
    /// A real GF100 through VFIO.
    Vfio(vfio::PciAddress),
}

impl std::str::FromStr for GpuSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sim" => Ok(GpuSpec::Sim),
            _ => s
                .strip_prefix("vfio:")
                .unwrap_or(s)
                .parse()
                .map(GpuSpec::Vfio)
                .map_err(|e| format!("{e}; or 'sim'")),
        }
    }
}

/// Opens the physical GPU `spec` names: a new simulated GF100 built from `sim`, or the device
/// at a PCI address through VFIO (with the default sysfs and `/dev/vfio` paths).
pub fn open(spec: GpuSpec, sim: SimConfig) -> Result<Arc<dyn PhysicalGpu>, vfio::OpenError> {
    match spec {
        GpuSpec::Sim => Ok(Arc::new(gpuvm_sim::SimGpu::new(sim))),
        GpuSpec::Vfio(addr) => {
            let dev = vfio::VfioPci::open(addr, &vfio::VfioPaths::default())?;
            Ok(Arc::new(vfio::VfioGpu::new(dev)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuvm_vfio::OpenError;

    #[test]
    fn opening_a_device_on_this_machine_fails_cleanly() {
        // No VFIO here (and on a machine with VFIO, no device at this address): an error, no panic.
        let spec: GpuSpec = "vfio:0000:ff:1f.7".parse().unwrap();
        let Err(e) = open(spec, SimConfig::default()) else {
            panic!("opened a VFIO device that cannot exist here");
        };
        let msg = e.to_string();
        assert!(
            matches!(e, OpenError::NoVfio(_) | OpenError::NoSuchDevice { .. }),
            "{msg}"
        );
        assert!(open("sim".parse().unwrap(), SimConfig::default()).is_ok());
    }

    #[test]
    fn gpu_specs_parse() {
        assert_eq!("sim".parse::<GpuSpec>(), Ok(GpuSpec::Sim));
        assert!("simm".parse::<GpuSpec>().is_err());
        assert!(matches!(
            "0000:01:00.0".parse::<GpuSpec>(),
            Ok(GpuSpec::Vfio(_))
        ));
    }
}
