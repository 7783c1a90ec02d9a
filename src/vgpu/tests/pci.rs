//! The PCI command register and the expansion ROM BAR as a guest kernel uses them, through the
//! vGPU's configuration space (what every transport forwards): memory decoding off makes every
//! BAR read all-ones and drop writes; bus mastering off keeps the VM's GPU work away from its
//! RAM; the ROM BAR sizes to 512 KiB and offers the generated VBIOS only while enabled.

use super::*;
use vm_memory::Bytes;

const COMMAND: u16 = 0x04;
const ROM_BAR: u16 = 0x30;
const MEM: u16 = 1 << 1;
const MASTER: u16 = 1 << 2;

fn command(v: &Vgpu, bits: u16) {
    v.config_write(COMMAND, &bits.to_le_bytes());
}

fn cfg32(v: &Vgpu, off: u16) -> u32 {
    let mut b = [0u8; 4];
    v.config_read(off, &mut b);
    u32::from_le_bytes(b)
}

#[test]
fn memory_decoding_off_reads_all_ones_and_drops_writes() {
    let r = rig();
    let v = r.vm(ShadowMode::Lazy);
    // Created as firmware leaves a POSTed GPU: decoding and bus mastering on.
    assert_eq!(cfg32(&v, COMMAND) & 0xffff, u32::from(MEM | MASTER));
    wr(
        &v,
        pfifo::USERD_POLL_BASE,
        pfifo::userd_poll_encode(0x4_0000),
    );
    let poll = rd(&v, pfifo::USERD_POLL_BASE);
    assert_ne!(poll, 0);
    let exits = v.stats().exits.bar0.total();

    command(&v, MASTER);
    assert_eq!(rd(&v, pmc::BOOT_0), 0xffff_ffff, "BAR0 reads all-ones");
    wr(&v, pfifo::USERD_POLL_BASE, 0);
    let mut q = [0u8; 8];
    v.bar_read(Bar::Bar1, 0x4_0000, &mut q);
    assert_eq!(q, [0xff; 8], "BAR1 too");
    v.bar_read(Bar::Bar3, 0, &mut q[..4]);
    assert_eq!(q[..4], [0xff; 4], "and BAR3");
    v.bar_write(Bar::Bar1, 0x4_0000 + userd::GP_PUT, &7u32.to_le_bytes());
    assert!(
        v.direct_map(Bar::Bar1).runs.is_empty(),
        "nothing may be mapped through"
    );
    let s = v.stats();
    assert_eq!(s.pci.decode_off.reads, 3);
    assert_eq!(s.pci.decode_off.writes, 2);
    assert_eq!(
        s.exits.bar0.total(),
        exits,
        "no access reached the register file"
    );
    assert_eq!(s.doorbells, 0, "the dropped GP_PUT write rang no doorbell");

    command(&v, MEM | MASTER);
    assert_eq!(rd(&v, pmc::BOOT_0), pmc::BOOT_0_QUADRO_6000);
    assert_eq!(
        rd(&v, pfifo::USERD_POLL_BASE),
        poll,
        "the dropped write changed nothing"
    );
    // D3hot also stops decoding (PM capability at 0x60, PMCSR at +4).
    v.config_write(0x64, &3u16.to_le_bytes());
    assert_eq!(rd(&v, pmc::BOOT_0), 0xffff_ffff);
    v.config_write(0x64, &0u16.to_le_bytes());
    assert_eq!(rd(&v, pmc::BOOT_0), pmc::BOOT_0_QUADRO_6000);
}

/// A channel whose pushbuffer (VRAM) releases `value` to a semaphore in the VM's RAM at
/// `sem_gpa`, submitted as GP entry `n` (0-based) of its ring.
struct SysSemChannel {
    push_at: u64,
}

impl SysSemChannel {
    const RING: u64 = 0x6_0000;
    const SEM_VA: u64 = 0x0400_2000;

    fn new(v: &Vgpu, sem_gpa: u64) -> SysSemChannel {
        let (inst_a, pd, pt, userd_a) = (0x1_0000, 0x2_0000, 0x10_0000, 0x3_0000);
        guest_vm(
            v,
            pd,
            pt,
            &[
                (0x0400_0000, Self::RING, Target::Vram),
                (0x0400_1000, 0x6_1000, Target::Vram),
                (Self::SEM_VA, sem_gpa, Target::SysCoherent),
            ],
        );
        inst_block(v, inst_a, pd, userd_a, 0x0400_0000, 16);
        wr(
            v,
            pfifo::USERD_POLL_BASE,
            pfifo::userd_poll_encode(0x4_0000),
        );
        wr(
            v,
            pfifo::chan_table(0),
            pfifo::chan_encode(inst_a, Target::Vram),
        );
        wr(v, pfifo::chan_state(0), pfifo::STATE_START);
        submit_runlist(v, 0x5_0000, &[0]);
        SysSemChannel { push_at: 0x6_1000 }
    }

    /// Writes GP entry `n` releasing `value` and rings the doorbell.
    fn release(&mut self, v: &Vgpu, n: u32, value: u32) {
        let push = [
            gf100::method::incr(0, gf100::host::SEMAPHORE_A, 4),
            (Self::SEM_VA >> 32) as u32,
            Self::SEM_VA as u32,
            value,
            gf100::host::SEM_OP_RELEASE | gf100::host::SEM_RELEASE_4BYTE,
        ];
        let bytes: Vec<u8> = push.iter().flat_map(|w| w.to_le_bytes()).collect();
        pramin_wr(v, self.push_at, &bytes);
        let va = 0x0400_1000 + (self.push_at - 0x6_1000);
        pramin_wr64(
            v,
            Self::RING + u64::from(n) * 8,
            GpEntry::new(va, push.len() as u32).encode(),
        );
        self.push_at += 0x40;
        doorbell(v, 0, n + 1);
    }
}

