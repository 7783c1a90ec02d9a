//! A vhost-user PCI back end for gpuvm's virtual GPUs, speaking the protocol of User-Mode
//! Linux's PCI-over-virtio transport (`arch/um/drivers/virt-pci.c`,
//! `include/uapi/linux/virtio_pcidev.h`): an unmodified Linux kernel running as a process
//! sees a Quadro 6000 whose config space and BARs are served by one `Vgpu` on a shared
//! `GpuHost`, with DMA into the kernel's RAM (the vhost-user memory table) and interrupts
//! delivered as INTx or MSI messages. One socket per VM; a disconnect or crash of the guest
//! destroys and scrubs its vGPU and serves a fresh one, as `gpuvm serve` does for vfio-user.
//!
//! Built on rust-vmm's `vhost-user-backend` 0.18 / `vhost` 0.14 / `virtio-queue` 0.14
//! unpatched; the three things UML needs that those crates do not give by default are handled
//! here: SET_MEM_TABLE normalized in front of the crate ([`relay`]), the BACKEND_REQ protocol
//! feature offered and the back-end request channel kept ([`backend`]).

pub mod backend;
pub mod irq;
pub mod relay;
pub mod server;
pub mod wire;

pub use backend::{PciBackend, RegisterUse, VmDevice};
pub use server::{Server, ServerConfig};
