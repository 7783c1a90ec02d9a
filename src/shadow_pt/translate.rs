//! Translation and validation of one guest entry — GPUvm's `context::guest_to_host` (GXEN
//! `context.cc`), with the check GPUvm left as a TODO: system-memory pages are validated too.
//!
//! A present guest PTE becomes a shadow PTE whose address is what the physical GPU must use:
//! - **VRAM**: guest VRAM address + the VM's slice base; the whole page (4 KiB or 128 KiB) must
//!   lie inside the slice;
//! - **system memory** (either target): the IOVA of the GPA in the VM's DMA window; the whole
//!   page must lie inside one region of the VM's RAM (and RAM must be attached).
//!
//! Kept from the guest entry: target (VRAM / snooped / non-snooped), SUPERVISOR_ONLY,
//! READ_ONLY, ENCRYPTED, VOL and the storage kind. **Cleared: the compression tag.** Comptag
//! lines are a physical-GPU-wide resource (the L2 compression tag RAM) that the device model
//! does not partition, so a guest naming a tag line could read or corrupt another VM's
//! compressed data; with tag 0 a compressible kind simply stays uncompressed. Bit 35 (meaning
//! unknown) is dropped as well, since the entry is re-encoded from its decoded fields.
//!
//! Everything else — an invalid target (value 1), a page outside the slice or guest RAM, system
//! memory without RAM, or a physical address the 40-bit PTE cannot encode — is rejected; the
//! caller writes a not-present shadow entry and counts a violation.
//!
//! A shadow PDE points at shadow tables, which always live in hypervisor VRAM: targets are VRAM,
//! VOL is clear, PT_SIZE is the guest's.

use gf100::mmu::{Pde, PtRef, PtSize, Pte};
use gf100::Target;

use crate::guest_mem::{GuestMem, Violation};

/// First physical address a PTE or PDE cannot encode (28 address bits from bit 12).
pub(crate) const PHYS_LIMIT: u64 = 1 << 40;

/// Why a guest entry was not shadowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reject {
    /// The guest named memory it does not own, or an invalid target.
    Guest(Violation),
    /// The page's physical address (VRAM or IOVA) is beyond what a PTE encodes.
    Unencodable {
        /// The physical address.
        phys: u64,
    },
}

/// The shadow PTE for guest PTE `raw` of a table mapping pages of `page_size` bytes: `Ok(0)` for
/// a not-present entry (whatever its other bits), `Err` for a rejected one.
pub(crate) fn shadow_pte(mem: &GuestMem, raw: u64, page_size: u64) -> Result<u64, Reject> {
    let pte = match Pte::decode(raw) {
        Ok(None) => return Ok(0),
        Ok(Some(pte)) => pte,
        Err(_) => return Err(Reject::Guest(Violation::InvalidTarget)),
    };
    let phys = mem
        .to_phys(pte.target, pte.addr, page_size)
        .map_err(Reject::Guest)?;
    match phys.checked_add(page_size) {
        Some(end) if end <= PHYS_LIMIT => {}
        _ => return Err(Reject::Unencodable { phys }),
    }
    // The GPU can now reach the page (read-only entries included: the dirty log does not rely
    // on the MMU enforcing them).
    if let Some(log) = mem.log {
        match pte.target {
            Target::Vram => log.gpu_maps(pte.addr, page_size),
            Target::SysCoherent | Target::SysNonCoherent => log.dma_maps(pte.addr, page_size),
        }
    }
    Ok(Pte {
        addr: phys,
        comptag: 0,
        ..pte
    }
    .encode())
}

