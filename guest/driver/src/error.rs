//! The driver's error type. Every failure the hardware (or a hostile device model) can cause is an
//! error value, never a panic or a hang: nouveau's `nvkm_error` + `-ETIMEDOUT`/`-ENOSPC` paths.

use core::fmt;

use gf100::fault;

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverError {
    /// BOOT_0 does not name a Fermi (chipset 0xc0..0xcf).
    NotFermi {
        /// The BOOT_0 value read.
        boot0: u32,
    },
    /// The memory-controller registers describe an implausible amount of VRAM.
    BadVramSize {
        /// The size computed (bytes), possibly 0.
        bytes: u64,
    },
    /// No VRAM left for an allocation of this size.
    OutOfVram {
        /// Bytes requested.
        size: u64,
    },
    /// No guest RAM (DMA region) left for an allocation of this size.
    OutOfDma {
        /// Bytes requested.
        size: u64,
    },
    /// No GPU virtual address space left (channel VM, BAR1 or BAR3).
    OutOfVa {
        /// Which address space.
        space: &'static str,
        /// Bytes requested.
        size: u64,
    },
    /// All 128 channels are in use.
    OutOfChannels,
    /// A request the driver cannot honour (bad size, misaligned buffer, ...).
    InvalidArgument {
        /// What was wrong.
        what: &'static str,
    },
    /// The hardware did not reach the expected state in time.
    Timeout {
        /// What the driver was waiting for.
        what: &'static str,
    },
    /// An MMU fault reported by PFIFO (`VM_FAULT` registers).
    MmuFault {
        /// Faulting GPU virtual address.
        va: u64,
        /// Reason code (`gf100::fault::REASON_*`).
        reason: u32,
        /// Fault unit (`gf100::fault::UNIT_*`).
        unit: u32,
        /// Client id.
        client: u32,
        /// Hub (true) or GPC client.
        hub: bool,
        /// The access was a write.
        write: bool,
        /// Instance block of the faulting context.
        inst: u64,
    },
    /// A PBDMA reported an error (invalid GPFIFO entry, illegal method, ...).
    PbdmaError {
        /// Which PBDMA.
        pbdma: u32,
        /// Its INTR bits.
        intr: u32,
        /// The channel it was working for (PBDMA CHID register).
        chid: u32,
    },
    /// PFIFO reported a channel-table or scheduling error.
    ChannelError {
        /// Which error register (`"channel table"` or `"scheduler"`).
        kind: &'static str,
        /// The error code read.
        code: u32,
    },
    /// The hardware returned a value outside its valid range.
    BadHardwareValue {
        /// What was read.
        what: &'static str,
        /// The value.
        value: u64,
    },
    /// [`crate::Paravirt::Required`] but the vGPU does not offer the para-virtual page-table
    /// interface (its ID register does not read `gf100::pv::MAGIC`).
    ParavirtUnavailable {
        /// What the ID register (BAR0 0x1f00000) read.
        id: u32,
    },
    /// The vGPU did not apply a whole para-virtual page-table batch: STATUS (ops applied) was not
    /// the batch's count, or ERROR was not `ERR_NONE`.
    ParavirtBatch {
        /// ERROR (`gf100::pv::ERR_*`) as read.
        error: u32,
        /// Index in the batch of the first op not applied (= STATUS as read).
        op_index: u32,
        /// Op code (`gf100::pv::OP_*`) of that op, if it is in the batch.
        op: Option<u32>,
        /// Ops in the batch.
        count: u32,
    },
    /// The driver's bookkeeping refused an operation (double free, foreign buffer, ...).
    Internal {
        /// What went wrong.
        what: &'static str,
    },
}

/// Name of an MMU fault reason code (nouveau `gf100_fifo_mmu_fault_reason`).
pub fn fault_reason_name(reason: u32) -> &'static str {
    match reason {
        fault::REASON_PT_NOT_PRESENT => "PT_NOT_PRESENT",
        fault::REASON_PT_TOO_SHORT => "PT_TOO_SHORT",
        fault::REASON_PAGE_NOT_PRESENT => "PAGE_NOT_PRESENT",
        fault::REASON_VM_LIMIT_EXCEEDED => "VM_LIMIT_EXCEEDED",
        fault::REASON_NO_CHANNEL => "NO_CHANNEL",
        fault::REASON_PAGE_SYSTEM_ONLY => "PAGE_SYSTEM_ONLY",
        fault::REASON_PAGE_READ_ONLY => "PAGE_READ_ONLY",
        fault::REASON_INVALID_STORAGE_TYPE => "INVALID_STORAGE_TYPE",
        _ => "unknown reason",
    }
}

/// Name of an MMU fault unit (nouveau `gf100_fifo_mmu_fault_engine`).
pub fn fault_unit_name(unit: u32) -> &'static str {
    match unit {
        fault::UNIT_PGRAPH => "PGRAPH",
        fault::UNIT_BAR1 => "BAR1",
        fault::UNIT_BAR3 => "BAR3",
        fault::UNIT_PFIFO => "PFIFO",
        fault::UNIT_PCOPY0 => "PCOPY0",
        fault::UNIT_PCOPY1 => "PCOPY1",
        _ => "unknown unit",
    }
}

