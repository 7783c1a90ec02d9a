//! A VM's device state as one value: [`DeviceState`] holds everything needed to rebuild a
//! vGPU on another GPU except the contents of its VRAM slice — the profile, PCI configuration
//! space, the virtual register files, each channel's guest-visible state and the GPU-held part
//! of its context, the accepted runlist. Derived state is not in it and is rebuilt on restore
//! from guest memory (shadow page tables and shadow instance blocks, the BAR bindings and their
//! TLB, the instance-page tracking), and so is what the host lends the VM (VRAM slice, physical
//! channels, DMA window, host-owned GR contexts).
//!
//! [`capture`] reads it from a quiesced VM; [`apply`] replays it into a freshly created vGPU
//! of the same profile through the same paths a guest's own writes take (a channel is bound as a
//! CHAN write binds it), so a snapshot that names memory, channels or addresses the VM does not
//! own is refused the way the guest would be refused, and reported as an error.

use gf100::{pfifo, userd};
use serde::{Deserialize, Serialize};

use crate::channels::cmdscan::{ScanParts, ScanState};
use crate::channels::Effect;
use crate::mmio::pci::{PciConfig, PciConfigState};
use crate::mmio::vregs::VRegs;
use crate::profile::VgpuProfile;

use super::VmCx;

/// The format of [`DeviceState`] (bumped on any incompatible change).
pub const DEVICE_STATE_VERSION: u32 = 1;

/// One guest channel as a snapshot carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChanState {
    /// The CHAN word as the guest wrote it (VALID: bound on restore).
    pub chan_word: u32,
    /// GP_PUT as the guest last wrote it.
    pub gp_put: u32,
    /// GP_PUT the GPU was given.
    pub phys_put: u32,
    /// Where the GPU's GP_GET stood: short of `phys_put` when the channel stopped part-way
    /// (parked on a semaphore acquire, or disabled, with entries left). `None` (streams from
    /// before it was carried): at `phys_put`.
    #[serde(default)]
    pub gp_get: Option<u32>,
    /// Killed by the watchdog.
    pub killed: bool,
    /// The physical STATE word's RUNNABLE and engine bits.
    pub state: u32,
    /// The pushbuffer scan state carried between submissions.
    pub scan: ScanParts,
    /// The GPU-held part of the channel's context (`PhysicalGpu::save_channel`), if bound.
    pub gpu_context: Option<Vec<u8>>,
}

/// Everything needed to rebuild a VM's device except its VRAM contents.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceState {
    /// [`DEVICE_STATE_VERSION`] of the producer.
    pub version: u32,
    /// The profile the vGPU was created from.
    pub profile: VgpuProfile,
    /// PCI configuration space.
    pub pci: PciConfigState,
    /// The virtual register files (PMC, PFIFO, PFB, PTIMER, board, PGRAPH, PMU, PV).
    regs: VRegs,
    /// Every channel of the partition.
    pub chans: Vec<ChanState>,
    /// The accepted guest runlist (guest channel ids, in order).
    pub runlist: Vec<u32>,
}

/// Why a device state could not be captured or applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Another format version.
    #[error("device state version {found}, this build reads {DEVICE_STATE_VERSION}")]
    Version {
        /// The version found.
        found: u32,
    },
    /// The state does not fit the vGPU it is applied to.
    #[error("device state does not fit the vGPU: {0}")]
    Mismatch(String),
    /// A channel could not be taken, or did not bind on the destination.
    #[error("channel {chan}: {what}")]
    Channel {
        /// The guest channel.
        chan: u32,
        /// What went wrong.
        what: String,
    },
}

/// Reads the device state of the VM in `cx`, whose channels are off the GPU (quiesced).
pub(crate) fn capture(cx: &mut VmCx) -> Result<DeviceState, StateError> {
    let mut chans = Vec::with_capacity(cx.vm.chans.len());
    for (g, c) in cx.vm.chans.iter().enumerate() {
        let p = cx.vm.phys_chid(g as u32);
        let (state, scan, gpu_context, gp_get) = match &c.bound {
            Some(b) => {
                // RUNNABLE as the guest set it (the physical bit is the host's).
                let run = if c.enabled { pfifo::STATE_RUNNABLE } else { 0 };
                let state =
                    (cx.phys.read_reg(pfifo::chan_state(p)) & pfifo::STATE_ENGINE_MASK) | run;
                let blob = cx.phys.save_channel(p).map_err(|e| StateError::Channel {
                    chan: g as u32,
                    what: e.to_string(),
                })?;
                let mut get = [0u8; 4];
                cx.phys
                    .read_vram(cx.layout.userd_page(p).offset(userd::GP_GET), &mut get);
                let get = u32::from_le_bytes(get);
                (state, b.scan.parts(), Some(blob), Some(get))
            }
            None => (0, ScanParts::default(), None, None),
        };
        chans.push(ChanState {
            chan_word: c.chan_word,
            gp_put: c.gp_put,
            phys_put: c.phys_put,
            gp_get,
            killed: c.killed,
            state,
            scan,
            gpu_context,
        });
    }
    Ok(DeviceState {
        version: DEVICE_STATE_VERSION,
        profile: cx.vm.profile.clone(),
        pci: cx.vm.pci.state(),
        regs: cx.vm.regs.clone(),
        chans,
        runlist: cx.vm.runlist.clone(),
    })
}

