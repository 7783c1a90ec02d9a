//! The simulated GR's memory-to-memory format object (class 0x9039, issue #24), driven through
//! the hardware interface only: nouveau's buffer-move launch, inline data, completion
//! semaphores and notifiers, and the refusals (block-linear layouts, undefined fields, classes
//! the model does not execute) that stop only the offending channel. Also nouveau's other
//! buffer-move path, the copy engine's (`nvc0_bo_move_copy`, class 0x90b5), method for method.

use gpuvm::addr::HostVram;
use gpuvm::clock::Clock;
use gpuvm::gf100::fault::{self, FaultFlags};
use gpuvm::gf100::{copy as ce, host, m2mf as mf, pfifo};
use gpuvm::phys::PhysicalGpu;

mod support;

use support::sim_rig::*;

const SUBC: u32 = 2;

fn bind_m2mf() -> Vec<u32> {
    mthd(
        SUBC,
        host::SET_OBJECT,
        &[host::set_object(mf::CLASS, host::ENGINE_PGRAPH)],
    )
}

/// The launch `nvc0_bo_move_m2mf` sends: pitch in and out, FLUSH_DISABLE, no interrupt, one-word
/// semaphore structure.
const NOUVEAU_LAUNCH: u32 =
    mf::LAUNCH_SRC_PITCH | mf::LAUNCH_DST_PITCH | mf::LAUNCH_SEMAPHORE_ONE_WORD;

/// nouveau's move of `pages` 4 KiB pages, method for method (two headers for the offsets, one
/// for the launch).
fn nouveau_move(src: u64, dst: u64, pages: u32) -> Vec<u32> {
    let mut p = mthd(
        SUBC,
        mf::OFFSET_OUT_UPPER,
        &[(dst >> 32) as u32, dst as u32],
    );
    p.extend(mthd(
        SUBC,
        mf::OFFSET_IN_UPPER,
        &[(src >> 32) as u32, src as u32, 4096, 4096, 4096, pages],
    ));
    p.extend(mthd(SUBC, mf::LAUNCH_DMA, &[NOUVEAU_LAUNCH]));
    p
}

fn pbdma_stopped_on(r: &Rig, ch: &Chan, method: u32) {
    assert_ne!(
        r.reg(pfifo::pbdma(0, pfifo::PBDMA_INTR)) & pfifo::PBDMA_INTR_ILLEGAL_MTHD,
        0
    );
    assert_eq!(r.reg(pfifo::pbdma(0, pfifo::PBDMA_CHID)) & 0x7f, ch.chid);
    assert_eq!(
        r.reg(pfifo::pbdma(0, pfifo::PBDMA_METHOD0)) & 0x3ffc,
        method
    );
    assert!(!r.runnable(ch));
    r.gpu
        .write_reg(pfifo::pbdma(0, pfifo::PBDMA_INTR), u32::MAX);
}

#[test]
fn nouveau_buffer_move_copies_pages_and_releases_its_fence() {
    let mut r = Rig::new();
    let mut c = r.channel(2);
    r.runlist(&[2]);
    let src = r.buffer(&mut c, DATA_VA, 0x5000);
    let dst = r.buffer(&mut c, DATA_VA + 0x10_0000, 0x5000);
    let sem = r.buffer(&mut c, DATA_VA + 0x20_0000, 0x1000);
    let data: Vec<u8> = (0..0x5000u32).map(|i| (i * 13 + 5) as u8).collect();
    r.gpu.write_vram(HostVram(src), &data);
    let mut p = bind_m2mf();
    p.extend(nouveau_move(DATA_VA, DATA_VA + 0x10_0000, 5));
    // nouveau's fence after the move: a host semaphore release on the same channel.
    p.extend(release4(DATA_VA + 0x20_0000, 0x1234));
    r.submit(&mut c, &p);
    r.settle();
    let mut out = vec![0u8; 0x5000];
    r.gpu.read_vram(HostVram(dst), &mut out);
    assert!(out == data, "the moved pages differ");
    assert_eq!(r.r32(sem), 0x1234);
    let st = r.gpu.stats();
    assert_eq!(
        (st.engine_ops, st.m2mf_transfers, st.m2mf_bytes),
        (1, 1, 0x5000)
    );
    assert!(r.runnable(&c));
}

