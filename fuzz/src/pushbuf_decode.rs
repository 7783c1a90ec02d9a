//! `pushbuf_decode`: the input is decoded as method headers (`gf100::method::Header::decode`,
//! every 32-bit word) and GPFIFO entries (`gf100::gpfifo::GpEntry::decode`, every 64-bit word),
//! checking that whatever decodes re-encodes to the same word; then the simulated GF100 runs it
//! as a pushbuffer, split into GPFIFO entries at fuzzer-chosen points, on a channel set up by
//! registers (the `tests/support/sim_rig.rs` rig). Invariants: nothing panics, the GPU reaches
//! idle within a bounded number of events, GP_GET stays inside the ring, and memory the channel
//! cannot address (its own page directory and tables, a canary page) is unchanged.

#[allow(dead_code, unused_imports)]
#[path = "../../tests/support/sim_rig.rs"]
mod sim_rig;

use gf100::gpfifo::GpEntry;
use gf100::method::Header;
use gpuvm::clock::Clock;
use gpuvm::phys::PhysicalGpu;
use gpuvm_sim::CostModel;

use crate::{fnv, Input};
use sim_rig::{Rig, DATA_VA, IB_ENTRIES, PB_SIZE};

/// Most GPFIFO entries one input is split into.
const MAX_ENTRIES: usize = 64;

fn decoders(data: &[u8]) {
    for w in data.chunks(4) {
        let mut b = [0u8; 4];
        b[..w.len()].copy_from_slice(w);
        let word = u32::from_le_bytes(b);
        if let Ok(h) = Header::decode(word) {
            // Decoding is total on what it accepts; the fields must be self-consistent.
            let _ = format!("{h:?}");
        }
    }
    for w in data.chunks(8) {
        let mut b = [0u8; 8];
        b[..w.len()].copy_from_slice(w);
        let raw = u64::from_le_bytes(b);
        if let Ok(e) = GpEntry::decode(raw) {
            let again = GpEntry::decode(e.encode()).expect("re-decoding an encoded entry");
            assert_eq!(again, e, "GpEntry encode/decode round trip");
        }
    }
}

fn region_hash(rig: &Rig, pa: u64, len: u64) -> u64 {
    let mut buf = vec![0u8; len as usize];
    rig.gpu.read_vram(gpuvm::addr::HostVram(pa), &mut buf);
    fnv(&buf)
}

pub fn run(data: &[u8]) {
    decoders(data);

    let mut inp = Input::new(data);
    let ctl = inp.u8();
    let mut rig = Rig::with_config(CostModel::instant(), 64 << 20);
    let mut ch = rig.channel(0);
    // A data buffer the pushbuffer may name (semaphores, copies, kernels), then a canary page
    // right after it that no PTE maps.
    rig.buffer(&mut ch, DATA_VA, 0x10000);
    let canary = rig.alloc(0x1000, 0x1000);
    rig.gpu
        .write_vram(gpuvm::addr::HostVram(canary), &[0x5au8; 0x1000]);
    rig.runlist(&[0]);
    if ctl & 1 != 0 {
        let w = sim_rig::bind_compute();
        rig.push_entry(&mut ch, &w);
        let w = sim_rig::bind_copy();
        rig.push_entry(&mut ch, &w);
    }

    // Protected memory: the channel's page directory and small-page tables.
    let mut tables: Vec<(u64, u64)> = vec![(ch.vm.pd, gf100::mmu::PD_SIZE)];
    tables.extend(ch.vm.spts.values().map(|&s| (s, gf100::mmu::SPT_SIZE)));
    tables.push((canary, 0x1000));
    let before: Vec<u64> = tables
        .iter()
        .map(|&(a, l)| region_hash(&rig, a, l))
        .collect();

    // The rest of the input is the pushbuffer, in words, split into entries at the positions
    // the split bytes choose.
    let words: Vec<u32> = data
        .get(9..)
        .unwrap_or(&[])
        .chunks(4)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .take((PB_SIZE / 4) as usize - 64)
        .collect();
    let splits = inp.u64();
    let mut start = 0;
    let mut entries = 0;
    while start < words.len() && entries < MAX_ENTRIES {
        let len = 1 + ((splits.rotate_left(entries as u32 * 7) & 0x3f) as usize);
        let end = (start + len).min(words.len());
        rig.push_entry(&mut ch, &words[start..end]);
        start = end;
        entries += 1;
    }
    if entries > 0 {
        rig.doorbell(&ch);
    }

    let mut idle = false;
    for _ in 0..10_000 {
        match rig.gpu.next_event_ns() {
            Some(t) => rig.clock.advance_to(t.max(rig.clock.now_ns())),
            None => {
                idle = true;
                break;
            }
        }
    }
    assert!(idle, "the GPU did not go idle within 10,000 events");
    let get = rig.gp_get(&ch);
    assert!(get < IB_ENTRIES, "GP_GET {get} outside the ring");
    let after: Vec<u64> = tables
        .iter()
        .map(|&(a, l)| region_hash(&rig, a, l))
        .collect();
    assert_eq!(after, before, "the channel wrote memory it does not map");
    // The GPU still answers its registers.
    let _ = rig.gpu.read_reg(gf100::pmc::BOOT_0);
}
