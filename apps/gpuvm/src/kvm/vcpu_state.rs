//! The KVM state of a paused guest as the snapshot and the migration stream carry it: each
//! vCPU (regs, sregs, XSAVE, XCRs, debug registers, LAPIC, MP state, events, CPUID, MSRs, TSC
//! frequency) and the VM (irqchips, KVM clock), every KVM structure as its exact bytes
//! ([`Blob`], hex in the manifest, its length checked on restore): capture and restore.

use anyhow::{bail, ensure, Context};
use kvm_bindings::{
    kvm_clock_data, kvm_cpuid_entry2, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state,
    kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::{Cap, Kvm, VcpuFd, VmFd};
use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// A KVM structure as its exact bytes, hex in the manifest; the length is checked on restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Blob(pub(super) String);

impl Blob {
    /// The bytes of `x`.
    pub fn of<T: IntoBytes + Immutable>(x: &T) -> Blob {
        Blob(hex(x.as_bytes()))
    }

    /// The structure back; an error names `what` if the length or the hex is wrong.
    pub fn get<T: FromBytes>(&self, what: &str) -> anyhow::Result<T> {
        let bytes = unhex(&self.0).with_context(|| format!("{what}: not hex"))?;
        let want = std::mem::size_of::<T>();
        ensure!(
            bytes.len() == want,
            "{what}: {} bytes, expected {want} (a snapshot of another KVM ABI, or damaged)",
            bytes.len()
        );
        T::read_from_bytes(&bytes)
            .map_err(|_| anyhow::anyhow!("{what}: not a valid {want}-byte value"))
    }
}

pub(super) fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(D[(x >> 4) as usize] as char);
        s.push(D[(x & 15) as usize] as char);
    }
    s
}

fn unhex(s: &str) -> anyhow::Result<Vec<u8>> {
    ensure!(s.len().is_multiple_of(2), "odd length");
    let nib = |c: u8| -> anyhow::Result<u8> {
        Ok(match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => bail!("bad hex digit {:?}", c as char),
        })
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Ok(nib(p[0])? << 4 | nib(p[1])?))
        .collect()
}

/// One MSR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Msr {
    /// Index.
    pub index: u32,
    /// Value.
    pub data: u64,
}

/// Informational copy of a few registers (restore ignores it; the blobs are the state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// RIP.
    pub rip: String,
    /// RSP.
    pub rsp: String,
    /// RFLAGS.
    pub rflags: String,
    /// CR3.
    pub cr3: String,
    /// CS selector (0x23: ring 3).
    pub cs: String,
}

/// One vCPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpuState {
    /// vCPU id.
    pub id: u32,
    /// For people reading the manifest.
    pub summary: Summary,
    /// `kvm_regs`.
    pub regs: Blob,
    /// `kvm_sregs`.
    pub sregs: Blob,
    /// `kvm_xsave` (the legacy 4096-byte layout; hosts needing more are refused).
    pub xsave: Blob,
    /// `kvm_xcrs`.
    pub xcrs: Blob,
    /// `kvm_debugregs`.
    pub debugregs: Blob,
    /// `kvm_lapic_state`.
    pub lapic: Blob,
    /// `kvm_mp_state`.
    pub mp_state: Blob,
    /// `kvm_vcpu_events`.
    pub events: Blob,
    /// `kvm_cpuid_entry2` each.
    pub cpuid: Vec<Blob>,
    /// Every MSR that read back.
    pub msrs: Vec<Msr>,
    /// TSC frequency, kHz.
    pub tsc_khz: u32,
}

/// The VM-wide KVM state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmState {
    /// `kvm_irqchip` of the PIC master, PIC slave and IOAPIC.
    pub irqchip: Vec<Blob>,
    /// `kvm_clock_data`.
    pub clock: Blob,
}

const IRQCHIPS: [u32; 3] = [
    KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
    KVM_IRQCHIP_IOAPIC,
];

/// Finishes the exit the vCPU last took (an `in` or MMIO read completes only when `KVM_RUN` is
/// entered again) without running a guest instruction: `KVM_RUN` with `immediate_exit` set,
/// which KVM documents as the way to make the state consistent before saving it. Also clears a
/// kick's `immediate_exit` afterwards.
pub fn complete_pending_io(vcpu: &mut VcpuFd) -> anyhow::Result<()> {
    vcpu.set_kvm_immediate_exit(1);
    let r = vcpu.run();
    let r = match r {
        Err(e) if e.errno() == libc::EINTR => Ok(()),
        Err(e) => Err(anyhow::anyhow!("KVM_RUN with immediate_exit: {e}")),
        Ok(exit) => Err(anyhow::anyhow!(
            "KVM_RUN with immediate_exit returned an exit ({exit:?}) instead of EINTR"
        )),
    };
    vcpu.set_kvm_immediate_exit(0);
    r
}

