//! The architecture test: gpuvm's layers run one way, along the data flow of a guest access.
//!
//! **Folders** are layers (`FOLDERS`, bottom up: `hw/`, the core at the root with `backends/`
//! and `guest/`, `transports/`, `tools/`, `apps/`, `fuzz/`): every crate lives in one, and no
//! crate depends (normal dependencies) on a crate in a higher folder. Tests and benches may
//! use anything (dev-dependencies are not arrows of the architecture).
//!
//! **Crates** (`cargo metadata`, normal dependencies only): the device-model core `gpuvm` is what
//! a VMM embeds, so it must not pull in the guest driver, a GPU backend, the trace tooling, the
//! harness, or tool dependencies (compression, plotting, progress bars, CLI parsing, anyhow).
//! Each workspace crate has a rank; a crate may depend only on crates of a lower rank.
//!
//! **Files of every crate** (workspace members, `guest/bin`, `fuzz`; tests excluded): the
//! crate is read from its root through its `mod` declarations; each `use` tree and each
//! `crate::`/`super::`/`self::`/child-module path is an edge to the file that defines what it
//! names (through `pub use` re-exports). A file may name its ancestors (the `mod.rs` or crate
//! root that declares it: a module's face is what its parts share); every other edge counts,
//! and the file graph must have no circle. No non-test Rust file has more than 1,200 lines.
//!
//! **Modules of the core** (the `crate::` paths in `src/`, tests excluded): each top-level
//! module has a rank along the data flow — the host (composition root) over the per-VM device
//! over channels over counters over {mmio, shadow_pt} over the scheduler over memory and layout
//! over the physical-GPU boundary. A module may use modules of its own rank or lower, and the
//! module graph must have no cycle.
//!
//! When this test fails, its message says which file imports what against which rule; the fix
//! is to move a type to the file that owns it, to pass a narrow view or a returned value down
//! (as `channels::ChanCx` and `channels::Effect` do) or to invert the call through a trait the
//! lower layer defines (as `vgpu::GpuPort` does), not to add an exception here. `docs/design.md`
//! draws the layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Workspace crates and their ranks (higher may depend on lower).
const CRATES: &[(&str, u32, &str)] = &[
    ("gf100", 0, "hardware facts"),
    ("gpuvm-guest", 1, "the guest driver (knows only gf100)"),
    ("gpuvm-phys", 1, "the physical-GPU boundary"),
    ("gpuvm-sim", 2, "a GPU backend"),
    ("gpuvm-vfio", 2, "a GPU backend"),
    ("gpuvm", 2, "the device-model core"),
    ("gpuvm-trace", 3, "trace / replay / fault injection"),
    ("gpuvm-harness", 4, "in-process harness and experiments"),
    ("gpuvm-vfio-user", 4, "a transport"),
    ("gpuvm-vhost-user", 4, "a transport"),
    ("gpuvm-app", 5, "the gpuvm command and the KVM VMM"),
];

/// The layer folders, bottom (0) up. A crate lives in one of them (the core at the root) and may
/// depend (normal dependencies) only on crates in its own folder or a lower one.
const FOLDERS: &[(u32, &str)] = &[
    (0, "hw"),         // hardware facts (gf100) and the PhysicalGpu boundary (phys)
    (1, "."),          // the device-model core, package `gpuvm` at the root (src/)
    (1, "backends"),   // what a PhysicalGpu is: the simulator, VFIO passthrough
    (1, "guest"),      // what runs inside a VM: the driver, the bare-metal guest binary
    (2, "transports"), // how a VMM reaches the core: vfio-user, vhost-user
    (3, "tools"),      // trace/replay/fault injection, the in-process harness and experiments
    (4, "apps"),       // the gpuvm command: CLI, KVM VMM, serve daemon, CLI experiments
    (5, "fuzz"),       // cargo-fuzz targets (a workspace of their own)
];

/// Crates the core must not depend on, directly or through anything it links.
const NOT_IN_CORE: &[&str] = &[
    "gpuvm-guest",
    "gpuvm-sim",
    "gpuvm-vfio",
    "gpuvm-trace",
    "gpuvm-harness",
    "gpuvm-app",
    "flate2",
    "lzma-rs",
    "plotters",
    "indicatif",
    "clap",
    "anyhow",
];