#[test]
fn launch_completion_releases_a_semaphore_and_notify_writes_a_notifier() {
    let mut r = Rig::new();
    let mut c = r.channel(3);
    r.runlist(&[3]);
    let src = r.buffer(&mut c, DATA_VA, 0x1000);
    let dst = r.buffer(&mut c, DATA_VA + 0x10_0000, 0x1000);
    let sem = r.buffer(&mut c, DATA_VA + 0x20_0000, 0x1000);
    r.gpu
        .write_vram(HostVram(src), &words_le(&[1, 2, 3, 4, 5, 6, 7, 8]));
    let sem_va = DATA_VA + 0x20_0000;
    let mut p = bind_m2mf();
    // 3 lines of 8 bytes, source pitch 8, destination pitch 0x100; a four-word release.
    p.extend(mthd(
        SUBC,
        mf::OFFSET_OUT_UPPER,
        &[0, (DATA_VA + 0x10_0000) as u32],
    ));
    p.extend(mthd(
        SUBC,
        mf::OFFSET_IN_UPPER,
        &[0, DATA_VA as u32, 8, 0x100, 8, 3],
    ));
    p.extend(mthd(
        SUBC,
        mf::SET_SEMAPHORE_A,
        &[(sem_va >> 32) as u32, sem_va as u32, 0xfeed],
    ));
    let launch =
        mf::LAUNCH_SRC_PITCH | mf::LAUNCH_DST_PITCH | mf::COMPLETION_RELEASE_SEMAPHORE << 12;
    p.extend(mthd(SUBC, mf::LAUNCH_DMA, &[launch]));
    p.extend(mthd(SUBC, mf::SET_NOTIFY_A, &[0, (sem_va + 0x40) as u32]));
    p.extend(mthd(SUBC, mf::NOTIFY, &[0]));
    r.submit(&mut c, &p);
    r.settle();
    for line in 0..3u64 {
        let got: Vec<u32> = (0..2).map(|i| r.r32(dst + line * 0x100 + i * 4)).collect();
        assert_eq!(
            got,
            vec![1 + 2 * line as u32, 2 + 2 * line as u32],
            "line {line}"
        );
    }
    assert_eq!((r.r32(sem), r.r32(sem + 4)), (0xfeed, 0));
    let stamp = r.r64(sem + 8);
    assert!(stamp > 0 && stamp <= r.clock.now_ns());
    let notified = r.r64(sem + 0x40);
    assert!(
        notified >= stamp,
        "the notifier is written after the transfer"
    );
    assert_eq!((r.r32(sem + 0x48), r.r32(sem + 0x4c)), (0, 0));
}

#[test]
fn inline_data_lands_line_by_line_then_the_semaphore() {
    let mut r = Rig::new();
    let mut c = r.channel(4);
    r.runlist(&[4]);
    let dst = r.buffer(&mut c, DATA_VA, 0x1000);
    let sem = r.buffer(&mut c, DATA_VA + 0x10_0000, 0x1000);
    r.gpu.write_vram(HostVram(dst), &[0xee; 0x200]);
    let mut p = bind_m2mf();
    p.extend(mthd(SUBC, mf::OFFSET_OUT_UPPER, &[0, DATA_VA as u32]));
    p.extend(mthd(SUBC, mf::PITCH_OUT, &[0x100]));
    p.extend(mthd(SUBC, mf::LINE_LENGTH_IN, &[6, 2]));
    p.extend(mthd(
        SUBC,
        mf::SET_SEMAPHORE_A,
        &[0, (DATA_VA + 0x10_0000) as u32, 0x55],
    ));
    // Mesa's nvc0_m2mf_push_linear launch with a one-word semaphore release.
    let launch = 0x100111 | mf::COMPLETION_RELEASE_SEMAPHORE << 12;
    p.extend(mthd(SUBC, mf::LAUNCH_DMA, &[launch]));
    // Non-incrementing: every word goes to LOAD_INLINE_DATA.
    p.push(gpuvm::gf100::method::non_incr(
        SUBC,
        mf::LOAD_INLINE_DATA,
        4,
    ));
    p.extend([0x0403_0201, 0x0807_0605, 0x0c0b_0a09, 0x100f_0e0d]);
    r.submit(&mut c, &p);
    r.settle();
    let mut out = [0u8; 0x108];
    r.gpu.read_vram(HostVram(dst), &mut out);
    assert_eq!(&out[..8], &[1, 2, 3, 4, 5, 6, 0xee, 0xee]);
    assert_eq!(&out[0x100..0x108], &[9, 10, 11, 12, 13, 14, 0xee, 0xee]);
    assert_eq!(r.r32(sem), 0x55);
    assert!(r.runnable(&c));
    let st = r.gpu.stats();
    assert_eq!((st.m2mf_transfers, st.m2mf_bytes), (1, 12));
}

