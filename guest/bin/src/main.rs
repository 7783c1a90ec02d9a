//! The bare-metal KVM guest of `gpuvm run --kvm`.
//!
//! The VMM loads this program at 1 MiB and starts it directly in 64-bit ring 3 (page tables,
//! GDT, TSS and IDT are set up by the VMM; see `abi.rs` and `docs/kvm.md`). It never enters
//! ring 0, so it uses no privileged instruction: port I/O works because RFLAGS.IOPL is 3 (on PVM:
//! the TSS I/O bitmap), it ends with an `out` to the exit port instead of `hlt`. A PVH loader
//! (Cloud Hypervisor, `gpuvm run --kvm --pvh`) enters `pvh.rs` instead, whose assembly stub sets
//! the same up itself and switches to ring 3 before any Rust code runs.
//!
//! What it does: reads the boot parameters, enumerates PCI bus 0 through configuration
//! mechanism 1, finds the Quadro 6000 (10de:06d8), sizes its BARs and places them in the MMIO
//! hole, enables memory decoding and bus mastering, then runs the `gpuvm-guest` driver on it
//! (`Mmio` = volatile loads and stores to the identity-mapped BARs, each a VM exit; `Dma` = the
//! guest-RAM region the VMM names; delays = a TSC spin), runs the selected workloads, writes
//! each result into the results block, prints them on the serial port and reports pass/fail
//! through the exit port.
#![no_std]
#![no_main]

mod abi;
mod pvh;

extern crate alloc;

use core::alloc::{GlobalAlloc, Layout};
use core::arch::{asm, global_asm};
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use gpuvm_guest::hal::{Bar, Dma, Mmio, Platform};
use gpuvm_guest::workloads::{self, Workload};
use gpuvm_guest::{DriverConfig, FenceMode, Gpu};

// ---------------------------------------------------------------------------------------------
// Port I/O and raw memory: the hardware boundary.

fn outb(port: u16, v: u8) {
    // SAFETY: port I/O has no memory effects; RFLAGS.IOPL = 3 allows it in ring 3.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") v, options(nomem, nostack, preserves_flags))
    }
}

fn outl(port: u16, v: u32) {
    // SAFETY: as in `outb`.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") v, options(nomem, nostack, preserves_flags))
    }
}

fn inl(port: u16) -> u32 {
    let v: u32;
    // SAFETY: as in `outb`.
    unsafe {
        asm!("in eax, dx", out("eax") v, in("dx") port, options(nomem, nostack, preserves_flags))
    }
    v
}

fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc only reads the time-stamp counter (CR4.TSD is clear, so ring 3 may).
    unsafe { asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags)) }
    (hi as u64) << 32 | lo as u64
}

fn rd32(addr: u64) -> u32 {
    // SAFETY: `addr` is identity-mapped guest RAM (boot parameters, results) or a device
    // register the VMM maps; the caller passes 4-byte aligned addresses.
    unsafe { core::ptr::read_volatile(addr as *const u32) }
}

fn rd64(addr: u64) -> u64 {
    // SAFETY: as in `rd32`, 8-byte aligned.
    unsafe { core::ptr::read_volatile(addr as *const u64) }
}

fn wr32(addr: u64, v: u32) {
    // SAFETY: as in `rd32`.
    unsafe { core::ptr::write_volatile(addr as *mut u32, v) }
}

fn wr64(addr: u64, v: u64) {
    // SAFETY: as in `rd64`.
    unsafe { core::ptr::write_volatile(addr as *mut u64, v) }
}

fn wr8(addr: u64, v: u8) {
    // SAFETY: as in `rd32`.
    unsafe { core::ptr::write_volatile(addr as *mut u8, v) }
}

// The C memory functions: `core` calls them and there is no libc.

/// # Safety
/// `dst` and `src` are valid for `n` bytes and do not overlap.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract; `rep movsb` copies exactly `n` bytes forward.
    unsafe {
        asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _, inout("rsi") src => _,
             options(nostack, preserves_flags));
    }
    dst
}

/// # Safety
/// `dst` and `src` are valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize).wrapping_add(n) {
        // SAFETY: a forward copy is correct when `dst` is below `src` or past its end.
        unsafe { memcpy(dst, src, n) }
    } else {
        // SAFETY: copies backwards (direction flag set and cleared again) over the same bytes.
        unsafe {
            asm!("std", "rep movsb", "cld",
                 inout("rcx") n => _,
                 inout("rdi") dst.add(n - 1) => _,
                 inout("rsi") src.add(n - 1) => _,
                 options(nostack));
        }
        dst
    }
}

/// # Safety
/// `dst` is valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract; `rep stosb` stores exactly `n` bytes.
    unsafe {
        asm!("rep stosb", inout("rcx") n => _, inout("rdi") dst => _, in("al") c as u8,
             options(nostack, preserves_flags));
    }
    dst
}