/// The shadow PDE pointing at shadow tables `small` / `large` (physical VRAM) with the guest's
/// PT_SIZE; 0 when neither exists (the walk faults PT_NOT_PRESENT either way).
pub(crate) fn shadow_pde(size: PtSize, small: Option<u64>, large: Option<u64>) -> u64 {
    if small.is_none() && large.is_none() {
        return 0;
    }
    let table = |addr| PtRef {
        addr,
        target: Target::Vram,
        vol: false,
    };
    Pde {
        large: large.map(table),
        small: small.map(table),
        size,
    }
    .encode()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{HostVram, Iova};
    use crate::guest_mem::{GuestRam, VramSlice};
    use gf100::mmu::{LARGE_PAGE_SIZE, SMALL_PAGE_SIZE};
    use gpuvm_sim::{SimConfig, SimGpu};
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    const BASE: u64 = 16 << 20;
    const SLICE: u64 = 8 << 20;
    const IOVA: u64 = 1 << 32;

    fn with_mem(ram: bool, f: impl FnOnce(&GuestMem)) {
        let gpu = SimGpu::new(SimConfig {
            vram_size: 32 << 20,
            ..SimConfig::default()
        });
        let r = GuestRam {
            mem: GuestMemoryMmap::<()>::from_ranges(&[
                (GuestAddress(0), 1 << 20),
                (GuestAddress(2 << 20), 1 << 20),
            ])
            .unwrap(),
            iova_base: Iova(IOVA),
        };
        let m = GuestMem {
            phys: &gpu,
            slice: VramSlice {
                base: HostVram(BASE),
                size: SLICE,
            },
            ram: ram.then_some(&r),
            log: None,
        };
        f(&m)
    }

    fn out(raw: u64) -> Pte {
        Pte::decode(raw).unwrap().unwrap()
    }

    #[test]
    fn vram_pages_move_into_the_slice_with_flags_kept_and_comptag_cleared() {
        with_mem(true, |m| {
            let guest = Pte {
                supervisor: true,
                read_only: true,
                kind: 0xfe,
                comptag: 0x1234,
                vol: true,
                ..Pte::new(0x3000, Target::Vram)
            };
            let s = out(shadow_pte(m, guest.encode(), SMALL_PAGE_SIZE).unwrap());
            assert_eq!(
                s,
                Pte {
                    addr: BASE + 0x3000,
                    comptag: 0,
                    ..guest
                }
            );
            let last = Pte::new(SLICE - SMALL_PAGE_SIZE, Target::Vram).encode();
            assert!(shadow_pte(m, last, SMALL_PAGE_SIZE).is_ok());
            assert!(
                shadow_pte(m, last, LARGE_PAGE_SIZE).is_err(),
                "a large page must fit whole"
            );
            assert_eq!(
                shadow_pte(m, Pte::new(SLICE, Target::Vram).encode(), SMALL_PAGE_SIZE),
                Err(Reject::Guest(Violation::VramOutOfSlice {
                    addr: crate::addr::GuestVram(SLICE),
                    len: SMALL_PAGE_SIZE,
                    slice: SLICE
                }))
            );
        });
    }

    #[test]
    fn sysram_pages_move_into_the_dma_window_and_must_be_in_ram() {
        with_mem(true, |m| {
            let guest = Pte {
                encrypted: true,
                ..Pte::new(0x2000, Target::SysNonCoherent)
            };
            let s = out(shadow_pte(m, guest.encode(), SMALL_PAGE_SIZE).unwrap());
            assert_eq!(s.addr, IOVA + 0x2000);
            assert_eq!(s.target, Target::SysNonCoherent);
            assert!(s.encrypted && s.vol);
            let hole = Pte::new(1 << 20, Target::SysCoherent).encode();
            assert!(matches!(
                shadow_pte(m, hole, SMALL_PAGE_SIZE),
                Err(Reject::Guest(Violation::SysramOutOfRam { .. }))
            ));
            let straddle = Pte::new((1 << 20) - 0x1000, Target::SysCoherent).encode();
            assert!(shadow_pte(m, straddle, SMALL_PAGE_SIZE).is_ok());
            assert!(shadow_pte(m, straddle, LARGE_PAGE_SIZE).is_err());
        });
        with_mem(false, |m| {
            let p = Pte::new(0x2000, Target::SysCoherent).encode();
            assert_eq!(
                shadow_pte(m, p, SMALL_PAGE_SIZE),
                Err(Reject::Guest(Violation::NoGuestRam))
            );
        });
    }

    #[test]
    fn not_present_is_zero_and_invalid_target_is_rejected() {
        with_mem(true, |m| {
            assert_eq!(shadow_pte(m, 0, SMALL_PAGE_SIZE), Ok(0));
            assert_eq!(
                shadow_pte(m, 0xffff_ffff_ffff_fffe, SMALL_PAGE_SIZE),
                Ok(0),
                "present bit clear: absent whatever else is set"
            );
            let bad = Pte::new(0x1000, Target::Vram).encode() | 1 << 33;
            assert_eq!(
                shadow_pte(m, bad, SMALL_PAGE_SIZE),
                Err(Reject::Guest(Violation::InvalidTarget))
            );
        });
    }

    #[test]
    fn shadow_pdes_point_at_vram_and_keep_pt_size() {
        let raw = shadow_pde(PtSize::Quarter, Some(0x10_0000), Some(0x20_0000));
        let d = Pde::decode(raw);
        assert_eq!(d.size, PtSize::Quarter);
        assert_eq!(
            d.small,
            Some(PtRef {
                addr: 0x10_0000,
                target: Target::Vram,
                vol: false
            })
        );
        assert_eq!(d.large.unwrap().addr, 0x20_0000);
        assert_eq!(shadow_pde(PtSize::Half, None, None), 0);
    }
}