/// The core's top-level modules and their ranks, top (0) to bottom: a module may use modules of
/// its own rank or a higher number (further down the data flow), never a lower one.
const MODULES: &[(&str, u32, &str)] = &[
    (
        "migrate",
        0,
        "snapshot, restore, live migration (on the host API)",
    ),
    (
        "host",
        0,
        "composition root: GPU-wide lock and state, dispatch, interrupt routing",
    ),
    ("vgpu", 1, "the per-VM device a transport calls"),
    ("channels", 2, "shadow channels, runlists, USERD"),
    ("stats", 3, "the per-VM counters"),
    ("mmio", 4, "register files, region table, PCI config"),
    ("shadow_pt", 4, "shadow page tables"),
    ("sched", 5, "schedulers and GPU-time accounting"),
    ("guest_mem", 6, "guest memory views"),
    ("vram_alloc", 6, "VRAM allocators"),
    ("layout", 6, "the host's structures in VRAM"),
    ("phys_driver", 6, "register sequences on the physical GPU"),
    ("profile", 6, "vGPU profiles"),
    ("phys", 7, "the PhysicalGpu boundary (gpuvm-phys)"),
    ("addr", 7, "address newtypes (gpuvm-phys)"),
    ("clock", 7, "time bases (gpuvm-phys)"),
    ("irq", 7, "interrupt lines (gpuvm-phys)"),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `from` may use `to` if `to` is at the same level or further down (a higher number).
fn allowed(ranks: &BTreeMap<String, u32>, from: &str, to: &str) -> bool {
    match (ranks.get(from), ranks.get(to)) {
        (Some(f), Some(t)) => t >= f,
        _ => false,
    }
}

/// Normal (non-dev, non-build) dependency edges between packages, by name, from `cargo metadata`.
/// `cargo metadata` of the workspace whose manifest is `manifest`, with `args` added.
fn cargo_metadata(manifest: &Path, args: &[&str]) -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
        ])
        .arg(manifest)
        .args(args)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata {}: {}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("metadata JSON")
}

/// The host's target triple (`rustc -vV`), for `cargo metadata --filter-platform`.
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = std::process::Command::new(rustc)
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