/// # Safety
/// `a` and `b` are valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: `i < n`, within both buffers.
        let (x, y) = unsafe {
            (
                core::ptr::read_volatile(a.add(i)),
                core::ptr::read_volatile(b.add(i)),
            )
        };
        if x != y {
            return x as i32 - y as i32;
        }
    }
    0
}

/// # Safety
/// As `memcmp`.
#[no_mangle]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the same contract.
    unsafe { memcmp(a, b, n) }
}

// ---------------------------------------------------------------------------------------------
// Heap: a bump allocator over the region the VMM names, which gives back the most recent block
// (the common Vec-growth and temporary-buffer pattern) and grows it in place.

struct Bump {
    next: AtomicUsize,
    end: AtomicUsize,
}

#[global_allocator]
static HEAP: Bump = Bump {
    next: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
};

impl Bump {
    fn init(&self, base: u64, size: u64) {
        self.next.store(base as usize, Ordering::Relaxed);
        self.end.store((base + size) as usize, Ordering::Relaxed);
    }

    fn used_top(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }
}

// SAFETY: blocks are disjoint ranges of the heap region, aligned as asked; the guest is
// single-threaded and the interrupt handler does not allocate.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let next = self.next.load(Ordering::Relaxed);
        let start = (next + layout.align() - 1) & !(layout.align() - 1);
        let end = start + layout.size();
        if end > self.end.load(Ordering::Relaxed) {
            return core::ptr::null_mut();
        }
        self.next.store(end, Ordering::Relaxed);
        start as *mut u8
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Only the most recent block comes back.
        if ptr as usize + layout.size() == self.next.load(Ordering::Relaxed) {
            self.next.store(ptr as usize, Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let top = self.next.load(Ordering::Relaxed);
        if ptr as usize + layout.size() == top {
            // The last block grows or shrinks in place.
            if ptr as usize + new_size <= self.end.load(Ordering::Relaxed) {
                self.next.store(ptr as usize + new_size, Ordering::Relaxed);
                return ptr;
            }
            return core::ptr::null_mut();
        }
        // SAFETY: the GlobalAlloc contract, passed on.
        unsafe {
            let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
            if !new.is_null() {
                memcpy(new, ptr, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Serial console (16550 transmit register; the VMM's UART is always ready).

struct Serial;

impl Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            outb(abi::PORT_SERIAL, b);
        }
        Ok(())
    }
}

macro_rules! println {
    ($($arg:tt)*) => {{
        let _ = writeln!(Serial, $($arg)*);
    }};
}

fn exit(code: u32) -> ! {
    if pvh::active() {
        pvh::shutdown(code);
    }
    outl(abi::PORT_EXIT, code);
    loop {
        // The VMM stops the vCPU at the exit port; nothing else to do in ring 3.
        core::hint::spin_loop();
    }
}

/// Referenced by the precompiled `alloc` (built for unwinding); never called with panic=abort.
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    println!("PANIC: {info}");
    exit(abi::EXIT_PANIC)
}

// ---------------------------------------------------------------------------------------------
// Interrupts: the vGPU's vector is a gate with DPL 3 into this ring-3 handler. It counts, sends
// the local APIC an EOI and returns. A *trap* gate, not an interrupt gate: under PVM an
// interrupt gate clears the virtual RFLAGS.IF on delivery and the `iretq` (run natively in ring
// 3, where the hardware IOPL is 0) cannot set it again, so only the first interrupt would ever
// arrive. With IF set in the handler, the local APIC alone keeps it from nesting — and only
// until the EOI: a second edge that arrived meanwhile is delivered right after the EOI, before
// the handler's `iretq`.
//
// Delivery is on IST1 (the interrupted code's red zone must not be overwritten), and IST1's
// stack pointer is reset at every delivery: a delivery nested after the EOI would write its
// frame over the first one's, and the first handler would then return into itself for good
// (`pop`/`iretq` on the nested frame, no exit ever again). So the handler leaves IST1 before
// its EOI: it copies its frame and the two registers it uses to the interrupted stack, below
// that code's 128-byte red zone, and runs on from there; a nested delivery finds IST1 unused
// and nests on the interrupted stack as on any other.
//
// `IRQ_NEST` (`abi::BP_IRQ_NEST`'s self-test): when set, the handler clears it and sends its
// own vector to itself before its EOI, so that the second delivery is nested in exactly that
// window.

static IRQS: AtomicU64 = AtomicU64::new(0);
/// The self-test's request (see above): 1 = send the vector once more before the EOI.
static IRQ_NEST: AtomicU32 = AtomicU32::new(0);
/// The vGPU's vector (what the self-test sends).
static IRQ_VECTOR: AtomicU32 = AtomicU32::new(0);

global_asm!(
    ".global gpuvm_irq_entry",
    "gpuvm_irq_entry:",
    // On IST1: [rsp] = RIP, CS, RFLAGS, RSP, SS of the interrupted code.
    "push rax",
    "push rbx",
    // The interrupted RSP, past its red zone and room for 7 words, 16-byte aligned.
    "mov rax, [rsp + 40]",
    "sub rax, 192",
    "and rax, -16",
    // rbx, rax, RIP, CS, RFLAGS, RSP, SS, in that order, there.
    "mov rbx, [rsp]",
    "mov [rax], rbx",
    "mov rbx, [rsp + 8]",
    "mov [rax + 8], rbx",
    "mov rbx, [rsp + 16]",
    "mov [rax + 16], rbx",
    "mov rbx, [rsp + 24]",
    "mov [rax + 24], rbx",
    "mov rbx, [rsp + 32]",
    "mov [rax + 32], rbx",
    "mov rbx, [rsp + 40]",
    "mov [rax + 40], rbx",
    "mov rbx, [rsp + 48]",
    "mov [rax + 48], rbx",
    "mov rsp, rax",
    // Off IST1.
    "lock inc qword ptr [rip + {irqs}]",
    "cmp dword ptr [rip + {nest}], 0",
    "je 2f",
    "mov dword ptr [rip + {nest}], 0",
    // Local APIC ICR low: the vector, fixed delivery, destination shorthand "self".
    "mov ebx, dword ptr [rip + {vector}]",
    "or ebx, 0x40000",
    "mov rax, 0xfee00300",
    "mov dword ptr [rax], ebx",
    "2:",
    "mov rax, 0xfee000b0",
    "mov dword ptr [rax], 0",
    "pop rbx",
    "pop rax",
    "iretq",
    irqs = sym IRQS,
    nest = sym IRQ_NEST,
    vector = sym IRQ_VECTOR,
);

extern "C" {
    fn gpuvm_irq_entry();
}

/// Installs the handler as IDT gate `vector` (64-bit trap gate, DPL 3, ring-3 code selector,
/// IST1), software-enables the local APIC and routes the vGPU's interrupt to `vector`: by MSI
/// (the device's MSI capability, `msi`), or INTx on IOAPIC pin `gsi` (every pin from
/// `abi::IRQ_GSI_FIRST` up for `abi::IRQ_GSI_ALL`).
fn enable_interrupts(dev: u8, gsi: u32, vector: u32, msi: bool) -> bool {
    let handler = gpuvm_irq_entry as *const () as usize as u64;
    let gate = pvh::idt_base() + 16 * (vector as u64 & 0xff);
    let lo = (handler & 0xffff)
        | (abi::SEL_USER_CS as u64) << 16
        | 1 << 32 // IST1
        | 0xef << 40 // present, DPL 3, 64-bit trap gate (IF stays set)
        | ((handler >> 16) & 0xffff) << 48;
    wr64(gate, lo);
    wr64(gate + 8, handler >> 32);
    IRQ_VECTOR.store(vector & 0xff, Ordering::SeqCst);
    // Local APIC: software enable (SVR bit 8, spurious vector 0xff), task priority 0.
    wr32(abi::LAPIC_BASE + 0xf0, 0x1ff);
    wr32(abi::LAPIC_BASE + 0x80, 0);
    if msi {
        return enable_msi(dev, vector);
    }
    let pins = if gsi == abi::IRQ_GSI_ALL {
        abi::IRQ_GSI_FIRST..abi::IOAPIC_PINS
    } else {
        gsi..gsi + 1
    };
    for pin in pins {
        // IOAPIC redirection entry: fixed, physical, edge, active high, unmasked, to APIC 0.
        wr32(abi::IOAPIC_BASE, 0x10 + 2 * pin + 1);
        wr32(abi::IOAPIC_BASE + 0x10, 0);
        wr32(abi::IOAPIC_BASE, 0x10 + 2 * pin);
        wr32(abi::IOAPIC_BASE + 0x10, vector & 0xff);
    }
    // RFLAGS.IF was set by the VMM (or the PVH stub's `iretq`): `sti` needs IOPL 3, which PVM
    // does not give ring 3.
    true
}

/// `abi::BP_IRQ_NEST`: sends the vGPU's vector to itself; the handler sends it once more
/// before its EOI, so that the second delivery nests in the first handler right after its EOI.
/// Waits (up to a second) for both and prints how many the handler counted. A handler that
/// nested on its own interrupt stack would never return here.
fn irq_nest_test(tsc_khz: u64) {
    let before = IRQS.load(Ordering::SeqCst);
    IRQ_NEST.store(1, Ordering::SeqCst);
    // ICR low: the vector, fixed delivery, destination shorthand "self".
    wr32(
        abi::LAPIC_BASE + 0x300,
        IRQ_VECTOR.load(Ordering::SeqCst) | 0x4_0000,
    );
    let t = rdtsc();
    while IRQS.load(Ordering::SeqCst) < before + 2 && rdtsc().wrapping_sub(t) < 1000 * tsc_khz {
        core::hint::spin_loop();
    }
    let n = IRQS.load(Ordering::SeqCst) - before;
    println!("irq nest: {n} interrupt(s) handled, the second sent by the first before its EOI");
}

/// PCI capability ID of MSI.
const CAP_MSI: u32 = 0x05;

/// Programs the device's MSI capability: message address = the local APIC of CPU 0, data =
/// `vector` (fixed delivery, edge), then MSI Enable. False if the device has no MSI capability.
fn enable_msi(dev: u8, vector: u32) -> bool {
    if cfg_read(dev, 0x04) & (1 << 20) == 0 {
        println!("msi: the device has no capability list");
        return false;
    }
    let mut ptr = (cfg_read(dev, 0x34) & 0xfc) as u8;
    // A capability list that loops is cut after 48 entries (as many as fit in 192 bytes).
    for _ in 0..48 {
        if ptr < 0x40 {
            break;
        }
        let head = cfg_read(dev, ptr);
        if head & 0xff == CAP_MSI {
            let control = (head >> 16) as u16;
            let is64 = control & (1 << 7) != 0;
            cfg_write(dev, ptr + 4, abi::LAPIC_BASE as u32);
            let data_off = if is64 {
                cfg_write(dev, ptr + 8, 0);
                ptr + 0xc
            } else {
                ptr + 8
            };
            cfg_write(dev, data_off, vector & 0xff);
            // Multiple Message Enable 0 (one vector), MSI Enable.
            let control = (control & !(0x7 << 4)) | 1;
            cfg_write(dev, ptr, (head & 0xffff) | u32::from(control) << 16);
            println!("msi: capability at {ptr:#x} enabled, vector {vector:#x}");
            return true;
        }
        ptr = ((head >> 8) & 0xfc) as u8;
    }
    println!("msi: the device has no MSI capability");
    false
}

// ---------------------------------------------------------------------------------------------
// Boot parameters.

struct Boot {
    mode: u32,
    size: u32,
    fence_irq: bool,
    workloads: [u8; abi::MAX_WORKLOADS],
    nworkloads: usize,
    tsc_khz: u64,
    dma_base: u64,
    dma_size: u64,
    mmio_base: u64,
    irq_vector: u32,
    irq_gsi: u32,
    irq_msi: bool,
    calibrate: u32,
    gate: bool,
    irq_nest: bool,
}

fn bp32(off: u64) -> u32 {
    rd32(abi::BOOT_PARAMS + off)
}

fn bp64(off: u64) -> u64 {
    rd64(abi::BOOT_PARAMS + off)
}

fn read_boot() -> Boot {
    if bp64(abi::BP_MAGIC) != abi::MAGIC {
        println!("no boot parameters at {:#x}", abi::BOOT_PARAMS);
        exit(abi::EXIT_PANIC);
    }
    HEAP.init(bp64(abi::BP_HEAP_BASE), bp64(abi::BP_HEAP_SIZE));
    ECAM.store(bp64(abi::BP_ECAM), Ordering::Relaxed);
    let mut workloads = [0u8; abi::MAX_WORKLOADS];
    let nworkloads = (bp32(abi::BP_NWORKLOADS) as usize).min(abi::MAX_WORKLOADS);
    for (i, w) in workloads.iter_mut().enumerate().take(nworkloads) {
        // SAFETY: the boot-parameter block is identity-mapped guest RAM.
        *w = unsafe {
            core::ptr::read_volatile((abi::BOOT_PARAMS + abi::BP_WORKLOADS + i as u64) as *const u8)
        };
    }
    Boot {
        mode: bp32(abi::BP_MODE),
        size: bp32(abi::BP_SIZE),
        fence_irq: bp32(abi::BP_FENCE_MODE) == 1,
        workloads,
        nworkloads,
        tsc_khz: match bp64(abi::BP_TSC_KHZ) {
            0 => 1_000_000,
            k => k,
        },
        dma_base: bp64(abi::BP_DMA_BASE),
        dma_size: bp64(abi::BP_DMA_SIZE),
        mmio_base: bp64(abi::BP_MMIO_BASE),
        irq_vector: bp32(abi::BP_IRQ_VECTOR),
        irq_gsi: bp32(abi::BP_IRQ_GSI),
        irq_msi: bp32(abi::BP_IRQ_MSI) == 1,
        calibrate: bp32(abi::BP_CALIBRATE),
        gate: bp32(abi::BP_GATE) == 1,
        irq_nest: bp32(abi::BP_IRQ_NEST) == 1,
    }
}

// ---------------------------------------------------------------------------------------------
// PCI configuration mechanism 1.

fn cfg_addr(dev: u8, off: u8) -> u32 {
    0x8000_0000 | (dev as u32) << 11 | (off as u32 & 0xfc)
}

/// The ECAM window to use for configuration accesses (0: mechanism 1 through ports).
static ECAM: AtomicU64 = AtomicU64::new(0);

fn ecam_addr(dev: u8, off: u8) -> Option<u64> {
    match ECAM.load(Ordering::Relaxed) {
        0 => None,
        base => Some(base + ((dev as u64 & 0x1f) << 15) + (off as u64 & 0xfc)),
    }
}

fn cfg_read(dev: u8, off: u8) -> u32 {
    if let Some(a) = ecam_addr(dev, off) {
        return rd32(a);
    }
    outl(abi::PORT_PCI_ADDR, cfg_addr(dev, off));
    inl(abi::PORT_PCI_DATA)
}

fn cfg_write(dev: u8, off: u8, v: u32) {
    if let Some(a) = ecam_addr(dev, off) {
        return wr32(a, v);
    }
    outl(abi::PORT_PCI_ADDR, cfg_addr(dev, off));
    outl(abi::PORT_PCI_DATA, v);
}

/// BAR0, BAR1 and BAR3 addresses of the vGPU.
#[derive(Clone, Copy)]
struct Bars {
    bar0: u64,
    bar1: u64,
    bar3: u64,
}

/// Finds 10de:06d8 on bus 0; returns its device number.
fn find_gpu() -> Option<u8> {
    for dev in 0..32u8 {
        let id = cfg_read(dev, 0);
        if id == 0xffff_ffff {
            continue;
        }
        println!(
            "pci 00:{dev:02x}.0 {:04x}:{:04x} class {:06x}",
            id & 0xffff,
            id >> 16,
            cfg_read(dev, 8) >> 8
        );
        if id == 0x06d8_10de {
            return Some(dev);
        }
    }
    None
}

/// Sizes the device's BARs and places them in the MMIO hole (largest first, naturally aligned),
/// the I/O BAR at 0xC000; enables memory decoding and bus mastering.
fn setup_bars(dev: u8, mmio_base: u64) -> Bars {
    // (slot, size, is 64-bit) of the memory BARs.
    let mut mem: [(u8, u64, bool); 6] = [(0, 0, false); 6];
    let mut n = 0;
    let mut slot = 0u8;
    let mut io_port = abi::IO_BAR_BASE as u32;
    cfg_write(dev, 4, 0); // decoding off while sizing
    while slot < 6 {
        let off = 0x10 + slot * 4;
        let orig = cfg_read(dev, off);
        cfg_write(dev, off, 0xffff_ffff);
        let mask = cfg_read(dev, off);
        if orig & 1 == 1 {
            let size = (!(mask & !3)).wrapping_add(1) & 0xffff;
            if mask != 0 && size != 0 {
                cfg_write(dev, off, io_port);
                println!("BAR{slot}: I/O, {size} bytes at {io_port:#x}");
                io_port += size.max(4);
            }
            slot += 1;
            continue;
        }
        let is64 = (mask >> 1) & 3 == 2;
        let mut full = (mask & !0xf) as u64;
        if is64 {
            let hi_off = off + 4;
            cfg_write(dev, hi_off, 0xffff_ffff);
            full |= (cfg_read(dev, hi_off) as u64) << 32;
        } else {
            full |= 0xffff_ffff_0000_0000;
        }
        let size = (!full).wrapping_add(1);
        if mask != 0 && size != 0 {
            mem[n] = (slot, size, is64);
            n += 1;
        }
        slot += if is64 { 2 } else { 1 };
    }
    // Largest first keeps every BAR naturally aligned without holes.
    mem[..n].sort_unstable_by_key(|b| core::cmp::Reverse(b.1));
    let mut at = mmio_base;
    let mut bars = Bars {
        bar0: 0,
        bar1: 0,
        bar3: 0,
    };
    for &(slot, size, is64) in &mem[..n] {
        at = (at + size - 1) & !(size - 1);
        let off = 0x10 + slot * 4;
        cfg_write(dev, off, at as u32);
        if is64 {
            cfg_write(dev, off + 4, (at >> 32) as u32);
        }
        println!(
            "BAR{slot}: memory, {} MiB at {at:#x}{}",
            size >> 20,
            if is64 { " (64-bit)" } else { "" }
        );
        match slot {
            0 => bars.bar0 = at,
            1 => bars.bar1 = at,
            3 => bars.bar3 = at,
            _ => {}
        }
        at += size;
    }
    // Memory space + bus master.
    cfg_write(dev, 4, 0x6);
    bars
}

// ---------------------------------------------------------------------------------------------
// The driver's HAL.

struct KvmHal {
    bars: Bars,
    dma_base: u64,
    dma_size: u64,
    tsc_khz: u64,
    irq_mode: bool,
}

impl KvmHal {
    fn addr(&self, bar: Bar, offset: u64, width: u64) -> Option<u64> {
        let (base, size) = match bar {
            Bar::Bar0 => (self.bars.bar0, Bar::Bar0.size()),
            Bar::Bar1 => (self.bars.bar1, Bar::Bar1.size()),
            Bar::Bar3 => (self.bars.bar3, Bar::Bar3.size()),
        };
        (base != 0 && offset & (width - 1) == 0 && offset.checked_add(width)? <= size)
            .then(|| base + offset)
    }

    fn in_dma(&self, addr: u64, len: usize) -> bool {
        addr >= self.dma_base
            && addr
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.dma_base + self.dma_size)
    }
}

impl Mmio for KvmHal {
    fn read32(&mut self, bar: Bar, offset: u64) -> u32 {
        match self.addr(bar, offset, 4) {
            Some(a) => {
                BAR_READS.fetch_add(1, Ordering::Relaxed);
                rd32(a)
            }
            None => 0xffff_ffff,
        }
    }

    fn write32(&mut self, bar: Bar, offset: u64, value: u32) {
        if let Some(a) = self.addr(bar, offset, 4) {
            BAR_WRITES.fetch_add(1, Ordering::Relaxed);
            wr32(a, value);
        }
    }

    fn read64(&mut self, bar: Bar, offset: u64) -> u64 {
        match bar {
            Bar::Bar0 => {
                let lo = self.read32(bar, offset) as u64;
                let hi = self.read32(bar, offset + 4) as u64;
                hi << 32 | lo
            }
            _ => match self.addr(bar, offset, 8) {
                Some(a) => {
                    BAR_READS.fetch_add(1, Ordering::Relaxed);
                    rd64(a)
                }
                None => u64::MAX,
            },
        }
    }

    fn write64(&mut self, bar: Bar, offset: u64, value: u64) {
        match bar {
            Bar::Bar0 => {
                self.write32(bar, offset, value as u32);
                self.write32(bar, offset + 4, (value >> 32) as u32);
            }
            _ => {
                if let Some(a) = self.addr(bar, offset, 8) {
                    BAR_WRITES.fetch_add(1, Ordering::Relaxed);
                    wr64(a, value);
                }
            }
        }
    }
}

impl Dma for KvmHal {
    fn base(&self) -> u64 {
        self.dma_base
    }

    fn size(&self) -> u64 {
        self.dma_size
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) {
        if !self.in_dma(addr, buf.len()) {
            buf.fill(0xff);
            return;
        }
        core::sync::atomic::fence(Ordering::SeqCst);
        // SAFETY: the range lies in the DMA region, identity-mapped guest RAM that no Rust
        // object owns; the GPU (the VMM) may write it concurrently, hence the fence.
        unsafe { core::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) }
    }

    fn write(&mut self, addr: u64, data: &[u8]) {
        if !self.in_dma(addr, data.len()) {
            return;
        }
        // SAFETY: as in `read`.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) }
        core::sync::atomic::fence(Ordering::SeqCst);
    }
}

