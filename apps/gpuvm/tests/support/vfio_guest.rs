//! gpuvm's own guest driver run in the test process against one VM of a `gpuvm serve`, over
//! the `vfio_user` crate's client (the same client Cloud Hypervisor and `gpuvm run --kvm
//! --vfio-user` use): BAR accesses are REGION_READ/WRITE messages, guest RAM is a memfd shared
//! with DMA_MAP and also mapped here for the driver's own reads and writes, fences are polled.
//! A client session that really submits GPU work, without KVM.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;

use gpuvm_guest::hal::{Bar, Dma, Mmio, Platform};
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, Gpu};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap};

/// A memfd of `len` bytes, sealed against shrinking if `seal` (as the daemon requires unless
/// `--allow-unsealed-dma`).
pub fn memfd(len: u64, seal: bool) -> File {
    // SAFETY: memfd_create with a NUL-terminated name returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"guest-ram".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor we own.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    if seal {
        // SAFETY: adds a seal to our own descriptor.
        assert_eq!(
            unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) },
            0
        );
    }
    f
}

/// The driver's HAL over a vfio-user connection.
pub struct VfioGuest {
    client: vfio_user::Client,
    mem: GuestMemoryMmap,
    /// Where the driver's DMA region starts in guest RAM.
    base: u64,
    size: u64,
}

/// Guest RAM of the test guest and the part the driver may hand to the GPU.
const RAM: u64 = 32 << 20;
const DMA_BASE: u64 = 1 << 20;

impl VfioGuest {
    /// Connects to `socket` as a booting VMM does: reads configuration space first, enables
    /// memory decoding and bus mastering, maps its RAM (a sealed memfd) at GPA 0.
    pub fn connect(socket: &Path) -> VfioGuest {
        let ram = memfd(RAM, true);
        let mut client = vfio_user::Client::new(socket).expect("connect to the VM's socket");
        let mut id = [0u8; 4];
        client.region_read(7, 0, &mut id).unwrap();
        assert_eq!(u32::from_le_bytes(id), 0x06d8_10de, "the vGPU's PCI ids");
        client.region_write(7, 4, &6u16.to_le_bytes()).unwrap();
        client.dma_map(0, 0, RAM, ram.as_raw_fd()).unwrap();
        let mem = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(0),
            RAM as usize,
            Some(FileOffset::new(ram, 0)),
        )])
        .expect("map the guest RAM here too");
        VfioGuest {
            client,
            mem,
            base: DMA_BASE,
            size: RAM - DMA_BASE,
        }
    }
}

impl Mmio for VfioGuest {
    fn read32(&mut self, bar: Bar, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.client
            .region_read(u32::from(bar.index()), offset, &mut b)
            .expect("REGION_READ");
        u32::from_le_bytes(b)
    }

    fn write32(&mut self, bar: Bar, offset: u64, value: u32) {
        self.client
            .region_write(u32::from(bar.index()), offset, &value.to_le_bytes())
            .expect("REGION_WRITE");
    }
}

impl Dma for VfioGuest {
    fn base(&self) -> u64 {
        self.base
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) {
        self.mem
            .read_slice(buf, GuestAddress(addr))
            .expect("guest RAM read");
    }

    fn write(&mut self, addr: u64, data: &[u8]) {
        self.mem
            .write_slice(data, GuestAddress(addr))
            .expect("guest RAM write");
    }
}

impl Platform for VfioGuest {
    fn delay_ns(&mut self, ns: u64) {
        std::thread::sleep(std::time::Duration::from_nanos(ns));
    }
}

/// One client session of the VM at `socket`: brings the driver up, runs `rounds` x madd
/// (size 16) and checks every result, then disconnects. Returns the workloads verified.
pub fn session(socket: &Path, rounds: u32) -> u32 {
    let mut gpu = Gpu::init(VfioGuest::connect(socket), DriverConfig::default())
        .expect("the driver brings the vGPU up over vfio-user");
    let mut verified = 0;
    for _ in 0..rounds {
        let r = workloads::run(&mut gpu, Workload::Madd, 16).expect("madd runs");
        assert!(r.verified, "madd verified: {r:?}");
        verified += 1;
    }
    verified
}
