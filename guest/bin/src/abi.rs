//! The contract between the VMM (`gpuvm run --kvm`) and the guest program: the guest-physical
//! memory map, the boot-parameter block the VMM fills in, the results block the guest fills in,
//! and the I/O ports. One source for both sides: the VMM includes this file with `#[path]`.
//!
//! Memory map (guest-physical, identity-mapped by the VMM's page tables, 2 MiB pages with the
//! user bit, the first 4 GiB):
//!
//! | range | what |
//! |---|---|
//! | `0x1000` | GDT (null, kernel code/data, user data, user code, TSS) |
//! | `0x2000` | IDT (256 gates; the vGPU's vector points at a ring-3 handler) |
//! | `0x3000` | TSS (IST1 = the interrupt stack) |
//! | `0x7000` | boot parameters ([`BP_MAGIC`] ...) |
//! | `0x8000` | results (init + one entry per workload), then the results header |
//! | `0x10000` | PML4, PDPT, 4 page directories |
//! | `0x100000` | the guest program ([`LOAD_ADDR`]), up to [`STACK_BOTTOM`] |
//! | `0x400000..0x600000` | stack (grows down from [`STACK_TOP`]) |
//! | `0x600000..0x700000` | interrupt stack (IST1, top [`IST_TOP`]) |
//! | `heap_base..+heap_size` | the guest's heap (from 8 MiB) |
//! | `dma_base..+dma_size` | guest RAM handed to the driver for DMA (the rest of RAM) |
//! | `0xC000_0000..0xFEC0_0000` | PCI MMIO hole: the guest places the vGPU's BARs here |
//! | `0xE000_0000..+1 MiB` | PCI Express ECAM window of bus 0 ([`ECAM_BASE`]) |
//! | `0xFEC0_0000`, `0xFEE0_0000` | IOAPIC, local APIC (KVM's in-kernel irqchip) |

#![allow(dead_code)]

/// GDT.
pub const GDT_ADDR: u64 = 0x1000;
/// IDT.
pub const IDT_ADDR: u64 = 0x2000;
/// TSS.
pub const TSS_ADDR: u64 = 0x3000;
/// Boot-parameter block.
pub const BOOT_PARAMS: u64 = 0x7000;
/// Results block.
pub const RESULTS: u64 = 0x8000;
/// PML4 (followed by the PDPT and four page directories).
pub const PML4_ADDR: u64 = 0x10000;
/// Where the guest program is loaded (its linker script says the same).
pub const LOAD_ADDR: u64 = 0x10_0000;
/// End of the space for the program image.
pub const STACK_BOTTOM: u64 = 0x40_0000;
/// Initial stack pointer + 8 (the entry sees a 16-byte aligned stack minus a return address).
pub const STACK_TOP: u64 = 0x60_0000;
/// Top of the interrupt stack (TSS IST1).
pub const IST_TOP: u64 = 0x70_0000;
/// Start of the heap.
pub const HEAP_BASE: u64 = 0x80_0000;
/// Start of the PCI MMIO hole.
pub const MMIO_HOLE: u64 = 0xC000_0000;
/// End of the PCI MMIO hole (the IOAPIC).
pub const MMIO_HOLE_END: u64 = 0xFEC0_0000;
/// First I/O port the guest gives an I/O BAR.
pub const IO_BAR_BASE: u16 = 0xC000;
/// IOAPIC MMIO base.
pub const IOAPIC_BASE: u64 = 0xFEC0_0000;
/// Local APIC MMIO base.
pub const LAPIC_BASE: u64 = 0xFEE0_0000;
/// PCI Express ECAM window of bus 0 (4 KiB per function: device << 15 | function << 12).
pub const ECAM_BASE: u64 = 0xE000_0000;
/// Size of the ECAM window: bus 0 only.
pub const ECAM_SIZE: u64 = 1 << 20;

/// GDT selectors: kernel code, kernel data, user data, user code (RPL 3), TSS.
pub const SEL_KERNEL_CS: u16 = 0x08;
/// Kernel data selector.
pub const SEL_KERNEL_DS: u16 = 0x10;
/// User data selector (RPL 3).
pub const SEL_USER_DS: u16 = 0x18 | 3;
/// User code selector (RPL 3).
pub const SEL_USER_CS: u16 = 0x20 | 3;
/// TSS selector.
pub const SEL_TSS: u16 = 0x28;

/// "GPUVMBP1".
pub const MAGIC: u64 = u64::from_le_bytes(*b"GPUVMBP1");
/// Most workloads one boot can run.
pub const MAX_WORKLOADS: usize = 16;