impl Platform for KvmHal {
    fn delay_ns(&mut self, ns: u64) {
        let ticks = ns.saturating_mul(self.tsc_khz) / 1_000_000;
        let start = rdtsc();
        while rdtsc().wrapping_sub(start) < ticks {
            core::hint::spin_loop();
        }
    }

    fn wait_for_interrupt(&mut self, timeout_ns: u64) -> bool {
        let seen = IRQS.load(Ordering::SeqCst);
        let ticks = timeout_ns.saturating_mul(self.tsc_khz) / 1_000_000;
        let start = rdtsc();
        while rdtsc().wrapping_sub(start) < ticks {
            if IRQS.load(Ordering::SeqCst) != seen {
                return true;
            }
            core::hint::spin_loop();
        }
        IRQS.load(Ordering::SeqCst) != seen
    }

    fn has_interrupts(&self) -> bool {
        self.irq_mode
    }
}

// ---------------------------------------------------------------------------------------------
// Results.

struct ErrBuf {
    buf: [u8; abi::R_ERR_MAX as usize],
    len: usize,
}

impl Write for ErrBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for &b in s.as_bytes() {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
        Ok(())
    }
}

fn result(index: usize, verified: bool, bytes: u64, gpu_ns: u64, error: Option<&dyn fmt::Display>) {
    let base = abi::RESULTS + index as u64 * abi::RESULT_SIZE;
    wr32(base + abi::R_VERIFIED, verified as u32);
    wr64(base + abi::R_BYTES, bytes);
    wr64(base + abi::R_GPU_NS, gpu_ns);
    let mut e = ErrBuf {
        buf: [0; abi::R_ERR_MAX as usize],
        len: 0,
    };
    if let Some(err) = error {
        let _ = write!(e, "{err}");
    }
    for (i, &b) in e.buf[..e.len].iter().enumerate() {
        wr8(base + abi::R_ERR + i as u64, b);
    }
    wr32(base + abi::R_ERR_LEN, e.len as u32);
    wr32(
        base + abi::R_STATE,
        if error.is_some() {
            abi::STATE_ERROR
        } else {
            abi::STATE_DONE
        },
    );
}

