//! Recorded MMIO traces (issue 6): the Linux mmiotrace text format with gpuvm side records
//! ([`format`], spec in `docs/trace-format.md`), recording sessions (the in-process HAL wrapper is in `gpuvm-harness`)
//! ([`record`]), deterministic replay against a fresh `gpuvm::host::GpuHost` on the simulated
//! clock ([`replay`]) and fault injection with an invariant checker ([`inject`]).

pub mod compress;
pub mod format;
pub mod inject;
pub mod record;
pub mod replay;

pub use format::{Event, Header, Op, ParseError, Trace};
pub use record::{Session, TapRecorder};
