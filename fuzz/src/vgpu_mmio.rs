//! `vgpu_mmio`: VM 0 of a two-VM `GpuHost` performs a fuzzer-chosen sequence of BAR0, BAR1,
//! BAR3 and config-space accesses (offsets biased toward `BAR0_REGIONS`), interleaved with
//! clock advances, polls and, rarely, its own destruction. Invariants: nothing panics; VM 1's
//! VRAM slice (sampled pages filled with a pattern), VM 1's guest RAM and VM 1's physical
//! channel registers are unchanged afterwards, also after VM 0 is destroyed.

use std::sync::Arc;

use gf100::pfifo;
use gpuvm::addr::HostVram;
use gpuvm::clock::{Clock, SimClock};
use gpuvm::host::{GpuHost, HostConfig};
use gpuvm::mmio::regions::BAR0_REGIONS;
use gpuvm::phys::sim::{CostModel, SimConfig, SimGpu};
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm::profile::{ShadowMode, VgpuProfile};
use gpuvm::vgpu::Vgpu;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::{fnv, Input};

const VRAM: u64 = 256 << 20;
const SLICE_MIB: u64 = 64;
const GUEST_RAM: usize = 1 << 20;
/// Accesses per input at most (keeps one execution short).
const MAX_OPS: usize = 512;
/// VM 1's VRAM is checked in this many pages spread over its slice.
const SAMPLES: u64 = 32;

fn profile(name: &str, shadow: ShadowMode) -> VgpuProfile {
    VgpuProfile {
        name: name.into(),
        vram_mib: SLICE_MIB,
        channels: 4,
        weight: 1,
        shadow,
    }
}

fn vm(host: &GpuHost, name: &str, shadow: ShadowMode) -> (Arc<Vgpu>, GuestMemoryMmap) {
    let v = host.create_vgpu(&profile(name, shadow)).expect("create_vgpu");
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), GUEST_RAM)]).unwrap();
    v.attach_guest_memory(mem.clone()).expect("attach_guest_memory");
    (v, mem)
}

/// What VM 1 owns that VM 0 must not be able to change.
#[derive(Debug, PartialEq, Eq)]
struct Victim {
    vram: Vec<u64>,
    ram: u64,
    chans: Vec<(u32, u32)>,
}

fn snapshot(gpu: &SimGpu, v1: &Vgpu, ram1: &GuestMemoryMmap) -> Victim {
    let slice = v1.vram_slice();
    let step = slice.size / SAMPLES;
    let mut page = vec![0u8; 4096];
    let vram = (0..=SAMPLES)
        .map(|i| {
            let off = (i * step).min(slice.size - 4096);
            gpu.read_vram(HostVram(slice.base.raw() + off), &mut page);
            fnv(&page)
        })
        .collect();
    let mut buf = vec![0u8; GUEST_RAM];
    ram1.read_slice(&mut buf, GuestAddress(0)).unwrap();
    let chans = v1
        .phys_channels()
        .map(|c| {
            (
                gpu.read_reg(pfifo::chan_table(c)),
                gpu.read_reg(pfifo::chan_state(c)) & pfifo::STATE_START,
            )
        })
        .collect();
    Victim {
        vram,
        ram: fnv(&buf),
        chans,
    }
}

/// Fills VM 1's sampled pages and its RAM with a recognisable pattern.
fn plant(gpu: &SimGpu, v1: &Vgpu, ram1: &GuestMemoryMmap) {
    let slice = v1.vram_slice();
    let step = slice.size / SAMPLES;
    for i in 0..=SAMPLES {
        let off = (i * step).min(slice.size - 4096);
        let page: Vec<u8> = (0..4096u32).map(|b| (b as u8) ^ (i as u8) ^ 0xa5).collect();
        gpu.write_vram(HostVram(slice.base.raw() + off), &page);
    }
    let ram: Vec<u8> = (0..GUEST_RAM).map(|b| (b as u8) ^ 0x5a).collect();
    ram1.write_slice(&ram, GuestAddress(0)).unwrap();
}