/// Checks what can be checked before anything changes.
pub(crate) fn validate(st: &DeviceState, profile: &VgpuProfile) -> Result<(), StateError> {
    if st.version != DEVICE_STATE_VERSION {
        return Err(StateError::Version { found: st.version });
    }
    if st.profile != *profile {
        return Err(StateError::Mismatch(format!(
            "profile {:?}, the vGPU has {:?}",
            st.profile, profile
        )));
    }
    if st.chans.len() != profile.channels as usize {
        return Err(StateError::Mismatch(format!(
            "{} channels, the profile has {}",
            st.chans.len(),
            profile.channels
        )));
    }
    let mut seen = vec![false; st.chans.len()];
    for &g in &st.runlist {
        match seen.get_mut(g as usize) {
            Some(s) if !*s => *s = true,
            _ => {
                return Err(StateError::Mismatch(format!(
                    "runlist entry {g} is not a channel of the partition or repeats"
                )))
            }
        }
    }
    for (g, c) in st.chans.iter().enumerate() {
        let bad = |what: &str| StateError::Channel {
            chan: g as u32,
            what: what.to_string(),
        };
        if ScanState::from_parts(c.scan).is_none() {
            return Err(bad("invalid pushbuffer scan state"));
        }
        let valid = c.chan_word & pfifo::CHAN_VALID != 0;
        if valid != c.gpu_context.is_some() {
            return Err(bad(
                "a bound channel needs its GPU context, an unbound one has none",
            ));
        }
        if c.state & !(pfifo::STATE_RUNNABLE | pfifo::STATE_ENGINE_MASK) != 0 {
            return Err(bad("STATE bits beyond RUNNABLE and the engine"));
        }
    }
    Ok(())
}

/// Replays `st` (validated) into the freshly created vGPU of `cx`: PCI space, registers, then
/// each channel bound through the guest's own binding path, its progress and GPU context
/// restored, then the runlist. Work the guest had queued but the GPU had not been given is
/// rung again.
pub(crate) fn apply(cx: &mut VmCx, st: &DeviceState) -> Result<(), StateError> {
    validate(st, &cx.vm.profile)?;
    cx.vm.pci = PciConfig::from_state(st.pci);
    if !cx.vm.pci.bus_master() {
        super::unmap_windows(cx);
    }
    cx.vm.regs = st.regs.clone();
    super::aperture::reload(cx, super::aperture::Reload::Binding);
    cx.vm.map_gen += 1;
    for (g, c) in st.chans.iter().enumerate() {
        let g = g as u32;
        let chan_err = |what: String| StateError::Channel { chan: g, what };
        if c.chan_word & pfifo::CHAN_VALID == 0 {
            cx.vm.chans[g as usize].chan_word = c.chan_word;
            continue;
        }
        let before = cx.vm.stats.violations.total;
        if !crate::channels::restore_binding(&mut cx.chan(), g, c.chan_word) {
            return Err(chan_err(format!(
                "CHAN word {:#010x} does not bind on the destination ({} violation(s) counted)",
                c.chan_word,
                cx.vm.stats.violations.total - before
            )));
        }
        let entries = match &cx.vm.chans[g as usize].bound {
            Some(b) => 1u64 << b.ib_order.min(32),
            None => 0,
        };
        let gp_get = c.gp_get.unwrap_or(c.phys_put);
        if u64::from(c.gp_put) >= entries
            || u64::from(c.phys_put) >= entries
            || u64::from(gp_get) >= entries
        {
            return Err(chan_err(format!(
                "GP_PUT {} / {} or GP_GET {gp_get} beyond its {entries}-entry ring",
                c.gp_put, c.phys_put
            )));
        }
        let p = cx.vm.phys_chid(g);
        let page = cx.layout.userd_page(p);
        cx.phys
            .write_vram(page.offset(userd::GP_GET), &gp_get.to_le_bytes());
        cx.phys
            .write_vram(page.offset(userd::GP_PUT), &c.phys_put.to_le_bytes());
        if let Some(blob) = &c.gpu_context {
            cx.phys
                .restore_channel(p, blob)
                .map_err(|e| chan_err(e.to_string()))?;
        }
        let ch = &mut cx.vm.chans[g as usize];
        ch.gp_put = c.gp_put;
        ch.phys_put = c.phys_put;
        ch.done_put = None;
        ch.killed = c.killed;
        if let Some(b) = ch.bound.as_mut() {
            b.scan = ScanState::from_parts(c.scan).unwrap_or_default();
        }
        // The guest's RUNNABLE is virtual; the GPU gets only the engine field, and the channel
        // runs when the scheduler dispatches it (its work, or the rest of a segment or acquire
        // it stopped in, is queued below).
        ch.enabled = c.state & pfifo::STATE_RUNNABLE != 0 && !c.killed;
        let engine = c.state & pfifo::STATE_ENGINE_MASK;
        if engine != 0 {
            cx.phys.write_reg(pfifo::chan_state(p), engine);
        }
    }
    cx.vm.runlist = st.runlist.clone();
    cx.vm.effects.push(Effect::RunlistChanged);
    for (g, c) in st.chans.iter().enumerate() {
        let work_left = c.gp_put != c.phys_put || c.gp_get.is_some_and(|get| get != c.phys_put);
        if c.chan_word & pfifo::CHAN_VALID != 0 && work_left && !c.killed {
            cx.vm.effects.push(Effect::Doorbell(g as u32));
        }
    }
    Ok(())
}
