//! Codec tests for the `gf100` facts crate: every encoder/decoder pair round-trips, decoders
//! reject what hardware (or the model, where hardware is unknown) rejects, and a few values are
//! pinned to what nouveau actually writes.

use gf100::compute::{self, Kernel, KernelError, KernelId};
use gf100::fault::{self, FaultFlags};
use gf100::gpfifo::{GpEntry, GpEntryError, MAX_LENGTH_DWORDS};
use gf100::method::{self, Header, HeaderError, Mode};
use gf100::mmu::{EntryError, Pde, PtRef, PtSize, Pte};
use gf100::{host, inst, pbus, pffb, pfifo, pmc, Target};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        Just(Target::Vram),
        Just(Target::SysCoherent),
        Just(Target::SysNonCoherent)
    ]
}

/// A 4 KiB-aligned 40-bit physical address.
fn addr_4k() -> impl Strategy<Value = u64> {
    (0u64..(1 << 28)).prop_map(|x| x << 12)
}

/// A 40-bit GPU virtual address.
fn va40() -> impl Strategy<Value = u64> + Clone {
    0u64..(1 << 40)
}

fn pt_size() -> impl Strategy<Value = PtSize> {
    prop_oneof![
        Just(PtSize::Full),
        Just(PtSize::Half),
        Just(PtSize::Quarter),
        Just(PtSize::Eighth)
    ]
}

fn pt_ref() -> impl Strategy<Value = PtRef> {
    (addr_4k(), target(), any::<bool>()).prop_map(|(addr, target, vol)| PtRef { addr, target, vol })
}

fn pte() -> impl Strategy<Value = Pte> {
    (
        addr_4k(),
        target(),
        any::<[bool; 4]>(),
        any::<u8>(),
        0u32..(1 << 17),
    )
        .prop_map(
            |(addr, target, [supervisor, read_only, encrypted, vol], kind, comptag)| Pte {
                addr,
                target,
                supervisor,
                read_only,
                encrypted,
                vol,
                kind,
                comptag,
            },
        )
}

fn gp_entry() -> impl Strategy<Value = GpEntry> {
    (va40(), 1u32..=MAX_LENGTH_DWORDS, any::<[bool; 5]>()).prop_map(|(va, len, f)| GpEntry {
        va: va & !3,
        length_dwords: len,
        fetch_conditional: f[0],
        no_context_switch: f[1],
        privileged: f[2],
        subroutine: f[3],
        sync_wait: f[4],
    })
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![
        Just(Mode::Incrementing),
        Just(Mode::NonIncrementing),
        Just(Mode::IncrementOnce)
    ]
}

/// Every valid header: method a multiple of 4 below 0x4000, count/immediate below 8192,
/// subchannel below 8.
fn header() -> impl Strategy<Value = Header> {
    let method = (0u32..0x1000).prop_map(|m| m << 2);
    prop_oneof![
        (mode(), 0u32..8, method.clone(), 0u32..8192).prop_map(
            |(mode, subchannel, method, count)| {
                Header::Methods {
                    mode,
                    subchannel,
                    method,
                    count,
                }
            }
        ),
        (0u32..8, method, 0u32..8192).prop_map(|(subchannel, method, data)| Header::Immediate {
            subchannel,
            method,
            data
        }),
        Just(Header::SubDeviceMask),
        Just(Header::EndSegment),
    ]
}

/// A valid compute launch (sizes within the model's limits, VAs within 40 bits).
fn kernel() -> impl Strategy<Value = Kernel> {
    let abc = (va40(), va40(), va40());
    prop_oneof![
        (va40(), (1u32..=compute::MAX_MEMSET_BYTES / 4), any::<u32>()).prop_map(
            |(dst, words, value)| Kernel::Memset {
                dst,
                bytes: words * 4,
                value
            }
        ),
        (abc.clone(), 1u32..=compute::MAX_ELEMENTS).prop_map(|((a, b, c), n)| Kernel::Madd {
            a,
            b,
            c,
            n
        }),
        (abc.clone(), 1u32..=compute::MAX_MATRIX_DIM).prop_map(|((a, b, c), n)| Kernel::Mmul {
            a,
            b,
            c,
            n
        }),
        (abc.clone(), 1u32..=compute::MAX_ELEMENTS).prop_map(|((a, b, c), n)| Kernel::Fmadd {
            a,
            b,
            c,
            n
        }),
        (abc, 1u32..=compute::MAX_MATRIX_DIM).prop_map(|((a, b, c), n)| Kernel::Fmmul {
            a,
            b,
            c,
            n
        }),
        (va40(), any::<u64>(), any::<u32>()).prop_map(|(dst, iterations, seed)| Kernel::Loop {
            dst,
            iterations,
            seed
        }),
    ]
}

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