/// The I/O port of the vGPU's BAR5 under PVH (0: none): phase markers go there too, so a
/// vfio-user server (which sees BAR5 writes as messages, unlike the VMM's phase port) can tell
/// workloads apart in its message counts.
static MARK_PORT: AtomicU64 = AtomicU64::new(0);

fn phase(p: u32) {
    outl(abi::PORT_PHASE, p);
    match MARK_PORT.load(Ordering::Relaxed) {
        0 => {}
        port => outl(port as u16, p),
    }
}

/// BAR accesses the driver made (each one a VM exit: every BAR access is trapped).
static BAR_READS: AtomicU64 = AtomicU64::new(0);
static BAR_WRITES: AtomicU64 = AtomicU64::new(0);

fn bar_accesses() -> (u64, u64) {
    (
        BAR_READS.load(Ordering::Relaxed),
        BAR_WRITES.load(Ordering::Relaxed),
    )
}

/// Times `n` exits of each kind, bracketed by phase markers the VMM timestamps.
fn calibrate(n: u32, bar0: u64) {
    phase(abi::PHASE_CAL_PIO);
    for _ in 0..n {
        outl(abi::PORT_NOP, 0);
    }
    phase(abi::PHASE_CAL_NULL_MMIO);
    for _ in 0..n {
        rd32(abi::NULL_MMIO);
    }
    phase(abi::PHASE_CAL_VGPU_MMIO);
    for _ in 0..n {
        rd32(bar0);
    }
    phase(abi::PHASE_CAL_END);
}