/// The XSAVE size KVM needs on this host, if it is more than the legacy 4096 bytes.
fn xsave_too_big(vm: &VmFd) -> Option<i32> {
    let n = vm.check_extension_int(Cap::Xsave2);
    (n > std::mem::size_of::<kvm_xsave>() as i32).then_some(n)
}

/// Captures vCPU `vcpu` (paused: see [`complete_pending_io`]).
pub fn capture_vcpu(kvm: &Kvm, vm: &VmFd, vcpu: &VcpuFd) -> anyhow::Result<VcpuState> {
    if let Some(n) = xsave_too_big(vm) {
        bail!("this host's XSAVE area is {n} bytes; only the 4096-byte KVM_GET_XSAVE layout is implemented");
    }
    let regs = vcpu.get_regs().context("KVM_GET_REGS")?;
    let sregs = vcpu.get_sregs().context("KVM_GET_SREGS")?;
    let xsave = vcpu.get_xsave().context("KVM_GET_XSAVE")?;
    let xcrs = vcpu.get_xcrs().context("KVM_GET_XCRS")?;
    let debugregs = vcpu.get_debug_regs().context("KVM_GET_DEBUGREGS")?;
    let lapic = vcpu.get_lapic().context("KVM_GET_LAPIC")?;
    let mp_state = vcpu.get_mp_state().context("KVM_GET_MP_STATE")?;
    let events = vcpu.get_vcpu_events().context("KVM_GET_VCPU_EVENTS")?;
    let cpuid = vcpu
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .context("KVM_GET_CPUID2")?;
    let tsc_khz = vcpu.get_tsc_khz().context("KVM_GET_TSC_KHZ")?;
    // Every MSR KVM saves or emulates, one at a time: KVM_GET_MSRS stops at the first it cannot
    // read, and which ones a host refuses varies.
    let list = kvm.get_msr_index_list().context("KVM_GET_MSR_INDEX_LIST")?;
    let mut msrs = Vec::new();
    for &index in list.as_slice() {
        let mut m = Msrs::from_entries(&[kvm_msr_entry {
            index,
            ..Default::default()
        }])
        .map_err(|e| anyhow::anyhow!("MSR list: {e:?}"))?;
        if let Ok(1) = vcpu.get_msrs(&mut m) {
            msrs.push(Msr {
                index,
                data: m.as_slice()[0].data,
            });
        }
    }
    Ok(VcpuState {
        id: 0,
        summary: Summary {
            rip: format!("{:#x}", regs.rip),
            rsp: format!("{:#x}", regs.rsp),
            rflags: format!("{:#x}", regs.rflags),
            cr3: format!("{:#x}", sregs.cr3),
            cs: format!("{:#x}", sregs.cs.selector),
        },
        regs: Blob::of(&regs),
        sregs: Blob::of(&sregs),
        xsave: Blob::of(&xsave),
        xcrs: Blob::of(&xcrs),
        debugregs: Blob::of(&debugregs),
        lapic: Blob::of(&lapic),
        mp_state: Blob::of(&mp_state),
        events: Blob::of(&events),
        cpuid: cpuid.as_slice().iter().map(Blob::of).collect(),
        msrs,
        tsc_khz,
    })
}

/// What a restore could not put back exactly (reported, not fatal).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RestoreNotes {
    /// MSRs KVM refused to set, by index.
    pub msrs_refused: Vec<String>,
    /// The TSC frequency differs from the snapshot's and could not be set.
    pub tsc_khz: Option<String>,
}