fn normal_deps() -> BTreeMap<String, BTreeSet<String>> {
    // The resolve for the host only: a build downloads just the host's packages, and the full
    // resolve would need every platform's (clap's Windows console crate, for one) — offline,
    // on a fresh cargo home, it failed.
    let host = host_triple();
    let v = cargo_metadata(
        &root().join("Cargo.toml"),
        &["--filter-platform", host.as_str()],
    );
    let mut names = BTreeMap::new();
    for p in v["packages"].as_array().expect("packages") {
        names.insert(
            p["id"].as_str().unwrap().to_string(),
            p["name"].as_str().unwrap().to_string(),
        );
    }
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for n in v["resolve"]["nodes"].as_array().expect("resolve") {
        let from = names[n["id"].as_str().unwrap()].clone();
        let e = g.entry(from).or_default();
        for d in n["deps"].as_array().unwrap() {
            let normal = d["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null());
            if normal {
                e.insert(names[d["pkg"].as_str().unwrap()].clone());
            }
        }
    }
    g
}

fn closure(g: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_string()];
    while let Some(n) = stack.pop() {
        for d in g.get(&n).into_iter().flatten() {
            if seen.insert(d.clone()) {
                stack.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn crates_depend_only_downwards() {
    let g = normal_deps();
    let ranks: BTreeMap<String, u32> = CRATES.iter().map(|(n, r, _)| (n.to_string(), *r)).collect();
    let mut bad = Vec::new();
    for (name, _, _) in CRATES {
        let deps = g
            .get(*name)
            .unwrap_or_else(|| panic!("workspace crate {name} missing from cargo metadata"));
        for d in deps.iter().filter(|d| ranks.contains_key(*d)) {
            if ranks[d] >= ranks[*name] {
                bad.push(format!(
                    "crate {name} (rank {}) depends on {d} (rank {}): a crate may depend only on \
                     crates of a lower rank (tests/architecture.rs, CRATES)",
                    ranks[*name], ranks[d]
                ));
            }
        }
    }
    for ws in g.keys().filter(|n| n.starts_with("gpuvm") || *n == "gf100") {
        if !ranks.contains_key(ws) && ws != "gpuvm-fuzz" {
            bad.push(format!(
                "workspace crate {ws} has no rank: add it to CRATES in tests/architecture.rs"
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Each workspace crate's layer folder (the first component of its directory; `.` for the root).
fn crate_folders() -> BTreeMap<String, String> {
    let v = cargo_metadata(&root().join("Cargo.toml"), &["--no-deps"]);
    let mut m = BTreeMap::new();
    for p in v["packages"].as_array().expect("packages") {
        let dir = Path::new(p["manifest_path"].as_str().unwrap())
            .parent()
            .unwrap()
            .to_path_buf();
        let rel = dir.strip_prefix(root()).unwrap();
        let folder = rel.components().next().map_or(".".to_string(), |c| {
            c.as_os_str().to_string_lossy().to_string()
        });
        m.insert(p["name"].as_str().unwrap().to_string(), folder);
    }
    m
}

#[test]
fn folders_are_layers_and_no_crate_depends_on_a_higher_folder() {
    let g = normal_deps();
    let folders = crate_folders();
    let rank = |f: &str| FOLDERS.iter().find(|(_, n)| *n == f).map(|(r, _)| *r);
    let mut bad = Vec::new();
    for (name, folder) in &folders {
        let Some(r) = rank(folder) else {
            bad.push(format!(
                "crate {name} lives in {folder}/, which is no layer folder: move it (git mv) \
                 into the folder of its layer, or add the folder to FOLDERS in \
                 tests/architecture.rs and to the map in docs/design.md"
            ));
            continue;
        };
        for d in g.get(name).into_iter().flatten() {
            let Some(df) = folders.get(d) else { continue };
            let dr = rank(df).unwrap_or(u32::MAX);
            if dr > r {
                bad.push(format!(
                    "crate {name} ({folder}/, layer {r}) depends on {d} ({df}/, layer {dr}): an \
                     arrow back up. Move the code {name} needs from {d} down (into {name} or a \
                     crate of a lower layer), or move {name} up to the layer that uses it"
                ));
            }
        }
    }
    assert!(
        folders.len() >= 10,
        "found only {} crates: the scan is broken",
        folders.len()
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_core_links_no_driver_backend_tooling_or_cli() {
    let g = normal_deps();
    let all = closure(&g, "gpuvm");
    let found: Vec<_> = NOT_IN_CORE.iter().filter(|c| all.contains(**c)).collect();
    assert!(
        found.is_empty(),
        "the device-model core `gpuvm` links {found:?} (directly or through a dependency). A VMM \
         that embeds the core must not compile the guest driver, a GPU backend, the trace tooling \
         or tool dependencies: move the code that needs them into gpuvm-harness, gpuvm-trace or \
         the CLI crate, or put the backend behind the PhysicalGpu trait (gpuvm-phys)."
    );
}

/// The `crate::<module>` paths a file's non-test code uses.
fn referenced_modules(src: &str, known: &BTreeSet<&str>) -> BTreeSet<String> {
    // Test modules sit at the end of a file by convention: drop everything from them on.
    let code = match src.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &src[..i],
        None => src,
    };
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let l = line.trim_start();
        if l.starts_with("//") {
            continue;
        }
        let l = l.split("//").next().unwrap_or("");
        // `crate::m::...` anywhere, and `use crate::{m::..., n}` groups.
        let mut rest = l;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let m = item.trim().split("::").next().unwrap_or("").trim();
                    if known.contains(m) {
                        out.insert(m.to_string());
                    }
                }
            } else {
                let m: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if known.contains(m.as_str()) {
                    out.insert(m);
                }
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "tests") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs")
            && p.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(p);
        }
    }
}

/// Module edges of the core: (from, to) -> the files that make them.
fn module_edges(src: &Path) -> BTreeMap<(String, String), BTreeSet<String>> {
    let known: BTreeSet<&str> = MODULES.iter().map(|(m, _, _)| *m).collect();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap().to_string_lossy().to_string();
        let first = rel.split('/').next().unwrap().trim_end_matches(".rs");
        if first == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for to in referenced_modules(&text, &known) {
            if to != first {
                edges
                    .entry((first.to_string(), to))
                    .or_default()
                    .insert(rel.clone());
            }
        }
    }
    edges
}

/// The violations of the module rules in `edges`.
fn module_violations(edges: &BTreeMap<(String, String), BTreeSet<String>>) -> Vec<String> {
    let ranks: BTreeMap<String, u32> = MODULES
        .iter()
        .map(|(n, r, _)| (n.to_string(), *r))
        .collect();
    let role = |m: &str| {
        MODULES
            .iter()
            .find(|(n, _, _)| *n == m)
            .map(|(_, _, r)| *r)
            .unwrap_or("unknown")
    };
    let mut bad = Vec::new();
    for ((from, to), files) in edges {
        if !ranks.contains_key(from) {
            bad.push(format!(
                "module {from} has no rank: add it to MODULES in tests/architecture.rs"
            ));
        } else if !allowed(&ranks, from, to) {
            bad.push(format!(
                "{files:?}: module `{from}` ({}, rank {}) uses `crate::{to}` ({}, rank {}), which \
                 sits above it. Pass what `{to}` needs down as a narrow view or a returned value, \
                 or invert the call through a trait `{from}` defines.",
                role(from),
                ranks[from],
                role(to),
                ranks[to]
            ));
        }
    }
    // Cycles among same-rank modules (the rank rule already forbids every other cycle).
    let mut g: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        g.entry(from.as_str()).or_default().push(to.as_str());
    }
    for start in g.keys() {
        let mut stack = vec![(*start, vec![*start])];
        let mut seen = BTreeSet::new();
        while let Some((n, path)) = stack.pop() {
            for &d in g.get(n).into_iter().flatten() {
                if d == *start {
                    bad.push(format!(
                        "import cycle among the core's modules: {} -> {start}",
                        path.join(" -> ")
                    ));
                } else if seen.insert(d) {
                    let mut p = path.clone();
                    p.push(d);
                    stack.push((d, p));
                }
            }
        }
    }
    bad
}

#[test]
fn core_modules_import_along_the_data_flow_without_cycles() {
    let edges = module_edges(&root().join("src"));
    assert!(
        edges.len() > 10,
        "found only {} module edges: the scan is broken",
        edges.len()
    );
    let bad = module_violations(&edges);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_checker_catches_an_upward_import_and_a_cycle() {
    let known: BTreeSet<&str> = MODULES.iter().map(|(m, _, _)| *m).collect();
    let up =
        "use crate::host::HostState;\nuse crate::{stats::X, mmio};\n// crate::vgpu in a comment\n\
              #[cfg(test)]\nmod tests {\n    use crate::vgpu::Vgpu;\n}\n";
    let refs = referenced_modules(up, &known);
    assert_eq!(
        refs,
        ["host", "mmio", "stats"]
            .into_iter()
            .map(String::from)
            .collect::<BTreeSet<_>>(),
        "comments and test modules are ignored, groups are read"
    );
    let mut edges = BTreeMap::new();
    let file = |f: &str| BTreeSet::from([f.to_string()]);
    edges.insert(
        ("channels".into(), "host".into()),
        file("channels/runlist.rs"),
    );
    edges.insert(("mmio".into(), "shadow_pt".into()), file("mmio/a.rs"));
    edges.insert(("shadow_pt".into(), "mmio".into()), file("shadow_pt/b.rs"));
    let bad = module_violations(&edges);
    assert!(
        bad.iter()
            .any(|m| m.contains("module `channels`") && m.contains("crate::host")),
        "{bad:?}"
    );
    assert!(bad.iter().any(|m| m.contains("import cycle")), "{bad:?}");
}

// ---------------------------------------------------------------------------------------------
// The import graph of every crate, at file granularity.
// ---------------------------------------------------------------------------------------------

/// Workspaces of their own (not members of the main one) whose sources the graph also reads.
const OTHER_WORKSPACES: &[&str] = &["guest/bin", "fuzz"];

/// Circles left on purpose, each with why and the fix: the files of the circle (exactly), and
/// the reason. The test fails when a listed circle is gone (delete its entry) or changes.
/// Add none: break the circle instead.
const DEFERRED_CIRCLES: &[(&[&str], &str)] = &[];

/// The most lines a non-test Rust file may have.
const MAX_LINES: usize = 1200;

/// `src` with comments, string and char literals blanked (same length, newlines kept).
fn strip_literals(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = src[i..].find('\n').map_or(b.len(), |e| i + e);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let (mut depth, mut j) = (1, i + 2);
                while j < b.len() && depth > 0 {
                    if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                        depth += 1;
                        j += 1;
                    } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                        depth -= 1;
                        j += 1;
                    }
                    j += 1;
                }
                blank(&mut out, i, j);
                i = j;
            }
            b'r' if (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let start = i + 2 + hashes;
                let end = src[start..]
                    .find(&close)
                    .map_or(b.len(), |e| start + e + close.len());
                blank(&mut out, i, end);
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i, j + 1);
                i = j + 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}', a multi-byte char), or a lifetime.
                let rest = &src[i + 1..];
                let mut cs = rest.char_indices();
                let end = match cs.next() {
                    Some((_, '\\')) => rest.find('\'').map(|e| {
                        let e2 = rest[e + 1..].find('\'');
                        // '\'' : the first quote is escaped.
                        if e == 1 {
                            e2.map_or(e, |x| e + 1 + x)
                        } else {
                            e
                        }
                    }),
                    Some((_, c)) => match cs.next() {
                        Some((k, '\'')) if c != '\'' => Some(k),
                        _ => None,
                    },
                    None => None,
                };
                match end {
                    Some(e) => {
                        blank(&mut out, i, i + 2 + e);
                        i += 2 + e;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).expect("blanking keeps UTF-8 (only ASCII replaced whole literals)")
}

/// The index of the `}` that closes the `{` at `open` (or the end).
fn matching_brace(s: &[u8], open: usize) -> usize {
    let mut depth = 0;
    for (k, c) in s.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// Blanks every item under `#[cfg(test)]` (a test module, a test-only helper or import).
fn drop_test_items(code: &str) -> String {
    let mut out = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some(k) = code[from..].find("#[cfg(test)]") {
        let at = from + k;
        let b = code.as_bytes();
        let semi = code[at..].find(';').map(|x| at + x);
        let brace = code[at..].find('{').map(|x| at + x);
        let end = match (semi, brace) {
            (Some(s), Some(br)) if s < br => s,
            (_, Some(br)) => matching_brace(b, br),
            (Some(s), None) => s,
            (None, None) => b.len() - 1,
        };
        for c in &mut out[at..=end.min(b.len() - 1)] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = end.min(b.len() - 1) + 1;
    }
    String::from_utf8(out).unwrap()
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Id(String),
    Path,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other(char),
}

/// Tokens with their byte offsets.
fn tokens(code: &str) -> Vec<(usize, Tok)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((s, Tok::Id(code[s..i].to_string())));
            continue;
        }
        let t = match c {
            b':' if b.get(i + 1) == Some(&b':') => {
                i += 1;
                Tok::Path
            }
            b'{' => Tok::Open,
            b'}' => Tok::Close,
            b',' => Tok::Comma,
            b';' => Tok::Semi,
            b'*' => Tok::Star,
            c if c.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            c => Tok::Other(c as char),
        };
        out.push((i, t));
        i += 1;
    }
    out
}

