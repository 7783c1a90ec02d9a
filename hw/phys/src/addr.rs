//! Newtypes for the address spaces a GPU device model juggles, so that mixing them up is a
//! compile error (DESIGN §4).
//!
//! - [`Gpa`]: guest physical address, an address in a VM's RAM.
//! - [`GuestVram`]: what a guest writes into PTEs, PDEs and instance pointers: 0..its VRAM size.
//! - [`HostVram`]: an address in the physical GPU's VRAM (guest VRAM + the VM's slice base).
//! - [`Iova`]: the bus address the physical GPU uses to reach system memory (a DMA window).
//! - [`GpuVa`]: a 40-bit GPU virtual address, per page directory.

use core::fmt;

macro_rules! address_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub u64);

        impl $name {
            /// The raw address.
            pub const fn raw(self) -> u64 {
                self.0
            }

            /// The address `off` bytes further, or `None` on overflow.
            pub const fn checked_add(self, off: u64) -> Option<Self> {
                match self.0.checked_add(off) {
                    Some(v) => Some(Self(v)),
                    None => None,
                }
            }

            /// The address `off` bytes further (wrapping is a bug: panics in debug builds).
            pub const fn offset(self, off: u64) -> Self {
                Self(self.0 + off)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

address_newtype!(
    /// Guest physical address (an address in a VM's RAM).
    Gpa
);
address_newtype!(
    /// Guest VRAM address: what a guest writes into its PTEs/PDEs/instance pointers.
    GuestVram
);
address_newtype!(
    /// Host (physical GPU) VRAM address.
    HostVram
);
address_newtype!(
    /// Bus address through which the physical GPU reaches system memory.
    Iova
);
address_newtype!(
    /// GPU virtual address (40 bits, per page directory).
    GpuVa
);