// Boot-parameter block, offsets from BOOT_PARAMS (little-endian).
/// u64: [`MAGIC`].
pub const BP_MAGIC: u64 = 0x00;
/// u32: [`MODE_NORMAL`], [`MODE_POKE_OUTSIDE`] or [`MODE_CONFIG_GARBAGE`].
pub const BP_MODE: u64 = 0x08;
/// u32: problem size.
pub const BP_SIZE: u64 = 0x0c;
/// u32: 0 poll fences, 1 wait for fences by interrupt.
pub const BP_FENCE_MODE: u64 = 0x10;
/// u32: number of workloads in [`BP_WORKLOADS`].
pub const BP_NWORKLOADS: u64 = 0x14;
/// u64: TSC frequency in kHz (0: unknown, the guest calibrates nothing and assumes 1 GHz).
pub const BP_TSC_KHZ: u64 = 0x18;
/// u64: heap base.
pub const BP_HEAP_BASE: u64 = 0x20;
/// u64: heap size.
pub const BP_HEAP_SIZE: u64 = 0x28;
/// u64: DMA region base.
pub const BP_DMA_BASE: u64 = 0x30;
/// u64: DMA region size.
pub const BP_DMA_SIZE: u64 = 0x38;
/// u64: where the guest may place BARs (start of the MMIO hole).
pub const BP_MMIO_BASE: u64 = 0x40;
/// u32: IDT vector of the vGPU's interrupt.
pub const BP_IRQ_VECTOR: u64 = 0x48;
/// u32: IOAPIC pin (GSI) the VMM's irqfd raises.
pub const BP_IRQ_GSI: u64 = 0x4c;
/// [u8; MAX_WORKLOADS]: workload indices into `gpuvm_guest::workloads::Workload::ALL`.
pub const BP_WORKLOADS: u64 = 0x50;

/// u32: if not 0, first time this many exits of each kind (see [`PHASE_CAL_PIO`]).
pub const BP_CALIBRATE: u64 = 0x60;
/// u32: 1 = after the first workload (a warm-up that creates the channel), wait at the start
/// gate ([`PORT_GATE`]) until every VM of the run is there (`MODE_NORMAL`; `MODE_STREAM` always
/// waits there once its channel exists).
pub const BP_GATE: u64 = 0x64;
/// u64: `MODE_STREAM` and the stop modes: loop-kernel iterations per kernel.
pub const BP_STREAM_ITERS: u64 = 0x68;
/// u32: `MODE_STREAM`: kernels kept outstanding (1: submit the next when the last signalled).
pub const BP_STREAM_OUTSTANDING: u64 = 0x70;
/// u32: `MODE_STREAM`: after the gate, wait this long (ms, TSC) before the first submission.
pub const BP_STREAM_START_MS: u64 = 0x74;
/// u32: `MODE_STREAM`: submit for this long (ms from the gate, TSC); 0 = no time limit.
pub const BP_STREAM_MS: u64 = 0x78;
/// u32: `MODE_STREAM`: submit at most this many kernels; 0 = no count limit.
pub const BP_STREAM_COUNT: u64 = 0x7c;
/// u64: if not 0, the ECAM window ([`ECAM_BASE`]) the guest enumerates PCI through instead of
/// ports 0xCF8/0xCFC.
pub const BP_ECAM: u64 = 0x80;
/// u32: 1 = the vGPU's interrupt is MSI (the guest programs the device's MSI capability with
/// [`BP_IRQ_VECTOR`]) instead of INTx on [`BP_IRQ_GSI`].
pub const BP_IRQ_MSI: u64 = 0x88;
/// u32: 1 = once interrupts are enabled, a self-test of the handler: the guest sends its own
/// vector to itself (local APIC ICR) and the handler sends it once more before its EOI, so
/// that the second delivery nests right after that EOI — what two close edges of the line do.
pub const BP_IRQ_NEST: u64 = 0x8c;
/// End of the boot-parameter block.
pub const BP_END: u64 = 0x90;
/// [`BP_IRQ_GSI`] value: INTx may arrive on any IOAPIC pin from [`IRQ_GSI_FIRST`] up (a PVH
/// loader that names the pin only in ACPI); the guest routes all of them to its vector.
pub const IRQ_GSI_ALL: u32 = 0xffff_ffff;
/// First IOAPIC pin [`IRQ_GSI_ALL`] covers (0-4 are the legacy timer, keyboard, cascade and
/// serial lines).
pub const IRQ_GSI_FIRST: u32 = 5;
/// Pins of the IOAPIC.
pub const IOAPIC_PINS: u32 = 24;

/// Run the workloads.
pub const MODE_NORMAL: u32 = 0;
/// Hostile: after setting up the BARs, read an address in the MMIO hole outside every BAR.
pub const MODE_POKE_OUTSIDE: u32 = 1;
/// Hostile: write garbage over the vGPU's configuration space, then use the BARs as before.
pub const MODE_CONFIG_GARBAGE: u32 = 2;
/// Keep submitting `loop` kernels of [`BP_STREAM_ITERS`] iterations, [`BP_STREAM_OUTSTANDING`]
/// at a time, from the start gate for [`BP_STREAM_MS`] or [`BP_STREAM_COUNT`] kernels (the
/// performance-isolation experiment); result entry 1 is the stream, the header counts kernels.
pub const MODE_STREAM: u32 = 3;
/// Hostile: ring the doorbell for a long `loop` kernel ([`BP_STREAM_ITERS`]), then execute a
/// privileged instruction (`hlt` in ring 3: #GP with no handler, a KVM shutdown) with the
/// kernel in flight.
pub const MODE_STOP_FAULT: u32 = 4;
/// Hostile: ring the doorbell for a long `loop` kernel, then spin forever without an exit.
pub const MODE_STOP_SPIN: u32 = 5;
/// Hostile: after the first workload, write [`RO_PROBE_VALUE`] through BAR3 into the instance
/// block of the workload channel (bound, so the BAR-remap plan maps its page read-only) at
/// [`RO_PROBE_OFFSET`], read it back through BAR3, print both on the console, then run the rest
/// of the workloads (a read-back mismatch fails the run).
pub const MODE_RO_WRITE: u32 = 6;
/// `MODE_RO_WRITE`: offset in the instance block of the probe word: past the RAMFC, the page
/// directory and the graphics-context pointer, a word neither the driver nor the GPU uses.
pub const RO_PROBE_OFFSET: u64 = 0xff0;
/// `MODE_RO_WRITE`: the value written.
pub const RO_PROBE_VALUE: u32 = 0x600d_f00d;

