//! Plain-text tables for terminal output: columns sized to their widest cell.

/// A table with a header row.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(header: I) -> Table {
        Table {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells are blank).
    pub fn row<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, cells: I) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// Renders the table; the first column is left-aligned, the others right-aligned.
    pub fn render(&self) -> String {
        let cols = self.header.len();
        let mut width: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.len());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, w) in width.iter().enumerate() {
                let c = cells.get(i).map(String::as_str).unwrap_or("");
                if i == 0 {
                    s += &format!("{c:<w$}");
                } else {
                    s += &format!("  {c:>w$}");
                }
            }
            s.trim_end().to_string() + "\n"
        };
        let mut out = line(&self.header);
        out += &line(&width.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>());
        for r in &self.rows {
            out += &line(r);
        }
        out
    }
}

/// The "verified" cell of a workload row: `yes`, `NO`, or the failure.
pub fn verdict(error: &Option<String>, verified: bool) -> String {
    match (error, verified) {
        (Some(e), _) => format!("FAILED: {e}"),
        (None, true) => "yes".to_string(),
        (None, false) => "NO".to_string(),
    }
}

/// The per-workload table every run command prints (bring-up first, then each workload).
pub fn workload_table<'a>(
    runs: impl IntoIterator<Item = &'a gpuvm_harness::WorkloadRun>,
) -> String {
    let mut t = Table::new([
        "workload",
        "bytes",
        "gpu time",
        "wall time",
        "mmio reads",
        "mmio writes",
        "verified",
    ]);
    for w in runs {
        t.row([
            w.name.clone(),
            bytes(w.bytes),
            gpu_time(w.gpu_ns, w.fence_gpu_ns),
            ns(w.wall_ns),
            w.mmio_reads.to_string(),
            w.mmio_writes.to_string(),
            verdict(&w.error, w.verified),
        ]);
    }
    t.render()
}

/// The "gpu time" cell: the host's accounting, or where the host's is not known here (a
/// guest whose vGPU lives in `gpuvm serve`) the GPU time the guest measured between its fence
/// timestamps, marked `(guest)`.
pub fn gpu_time(host_ns: u64, guest_ns: u64) -> String {
    if host_ns == 0 && guest_ns > 0 {
        format!("{} (guest)", ns(guest_ns))
    } else {
        ns(host_ns)
    }
}

/// Formats nanoseconds with a unit suited to the magnitude.
pub fn ns(v: u64) -> String {
    match v {
        0..=9_999 => format!("{v} ns"),
        10_000..=9_999_999 => format!("{:.1} us", v as f64 / 1e3),
        10_000_000..=9_999_999_999 => format!("{:.1} ms", v as f64 / 1e6),
        _ => format!("{:.2} s", v as f64 / 1e9),
    }
}

/// Formats a byte count in binary units.
pub fn bytes(v: u64) -> String {
    match v {
        0..=1023 => format!("{v} B"),
        1024..=1_048_575 => format!("{:.1} KiB", v as f64 / 1024.0),
        _ => format!("{:.1} MiB", v as f64 / 1_048_576.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_to_widest_cell() {
        let mut t = Table::new(["name", "value"]);
        t.row(["a", "1"]);
        t.row(["longer", "12345"]);
        let out = t.render();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "name    value");
        assert_eq!(lines[1], "------  -----");
        assert_eq!(lines[2], "a           1");
        assert_eq!(lines[3], "longer  12345");
    }

    #[test]
    fn units_follow_magnitude() {
        assert_eq!(ns(999), "999 ns");
        assert_eq!(ns(25_000), "25.0 us");
        assert_eq!(ns(12_500_000), "12.5 ms");
        assert_eq!(bytes(2048), "2.0 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(gpu_time(2_000, 18_535), "2000 ns");
        assert_eq!(gpu_time(0, 18_535), "18.5 us (guest)");
        assert_eq!(gpu_time(0, 0), "0 ns");
    }
}
