//! Code shared by the integration tests and the benchmarks.

#[allow(dead_code)]
pub mod sim_rig;
#[allow(dead_code)]
pub mod vgpu_rig;