proptest! {
    #[test]
    fn target_bits_round_trip(t in target()) {
        prop_assert_eq!(Target::from_bits(t.bits()), Some(t));
    }

    #[test]
    fn pte_round_trip(p in pte()) {
        prop_assert_eq!(Pte::decode(p.encode()), Ok(Some(p)));
    }

    #[test]
    fn pte_not_present_is_none(raw in any::<u64>()) {
        prop_assert_eq!(Pte::decode(raw & !1), Ok(None));
    }

    #[test]
    fn pte_target_1_is_rejected(raw in any::<u64>()) {
        let raw = (raw & !(3 << 33)) | 1 | (1 << 33);
        prop_assert_eq!(Pte::decode(raw), Err(EntryError::InvalidTarget));
    }

    #[test]
    fn pde_round_trip(large in proptest::option::of(pt_ref()),
                      small in proptest::option::of(pt_ref()),
                      size in pt_size()) {
        let pde = Pde { large, small, size };
        prop_assert_eq!(Pde::decode(pde.encode()), pde);
    }

    #[test]
    fn pde_target_0_means_absent(raw in any::<u64>()) {
        let pde = Pde::decode(raw & !3 & !(3 << 32));
        prop_assert_eq!(pde.large, None);
        prop_assert_eq!(pde.small, None);
    }

    #[test]
    fn gp_entry_round_trip(e in gp_entry()) {
        prop_assert_eq!(GpEntry::decode(e.encode()), Ok(e));
        let (w0, w1) = e.encode_words();
        prop_assert_eq!((w1 as u64) << 32 | w0 as u64, e.encode());
    }

    #[test]
    fn gp_entry_length_0_is_rejected(raw in any::<u64>()) {
        let raw = raw & !((MAX_LENGTH_DWORDS as u64) << 42);
        prop_assert_eq!(GpEntry::decode(raw), Err(GpEntryError::ZeroLength));
    }

    #[test]
    fn header_round_trip(h in header()) {
        prop_assert_eq!(Header::decode(h.encode()), Ok(h));
    }

    #[test]
    fn header_sec_op_6_is_rejected(low in 0u32..(1 << 29)) {
        prop_assert_eq!(Header::decode(6 << 29 | low), Err(HeaderError::ReservedOpcode));
    }

    #[test]
    fn header_sec_op_2_with_tert_op_is_rejected(low in 0u32..(1 << 29), tert in 1u32..4) {
        let word = 2 << 29 | (low & !(3 << 16)) | tert << 16;
        prop_assert_eq!(Header::decode(word), Err(HeaderError::ReservedTertiary));
    }

    #[test]
    fn header_legacy_formats_decode(subchannel in 0u32..8, method in (0u32..0x800).prop_map(|m| m << 2),
                                    count in 0u32..0x800, non_inc in any::<bool>()) {
        // nouveau BEGIN_NV04 / BEGIN_NI04: opcode in 31:29, count 28:18, subc 15:13, method 12:2.
        let op = if non_inc { 0x4000_0000 } else { 0 };
        let word = op | count << 18 | subchannel << 13 | method;
        let mode = if non_inc { Mode::NonIncrementing } else { Mode::Incrementing };
        prop_assert_eq!(Header::decode(word), Ok(Header::Methods { mode, subchannel, method, count }));
    }

    #[test]
    fn pmem_round_trip(addr in (0u64..(1 << 24)).prop_map(|x| x << 16), t in target()) {
        prop_assert_eq!(pbus::pmem_decode(pbus::pmem_encode(addr, t)), Some((addr, t)));
    }

    #[test]
    fn bar_inst_round_trip(inst in addr_4k(), t in target()) {
        let v = pbus::bar_inst_encode(inst, t);
        prop_assert_eq!(pbus::bar_inst_decode(v), Some((inst, t)));
        // Bit 30 (nouveau 4.x always set it for BAR3) does not change the binding.
        prop_assert_eq!(pbus::bar_inst_decode(v | 1 << 30), Some((inst, t)));
        // Direct (non-VM) mode has no instance block.
        prop_assert_eq!(pbus::bar_inst_decode(v & !pbus::BAR_INST_VM_MODE), None);
    }

    #[test]
    fn chan_round_trip(inst in addr_4k(), t in target()) {
        let v = pfifo::chan_encode(inst, t);
        prop_assert_eq!(pfifo::chan_decode(v), Some((inst, t)));
        prop_assert_eq!(pfifo::chan_decode(v & !pfifo::CHAN_VALID), None);
    }

    #[test]
    fn runlist_base_round_trip(addr in addr_4k(), t in target()) {
        prop_assert_eq!(pfifo::runlist_base_decode(pfifo::runlist_base_encode(addr, t)), Some((addr, t)));
    }

    #[test]
    fn userd_poll_round_trip(va in addr_4k()) {
        let v = pfifo::userd_poll_encode(va);
        prop_assert_eq!(pfifo::userd_poll_decode(v), Some(va));
        prop_assert_eq!(pfifo::userd_poll_decode(v & !pfifo::USERD_POLL_ENABLE), None);
    }

    #[test]
    fn vspace_round_trip(pd in addr_4k(), t in target()) {
        prop_assert_eq!(pffb::vspace_decode(pffb::vspace_encode(pd, t)), Some((pd, t)));
    }

    #[test]
    fn pdb_round_trip(pd in addr_4k(), t in target()) {
        let v = inst::pdb_encode(pd, t);
        prop_assert_eq!(inst::pdb_decode(v), Some((pd, t)));
        // VOL (bit 2) only for the coherent host target, as gf100_vmm_join_ writes it.
        prop_assert_eq!(v & 4 != 0, t == Target::SysCoherent);
    }

    #[test]
    fn userd_round_trip(addr in addr_4k(), t in target()) {
        prop_assert_eq!(inst::userd_decode(inst::userd_encode(addr, t)), Some((addr, t)));
    }

    #[test]
    fn mem_op_a_round_trip(pd in addr_4k(), t in target()) {
        prop_assert_eq!(host::mem_op_a_decode(host::mem_op_a(pd, t)), Some((pd, t)));
    }

    #[test]
    fn fault_flags_round_trip(reason in 0u32..16, hub in any::<bool>(), write in any::<bool>(),
                              client in 0u32..32, gpc in 0u32..32) {
        let f = FaultFlags { reason, hub, write, client, gpc };
        prop_assert_eq!(FaultFlags::decode(f.encode()), f);
    }

    #[test]
    fn fault_flags_decode_encode_keeps_known_bits(v in any::<u32>()) {
        // Bits 0-3, 6, 7, 8-12 and 24-28 are the fields; the rest are not modelled.
        let known = 0x1f00_1fcf;
        prop_assert_eq!(FaultFlags::decode(v).encode(), v & known);
    }

    #[test]
    fn kernel_round_trip(k in kernel()) {
        let (words, used) = k.encode_args();
        prop_assert!(used <= compute::MAX_ARGS);
        prop_assert!(words[used..].iter().all(|&w| w == 0));
        prop_assert_eq!(Kernel::decode(k.id() as u32, &words), Ok(k));
    }

    #[test]
    fn kernel_unknown_id_is_rejected(id in 6u32.., words in any::<[u32; compute::MAX_ARGS]>()) {
        prop_assert_eq!(Kernel::decode(id, &words), Err(KernelError::UnknownKernel(id)));
    }

    #[test]
    fn kernel_oversized_sizes_are_rejected(extra in 1u32..1000, words in any::<[u32; compute::MAX_ARGS]>()) {
        let mut w = words;
        w[2] = compute::MAX_MEMSET_BYTES + 4 * extra;
        prop_assert_eq!(Kernel::decode(KernelId::Memset as u32, &w), Err(KernelError::BadSize));
        let mut w = words;
        w[6] = compute::MAX_ELEMENTS + extra;
        prop_assert_eq!(Kernel::decode(KernelId::Madd as u32, &w), Err(KernelError::BadSize));
        prop_assert_eq!(Kernel::decode(KernelId::Fmadd as u32, &w), Err(KernelError::BadSize));
        w[6] = compute::MAX_MATRIX_DIM + extra;
        prop_assert_eq!(Kernel::decode(KernelId::Mmul as u32, &w), Err(KernelError::BadSize));
        prop_assert_eq!(Kernel::decode(KernelId::Fmmul as u32, &w), Err(KernelError::BadSize));
    }

    #[test]
    fn kernel_zero_or_misaligned_sizes_are_rejected(words in any::<[u32; compute::MAX_ARGS]>(),
                                                    misalign in 1u32..4) {
        let mut w = words;
        w[2] = 0;
        prop_assert_eq!(Kernel::decode(KernelId::Memset as u32, &w), Err(KernelError::BadSize));
        w[2] = 4 + misalign;
        prop_assert_eq!(Kernel::decode(KernelId::Memset as u32, &w), Err(KernelError::BadSize));
        let mut w = words;
        w[6] = 0;
        for id in [KernelId::Madd, KernelId::Mmul, KernelId::Fmadd, KernelId::Fmmul] {
            prop_assert_eq!(Kernel::decode(id as u32, &w), Err(KernelError::BadSize));
        }
    }

    #[test]
    fn target_1_is_rejected_by_every_decoder(addr in addr_4k()) {
        // Build each register/field with a valid target, then force the target field to 1.
        let t = Target::Vram;
        let pmem = pbus::pmem_encode(addr & 0xff_ffff_0000, t) | 1 << 24;
        prop_assert_eq!(pbus::pmem_decode(pmem), None);
        prop_assert_eq!(pbus::bar_inst_decode(pbus::bar_inst_encode(addr, t) | 1 << 28), None);
        prop_assert_eq!(pfifo::chan_decode(pfifo::chan_encode(addr, t) | 1 << 28), None);
        prop_assert_eq!(pfifo::runlist_base_decode(pfifo::runlist_base_encode(addr, t) | 1 << 28), None);
        prop_assert_eq!(pffb::vspace_decode(pffb::vspace_encode(addr, t) | 1), None);
        prop_assert_eq!(inst::pdb_decode(inst::pdb_encode(addr, t) | 1), None);
        prop_assert_eq!(inst::userd_decode(inst::userd_encode(addr, t) | 1), None);
        prop_assert_eq!(host::mem_op_a_decode(host::mem_op_a(addr, t) | 1 << 30), None);
        prop_assert_eq!(Target::from_bits(1), None);
    }

    #[test]
    fn loop_result_matches_naive_steps(seed in any::<u32>(), n in 0u64..2000) {
        let mut x = seed;
        for _ in 0..n {
            x = compute::loop_step(x);
        }
        prop_assert_eq!(compute::loop_result(seed, n), x);
    }

    #[test]
    fn loop_result_composes(seed in any::<u32>(), a in any::<u32>(), b in any::<u32>()) {
        let (a, b) = (a as u64, b as u64);
        prop_assert_eq!(compute::loop_result(compute::loop_result(seed, a), b),
                        compute::loop_result(seed, a + b));
    }
}