/// Expands a use tree starting at `toks[*i]` into paths (`as` renames are kept as the last
/// element `as:NAME`).
fn use_tree(toks: &[(usize, Tok)], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        match toks.get(*i).map(|t| &t.1) {
            Some(Tok::Id(id)) if id == "as" => {
                *i += 1;
                if let Some((_, Tok::Id(n))) = toks.get(*i) {
                    path.push(format!("as:{n}"));
                    *i += 1;
                }
            }
            Some(Tok::Id(id)) => {
                path.push(id.clone());
                *i += 1;
            }
            Some(Tok::Path) => *i += 1,
            Some(Tok::Star) => {
                path.push("*".into());
                *i += 1;
            }
            Some(Tok::Open) => {
                *i += 1;
                loop {
                    use_tree(toks, i, path.clone(), out);
                    match toks.get(*i).map(|t| &t.1) {
                        Some(Tok::Comma) => *i += 1,
                        Some(Tok::Close) => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    if let Some((_, Tok::Close)) = toks.get(*i) {
                        *i += 1;
                        return;
                    }
                }
            }
            Some(Tok::Other('$')) => {
                // `$crate` in a macro: the caller's crate, not a module edge.
                *i += 2;
                path.clear();
            }
            _ => break,
        }
    }
    if !path.is_empty() {
        out.push(path);
    }
}