// ---------------------------------------------------------------------------------------------

mod stream;

#[no_mangle]
#[link_section = ".text._start"]
pub extern "C" fn _start() -> ! {
    let boot = read_boot();
    let code = run(&boot);
    exit(code)
}

fn run(boot: &Boot) -> u32 {
    println!(
        "gpuvm guest: ring 3, size {}, {} workload(s), fences by {}, TSC {} kHz, heap {:#x}",
        boot.size,
        boot.nworkloads,
        match (boot.fence_irq, boot.irq_msi) {
            (false, _) => "polling",
            (true, false) => "interrupt (INTx)",
            (true, true) => "interrupt (MSI)",
        },
        boot.tsc_khz,
        HEAP.used_top()
    );
    if let Some(a) = ecam_addr(0, 0) {
        println!("pci: configuration through ECAM at {a:#x}");
    }
    let Some(dev) = find_gpu() else {
        println!("no 10de:06d8 on PCI bus 0");
        return abi::EXIT_FAIL;
    };
    let bars = if pvh::active() {
        match pvh::firmware_bars(dev) {
            Some(b) => b,
            // A loader without PCI firmware left them unprogrammed (`gpuvm run --kvm --pvh`):
            // placed as on the VMM path, from the start of the 32-bit MMIO hole.
            None => {
                println!("BARs unprogrammed by the loader: placing them");
                setup_bars(dev, abi::MMIO_HOLE)
            }
        }
    } else {
        setup_bars(dev, boot.mmio_base)
    };
    match boot.mode {
        abi::MODE_POKE_OUTSIDE => {
            let addr = boot.mmio_base + 0x3000_0000;
            println!("hostile: reading {addr:#x}, outside every BAR");
            let v = rd32(addr);
            println!("hostile: read {v:#x} and still running");
            return abi::EXIT_FAIL;
        }
        abi::MODE_CONFIG_GARBAGE => {
            println!("hostile: writing garbage over configuration space");
            let mut x: u32 = 0x9e37_79b9;
            for off in (0..=0xfcu8).step_by(4) {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                cfg_write(dev, off, x);
            }
        }
        _ => {}
    }
    if boot.calibrate != 0 {
        calibrate(boot.calibrate, bars.bar0);
    }
    let fence_irq =
        boot.fence_irq && enable_interrupts(dev, boot.irq_gsi, boot.irq_vector, boot.irq_msi);
    if fence_irq && boot.irq_nest {
        irq_nest_test(boot.tsc_khz);
    }
    let hal = KvmHal {
        bars,
        dma_base: boot.dma_base,
        dma_size: boot.dma_size,
        tsc_khz: boot.tsc_khz,
        irq_mode: fence_irq,
    };
    let cfg = DriverConfig {
        fence_mode: if fence_irq {
            FenceMode::Interrupt
        } else {
            FenceMode::Poll
        },
        ..DriverConfig::default()
    };
    phase(0);
    let t0 = rdtsc();
    let mut gpu = match Gpu::init(hal, cfg) {
        Ok(g) => g,
        Err(e) => {
            result(0, false, 0, 0, Some(&e));
            phase(abi::PHASE_DONE);
            println!("driver init failed: {e}");
            return abi::EXIT_FAIL;
        }
    };
    let ms = |t: u64| (rdtsc() - t) / boot.tsc_khz;
    result(0, true, 0, 0, None);
    let irq_mode = gpu.fence_mode() == FenceMode::Interrupt;
    wr32(abi::RESULTS_HEADER + abi::H_FENCE_IRQ, irq_mode as u32);
    let (r0, w0) = bar_accesses();
    println!(
        "driver up in {} ms ({r0} BAR reads + {w0} BAR writes): {} MiB VRAM, fences by {}",
        ms(t0),
        gpu.vram_size() >> 20,
        if irq_mode { "interrupt" } else { "polling" }
    );
    match boot.mode {
        abi::MODE_STREAM => {
            let ok = stream::stream(&mut gpu, boot.tsc_khz);
            phase(abi::PHASE_DONE);
            return finish(ok);
        }
        abi::MODE_STOP_FAULT | abi::MODE_STOP_SPIN => {
            stream::stop_mid_submission(&mut gpu, boot.mode);
            return abi::EXIT_FAIL;
        }
        _ => {}
    }
    let mut ok = true;
    for (i, &w) in boot.workloads[..boot.nworkloads].iter().enumerate() {
        if i == 1 && boot.gate {
            stream::gate(boot.tsc_khz);
        }
        let Some(&w) = Workload::ALL.get(w as usize) else {
            result(1 + i, false, 0, 0, Some(&"unknown workload index"));
            ok = false;
            continue;
        };
        phase(1 + i as u32);
        let t = rdtsc();
        let (r0, w0) = bar_accesses();
        match workloads::run(&mut gpu, w, boot.size) {
            Ok(r) => {
                result(1 + i, r.verified, r.bytes, r.gpu_ns, None);
                ok &= r.verified;
                let (r1, w1) = bar_accesses();
                println!(
                    "{}: {} bytes, GPU {} ns, {} ms, {} BAR reads + {} BAR writes, {}",
                    w.name(),
                    r.bytes,
                    r.gpu_ns,
                    ms(t),
                    r1 - r0,
                    w1 - w0,
                    if r.verified {
                        "verified"
                    } else {
                        "NOT VERIFIED"
                    }
                );
            }
            Err(e) => {
                result(1 + i, false, 0, 0, Some(&e));
                ok = false;
                println!("{}: FAILED: {e}", w.name());
            }
        }
        if i == 0 && boot.mode == abi::MODE_RO_WRITE {
            ok &= ro_write(&gpu, bars.bar3);
        }
    }
    phase(abi::PHASE_DONE);
    let _ = workloads::release_channel(&mut gpu);
    finish(ok)
}