// ---------------------------------------------------------------------------------------------
// Known values from nouveau, NVIDIA headers and real cards
// ---------------------------------------------------------------------------------------------

#[test]
fn begin_nvc0_matches_nouveau() {
    // nouveau nouveau_dma.h: BEGIN_NVC0 = 0x20000000 | size << 16 | subc << 13 | mthd >> 2;
    // the fence emits BEGIN_NVC0(chan, 0 /*subc*/, 0x10, 5).
    assert_eq!(method::incr(0, 0x10, 5), 0x2005_0004);
    assert_eq!(
        Header::decode(0x2005_0004),
        Ok(Header::Methods {
            mode: Mode::Incrementing,
            subchannel: 0,
            method: 0x10,
            count: 5
        })
    );
    // BEGIN_NIC0 = 0x60000000 | ...; BEGIN_IMC0 = 0x80000000 | data << 16 | ...
    assert_eq!(
        method::non_incr(3, 0x1234, 7),
        0x6000_0000 | 7 << 16 | 3 << 13 | 0x1234 >> 2
    );
    assert_eq!(
        method::immediate(1, 0x200, 0x1abc),
        0x8000_0000 | 0x1abc << 16 | 1 << 13 | 0x80
    );
    assert_eq!(
        Header::decode(method::immediate(1, 0x200, 0x1abc)),
        Ok(Header::Immediate {
            subchannel: 1,
            method: 0x200,
            data: 0x1abc
        })
    );
}