/// A file of a crate: its module path (`[]` for the root) and what it says.
struct ModFile {
    file: PathBuf,
    module: Vec<String>,
    code: String,
}

/// The files of the crate rooted at `root_file`, following `mod x;` (and `#[path]`), tests
/// excluded (`#[cfg(test)] mod tests;` is blanked before the walk).
fn crate_files(root_file: &Path) -> Vec<ModFile> {
    let mut out: Vec<ModFile> = Vec::new();
    let mut todo = vec![(root_file.to_path_buf(), Vec::<String>::new(), true)];
    while let Some((file, module, owns_dir)) = todo.pop() {
        let Ok(src) = std::fs::read_to_string(&file) else {
            continue;
        };
        let code = drop_test_items(&strip_literals(&src));
        let dir = file.parent().unwrap().to_path_buf();
        let child_dir = if owns_dir {
            dir.clone()
        } else {
            dir.join(file.file_stem().unwrap())
        };
        let toks = tokens(&code);
        let inline = inline_mod_spans(&code, &toks);
        for (k, (at, t)) in toks.iter().enumerate() {
            if *t != Tok::Id("mod".into()) || inline.iter().any(|(s, e)| s < at && at < e) {
                continue;
            }
            let (Some((_, Tok::Id(name))), Some((_, Tok::Semi))) =
                (toks.get(k + 1), toks.get(k + 2))
            else {
                continue;
            };
            // `#[path = "..."]` right before (read from the original text).
            let before = &src[..*at];
            let attr_start = before.rfind("#[path");
            let path_attr = attr_start
                .filter(|s| {
                    before[*s..].find(']').is_some_and(|e| {
                        before[*s + e + 1..]
                            .split_whitespace()
                            .all(|w| w == "pub" || w.starts_with("pub(") || w.starts_with("#["))
                    })
                })
                .and_then(|s| {
                    let a = &before[s..];
                    let q1 = a.find('"')? + 1;
                    let q2 = a[q1..].find('"')? + q1;
                    Some(a[q1..q2].to_string())
                });
            let mut m = module.clone();
            m.push(name.clone());
            match path_attr {
                Some(p) => todo.push((dir.join(p), m, true)),
                None => {
                    let flat = child_dir.join(format!("{name}.rs"));
                    if flat.exists() {
                        todo.push((flat, m, false));
                    } else {
                        todo.push((child_dir.join(name).join("mod.rs"), m, true));
                    }
                }
            }
        }
        out.push(ModFile { file, module, code });
    }
    out.sort_by(|a, b| a.module.cmp(&b.module));
    out
}