#[test]
fn bus_mastering_off_keeps_gpu_work_out_of_guest_ram() {
    let r = rig();
    let v = r.host.create_vgpu(&profile(ShadowMode::Eager)).unwrap();
    let ram = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), GUEST_RAM as usize)]).unwrap();
    v.attach_guest_memory(ram.clone()).unwrap();
    let sem_gpa = 0x2000u64;
    let sem = |ram: &GuestMemoryMmap| ram.read_obj::<u32>(GuestAddress(sem_gpa)).unwrap();
    let mut ch = SysSemChannel::new(&v, sem_gpa);

    // Bus mastering on: the release lands in guest RAM.
    ch.release(&v, 0, 0x11);
    r.run_for(1_000_000);
    assert_eq!(sem(&ram), 0x11);

    // Off: the same work runs but its access to the VM's RAM master-aborts.
    command(&v, MEM);
    let aborts = r.gpu.stats().dma_errors;
    ch.release(&v, 1, 0x22);
    r.run_for(1_000_000);
    assert_eq!(
        sem(&ram),
        0x11,
        "no DMA into guest RAM with bus mastering off"
    );
    assert!(
        r.gpu.stats().dma_errors > aborts,
        "the refused access was counted"
    );
    assert_eq!(v.stats().pci.bus_master_off, 1);

    // Guest RAM re-attached while off (a vhost-user memory-table update) stays unmapped.
    v.detach_guest_memory().unwrap();
    v.attach_guest_memory(ram.clone()).unwrap();
    ch.release(&v, 2, 0x33);
    r.run_for(1_000_000);
    assert_eq!(sem(&ram), 0x11);

    // On again: the next release lands.
    command(&v, MEM | MASTER);
    ch.release(&v, 3, 0x44);
    r.run_for(1_000_000);
    assert_eq!(sem(&ram), 0x44);
}

#[test]
fn expansion_rom_bar_offers_the_vbios_only_while_enabled() {
    let r = rig();
    let v = r.vm(ShadowMode::Lazy);
    let mut b = [0u8; 4];
    // Sizing through config space: 512 KiB.
    v.config_write(ROM_BAR, &(!1u32).to_le_bytes());
    assert_eq!(cfg32(&v, ROM_BAR), 0xfff8_0000);
    // Assigned, not enabled: all-ones.
    v.config_write(ROM_BAR, &0xdb00_0000u32.to_le_bytes());
    v.rom_read(0, &mut b);
    assert_eq!(b, [0xff; 4]);
    // Enabled: the generated VBIOS, the same bytes the PROM window shows.
    v.config_write(ROM_BAR, &0xdb00_0001u32.to_le_bytes());
    v.rom_read(0, &mut b);
    assert_eq!(&b[..2], &[0x55, 0xaa]);
    let image = crate::mmio::vbios::image();
    let mut all = vec![0u8; image.len()];
    v.rom_read(0, &mut all);
    assert_eq!(all, image);
    let prom = rd(&v, gf100::vbios::PROM_BASE + 0x40);
    v.rom_read(0x40, &mut b);
    assert_eq!(u32::from_le_bytes(b), prom);
    // Past the image: zero; past the BAR: all-ones.
    v.rom_read(0x7_fffc, &mut b);
    assert_eq!(b, [0; 4]);
    v.rom_read(0x7_fffe, &mut b);
    assert_eq!(b, [0xff; 4]);
    v.rom_read(u64::MAX, &mut b);
    assert_eq!(b, [0xff; 4]);
    // Memory decoding off disables the ROM too.
    command(&v, MASTER);
    v.rom_read(0, &mut b);
    assert_eq!(b, [0xff; 4]);
    let s = v.stats().pci;
    assert_eq!((s.rom_reads, s.rom_refused), (4, 4));
}

#[test]
fn bar_fill_writes_what_the_pieces_would_and_honours_decoding() {
    let r = rig();
    let v = r.vm(ShadowMode::Lazy);
    wr(&v, pbus::PMEM, pbus::pmem_encode(0, Target::Vram));
    let base = u64::from(pbus::PRAMIN_BASE);
    // An unaligned fill across a FILL_CHUNK boundary, through the PRAMIN window.
    let (start, len) = (0x0ffe_u64, 0x1006_u64);
    v.bar_fill(Bar::Bar0, base + start, len, 0xa5);
    let byte = |a: u64| (pramin_rd(&v, a & !3) >> (8 * (a & 3))) as u8;
    assert_eq!(byte(start - 1), 0, "before the fill");
    assert_eq!(byte(start), 0xa5);
    assert_eq!(byte(0x1000), 0xa5, "across the chunk boundary");
    assert_eq!(byte(start + len - 1), 0xa5);
    assert_eq!(byte(start + len), 0, "after the fill");
    // Decoding off: nothing written, every piece counted.
    command(&v, MASTER);
    v.bar_fill(Bar::Bar0, base, 16, 0x11);
    assert_eq!(v.stats().pci.decode_off.writes, 2);
    command(&v, MEM | MASTER);
    assert_eq!(pramin_rd(&v, 0), 0);
    // A fill that would wrap does nothing.
    v.bar_fill(Bar::Bar1, u64::MAX - 3, 16, 0xff);
}