#[test]
fn refused_launches_and_classes_stop_only_their_channel() {
    let mut r = Rig::new();
    let mut c = r.channel(5);
    let mut other = r.channel(6);
    r.runlist(&[5, 6]);
    let src = r.buffer(&mut c, DATA_VA, 0x1000);
    let dst = r.buffer(&mut c, DATA_VA + 0x10_0000, 0x1000);
    r.gpu.write_vram(HostVram(src), &[7u8; 0x1000]);
    // A block-linear destination: nothing moves.
    let mut p = bind_m2mf();
    p.extend(mthd(
        SUBC,
        mf::OFFSET_OUT_UPPER,
        &[0, (DATA_VA + 0x10_0000) as u32],
    ));
    p.extend(mthd(
        SUBC,
        mf::OFFSET_IN_UPPER,
        &[0, DATA_VA as u32, 16, 16, 16, 1],
    ));
    p.extend(mthd(SUBC, mf::LAUNCH_DMA, &[mf::LAUNCH_SRC_PITCH]));
    r.submit(&mut c, &p);
    r.settle();
    pbdma_stopped_on(&r, &c, mf::LAUNCH_DMA);
    assert_eq!(r.r32(dst), 0, "a refused launch moved data");

    // The 3D class is not executed by the model: binding it is refused.
    let o = r.buffer(&mut other, DATA_VA, 0x1000);
    let mut p = mthd(
        3,
        host::SET_OBJECT,
        &[host::set_object(0x9097, host::ENGINE_PGRAPH)],
    );
    p.extend(release4(DATA_VA, 1));
    r.submit(&mut other, &p);
    r.settle();
    pbdma_stopped_on(&r, &other, host::SET_OBJECT);
    assert_eq!(r.r32(o), 0, "work after a refused bind ran");

    // A huge line count (4 GiB) is refused, not run.
    let mut d = r.channel(7);
    r.runlist(&[7]);
    let mut p = bind_m2mf();
    p.extend(mthd(
        SUBC,
        mf::OFFSET_IN_UPPER,
        &[0, 0, 0, 0, 1 << 20, 1 << 12],
    ));
    p.extend(mthd(SUBC, mf::LAUNCH_DMA, &[NOUVEAU_LAUNCH]));
    r.submit(&mut d, &p);
    r.settle();
    pbdma_stopped_on(&r, &d, mf::LAUNCH_DMA);
}

#[test]
fn m2mf_faults_are_pgraph_faults_of_the_channel() {
    let mut r = Rig::new();
    let mut c = r.channel(8);
    r.runlist(&[8]);
    r.buffer(&mut c, DATA_VA, 0x1000);
    let mut p = bind_m2mf();
    p.extend(nouveau_move(DATA_VA, 0x0700_0000, 1));
    r.submit(&mut c, &p);
    r.settle();
    assert_eq!(r.reg(pfifo::VM_FAULT_SOURCE), 1 << fault::UNIT_PGRAPH);
    let flags = FaultFlags::decode(r.reg(pfifo::vm_fault(fault::UNIT_PGRAPH, 0xc)));
    assert_eq!(
        (flags.reason, flags.write),
        (fault::REASON_PAGE_NOT_PRESENT, true)
    );
    assert_eq!(
        r.reg(pfifo::vm_fault(fault::UNIT_PGRAPH, 0)),
        (c.inst >> 12) as u32
    );
    assert!(!r.runnable(&c));
}