/// Byte spans of inline `mod x { ... }` blocks.
fn inline_mod_spans(code: &str, toks: &[(usize, Tok)]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    for (k, (at, t)) in toks.iter().enumerate() {
        if *t == Tok::Id("mod".into()) {
            if let (Some((_, Tok::Id(_))), Some((open, Tok::Open))) =
                (toks.get(k + 1), toks.get(k + 2))
            {
                spans.push((*at, matching_brace(code.as_bytes(), *open)));
            }
        }
    }
    spans
}

/// Every module path a file names (`crate::`, `super::`, `self::`, a child module), as
/// (path relative to the crate root, exported alias, is a `pub use`).
fn named_paths(
    f: &ModFile,
    children: &BTreeSet<String>,
) -> Vec<(Vec<String>, Option<String>, bool)> {
    let toks = tokens(&f.code);
    let inline = inline_mod_spans(&f.code, &toks);
    let mut raw: Vec<(usize, Vec<String>, bool)> = Vec::new();
    let mut k = 0;
    while k < toks.len() {
        let (at, t) = &toks[k];
        if *t == Tok::Id("use".into()) {
            let public = k > 0 && matches!(&toks[k - 1].1, Tok::Id(p) if p == "pub")
                || (k > 3 && matches!(&toks[k - 4].1, Tok::Id(p) if p == "pub"));
            let mut i = k + 1;
            let mut paths = Vec::new();
            use_tree(&toks, &mut i, Vec::new(), &mut paths);
            for p in paths {
                raw.push((*at, p, public));
            }
            k = i;
            continue;
        }
        // A path expression: `a::b::c` not preceded by `::` or `$`.
        if let Tok::Id(first) = t {
            let preceded = k > 0 && matches!(toks[k - 1].1, Tok::Path | Tok::Other('$'));
            if !preceded && toks.get(k + 1).map(|t| &t.1) == Some(&Tok::Path) {
                let mut p = vec![first.clone()];
                let mut i = k + 1;
                while let (Some((_, Tok::Path)), Some((_, Tok::Id(n)))) =
                    (toks.get(i), toks.get(i + 1))
                {
                    p.push(n.clone());
                    i += 2;
                }
                raw.push((*at, p, false));
                k = i;
                continue;
            }
        }
        k += 1;
    }
    let mut out = Vec::new();
    for (at, mut p, public) in raw {
        let alias = match p.last() {
            Some(l) if l.starts_with("as:") => Some(p.pop().unwrap()[3..].to_string()),
            _ => None,
        };
        let depth_inline = inline.iter().filter(|(s, e)| *s < at && at < *e).count();
        let Some(first) = p.first().cloned() else {
            continue;
        };
        let abs: Vec<String> = match first.as_str() {
            "crate" => p[1..].to_vec(),
            "self" if depth_inline == 0 => f
                .module
                .iter()
                .cloned()
                .chain(p[1..].iter().cloned())
                .collect(),
            "super" => {
                let supers = p.iter().take_while(|s| *s == "super").count();
                let up = supers.saturating_sub(depth_inline);
                if supers > depth_inline + f.module.len() {
                    continue;
                }
                let keep = f.module.len() - up;
                f.module[..keep]
                    .iter()
                    .cloned()
                    .chain(p[supers..].iter().cloned())
                    .collect()
            }
            c if depth_inline == 0 && children.contains(c) => {
                f.module.iter().cloned().chain(p.iter().cloned()).collect()
            }
            _ => continue,
        };
        out.push((abs, alias, public));
    }
    out
}

/// The file-level import graph of one crate.
struct CrateGraph {
    name: String,
    files: Vec<ModFile>,
    /// (from file index, to file index) -> the paths that make the edge.
    edges: BTreeMap<(usize, usize), BTreeSet<String>>,
}

