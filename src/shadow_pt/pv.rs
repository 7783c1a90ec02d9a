//! Para-virtual page-table batches — GPUvm's BAR4 "multicall" (GXEN `context_bar4.cc`, ops
//! `MAP_BATCH` / `UNMAP_BATCH` / `VM_FLUSH`), in this project's format (`gf100::pv`).
//!
//! GPUvm kept PV page tables in hypervisor pages and translated each PTE at map time. Here the
//! guest keeps its own tables (so the same guest driver works with or without PV) and each op
//! names an entry of one of them:
//! - `OP_WRITE_PDE` / `OP_WRITE_PTE`: `table` must be the page directory of an attached space
//!   (PDE) or a table one of its PDEs names and the VM's shadows use (PTE), in the memory the
//!   op's target names, else `ERR_BAD_TABLE`; `index` must be below the table's entries (8192
//!   for a directory; for a page table the entries its PT_SIZE makes valid, the largest if
//!   several PDEs name it), else `ERR_BAD_INDEX`. The value is written into the guest's table
//!   in guest memory (validated like every guest address) and the shadow entry is updated
//!   exactly as a tracked guest write would update it (a PDE re-walks the tables it newly
//!   names). A PTE of a table no PDE names yet is therefore refused: a PV guest links a table
//!   with `OP_WRITE_PDE` first, or fills it in its own memory before linking it.
//! - `OP_FLUSH`: `table` must be an attached page directory; its shadow is returned for the
//!   physical TLB flush (the shadow is already current).
//! - Any other op code: `ERR_BAD_OP`; a batch longer than `MAX_BATCH`: `ERR_BAD_BATCH`.
//!
//! Ops apply in order and the batch stops at the first rejected one.
//!
//! **Budget.** A PDE op re-walks the tables it newly names, so a batch of 2048 PDE ops switching
//! between two full tables held the host lock — every other VM's exits — for about 210 ms (the
//! isolation review's finding 9). A batch stops with `ERR_BUSY` once its ops have walked
//! [`WALK_BUDGET`] guest entries (at least one op is always applied, so a guest that resubmits
//! the rest always progresses); the guest driver resubmits from STATUS.

use gf100::mmu;
use gf100::pv::{self, Op};
use gf100::Target;

use super::track::{Mem, TableKind};
use super::walk::PtKind;
use super::{PvOutcome, ShadowCtx, ShadowPt};
use crate::profile::ShadowMode;

/// Guest table entries one batch may walk before it stops with `ERR_BUSY`: 64 Ki, two full
/// small-page tables (`gf100::mmu::SPT_ENTRIES`; host policy, not hardware). Measured with
/// `gpuvm exp lockhold`'s pv-switch neighbour on the 16-core machine: at 256 Ki entries it held
/// the host lock 0.7-1.6 ms, at 128 Ki mostly 0.4-0.8 ms but 1.0-2.3 ms in 3 of 14 runs — over
/// the 1 ms the engines-and-locks issue allows —, at 64 Ki 0.24-0.57 ms in 7 of 8 runs
/// (docs/benchmarks.md, fourteenth round).
pub const WALK_BUDGET: u64 = 2 * mmu::SPT_ENTRIES;

/// Applies `ops` to `pt` (see the module documentation).
pub(super) fn apply(pt: &mut ShadowPt, cx: &mut ShadowCtx, ops: &[Op]) -> PvOutcome {
    let mut out = PvOutcome::default();
    if pt.mode != ShadowMode::Pv {
        out.error = pv::ERR_NOT_AVAILABLE;
        return out;
    }
    pt.books.stats.pv_batches += 1;
    if ops.len() > pv::MAX_BATCH as usize {
        out.error = pv::ERR_BAD_BATCH;
        return out;
    }
    let walked_before = pt.books.stats.ptes_shadowed;
    for (i, op) in ops.iter().enumerate() {
        if let Err(e) = apply_one(pt, cx, op, &mut out) {
            out.error = e;
            break;
        }
        out.applied += 1;
        let walked = pt.books.stats.ptes_shadowed - walked_before;
        if walked >= WALK_BUDGET && i + 1 < ops.len() {
            out.error = pv::ERR_BUSY;
            break;
        }
    }
    out
}

/// Applies one op.
fn apply_one(
    pt: &mut ShadowPt,
    cx: &mut ShadowCtx,
    op: &Op,
    out: &mut PvOutcome,
) -> Result<(), u32> {
    if !matches!(op.op, pv::OP_WRITE_PDE | pv::OP_WRITE_PTE | pv::OP_FLUSH) {
        return Err(pv::ERR_BAD_OP);
    }
    let target = if op.target <= 3 {
        Target::from_bits(op.target)
    } else {
        None
    }
    .ok_or(pv::ERR_BAD_TABLE)?;
    if op.op == pv::OP_FLUSH {
        let pdbs = pt.matching(Some(super::GuestPdb {
            addr: op.table,
            target,
        }));
        if pdbs.is_empty() {
            return Err(pv::ERR_BAD_TABLE);
        }
        for pd in pdbs.iter().filter_map(|p| pt.shadow_pd(*p)) {
            if !out.flush.contains(&pd) {
                out.flush.push(pd);
            }
        }
        return Ok(());
    }
    let entries = table_entries(pt, Mem::of(target), op.table, op.op == pv::OP_WRITE_PDE)
        .ok_or(pv::ERR_BAD_TABLE)?;
    if op.index >= entries {
        return Err(pv::ERR_BAD_INDEX);
    }
    // Cannot overflow: the table lies in guest memory and the index is inside it.
    let addr = op
        .index
        .checked_mul(mmu::ENTRY_SIZE)
        .and_then(|off| op.table.checked_add(off))
        .ok_or(pv::ERR_BAD_INDEX)?;
    cx.mem
        .write(target, addr, &op.value.to_le_bytes())
        .map_err(|_| pv::ERR_BAD_TABLE)?;
    pt.guest_wrote(cx, target, addr, mmu::ENTRY_SIZE);
    Ok(())
}

/// Entries of the table at `table` in `mem` that the VM's shadows use: a page directory
/// (`pde`) or a page table; the most any user of it makes valid. `None` if it is no such table.
fn table_entries(pt: &ShadowPt, mem: Mem, table: u64, pde: bool) -> Option<u64> {
    let mut best: Option<u64> = None;
    for role in pt.books.tracker.roles_at(mem, table) {
        let entries = match (role.kind, pde) {
            (TableKind::Pd, true) => (role.pdb.addr == table && Mem::of(role.pdb.target) == mem)
                .then_some(mmu::PD_ENTRIES),
            (TableKind::Small(i), false) => {
                user_entries(pt, role.pdb, i, PtKind::Small, mem, table)
            }
            (TableKind::Large(i), false) => {
                user_entries(pt, role.pdb, i, PtKind::Large, mem, table)
            }
            _ => None,
        };
        best = best.max(entries);
    }
    best
}

/// Entries of the `kind` table of PDE `idx` of `pdb` if that table is the one at `table`.
fn user_entries(
    pt: &ShadowPt,
    pdb: super::GuestPdb,
    idx: u16,
    kind: PtKind,
    mem: Mem,
    table: u64,
) -> Option<u64> {
    let t = pt.spaces.get(&pdb)?.pdes.get(&idx)?.table(kind)?;
    (t.guest.addr == table && t.guest.mem() == mem).then_some(t.guest.entries)
}