/// `MODE_RO_WRITE`: writes [`abi::RO_PROBE_VALUE`] through BAR3 into the bound workload
/// channel's instance block and reads it back through BAR3; true if the read saw the value.
/// Under BAR remap the block's page is a read-only KVM slot: the write must exit to the device
/// model (which stores it into VRAM) and the read is served from the slot without an exit.
fn ro_write(gpu: &Gpu<KvmHal>, bar3: u64) -> bool {
    let Some(va) = workloads::channel_inst_bar3(gpu) else {
        println!("ro-write: the workload channel's instance block is not mapped in BAR3");
        return false;
    };
    let off = va + abi::RO_PROBE_OFFSET;
    let before = rd32(bar3 + off);
    wr32(bar3 + off, abi::RO_PROBE_VALUE);
    let after = rd32(bar3 + off);
    let ok = after == abi::RO_PROBE_VALUE;
    println!(
        "ro-write: BAR3 {off:#x} (instance block + {:#x}): was {before:#x}, wrote {:#x}, read back {after:#x}: {}",
        abi::RO_PROBE_OFFSET,
        abi::RO_PROBE_VALUE,
        if ok { "read back matches" } else { "READ BACK MISMATCH" }
    );
    ok
}

/// Reports the interrupts seen and the verdict.
fn finish(ok: bool) -> u32 {
    wr64(
        abi::RESULTS_HEADER + abi::H_IRQS,
        IRQS.load(Ordering::SeqCst),
    );
    println!(
        "{} (interrupts seen: {})",
        if ok { "PASS" } else { "FAIL" },
        IRQS.load(Ordering::SeqCst)
    );
    if ok {
        abi::EXIT_PASS
    } else {
        abi::EXIT_FAIL
    }
}