#[test]
fn legacy_and_special_headers() {
    // BEGIN_NV04(subc 2, mthd 0x100, 4) = size << 18 | subc << 13 | mthd.
    assert_eq!(
        Header::decode(4 << 18 | 2 << 13 | 0x100),
        Ok(Header::Methods {
            mode: Mode::Incrementing,
            subchannel: 2,
            method: 0x100,
            count: 4
        })
    );
    // BEGIN_NI04 = 0x40000000 | ...
    assert_eq!(
        Header::decode(0x4000_0000 | 1 << 18 | 0x1ffc),
        Ok(Header::Methods {
            mode: Mode::NonIncrementing,
            subchannel: 0,
            method: 0x1ffc,
            count: 1
        })
    );
    // NV906F_DMA_NOP = 0: a legacy incrementing header with no data.
    assert_eq!(Header::decode(0).map(|h| h.data_words()), Ok(0));
    // SET/STORE/USE_SUB_DEV_MASK: opcode 31:16 = 1, 2, 3.
    for op in 1..4 {
        assert_eq!(Header::decode(op << 16 | 0xff0), Ok(Header::SubDeviceMask));
    }
    assert_eq!(Header::decode(7 << 29), Ok(Header::EndSegment));
    // SEC_OP 5 (ONE_INC).
    assert_eq!(
        Header::decode(5 << 29 | 3 << 16 | 7 << 13 | 0xfff),
        Ok(Header::Methods {
            mode: Mode::IncrementOnce,
            subchannel: 7,
            method: 0x3ffc,
            count: 3
        })
    );
    assert_eq!(method::MAX_METHOD, 0x3ffc);
}

