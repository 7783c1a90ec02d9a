//! Tests of the embedded guest program's PVH entry note (guest-bin `pvh.rs`): what a PVH loader
//! (Cloud Hypervisor's `linux-loader`, Firecracker, QEMU) looks for before it boots an ELF.
//! The note must sit in a PT_NOTE segment, be named "Xen" with type `XEN_ELFNOTE_PHYS32_ENTRY`
//! (18) and a 4-byte descriptor, and its entry must be executable code that a PT_LOAD segment
//! loads below 4 GiB (the loader enters it with paging off).

use super::GUEST_ELF;

/// `XEN_ELFNOTE_PHYS32_ENTRY`.
const PHYS32_ENTRY: u32 = 18;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const PF_X: u32 = 1;

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// (type, flags, offset, paddr, filesz, memsz) of each program header.
fn phdrs(elf: &[u8]) -> Vec<(u32, u32, usize, u64, u64, u64)> {
    let (phoff, phentsize, phnum) = (
        u64_at(elf, 32) as usize,
        u16_at(elf, 54) as usize,
        u16_at(elf, 56) as usize,
    );
    (0..phnum)
        .map(|i| {
            let p = phoff + i * phentsize;
            (
                u32_at(elf, p),
                u32_at(elf, p + 4),
                u64_at(elf, p + 8) as usize,
                u64_at(elf, p + 24),
                u64_at(elf, p + 32),
                u64_at(elf, p + 40),
            )
        })
        .collect()
}

/// The PHYS32_ENTRY addresses of every "Xen" note in every PT_NOTE segment.
fn pvh_entries(elf: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    for (kind, _, off, _, filesz, _) in phdrs(elf) {
        if kind != PT_NOTE {
            continue;
        }
        let (mut p, end) = (off, off + filesz as usize);
        while p + 12 <= end {
            let (namesz, descsz, ty) = (
                u32_at(elf, p) as usize,
                u32_at(elf, p + 4) as usize,
                u32_at(elf, p + 8),
            );
            let name = &elf[p + 12..p + 12 + namesz];
            let desc = p + 12 + namesz.next_multiple_of(4);
            if name == b"Xen\0" && ty == PHYS32_ENTRY && descsz >= 4 {
                out.push(u32_at(elf, desc));
            }
            p = desc + descsz.next_multiple_of(4);
        }
    }
    out
}

#[test]
fn the_guest_carries_one_pvh_entry_note() {
    assert_eq!(&GUEST_ELF[..4], b"\x7fELF");
    let entries = pvh_entries(GUEST_ELF);
    assert_eq!(
        entries.len(),
        1,
        "exactly one PHYS32_ENTRY note: {entries:x?}"
    );
}

#[test]
fn the_pvh_entry_is_loaded_executable_code() {
    let entry = u64::from(pvh_entries(GUEST_ELF)[0]);
    let seg = phdrs(GUEST_ELF)
        .into_iter()
        .find(|&(kind, _, _, paddr, filesz, _)| {
            kind == PT_LOAD && (paddr..paddr + filesz).contains(&entry)
        })
        .expect("the PVH entry lies in no PT_LOAD segment");
    assert!(
        seg.1 & PF_X != 0,
        "the segment holding the PVH entry is not executable"
    );
    // The entry is 32-bit code starting with `cli` (0xfa), not the ring-3 entry.
    let byte = GUEST_ELF[seg.2 + (entry - seg.3) as usize];
    assert_eq!(byte, 0xfa, "PVH entry does not start with cli");
    assert_ne!(
        entry,
        u64_at(GUEST_ELF, 24),
        "PVH entry is not the ELF entry"
    );
    assert!(entry < 1 << 32);
}
