//! The simulator test rig: a tiny "driver" that programs the simulated GF100 only through its
//! hardware interface (BAR0 registers, the BAR1 aperture) and the VRAM backdoor (`write_vram` /
//! `read_vram`) the hypervisor uses to lay out page tables, instance blocks and pushbuffers.
//!
//! Shared by `tests/sim.rs` and `benches/sim.rs`; each uses only part of it.

use std::collections::HashMap;
use std::sync::Arc;

use gpuvm::addr::HostVram;
use gpuvm::clock::{Clock, SimClock};
use gpuvm::gf100::compute::{self as cc, Kernel};
use gpuvm::gf100::gpfifo::GpEntry;
use gpuvm::gf100::mmu::{self, Pde, PtRef, PtSize, Pte};
use gpuvm::gf100::{copy as ce, host, inst, method, pbus, pfifo, pmc, userd, Target};
use gpuvm::phys::{Bar, PhysicalGpu};
use gpuvm_sim::{CostModel, Executor, SimConfig, SimGpu};

/// Channel VA layout (every channel has its own VM).
pub const IB_VA: u64 = 0x0010_0000;
pub const IB_ENTRIES: u32 = 512;
pub const PB_VA: u64 = 0x0020_0000;
pub const PB_SIZE: u64 = 0x1_0000;
/// First VA tests use for data.
pub const DATA_VA: u64 = 0x0100_0000;
/// Subchannels the rig binds.
pub const SUBC_COMPUTE: u32 = 1;
pub const SUBC_COPY: u32 = 4;

/// A GPU VM built in VRAM: a page directory and its small-page tables.
#[derive(Debug, Clone)]
pub struct Vm {
    pub pd: u64,
    pub spts: HashMap<u64, u64>,
}

/// A channel set up by the rig.
#[derive(Debug)]
pub struct Chan {
    pub chid: u32,
    pub inst: u64,
    pub vm: Vm,
    pub ib_pa: u64,
    pub pb_pa: u64,
    pub pb_used: u64,
    pub put: u32,
}

pub struct Rig {
    pub gpu: SimGpu,
    pub clock: Arc<SimClock>,
    /// With the GPU on the host's clock ([`Rig::with_real_clock`]): the GPU's event reports
    /// (its waker, called when work it finished left nothing in flight), for `settle`.
    pub events: Option<std::sync::mpsc::Receiver<()>>,
    pub next: u64,
    pub userd: u64,
    pub bar1: Vm,
}

/// Writes `words` to VRAM at `pa` (the hypervisor's backdoor).
pub fn put_words(r: &Rig, pa: u64, words: &[u32]) {
    r.gpu.write_vram(HostVram(pa), &words_le(words));
}