#[test]
fn channel_bind_matches_nouveau() {
    // nouveau gf100_chan_bind: wr32(0x003000 + chid * 8, 0xc0000000 | inst >> 12).
    let inst = 0x0012_3456_7000;
    assert_eq!(
        pfifo::chan_encode(inst, Target::Vram),
        0xc000_0000 | (inst >> 12) as u32
    );
    assert_eq!(pfifo::chan_table(5), 0x3028);
    assert_eq!(pfifo::chan_state(5), 0x302c);
    assert_eq!(pfifo::STATE_START, 0x001f_0001);
    // nouveau 0x002254 = 0x10000000 | userd_bar1_va >> 12.
    assert_eq!(pfifo::userd_poll_encode(0x20_0000), 0x1000_0200);
    // nouveau gf100_runl_commit: (target << 28) | addr >> 12; 0x002274 = 0x01f00000 | count.
    assert_eq!(
        pfifo::runlist_base_encode(0x4000_0000, Target::SysNonCoherent),
        0x3004_0000
    );
    assert_eq!(pfifo::RUNLIST_SUBMIT_UNK20 | 3, 0x01f0_0003);
    assert_eq!(pfifo::vm_fault(2, 0xc), 0x282c);
    assert_eq!(pfifo::pbdma(2, pfifo::PBDMA_INTR), 0x44108);
}

#[test]
fn bar_bindings_match_nouveau() {
    // gf100_bar_bar1_init: wr32(0x001704, 0x80000000 | inst >> 12).
    assert_eq!(
        pbus::bar_inst_encode(0x0020_0000, Target::Vram),
        0x8000_0200
    );
    // nouveau 4.x BAR3: 0xc0000000 | inst >> 12 still decodes as a VM binding.
    assert_eq!(
        pbus::bar_inst_decode(0xc000_0201),
        Some((0x20_1000, Target::Vram))
    );
    // instmem/nv50.c: wr32(0x001700, base >> 16).
    assert_eq!(pbus::pmem_encode(0x12_3456_0000, Target::Vram), 0x0012_3456);
}

