//! The in-process harness: runs the shared guest driver (`gpuvm-guest`) inside this process,
//! against the bare simulated GPU ("native", the baseline every virtualized run is compared to)
//! and, later, against virtual GPUs. Used by the `gpuvm` command, the integration tests and the
//! trace recorder.

pub mod native;

pub use native::{run_native, NativeHal, NativeOptions, NativeReport, WorkloadRun};