/// Reads `n` words of VRAM at `pa`.
pub fn get_words(r: &Rig, pa: u64, n: usize) -> Vec<u32> {
    let mut b = vec![0u8; n * 4];
    r.gpu.read_vram(HostVram(pa), &mut b);
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn words_le(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// An incrementing method header with its data.
pub fn mthd(subc: u32, m: u32, data: &[u32]) -> Vec<u32> {
    let mut v = vec![method::incr(subc, m, data.len() as u32)];
    v.extend_from_slice(data);
    v
}

/// Host semaphore: set address and payload, then trigger `op`.
pub fn semaphore(va: u64, payload: u32, op: u32) -> Vec<u32> {
    mthd(
        0,
        host::SEMAPHORE_A,
        &[(va >> 32) as u32, va as u32, payload, op],
    )
}

/// A 4-byte host semaphore release.
pub fn release4(va: u64, payload: u32) -> Vec<u32> {
    semaphore(va, payload, host::SEM_OP_RELEASE | host::SEM_RELEASE_4BYTE)
}

pub fn bind_compute() -> Vec<u32> {
    mthd(
        SUBC_COMPUTE,
        host::SET_OBJECT,
        &[host::set_object(cc::CLASS, host::ENGINE_PGRAPH)],
    )
}

pub fn bind_copy() -> Vec<u32> {
    mthd(
        SUBC_COPY,
        host::SET_OBJECT,
        &[host::set_object(ce::CLASS, host::ENGINE_PCOPY0)],
    )
}

pub fn launch_kernel(k: &Kernel) -> Vec<u32> {
    let (args, used) = k.encode_args();
    let mut v = mthd(SUBC_COMPUTE, cc::KERNEL, &[k.id() as u32]);
    v.extend(mthd(SUBC_COMPUTE, cc::ARG, &args[..used]));
    v.extend(mthd(SUBC_COMPUTE, cc::LAUNCH, &[0]));
    v
}

/// A pitch copy of `lines` lines of `len` bytes.
pub fn copy(
    src: u64,
    dst: u64,
    pitch_in: u32,
    pitch_out: u32,
    len: u32,
    lines: u32,
    launch_extra: u32,
) -> Vec<u32> {
    let regs = [
        (src >> 32) as u32,
        src as u32,
        (dst >> 32) as u32,
        dst as u32,
        pitch_in,
        pitch_out,
        len,
        lines,
    ];
    let mut v = mthd(SUBC_COPY, ce::OFFSET_IN_UPPER, &regs);
    let launch = ce::LAUNCH_TRANSFER_NON_PIPELINED
        | ce::LAUNCH_SRC_PITCH
        | ce::LAUNCH_DST_PITCH
        | ce::LAUNCH_MULTI_LINE;
    v.extend(mthd(SUBC_COPY, ce::LAUNCH_DMA, &[launch | launch_extra]));
    v
}

impl Rig {
    /// A rig with the Quadro 6000 cost model and 6 GiB of VRAM.
    pub fn new() -> Rig {
        Rig::with_cost(CostModel::quadro_6000())
    }

    /// A rig with cost model `cost` and 6 GiB of VRAM.
    pub fn with_cost(cost: CostModel) -> Rig {
        Rig::with_config(cost, SimConfig::default().vram_size)
    }

    /// A rig whose GPU has `vram_size` bytes of (lazily allocated) VRAM.
    pub fn with_config(cost: CostModel, vram_size: u64) -> Rig {
        Rig::with_executor(cost, vram_size, Executor::Auto)
    }

    /// A rig whose GPU runs its engines' work by `executor`.
    pub fn with_executor(cost: CostModel, vram_size: u64, executor: Executor) -> Rig {
        Rig::build(cost, vram_size, executor, false)
    }

    /// A rig whose GPU runs on the host's clock (`RealClock`; with the default executor, the
    /// engine worker): `settle` waits in host time.
    pub fn with_real_clock(cost: CostModel, vram_size: u64) -> Rig {
        Rig::build(cost, vram_size, Executor::Auto, true)
    }

    fn build(cost: CostModel, vram_size: u64, executor: Executor, real: bool) -> Rig {
        let clock = Arc::new(SimClock::new());
        let gpu_clock: Arc<dyn Clock> = if real {
            Arc::new(gpuvm::clock::RealClock::new())
        } else {
            clock.clone()
        };
        let gpu = SimGpu::new(SimConfig {
            vram_size,
            clock: gpu_clock,
            cost,
            executor,
            ..SimConfig::default()
        });
        let events = real.then(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            gpu.set_event_waker(Arc::new(move || {
                let _ = tx.send(());
            }));
            rx
        });
        let mut rig = Rig {
            gpu,
            clock,
            events,
            next: 0x10_0000,
            userd: 0,
            bar1: Vm {
                pd: 0,
                spts: HashMap::new(),
            },
        };
        rig.init();
        rig
    }

    /// nouveau-style init: interrupts on, BAR1 VM with the USERD area at BAR1 VA 0, poll area.
    pub fn init(&mut self) {
        let g = &self.gpu;
        g.write_reg(pmc::ENABLE, pmc::ENABLE_ALL);
        g.write_reg(pfifo::INTR, u32::MAX);
        g.write_reg(pfifo::INTR_EN, u32::MAX);
        g.write_reg(pmc::INTR_EN_HOST, pmc::INTR_EN_HARDWARE);
        self.bar1 = self.vm();
        self.userd = self.alloc(pfifo::CHANNELS as u64 * userd::SIZE, 0x1000);
        let (vm, userd) = (self.bar1.clone(), self.userd);
        self.map_range(
            &vm,
            0,
            userd,
            pfifo::CHANNELS as u64 * userd::SIZE,
            Target::Vram,
        );
        self.bar1 = vm;
        let bar1_inst = self.inst_block(&self.bar1.clone(), Bar::Bar1.size() - 1);
        self.gpu.write_reg(
            pbus::BAR1_INST,
            pbus::bar_inst_encode(bar1_inst, Target::Vram),
        );
        self.gpu
            .write_reg(pfifo::USERD_POLL_BASE, pfifo::userd_poll_encode(0));
    }

    pub fn alloc(&mut self, size: u64, align: u64) -> u64 {
        let a = self.next.next_multiple_of(align);
        self.next = a + size;
        a
    }

    pub fn w32(&self, pa: u64, v: u32) {
        self.gpu.write_vram(HostVram(pa), &v.to_le_bytes());
    }

    pub fn w64(&self, pa: u64, v: u64) {
        self.gpu.write_vram(HostVram(pa), &v.to_le_bytes());
    }

    pub fn r32(&self, pa: u64) -> u32 {
        let mut b = [0u8; 4];
        self.gpu.read_vram(HostVram(pa), &mut b);
        u32::from_le_bytes(b)
    }

    pub fn r64(&self, pa: u64) -> u64 {
        let mut b = [0u8; 8];
        self.gpu.read_vram(HostVram(pa), &mut b);
        u64::from_le_bytes(b)
    }

    pub fn vm(&mut self) -> Vm {
        Vm {
            pd: self.alloc(mmu::PD_SIZE, 0x1000),
            spts: HashMap::new(),
        }
    }

    /// The SPT covering `va`, created (with a PDE) if needed.
    pub fn spt(&mut self, vm: &mut Vm, va: u64) -> u64 {
        let i = mmu::pde_index(va);
        if let Some(&s) = vm.spts.get(&i) {
            return s;
        }
        let s = self.alloc(mmu::SPT_SIZE, 0x1000);
        let pde = Pde {
            small: Some(PtRef {
                addr: s,
                target: Target::Vram,
                vol: false,
            }),
            large: None,
            size: PtSize::Full,
        };
        self.w64(vm.pd + i * 8, pde.encode());
        vm.spts.insert(i, s);
        s
    }

    pub fn pte_addr(&mut self, vm: &mut Vm, va: u64) -> u64 {
        self.spt(vm, va) + mmu::spt_index(va) * 8
    }

    pub fn set_pte(&mut self, vm: &mut Vm, va: u64, raw: u64) {
        let a = self.pte_addr(vm, va);
        self.w64(a, raw);
    }

    pub fn map_range(&mut self, vm: &Vm, va: u64, pa: u64, len: u64, target: Target) -> Vm {
        let mut vm = vm.clone();
        for off in (0..len).step_by(0x1000) {
            self.set_pte(&mut vm, va + off, Pte::new(pa + off, target).encode());
        }
        vm
    }

    /// An instance block whose PDB names `vm`, with VM limit `limit`.
    pub fn inst_block(&mut self, vm: &Vm, limit: u64) -> u64 {
        let i = self.alloc(inst::SIZE, 0x1000);
        self.w64(i + inst::PDB_LO, inst::pdb_encode(vm.pd, Target::Vram));
        self.w64(i + inst::LIMIT_LO, limit);
        i
    }

    /// A channel with its own VM, ring and pushbuffer, bound and started (not yet in a runlist).
    pub fn channel(&mut self, chid: u32) -> Chan {
        let vm = self.vm();
        let ib_pa = self.alloc(IB_ENTRIES as u64 * 8, 0x1000);
        let pb_pa = self.alloc(PB_SIZE, 0x1000);
        let vm = self.map_range(&vm, IB_VA, ib_pa, IB_ENTRIES as u64 * 8, Target::Vram);
        let vm = self.map_range(&vm, PB_VA, pb_pa, PB_SIZE, Target::Vram);
        let i = self.inst_block(&vm, mmu::VA_LIMIT - 1);
        self.w64(
            i + inst::RAMFC_USERD_LO,
            inst::userd_encode(self.userd + chid as u64 * userd::SIZE, Target::Vram),
        );
        self.w32(i + inst::RAMFC_IB_BASE_LO, IB_VA as u32);
        self.w32(
            i + inst::RAMFC_IB_CONFIG,
            inst::ib_config_encode(IB_VA, IB_ENTRIES),
        );
        for (off, v) in inst::RAMFC_NOUVEAU_DEFAULTS {
            self.w32(i + off, v);
        }
        self.gpu
            .write_reg(pfifo::chan_table(chid), pfifo::chan_encode(i, Target::Vram));
        self.gpu
            .write_reg(pfifo::chan_state(chid), pfifo::STATE_START);
        Chan {
            chid,
            inst: i,
            vm,
            ib_pa,
            pb_pa,
            pb_used: 0,
            put: 0,
        }
    }

    pub fn runlist(&mut self, chids: &[u32]) {
        let r = self.alloc(0x1000, 0x1000);
        for (n, &c) in chids.iter().enumerate() {
            self.w32(r + n as u64 * 8, c);
            self.w32(r + n as u64 * 8 + 4, pfifo::RUNLIST_ENTRY_WORD1);
        }
        self.gpu.write_reg(
            pfifo::RUNLIST_BASE,
            pfifo::runlist_base_encode(r, Target::Vram),
        );
        self.gpu.write_reg(
            pfifo::RUNLIST_SUBMIT,
            pfifo::RUNLIST_SUBMIT_UNK20 | chids.len() as u32,
        );
    }

    /// Maps `len` bytes of fresh VRAM at `va` in the channel's VM; returns the physical address.
    pub fn buffer(&mut self, ch: &mut Chan, va: u64, len: u64) -> u64 {
        let pa = self.alloc(len, 0x1000);
        ch.vm = self.map_range(&ch.vm, va, pa, len, Target::Vram);
        pa
    }

    /// Writes a GPFIFO entry for `words` (no doorbell).
    pub fn push_entry(&mut self, ch: &mut Chan, words: &[u32]) {
        let off = ch.pb_used;
        self.gpu
            .write_vram(HostVram(ch.pb_pa + off), &words_le(words));
        ch.pb_used += words.len() as u64 * 4;
        let e = GpEntry::new(PB_VA + off, words.len() as u32);
        self.w64(ch.ib_pa + ch.put as u64 * 8, e.encode());
        ch.put = (ch.put + 1) % IB_ENTRIES;
    }

    /// Rings the channel's doorbell: GP_PUT through BAR1.
    pub fn doorbell(&self, ch: &Chan) {
        self.gpu.write_aperture(
            Bar::Bar1,
            ch.chid as u64 * userd::SIZE + userd::GP_PUT,
            &ch.put.to_le_bytes(),
        );
    }

    pub fn submit(&mut self, ch: &mut Chan, words: &[u32]) {
        self.push_entry(ch, words);
        self.doorbell(ch);
    }

    pub fn gp_get(&self, ch: &Chan) -> u32 {
        let mut b = [0u8; 4];
        self.gpu.read_aperture(
            Bar::Bar1,
            ch.chid as u64 * userd::SIZE + userd::GP_GET,
            &mut b,
        );
        u32::from_le_bytes(b)
    }

    /// Advances the simulated clock event by event until the GPU is idle (with a real clock,
    /// waits until it is).
    pub fn settle(&self) {
        if let Some(events) = &self.events {
            // In host time: the worker does the work as the clock reaches it and reports when
            // it leaves nothing in flight; wait for that report (a minute without one is a
            // hang, not a timing).
            while self.gpu.next_event_ns().is_some() {
                let report = events.recv_timeout(std::time::Duration::from_secs(60));
                assert!(report.is_ok(), "the GPU did not settle");
            }
            return;
        }
        for _ in 0..100_000 {
            match self.gpu.next_event_ns() {
                Some(t) => self.clock.advance_to(t.max(self.clock.now_ns())),
                None => return,
            }
        }
        panic!("the GPU did not settle");
    }

    pub fn reg(&self, offset: u32) -> u32 {
        self.gpu.read_reg(offset)
    }

    pub fn runnable(&self, ch: &Chan) -> bool {
        self.reg(pfifo::chan_state(ch.chid)) & pfifo::STATE_RUNNABLE != 0
    }
}