#[test]
fn page_table_entries_match_nouveau() {
    // gf100_vmm_pgd_pde: LPT in VRAM -> low word (addr >> 8) | 1; SPT in HOST -> high word
    // (addr << 24) | 2 << 32 | BIT(34).
    let pde = Pde {
        large: Some(PtRef {
            addr: 0x10_0000,
            target: Target::Vram,
            vol: false,
        }),
        small: Some(PtRef {
            addr: 0x20_0000,
            target: Target::SysCoherent,
            vol: true,
        }),
        size: PtSize::Full,
    };
    assert_eq!(
        pde.encode(),
        (0x20_0000u64 << 24) | 2 << 32 | 1 << 34 | 0x1001
    );
    assert_eq!(Pde::decode(0), Pde::EMPTY);
    // gf100_vmm_valid: BIT(0) | vol << 32 | aper << 33 | kind << 36, address >> 8.
    assert_eq!(Pte::new(0x1234_5000, Target::Vram).encode(), 0x12_3451);
    assert_eq!(
        Pte::new(0x1234_5000, Target::SysCoherent).encode(),
        0x12_3451 | 1 << 32 | 2 << 33
    );
    // Old nouveau nvc0_vm_map_sg: bits 34:32 = 7 for non-snooped sysmem.
    assert_eq!(
        Pte::new(0x1000, Target::SysNonCoherent).encode() >> 32 & 7,
        7
    );
}

#[test]
fn instance_block_values_match_nouveau() {
    // gf100_vmm_join_: VRAM target 0, HOST 2 | VOL (bit 2), NCOH 3.
    assert_eq!(
        inst::pdb_encode(0x12_3456_7000, Target::Vram),
        0x12_3456_7000
    );
    assert_eq!(inst::pdb_encode(0x1000, Target::SysCoherent), 0x1006);
    assert_eq!(inst::pdb_encode(0x1000, Target::SysNonCoherent), 0x1003);
    // 0x4c = upper_32_bits(ioffset) | ilog2(entries) << 16.
    assert_eq!(inst::ib_config_encode(0x12_0000_0000, 512), 0x0009_0012);
    let sig = inst::RAMFC_NOUVEAU_DEFAULTS
        .iter()
        .find(|(o, _)| *o == inst::RAMFC_SIGNATURE);
    assert_eq!(sig.map(|(_, v)| v & 0xffff), Some(inst::SIGNATURE));
}

#[test]
fn tlb_invalidate_values() {
    // gf100_vmm_invalidate: 0x100cb8 = ((pd >> 12) << 4) | target; 0x100cbc = 0x80000000 | type.
    assert_eq!(
        pffb::vspace_encode(0x12_3456_7000, Target::SysCoherent),
        0x1234_5672
    );
    assert_eq!(
        pffb::FLUSH_TRIGGER | pffb::FLUSH_PAGE_ALL | pffb::FLUSH_HUB_ONLY,
        0x8000_0005
    );
    // cl906f.h: MEM_OP_A TLB_INVALIDATE_ADDR 29:2 (= pdb >> 12), TARGET 31:30;
    // MEM_OP_B OPERATION 31:27, MMU_TLB_INVALIDATE = 9, PDB 0:0, GPC 1:1.
    assert_eq!(
        host::mem_op_a(0x12_3456_7000, Target::SysNonCoherent),
        0xc000_0000 | 0x123_4567 << 2
    );
    assert_eq!(host::mem_op_b_tlb_invalidate(false), 0x4800_0000);
    assert_eq!(host::mem_op_b_tlb_invalidate(true), 0x4800_0001);
    assert_eq!(
        host::mem_op_b_operation(0x4800_0003),
        host::MEM_OP_MMU_TLB_INVALIDATE
    );
    assert_eq!(host::set_object(0x90b5, host::ENGINE_PCOPY0), 0x0004_90b5);
}

#[test]
fn gp_entry_matches_nouveau_push() {
    // nv50_dma_push: lo = lower_32_bits(va), hi = upper_32_bits(va) | length_bytes << 8.
    let e = GpEntry::new(0x12_3456_7890, 0x40 / 4);
    assert_eq!(e.encode_words(), (0x3456_7890, 0x12 | 0x40 << 8));
    // cl906f.h GP_ENTRY1: PRIV 8, LEVEL 9, SYNC 31.
    let e = GpEntry {
        privileged: true,
        subroutine: true,
        sync_wait: true,
        ..GpEntry::new(0, 1)
    };
    assert_eq!(e.encode_words().1, 1 << 8 | 1 << 9 | 1 << 10 | 1 << 31);
}

