//! PTIMER: the nanosecond time counter (BAR0 0x009000).
//!
//! Sources: ENVY `bus/ptimer.xml`, `docs/hw/bus/ptimer.rst`; NV-TMR `timer/nv04.c`, `nv41.c`.
//! nouveau programs the divider so that `(TIME_HIGH << 32) | TIME_LOW` counts nanoseconds, and
//! reads it as `do { hi = rd(TIME_HIGH); lo = rd(TIME_LOW); } while (hi != rd(TIME_HIGH))`.

/// INTR: bit 0 ALARM, write 1 to clear.
pub const INTR: u32 = 0x009100;
/// INTR_EN: bit 0 ALARM.
pub const INTR_EN: u32 = 0x009140;
/// CLOCK_DIV (nouveau "NUMERATOR"), bits 0-15.
pub const CLOCK_DIV: u32 = 0x009200;
/// CLOCK_MUL (nouveau "DENOMINATOR"), bits 0-15.
pub const CLOCK_MUL: u32 = 0x009210;
/// TIME_LOW: counter bits 0-31 (bits 0-4 always read 0 on hardware).
pub const TIME_LOW: u32 = 0x009400;
/// TIME_HIGH: counter bits 32-60.
pub const TIME_HIGH: u32 = 0x009410;
/// ALARM: fires when the low 32 bits of the counter pass this value.
pub const ALARM: u32 = 0x009420;
/// TIME_LOW bits that are always zero (the counter advances in 32 ns steps).
pub const TIME_LOW_ZERO_BITS: u32 = 0x1f;
