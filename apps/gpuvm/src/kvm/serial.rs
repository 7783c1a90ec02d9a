//! The serial console: vm-superio's 16550 at 0x3F8 with a writer that splits the output into
//! lines, prefixes each with the VM's name on standard error (when echoing) and keeps them for
//! the report.

use std::io::{self, Write};

use vm_superio::{Serial, Trigger};

/// First port of the UART.
pub const PORT_BASE: u16 = 0x3f8;
/// Ports the UART decodes.
pub const PORTS: std::ops::RangeInclusive<u16> = 0x3f8..=0x3ff;
/// Longest kept console line; longer ones are cut.
const MAX_LINE: usize = 512;
/// Most lines kept per VM (the first ones).
const MAX_LINES: usize = 10_000;

/// The UART's interrupt is not wired (the guest writes without waiting).
pub struct NoIrq;

impl Trigger for NoIrq {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Collects console output line by line.
pub struct Console {
    prefix: String,
    echo: bool,
    line: Vec<u8>,
    /// Complete lines so far.
    pub lines: Vec<String>,
}

impl Console {
    /// A console for VM `name`; `echo` prints each line to standard error as `[name] line`.
    pub fn new(name: &str, echo: bool) -> Console {
        Console {
            prefix: name.to_string(),
            echo,
            line: Vec::new(),
            lines: Vec::new(),
        }
    }

    fn end_line(&mut self) {
        let s = String::from_utf8_lossy(&self.line).trim_end().to_string();
        self.line.clear();
        if self.echo {
            eprintln!("[{}] {s}", self.prefix);
        }
        if self.lines.len() < MAX_LINES {
            self.lines.push(s);
        }
    }

    /// The unfinished line so far (a snapshot keeps it).
    pub fn partial(&self) -> &[u8] {
        &self.line
    }

    /// Flushes a partial last line.
    pub fn finish(&mut self) {
        if !self.line.is_empty() {
            self.end_line();
        }
    }
}

impl Write for Console {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for &b in buf {
            match b {
                b'\n' => self.end_line(),
                b'\r' => {}
                _ if self.line.len() < MAX_LINE => self.line.push(b),
                _ => {}
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The UART type.
pub type Uart = Serial<NoIrq, vm_superio::serial::NoEvents, Console>;

/// A UART for VM `name`.
pub fn uart(name: &str, echo: bool) -> Uart {
    Serial::new(NoIrq, Console::new(name, echo))
}

/// A UART for VM `name` with a snapshot's registers, unfinished line and console lines (the
/// lines are kept for the report, not echoed again).
pub fn restored_uart(
    name: &str,
    echo: bool,
    state: &vm_superio::serial::SerialState,
    partial: &[u8],
    lines: &[String],
) -> anyhow::Result<Uart> {
    let mut console = Console::new(name, echo);
    console.line = partial.iter().copied().take(MAX_LINE).collect();
    console.lines = lines.iter().take(MAX_LINES).cloned().collect();
    Serial::from_state(state, NoIrq, vm_superio::serial::NoEvents, console)
        .map_err(|e| anyhow::anyhow!("the serial port's state: {e:?}"))
}