#[test]
fn boot0_decodes_as_fermi() {
    // Quadro 6000 (GXEN NVC0_REG0) and a GTX 470 seen in nouveau logs.
    for boot0 in [pmc::BOOT_0_QUADRO_6000, 0x0c06_80a3] {
        assert_eq!(pmc::boot0_chipset(boot0), 0xc0);
        assert_eq!(pmc::boot0_stepping(boot0), 0xa3);
        assert!(pmc::boot0_is_fermi(boot0));
    }
    assert_eq!(pmc::BOOT_0_QUADRO_6000, 0x0c0c_00a3);
    // A Kepler GK104 (chipset 0xe4) is not a Fermi; neither is an empty register.
    assert!(!pmc::boot0_is_fermi(0x0e40_00a1));
    assert!(!pmc::boot0_is_fermi(0));
}

#[test]
fn fault_flags_known_word() {
    // BAR read fault on a read-only page from the hub: reason 6, hub bit 6, client 7 in 12:8.
    let f = FaultFlags::decode(0x0000_0746);
    assert_eq!(f.reason, fault::REASON_PAGE_READ_ONLY);
    assert!(f.hub);
    assert!(!f.write);
    assert_eq!(f.client, fault::HUB_CLIENT_BAR_READ);
}

#[test]
fn loop_kernel_edges() {
    assert_eq!(compute::loop_result(1234, 0), 1234);
    assert_eq!(compute::loop_result(0, 1), compute::LOOP_INC);
    let k = Kernel::Loop {
        dst: 0xff_ffff_fffc,
        iterations: u64::MAX,
        seed: 7,
    };
    let (w, used) = k.encode_args();
    assert_eq!(used, 5);
    assert_eq!(Kernel::decode(KernelId::Loop as u32, &w), Ok(k));
}

proptest! {
    #[test]
    fn pv_op_round_trips(op in any::<u32>(), target in any::<u32>(), table in any::<u64>(), index in any::<u64>(), value in any::<u64>()) {
        let o = gf100::pv::Op { op, target, table, index, value };
        prop_assert_eq!(gf100::pv::Op::from_bytes(&o.to_bytes()), o);
    }
}

#[test]
fn interrupt_tree_levels_follow_their_sources() {
    assert_eq!(pfifo::source_mask([0, 5, 0, 1]), 0b1010);
    assert_eq!(pfifo::intr_status(0, 0, 0, 0, 0), 0);
    assert_eq!(
        pfifo::intr_status(1, 0, 0, 0, 0),
        1,
        "latched bits pass through"
    );
    assert_eq!(pfifo::intr_status(0, 4, 0, 0, 0), pfifo::INTR_VM_FAULT);
    assert_eq!(pfifo::intr_status(0, 0, 2, 0, 0), pfifo::INTR_PBDMA);
    assert_eq!(
        pfifo::intr_status(0, 0, 0, pfifo::INTR_RUNLIST_EVENT, 0),
        pfifo::INTR_RUNLIST_DONE
    );
    assert_eq!(
        pfifo::intr_status(0, 0, 0, 1, 0),
        0,
        "only the event bit counts"
    );
    assert_eq!(pfifo::intr_status(0, 0, 0, 0, 1), pfifo::INTR_NON_STALL);
    let fault = pfifo::INTR_VM_FAULT;
    assert_eq!(
        pmc::intr_host(fault, pfifo::INTR_EN_DEFAULT, false, !0),
        pmc::INTR_PFIFO
    );
    assert_eq!(
        pmc::intr_host(pfifo::INTR_NON_STALL, pfifo::INTR_EN_DEFAULT, false, !0),
        0,
        "bit 31 not enabled"
    );
    assert_eq!(
        pmc::intr_host(fault, !0, true, !pmc::INTR_PFIFO),
        pmc::INTR_SOFTWARE,
        "masked"
    );
    assert!(pmc::line_asserted(pmc::INTR_PFIFO, pmc::INTR_EN_HARDWARE));
    assert!(!pmc::line_asserted(pmc::INTR_PFIFO, pmc::INTR_EN_SOFTWARE));
    assert!(pmc::line_asserted(
        pmc::INTR_SOFTWARE,
        pmc::INTR_EN_SOFTWARE
    ));
    assert!(!pmc::line_asserted(
        pmc::INTR_SOFTWARE,
        pmc::INTR_EN_HARDWARE
    ));
}