fn bar0_offset(inp: &mut Input, width: u64) -> u64 {
    let sel = inp.u8();
    let raw = u64::from(inp.u32());
    let off = if sel < 0xe0 {
        let r = &BAR0_REGIONS[sel as usize % BAR0_REGIONS.len()];
        u64::from(r.offset) + raw % u64::from(r.size.max(1))
    } else {
        raw % Bar::Bar0.size()
    };
    if sel & 1 == 0 {
        off & !(width - 1)
    } else {
        off
    }
}

fn aperture_offset(inp: &mut Input, bar: Bar, width: u64) -> u64 {
    let sel = inp.u8();
    let raw = u64::from(inp.u32());
    // Mostly the first 16 MiB, where a driver maps things; sometimes anywhere.
    let off = if sel < 0xc0 { raw % (16 << 20) } else { raw % bar.size() };
    (off & !(width - 1)).min(bar.size() - width)
}

pub fn run(data: &[u8]) {
    let clock = Arc::new(SimClock::new());
    let gpu = Arc::new(SimGpu::new(SimConfig {
        vram_size: VRAM,
        clock: clock.clone(),
        cost: CostModel::instant(),
    }));
    let host = GpuHost::new(
        gpu.clone(),
        HostConfig {
            hypervisor_vram: 32 << 20,
            ..HostConfig::default()
        },
    )
    .expect("GpuHost::new");
    let mut inp = Input::new(data);
    let mode = ShadowMode::ALL[inp.u8() as usize % 4];
    let (v0, _ram0) = vm(&host, "attacker", mode);
    let (v1, ram1) = vm(&host, "victim", ShadowMode::Lazy);
    plant(&gpu, &v1, &ram1);
    let before = snapshot(&gpu, &v1, &ram1);

    let mut destroyed = false;
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        let tag = inp.u8();
        let width = 1u64 << ((tag >> 4) & 3);
        let write = tag & 0x40 != 0;
        let value = inp.u64().to_le_bytes();
        let w = width as usize;
        match tag & 0x0f {
            0..=6 => {
                let off = bar0_offset(&mut inp, width);
                access(&v0, Bar::Bar0, off, write, &value[..w]);
            }
            7..=9 => {
                let off = aperture_offset(&mut inp, Bar::Bar1, width);
                access(&v0, Bar::Bar1, off, write, &value[..w]);
            }
            10..=11 => {
                let off = aperture_offset(&mut inp, Bar::Bar3, width);
                access(&v0, Bar::Bar3, off, write, &value[..w]);
            }
            12..=13 => {
                let raw = inp.u16();
                let off = if raw & 0x8000 == 0 { raw % 0x100 } else { raw % 0x1000 };
                let w = w.min(4);
                if write {
                    v0.config_write(off, &value[..w]);
                } else {
                    let mut b = [0u8; 4];
                    v0.config_read(off, &mut b[..w]);
                }
            }
            14 => {
                clock.advance(u64::from(inp.u16()) * 1000);
                host.poll();
            }
            _ => {
                if tag == 0xff && !destroyed {
                    host.destroy_vgpu(&v0).expect("destroy_vgpu");
                    destroyed = true;
                } else {
                    v0.poll();
                }
            }
        }
    }
    // Let whatever VM 0 started run to completion (bounded), then check, destroy, check.
    for _ in 0..64 {
        match gpu.next_event_ns() {
            Some(t) => clock.advance_to(t.max(clock.now_ns())),
            None => break,
        }
        host.poll();
    }
    host.poll();
    assert_eq!(snapshot(&gpu, &v1, &ram1), before, "VM 1 changed by VM 0's accesses");
    if !destroyed {
        host.destroy_vgpu(&v0).expect("destroy_vgpu");
    }
    host.poll();
    assert_eq!(snapshot(&gpu, &v1, &ram1), before, "VM 1 changed by VM 0's teardown");
}

fn access(v: &Vgpu, bar: Bar, off: u64, write: bool, value: &[u8]) {
    if write {
        v.bar_write(bar, off, value);
    } else {
        let mut b = [0u8; 8];
        v.bar_read(bar, off, &mut b[..value.len()]);
    }
}
