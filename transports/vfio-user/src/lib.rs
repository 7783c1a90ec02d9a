//! A vfio-user server for gpuvm's virtual GPUs: the "A3" aggregator of GPUvm, where one host
//! process owns the GPU and the scheduler and each VM's VMM (a separate process, such as Cloud
//! Hypervisor or `gpuvm run --kvm --vfio-user`) reaches its own vGPU through a Unix socket.
//!
//! - [`regions`]: the vGPU as VFIO PCI regions (BAR0..BAR5, ROM, config space) and interrupts,
//!   and the checks every region access passes.
//! - [`dma`]: guest RAM from the client's DMA_MAP messages (shared file mappings, validated).
//! - [`irq`]: the vGPU's level-triggered line as the INTx or MSI eventfd the client hands over.
//! - [`backend`]: one VM's vGPU behind `vfio_user::ServerBackend`, with reset and teardown.
//! - [`daemon`]: one `GpuHost`, one socket and one thread per VM (added and removed at run
//!   time), an event-driven poller (`event-manager`, a timerfd and an eventfd), shutdown.
//! - [`migration`]: moving a VM's vGPU out of one daemon and into another.
//! - [`traffic`]: per-connection message counts.
//! - [`peer`]: who a VM socket's client is (`SO_PEERCRED`).
//! - [`say`]: the daemon's timestamped log lines.
//! - [`wire`]: raw protocol framing, for tests that send what the `vfio_user` client cannot.
//!
//! Every message a client sends is untrusted. What the `vfio_user` crate itself mishandles is
//! contained per VM (see `docs/vfio-user.md`).
#![deny(missing_docs)]

pub mod backend;
pub mod daemon;
pub mod dma;
pub mod irq;
pub mod migration;
pub mod peer;
pub mod regions;
pub mod say;
pub mod traffic;
pub mod waker;
pub mod wire;

pub use backend::{Holder, VmDevice, VmTotals, UNSEALED_DMA_FIX};
pub use daemon::{Daemon, DaemonConfig, SocketAccess, VmSpec, Waker};
pub use dma::{DmaWindows, DEFAULT_MAX_WINDOW};
pub use migration::MigrationOut;
