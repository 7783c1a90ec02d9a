//! USERD emulation (GPUvm `context_bar1.cc`): the guest's USERD pages — 128 x 4 KiB at the BAR1
//! address it wrote to the poll-area register (0x2254) — are never backed by memory. A GP_PUT
//! write (offset 0x8c) there is the **doorbell**: the value is recorded as the channel's virtual
//! GP_PUT and handed to the scheduler; the physical GP_PUT is written only when the scheduler
//! dispatches. A GP_PUT read returns the virtual value; every other offset reads the hypervisor's
//! physical USERD page of the channel (so GP_GET shows the physical progress and REFERENCE what
//! SET_REFERENCE wrote); other writes are dropped and counted (`dropped_writes`). Pages of channels outside the VM's partition
//! read all-ones and count as violations.

use gf100::{pfifo, userd};

use super::view::{ChanCx, Effect};
use crate::stats::ViolationKind;

/// The guest channel and page offset of BAR1 offset `offset`, if it lies in the poll area.
fn locate(cx: &ChanCx, offset: u64) -> Option<(u32, u64)> {
    locate_in(cx.vm.regs.poll_area(), offset)
}

/// [`locate`] given the poll area's BAR1 offset.
pub(crate) fn locate_in(poll_area: Option<u64>, offset: u64) -> Option<(u32, u64)> {
    let rel = offset.checked_sub(poll_area?)?;
    let g = rel / userd::SIZE;
    (g < u64::from(pfifo::CHANNELS)).then_some((g as u32, rel % userd::SIZE))
}

/// Puts the virtual GP_PUT `put` over the bytes of `data` (read at `reg`) that cover it.
pub(crate) fn overlay_gp_put(reg: u64, data: &mut [u8], put: u32) {
    let (_, overlap) = gp_put_overlap(reg, data.len() as u64);
    if overlap {
        let put = put.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            let a = reg + i as u64;
            if (userd::GP_PUT..userd::GP_PUT + 4).contains(&a) {
                *b = put[(a - userd::GP_PUT) as usize];
            }
        }
    }
}

/// Bytes `[reg, reg + len)` overlap the GP_PUT word: (fully covered, any overlap).
fn gp_put_overlap(reg: u64, len: u64) -> (bool, bool) {
    let (lo, hi) = (userd::GP_PUT, userd::GP_PUT + 4);
    let end = reg + len;
    (reg <= lo && end >= hi, reg < hi && end > lo)
}

/// A guest BAR1 read; false if `offset` is not in the poll area.
pub(crate) fn read(cx: &mut ChanCx, offset: u64, data: &mut [u8]) -> bool {
    let Some((g, reg)) = locate(cx, offset) else {
        return false;
    };
    cx.vm.stats.by_class.userd.count(false);
    let len = data.len() as u64;
    if reg + len > userd::SIZE {
        data.fill(0xff);
        cx.violation(ViolationKind::BadAccess, || {
            format!("USERD read of {len} bytes at {reg:#x} crosses a page")
        });
        return true;
    }
    if g >= cx.vm.nchan() {
        data.fill(0xff);
        let n = cx.vm.nchan();
        cx.violation(ViolationKind::ForeignChannel, || {
            format!("USERD read of channel {g}, the VM owns {n}")
        });
        return true;
    }
    let p = cx.vm.phys_chid(g);
    cx.phys.read_vram(cx.layout.userd_page(p).offset(reg), data);
    overlay_gp_put(reg, data, cx.vm.chans[g as usize].gp_put);
    true
}

/// A guest BAR1 write; false if `offset` is not in the poll area.
pub(crate) fn write(cx: &mut ChanCx, offset: u64, data: &[u8]) -> bool {
    let Some((g, reg)) = locate(cx, offset) else {
        return false;
    };
    cx.vm.stats.by_class.userd.count(true);
    let len = data.len() as u64;
    if g >= cx.vm.nchan() {
        let n = cx.vm.nchan();
        cx.violation(ViolationKind::ForeignChannel, || {
            format!("USERD write (doorbell) of channel {g}, the VM owns {n}")
        });
        return true;
    }
    let (full, overlap) = gp_put_overlap(reg, len);
    if full {
        let i = (userd::GP_PUT - reg) as usize;
        let put = u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
        cx.vm.chans[g as usize].gp_put = put;
        cx.vm.stats.doorbells += 1;
        cx.vm.effects.push(Effect::Doorbell(g));
    } else if overlap {
        cx.violation(ViolationKind::BadAccess, || {
            format!("partial GP_PUT write of {len} bytes at {reg:#x}")
        });
    }
    if !overlap || (full && len > 4) {
        // GP_GET, REFERENCE and the rest of USERD are the GPU's: the write is dropped.
        cx.violation(ViolationKind::DroppedWrite, || {
            format!("USERD write of {len} bytes at {reg:#x} of channel {g} dropped (only GP_PUT is writable)")
        });
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gp_put_coverage() {
        assert_eq!(gp_put_overlap(userd::GP_PUT, 4), (true, true));
        assert_eq!(gp_put_overlap(userd::GP_GET, 8), (true, true));
        assert_eq!(gp_put_overlap(userd::GP_GET, 4), (false, false));
        assert_eq!(gp_put_overlap(userd::GP_PUT + 2, 2), (false, true));
        assert_eq!(gp_put_overlap(userd::GP_PUT + 4, 4), (false, false));
    }
}