fn crate_graph(name: &str, root_file: &Path) -> CrateGraph {
    let files = crate_files(root_file);
    let index: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.module.clone(), i))
        .collect();
    let children = |m: &[String]| -> BTreeSet<String> {
        files
            .iter()
            .filter(|f| f.module.len() == m.len() + 1 && f.module[..m.len()] == *m)
            .map(|f| f.module.last().unwrap().clone())
            .collect()
    };
    let named: Vec<_> = files
        .iter()
        .map(|f| named_paths(f, &children(&f.module)))
        .collect();
    // Re-exports: (module, exported name) -> the absolute path behind it.
    let mut reexports: BTreeMap<(Vec<String>, String), Vec<String>> = BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        for (p, alias, public) in &named[i] {
            if *public && p.last().is_some_and(|l| l != "*") {
                let n = alias.clone().unwrap_or_else(|| p.last().unwrap().clone());
                reexports.insert((f.module.clone(), n), p.clone());
            }
        }
    }
    // The file a path lands in: the deepest file module along it, through re-exports.
    fn resolve(
        p: &[String],
        index: &BTreeMap<Vec<String>, usize>,
        reexports: &BTreeMap<(Vec<String>, String), Vec<String>>,
        hops: u32,
    ) -> usize {
        let mut m: Vec<String> = Vec::new();
        for (k, s) in p.iter().enumerate() {
            let mut next = m.clone();
            next.push(s.clone());
            if index.contains_key(&next) {
                m = next;
                continue;
            }
            if hops < 8 {
                if let Some(target) = reexports.get(&(m.clone(), s.clone())) {
                    if target.as_slice() != &p[..=k] {
                        let mut t = target.clone();
                        t.extend(p[k + 1..].iter().cloned());
                        return resolve(&t, index, reexports, hops + 1);
                    }
                }
            }
            break;
        }
        index[&m]
    }
    let mut edges: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
    for (i, ps) in named.iter().enumerate() {
        for (p, _, _) in ps {
            let to = resolve(p, &index, &reexports, 0);
            // A file may name its ancestors (the crate root, the `mod.rs` that declares it):
            // a module's face is the vocabulary its parts share. Everything else is an edge.
            let ancestor = files[i].module.starts_with(&files[to].module);
            if to != i && !ancestor {
                edges.entry((i, to)).or_default().insert(p.join("::"));
            }
        }
    }
    CrateGraph {
        name: name.to_string(),
        files,
        edges,
    }
}

/// Strongly connected components of more than one file (Tarjan).
fn cycles(n: usize, edges: &BTreeMap<(usize, usize), BTreeSet<String>>) -> Vec<Vec<usize>> {
    let mut adj = vec![Vec::new(); n];
    for (a, b) in edges.keys() {
        adj[*a].push(*b);
    }
    struct T<'a> {
        adj: &'a [Vec<usize>],
        idx: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T, v: usize) {
        t.idx[v] = Some(t.next);
        t.low[v] = t.next;
        t.next += 1;
        t.stack.push(v);
        t.on[v] = true;
        for k in 0..t.adj[v].len() {
            let w = t.adj[v][k];
            match t.idx[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                _ => {}
            }
        }
        if Some(t.low[v]) == t.idx[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        adj: &adj,
        idx: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.idx[v].is_none() {
            visit(&mut t, v);
        }
    }
    t.out
}

/// How a cycle reads in a failure message: its files and the imports that close it.
fn describe_cycle(g: &CrateGraph, comp: &[usize], repo: &Path) -> String {
    let rel = |i: usize| {
        g.files[i]
            .file
            .strip_prefix(repo)
            .unwrap_or(&g.files[i].file)
            .display()
            .to_string()
    };
    let mut s = format!(
        "import circle in crate {} between {} files:\n",
        g.name,
        comp.len()
    );
    for ((a, b), paths) in &g.edges {
        if comp.contains(a) && comp.contains(b) {
            let shown: Vec<_> = paths.iter().take(3).cloned().collect();
            s += &format!("    {} -> {} ({})\n", rel(*a), rel(*b), shown.join(", "));
        }
    }
    s += "  Fix: decide which file is lower, then move the type or function the lower one \
          borrows into it (or into a new file both use), pass a narrow view or a returned \
          value down, or invert the call through a trait the lower file defines. A parent \
          `mod.rs` that both declares children and holds code they use is a circle: move that \
          code into a child of its own.";
    s
}

