//! Recorded MMIO traces (issue 6): the Linux mmiotrace text format with gpuvm side records
//! ([`format`], spec in `docs/trace-format.md`), a recorder that wraps a VM's driver HAL
//! ([`record`]), deterministic replay against a fresh [`crate::host::GpuHost`] on the simulated
//! clock ([`replay`]) and fault injection with an invariant checker ([`inject`]).

pub mod compress;
pub mod format;
pub mod inject;
pub mod record;
pub mod replay;

pub use format::{Event, Header, Op, ParseError, Trace};
pub use record::{RecordingHal, Session};