/// Names of the PBDMA INTR bits the driver knows (ENVY `gf100_psubfifo_intr`).
fn pbdma_intr_name(intr: u32) -> &'static str {
    use gf100::pfifo::*;
    if intr & PBDMA_INTR_IB_ENTRY_INVALID != 0 {
        "IB_ENTRY_INVALID"
    } else if intr & PBDMA_INTR_IB_PUT_OVERFLOW != 0 {
        "IB_PUT_OVERFLOW"
    } else if intr & PBDMA_INTR_ILLEGAL_CMD != 0 {
        "ILLEGAL_CMD"
    } else if intr & PBDMA_INTR_ILLEGAL_MTHD != 0 {
        "ILLEGAL_MTHD"
    } else if intr & PBDMA_INTR_ILLEGAL_SEM != 0 {
        "ILLEGAL_SEM"
    } else if intr & PBDMA_INTR_SEM_TIMEOUT != 0 {
        "SEM_TIMEOUT"
    } else {
        "unknown"
    }
}

/// Name of a para-virtual interface error code (`gf100::pv::ERR_*`).
pub fn pv_error_name(error: u32) -> &'static str {
    use gf100::pv::*;
    match error {
        ERR_NONE => "ERR_NONE",
        ERR_BAD_OP => "ERR_BAD_OP",
        ERR_BAD_TABLE => "ERR_BAD_TABLE",
        ERR_BAD_INDEX => "ERR_BAD_INDEX",
        ERR_BAD_BATCH => "ERR_BAD_BATCH",
        ERR_NOT_AVAILABLE => "ERR_NOT_AVAILABLE",
        ERR_BUSY => "ERR_BUSY",
        _ => "unknown error",
    }
}

/// Name of a para-virtual op code (`gf100::pv::OP_*`).
pub fn pv_op_name(op: u32) -> &'static str {
    use gf100::pv::*;
    match op {
        OP_WRITE_PDE => "WRITE_PDE",
        OP_WRITE_PTE => "WRITE_PTE",
        OP_FLUSH => "FLUSH",
        _ => "unknown op",
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DriverError::NotFermi { boot0 } => {
                write!(f, "BOOT_0 {boot0:#010x} is not a Fermi GPU (chipset 0xc0..0xcf)")
            }
            DriverError::BadVramSize { bytes } => {
                write!(f, "implausible VRAM size {bytes:#x} bytes read from the memory controller")
            }
            DriverError::OutOfVram { size } => write!(f, "out of VRAM allocating {size:#x} bytes"),
            DriverError::OutOfDma { size } => {
                write!(f, "out of guest DMA memory allocating {size:#x} bytes")
            }
            DriverError::OutOfVa { space, size } => {
                write!(f, "out of {space} virtual address space allocating {size:#x} bytes")
            }
            DriverError::OutOfChannels => write!(f, "all hardware channels are in use"),
            DriverError::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
            DriverError::Timeout { what } => write!(f, "timeout waiting for {what}"),
            DriverError::MmuFault { va, reason, unit, client, hub, write, inst } => write!(
                f,
                "MMU fault at VA {va:#012x}: {} (reason {reason:#x}) on {} {} by unit {} ({unit:#x}), \
                 {} client {client:#x}, instance {inst:#x}",
                fault_reason_name(*reason),
                if *write { "write" } else { "read" },
                if *write { "to" } else { "from" },
                fault_unit_name(*unit),
                if *hub { "hub" } else { "GPC" },
            ),
            DriverError::PbdmaError { pbdma, intr, chid } => write!(
                f,
                "PBDMA {pbdma} error {} (INTR {intr:#010x}) on channel {chid}",
                pbdma_intr_name(*intr)
            ),
            DriverError::ChannelError { kind, code } => {
                write!(f, "PFIFO {kind} error, code {code:#x}")
            }
            DriverError::BadHardwareValue { what, value } => {
                write!(f, "hardware returned an invalid {what}: {value:#x}")
            }
            DriverError::ParavirtUnavailable { id } => write!(
                f,
                "para-virtual page tables required but not offered: ID register {:#x} reads \
                 {id:#010x}, not {:#010x}",
                gf100::pv::ID,
                gf100::pv::MAGIC
            ),
            DriverError::ParavirtBatch { error, op_index, op, count } => {
                write!(
                    f,
                    "para-virtual page-table batch failed at op {op_index} of {count}"
                )?;
                if let Some(op) = op {
                    write!(f, " ({})", pv_op_name(*op))?;
                }
                if *error == gf100::pv::ERR_NONE {
                    write!(f, ": STATUS reads {op_index} ops applied, ERROR reads ERR_NONE")
                } else {
                    write!(f, ": {} (ERROR {error})", pv_error_name(*error))
                }
            }
            DriverError::Internal { what } => write!(f, "driver bookkeeping error: {what}"),
        }
    }
}

impl core::error::Error for DriverError {}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    #[test]
    fn mmu_fault_message_names_va_and_reason() {
        let e = DriverError::MmuFault {
            va: 0x20_0000_1000,
            reason: fault::REASON_PAGE_NOT_PRESENT,
            unit: fault::UNIT_PCOPY0,
            client: 1,
            hub: true,
            write: true,
            inst: 0x10_0000,
        };
        let s = e.to_string();
        assert!(s.contains("0x2000001000"), "{s}");
        assert!(s.contains("PAGE_NOT_PRESENT"), "{s}");
        assert!(s.contains("PCOPY0"), "{s}");
    }
}