/// Decodes every blob of `s` first (so a damaged snapshot fails before KVM is touched), then
/// sets the vCPU in the order Firecracker uses (CPUID, MP state, regs, sregs, XSAVE, XCRs,
/// debug registers, LAPIC, MSRs, events last).
pub fn restore_vcpu(vm: &VmFd, vcpu: &VcpuFd, s: &VcpuState) -> anyhow::Result<RestoreNotes> {
    ensure!(s.id == 0, "vCPU id {} (this VMM has vCPU 0 only)", s.id);
    let regs: kvm_regs = s.regs.get("regs")?;
    let sregs: kvm_sregs = s.sregs.get("sregs")?;
    let xsave: kvm_xsave = s.xsave.get("xsave")?;
    let xcrs: kvm_xcrs = s.xcrs.get("xcrs")?;
    let debugregs: kvm_debugregs = s.debugregs.get("debugregs")?;
    let lapic: kvm_lapic_state = s.lapic.get("lapic")?;
    let mp_state: kvm_mp_state = s.mp_state.get("mp_state")?;
    let events: kvm_vcpu_events = s.events.get("events")?;
    ensure!(
        !s.cpuid.is_empty() && s.cpuid.len() <= KVM_MAX_CPUID_ENTRIES,
        "{} CPUID entries",
        s.cpuid.len()
    );
    let entries = s
        .cpuid
        .iter()
        .map(|b| b.get::<kvm_cpuid_entry2>("cpuid entry"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    ensure!(s.msrs.len() <= 4096, "{} MSRs", s.msrs.len());
    if let Some(n) = xsave_too_big(vm) {
        bail!("this host's XSAVE area is {n} bytes; only the 4096-byte KVM_SET_XSAVE layout is implemented");
    }
    let mut notes = RestoreNotes::default();
    let here = vcpu.get_tsc_khz().unwrap_or(0);
    if s.tsc_khz != 0 && here != s.tsc_khz {
        if let Err(e) = vcpu.set_tsc_khz(s.tsc_khz) {
            notes.tsc_khz = Some(format!(
                "TSC {here} kHz here, {} kHz in the snapshot, KVM_SET_TSC_KHZ: {e}",
                s.tsc_khz
            ));
        }
    }
    let cpuid =
        CpuId::from_entries(&entries).map_err(|e| anyhow::anyhow!("CPUID entries: {e:?}"))?;
    vcpu.set_cpuid2(&cpuid).context("KVM_SET_CPUID2")?;
    vcpu.set_mp_state(mp_state).context("KVM_SET_MP_STATE")?;
    vcpu.set_regs(&regs).context("KVM_SET_REGS")?;
    vcpu.set_sregs(&sregs).context("KVM_SET_SREGS")?;
    // SAFETY: `xsave_too_big` returned None: KVM's XSAVE area fits the 4096-byte `kvm_xsave`,
    // so KVM_SET_XSAVE reads no further than this struct.
    unsafe { vcpu.set_xsave(&xsave) }.context("KVM_SET_XSAVE")?;
    vcpu.set_xcrs(&xcrs).context("KVM_SET_XCRS")?;
    vcpu.set_debug_regs(&debugregs)
        .context("KVM_SET_DEBUGREGS")?;
    vcpu.set_lapic(&lapic).context("KVM_SET_LAPIC")?;
    let entries: Vec<kvm_msr_entry> = s
        .msrs
        .iter()
        .map(|m| kvm_msr_entry {
            index: m.index,
            data: m.data,
            ..Default::default()
        })
        .collect();
    let all = Msrs::from_entries(&entries).map_err(|e| anyhow::anyhow!("MSRs: {e:?}"))?;
    let set = vcpu.set_msrs(&all).context("KVM_SET_MSRS")?;
    if set < entries.len() {
        // KVM stops at the first it refuses: retry the rest one by one to name them.
        for e in &entries[set..] {
            let one = Msrs::from_entries(&[*e]).map_err(|e| anyhow::anyhow!("MSR: {e:?}"))?;
            if !matches!(vcpu.set_msrs(&one), Ok(1)) {
                notes.msrs_refused.push(format!("{:#x}", e.index));
            }
        }
    }
    vcpu.set_vcpu_events(&events)
        .context("KVM_SET_VCPU_EVENTS")?;
    Ok(notes)
}

/// Captures the irqchip and the KVM clock.
pub fn capture_vm(vm: &VmFd) -> anyhow::Result<VmState> {
    let mut irqchip = Vec::new();
    for id in IRQCHIPS {
        let mut c = kvm_irqchip {
            chip_id: id,
            ..Default::default()
        };
        vm.get_irqchip(&mut c).context("KVM_GET_IRQCHIP")?;
        irqchip.push(Blob::of(&c));
    }
    let clock = vm.get_clock().context("KVM_GET_CLOCK")?;
    Ok(VmState {
        irqchip,
        clock: Blob::of(&clock),
    })
}

/// Puts the irqchip and the KVM clock back.
pub fn restore_vm(vm: &VmFd, s: &VmState) -> anyhow::Result<()> {
    ensure!(
        s.irqchip.len() == IRQCHIPS.len(),
        "{} irqchips, expected {} (PIC master, PIC slave, IOAPIC)",
        s.irqchip.len(),
        IRQCHIPS.len()
    );
    let chips = s
        .irqchip
        .iter()
        .map(|b| b.get::<kvm_irqchip>("irqchip"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (c, id) in chips.iter().zip(IRQCHIPS) {
        ensure!(
            c.chip_id == id,
            "irqchip {} where {id} was expected",
            c.chip_id
        );
    }
    let clock: kvm_clock_data = s.clock.get("clock")?;
    for c in &chips {
        vm.set_irqchip(c).context("KVM_SET_IRQCHIP")?;
    }
    let clock = kvm_clock_data {
        clock: clock.clock,
        ..Default::default()
    };
    vm.set_clock(&clock).context("KVM_SET_CLOCK")?;
    Ok(())
}