/// Every crate's root files: (crate name, root file), from `cargo metadata --no-deps`.
fn crate_roots() -> Vec<(String, PathBuf)> {
    let mut manifests = vec![root().join("Cargo.toml")];
    manifests.extend(
        OTHER_WORKSPACES
            .iter()
            .map(|w| root().join(w).join("Cargo.toml")),
    );
    let mut out = Vec::new();
    for m in manifests {
        let v = cargo_metadata(&m, &["--no-deps"]);
        for p in v["packages"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                let kinds: Vec<&str> = t["kind"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|k| k.as_str())
                    .collect();
                if kinds
                    .iter()
                    .any(|k| ["lib", "bin", "rlib", "proc-macro"].contains(k))
                {
                    out.push((
                        format!(
                            "{} ({})",
                            p["name"].as_str().unwrap(),
                            t["name"].as_str().unwrap()
                        ),
                        PathBuf::from(t["src_path"].as_str().unwrap()),
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn no_import_circle_in_any_crate() {
    let repo = root();
    let mut bad = Vec::new();
    let mut edges = 0;
    let mut deferred_seen = BTreeSet::new();
    for (name, file) in crate_roots() {
        let g = crate_graph(&name, &file);
        edges += g.edges.len();
        for comp in cycles(g.files.len(), &g.edges) {
            let files: BTreeSet<String> = comp
                .iter()
                .map(|i| {
                    g.files[*i]
                        .file
                        .strip_prefix(&repo)
                        .unwrap_or(&g.files[*i].file)
                        .display()
                        .to_string()
                })
                .collect();
            let deferred = DEFERRED_CIRCLES
                .iter()
                .any(|(fs, _)| fs.iter().map(|f| f.to_string()).collect::<BTreeSet<_>>() == files);
            if deferred {
                deferred_seen.insert(files);
            } else {
                bad.push(describe_cycle(&g, &comp, &repo));
            }
        }
    }
    assert!(
        edges > 200,
        "found only {edges} file edges in the workspace: the scan is broken"
    );
    assert!(
        bad.is_empty(),
        "{} import circle(s):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// Rust files that are tests: integration tests, `tests.rs` and `*_tests.rs` modules.
fn is_test_file(rel: &Path) -> bool {
    let name = rel.file_name().unwrap().to_string_lossy();
    rel.components().any(|c| c.as_os_str() == "tests")
        || name == "tests.rs"
        || name.ends_with("_tests.rs")
}

#[test]
fn no_source_file_over_the_line_limit() {
    let repo = root();
    let mut files = Vec::new();
    all_rust_files(&repo, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&repo).unwrap();
        if is_test_file(rel) {
            continue;
        }
        let lines = std::fs::read_to_string(&f).unwrap().lines().count();
        if lines > MAX_LINES {
            bad.push(format!(
                "{} has {lines} lines (limit {MAX_LINES}): split it where a mechanism ends (one \
                 file per mechanism, named after it, with a `//!` saying what it holds), or move \
                 its tests into a `tests.rs` beside it",
                rel.display()
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

fn all_rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let skip = p
            .file_name()
            .is_some_and(|n| n == "target" || n == ".git" || n == "corpus");
        if p.is_dir() && !skip {
            all_rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_graph_reads_use_trees_paths_and_test_items() {
    let code = drop_test_items(&strip_literals(
        "use crate::{a::X, b::{c::Y, Z as W}};\n\
         pub use self::d::V;\n\
         // use crate::comment::Q;\n\
         fn f() { let s = \"crate::string::S\"; super::e::g(); c::h(); }\n\
         #[cfg(test)]\nuse crate::t::T;\n\
         #[cfg(test)]\nmod tests { use crate::u::U; }\n",
    ));
    let f = ModFile {
        file: PathBuf::from("x/m.rs"),
        module: vec!["x".into(), "m".into()],
        code,
    };
    let kids = BTreeSet::from(["c".to_string()]);
    let got: BTreeSet<String> = named_paths(&f, &kids)
        .into_iter()
        .map(|(p, _, _)| p.join("::"))
        .collect();
    let want: BTreeSet<String> = [
        "a::X",
        "b::c::Y",
        "b::Z",
        "x::m::d::V",
        "x::e::g",
        "x::m::c::h",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want, "use groups, renames, super/self and child paths are read; comments, strings and test items are not");
    let mut edges = BTreeMap::new();
    edges.insert((0, 1), BTreeSet::from(["b::Y".to_string()]));
    edges.insert((1, 2), BTreeSet::from(["c::Z".to_string()]));
    edges.insert((2, 0), BTreeSet::from(["a::X".to_string()]));
    edges.insert((2, 3), BTreeSet::from(["d::V".to_string()]));
    assert_eq!(
        cycles(4, &edges),
        vec![vec![0, 1, 2]],
        "a three-file circle is one component"
    );
}