// Results: entry 0 is driver init, entry 1 + i workload i; RESULT_SIZE bytes each.
/// Bytes per result entry.
pub const RESULT_SIZE: u64 = 256;
/// u32: [`STATE_NOT_RUN`], [`STATE_DONE`] or [`STATE_ERROR`].
pub const R_STATE: u64 = 0x00;
/// u32: 1 if the result matched the CPU reference.
pub const R_VERIFIED: u64 = 0x04;
/// u64: bytes moved.
pub const R_BYTES: u64 = 0x08;
/// u64: GPU time between the fence timestamps, ns.
pub const R_GPU_NS: u64 = 0x10;
/// u32: length of the error message.
pub const R_ERR_LEN: u64 = 0x18;
/// The error message (UTF-8, at most [`R_ERR_MAX`] bytes).
pub const R_ERR: u64 = 0x20;
/// Longest error message.
pub const R_ERR_MAX: u64 = RESULT_SIZE - R_ERR;
/// Not run.
pub const STATE_NOT_RUN: u32 = 0;
/// Ran to the end (verified or not).
pub const STATE_DONE: u32 = 1;
/// Failed with an error (message in R_ERR).
pub const STATE_ERROR: u32 = 2;
/// Results header, after the entries.
pub const RESULTS_HEADER: u64 = RESULTS + (MAX_WORKLOADS as u64 + 1) * RESULT_SIZE;
/// u64: interrupts the guest's handler counted.
pub const H_IRQS: u64 = 0x00;
/// u32: 1 if the driver waits for fences by interrupt.
pub const H_FENCE_IRQ: u64 = 0x08;
/// u64: `MODE_STREAM`: kernels that completed.
pub const H_KERNELS: u64 = 0x10;
/// u64: `MODE_STREAM`: kernels submitted.
pub const H_SUBMITTED: u64 = 0x18;

/// Serial port (16550).
pub const PORT_SERIAL: u16 = 0x3f8;
/// PCI configuration address (mechanism 1).
pub const PORT_PCI_ADDR: u16 = 0xcf8;
/// PCI configuration data.
pub const PORT_PCI_DATA: u16 = 0xcfc;
/// 32-bit write: the guest is done; the value is [`EXIT_PASS`], [`EXIT_FAIL`] or [`EXIT_PANIC`].
pub const PORT_EXIT: u16 = 0x501;
/// 32-bit write: phase boundary; the value is the phase starting (0 init, 1 + i workload i) or
/// [`PHASE_DONE`].
pub const PORT_PHASE: u16 = 0x502;
/// Every workload verified.
pub const EXIT_PASS: u32 = 0;
/// Something failed (see the results).
pub const EXIT_FAIL: u32 = 1;
/// The guest panicked (message on the serial port).
pub const EXIT_PANIC: u32 = 2;
/// The last phase ended.
pub const PHASE_DONE: u32 = 0xff;
/// Calibration phase: `out` to [`PORT_NOP`] (a bare port-I/O exit).
pub const PHASE_CAL_PIO: u32 = 0x100;
/// Calibration phase: reads of [`NULL_MMIO`] (a bare MMIO exit, no device work).
pub const PHASE_CAL_NULL_MMIO: u32 = 0x101;
/// Calibration phase: reads of the vGPU's BAR0 BOOT_0 register (an MMIO exit into the vGPU).
pub const PHASE_CAL_VGPU_MMIO: u32 = 0x102;
/// Calibration ended.
pub const PHASE_CAL_END: u32 = 0x103;
/// A port the VMM ignores (calibration).
pub const PORT_NOP: u16 = 0x503;
/// 32-bit read: the start gate. The first read registers the VM as arrived; every read returns
/// 1 once every VM of the run that waits at the gate has arrived, else 0.
pub const PORT_GATE: u16 = 0x504;
/// Stream phase: the gate opened (the VMM timestamps it).
pub const PHASE_GATE_OPEN: u32 = 0x110;
/// Stream phase: the last kernel is submitted (time or count reached); the drain follows.
pub const PHASE_STREAM_STOP: u32 = 0x112;
/// A page of MMIO the VMM answers with zeros and no device work (calibration).
pub const NULL_MMIO: u64 = 0xFEB0_0000;
