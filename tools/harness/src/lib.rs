//! The in-process harness: runs the shared guest driver (`gpuvm-guest`) inside this process,
//! against the bare simulated GPU ("native", the baseline every virtualized run is compared to)
//! and against virtual GPUs sharing one simulated GPU ("virt", one thread per VM). Used by the
//! `gpuvm` command, the integration tests and the trace recorder.

#![deny(missing_docs)]

pub mod cpu;
pub mod exp_isolation;
pub mod exp_lockhold;
pub mod exp_overhead;
pub mod exp_traps;
pub mod gpu_spec;
pub mod hal;
pub mod mem;
pub mod movable;
pub mod native;
pub mod record;
pub mod soak;
pub mod virt;

pub use exp_isolation::{run_isolation, IsolationOptions, IsolationReport};
pub use exp_lockhold::{run_lockhold, LockholdOptions, LockholdReport, LockholdScenario};
pub use exp_traps::{run_traps, TrapsOptions, TrapsReport};
pub use gpu_spec::{open, GpuSpec};
pub use hal::{BareGpu, InProcessDevice, InProcessHal, MmioCounts};
pub use movable::MovableVgpu;
pub use native::{run_native, NativeHal, NativeOptions, NativeReport, WorkloadRun};
pub use record::RecordingHal;
pub use virt::{run_vms, VirtError, VirtHal, VirtOptions, VirtReport, VmReport};