/// `nvc0_bo_move_copy` (nouveau_bo90b5.c): OFFSET_IN_UPPER..LINE_COUNT in one header (pitch and
/// line length one page, up to 8191 lines), then LAUNCH_DMA non-pipelined, flush, no
/// semaphore or interrupt, pitch layouts, multi-line, no remap, BYPASS_L2 as the PTE says.
#[test]
fn nouveau_copy_engine_move_copies_pages() {
    let mut r = Rig::new();
    let mut c = r.channel(9);
    r.runlist(&[9]);
    let src = r.buffer(&mut c, DATA_VA, 0x3000);
    let dst = r.buffer(&mut c, DATA_VA + 0x10_0000, 0x3000);
    let sem = r.buffer(&mut c, DATA_VA + 0x20_0000, 0x1000);
    let data: Vec<u8> = (0..0x3000u32).map(|i| (i * 31 + 7) as u8).collect();
    r.gpu.write_vram(HostVram(src), &data);
    let (s_va, d_va) = (DATA_VA, DATA_VA + 0x10_0000);
    let mut p = bind_copy();
    p.extend(mthd(
        SUBC_COPY,
        ce::OFFSET_IN_UPPER,
        &[
            (s_va >> 32) as u32,
            s_va as u32,
            (d_va >> 32) as u32,
            d_va as u32,
            4096,
            4096,
            4096,
            3,
        ],
    ));
    let launch = ce::LAUNCH_TRANSFER_NON_PIPELINED
        | ce::LAUNCH_FLUSH_ENABLE
        | ce::LAUNCH_SRC_PITCH
        | ce::LAUNCH_DST_PITCH
        | ce::LAUNCH_MULTI_LINE;
    p.extend(mthd(SUBC_COPY, ce::LAUNCH_DMA, &[launch]));
    p.extend(release4(DATA_VA + 0x20_0000, 0x77));
    r.submit(&mut c, &p);
    r.settle();
    let mut out = vec![0u8; 0x3000];
    r.gpu.read_vram(HostVram(dst), &mut out);
    assert!(out == data, "the moved pages differ");
    assert_eq!(r.r32(sem), 0x77);
    assert!(r.runnable(&c));
}

/// A PBDMA stalls on its error interrupt: a channel stopped by a refused binding does not run
/// again when RUNNABLE is set while the interrupt is pending (the work after the error would
/// run before anyone saw the error); once software clears the interrupt, it goes on after the
/// refused method (nouveau rewrites METHOD0 to a NOP, so on hardware it continues there).
#[test]
fn a_refused_channel_stays_stopped_until_its_error_is_cleared() {
    let mut r = Rig::new();
    let mut c = r.channel(5);
    r.runlist(&[5]);
    let o = r.buffer(&mut c, DATA_VA, 0x1000);
    let mut p = mthd(
        3,
        host::SET_OBJECT,
        &[host::set_object(0x9097, host::ENGINE_PGRAPH)],
    );
    p.extend(release4(DATA_VA, 1));
    r.submit(&mut c, &p);
    r.settle();
    assert_ne!(
        r.reg(pfifo::pbdma(0, pfifo::PBDMA_INTR)) & pfifo::PBDMA_INTR_ILLEGAL_MTHD,
        0
    );
    assert!(!r.runnable(&c));
    r.gpu
        .write_reg(pfifo::chan_state(c.chid), pfifo::STATE_RUNNABLE);
    r.settle();
    assert_eq!(r.r32(o), 0, "ran while its error was pending");
    r.gpu
        .write_reg(pfifo::pbdma(0, pfifo::PBDMA_INTR), u32::MAX);
    r.settle();
    assert_eq!(r.r32(o), 1, "goes on after the refused method once cleared");
}
