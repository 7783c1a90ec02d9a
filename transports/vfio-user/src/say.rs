//! The daemon's log lines on standard error. Every line begins with the time (UTC, RFC 3339,
//! milliseconds) so that an operator can line daemon events up with the VMM's own log, then
//! `gpuvm serve:`, then a VM's name in brackets when the event is about one VM.

use std::fmt::Display;

/// The time now as the log lines print it (`2026-11-27T14:11:10.123Z`).
pub fn now() -> String {
    format!("{:.3}", jiff::Timestamp::now())
}

/// Prints `msg` as one daemon log line on standard error (and passes it to the `log` crate at
/// `info`, which `RUST_LOG=info` shows with its own timestamp).
pub fn say(msg: impl Display) {
    log::info!("{msg}");
    eprintln!("{} gpuvm serve: {msg}", now());
}
