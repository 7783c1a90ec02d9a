//! PTIMER: the nanosecond time counter (BAR0 0x009000).
//!
//! Sources: ENVY `bus/ptimer.xml`, `docs/hw/bus/ptimer.rst`; NV-TMR `timer/nv04.c`, `nv41.c`.
//! nouveau programs the divider so that `(TIME_HIGH << 32) | TIME_LOW` counts nanoseconds, and
//! reads it as `do { hi = rd(TIME_HIGH); lo = rd(TIME_LOW); } while (hi != rd(TIME_HIGH))`.

/// INTR: bit 0 ALARM, write 1 to clear (ENVY `ptimer.rst`).
pub const INTR: u32 = 0x009100;
/// INTR_EN: bit 0 ALARM (ENVY `ptimer.rst` INTR_ENABLE).
pub const INTR_EN: u32 = 0x009140;
/// CLOCK_DIV (nouveau `NV04_PTIMER_NUMERATOR`), bits 0-15 (ENVY `ptimer.rst`).
pub const CLOCK_DIV: u32 = 0x009200;
/// CLOCK_MUL (nouveau `NV04_PTIMER_DENOMINATOR`), bits 0-15; 0 stops the counter (ENVY
/// `ptimer.rst`).
pub const CLOCK_MUL: u32 = 0x009210;
/// TIME_LOW: bits 0-31 of the 64-bit timestamp nouveau reads as nanoseconds. On hardware bits
/// 0-4 always read 0 and bits 5-31 hold the low 27 bits of the 56-bit tick counter (ENVY
/// `docs/hw/bus/ptimer.rst`).
pub const TIME_LOW: u32 = 0x009400;
/// TIME_HIGH: bits 32-63 of the timestamp; bits 0-28 hold the high 29 counter bits, bits 29-31
/// always read 0 (ENVY `ptimer.rst`).
pub const TIME_HIGH: u32 = 0x009410;
/// ALARM: the ALARM interrupt (INTR bit 0) fires when bits 5-31 of this register *equal* bits
/// 5-31 of TIME_LOW (ENVY `ptimer.rst`: "triggered whenever value of ALARM register is equal to
/// value of TIME_LOW register"). A model that advances time in jumps has to treat "passed" as
/// equal, which is a modelling choice.
pub const ALARM: u32 = 0x009420;
/// TIME_LOW bits that are always zero (ENVY `ptimer.rst`: "bits 0-4: always 0"; with nouveau's
/// 31.25 MHz tick the timestamp advances in 32 ns steps).
pub const TIME_LOW_ZERO_BITS: u32 = 0x1f;
