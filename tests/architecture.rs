//! The architecture test: gpuvm's layers run one way, along the data flow of a guest access.
//!
//! **Crates** (`cargo metadata`, normal dependencies only): the device-model core `gpuvm` is what
//! a VMM embeds, so it must not pull in the guest driver, a GPU backend, the trace tooling, the
//! harness, or tool dependencies (compression, plotting, progress bars, CLI parsing, anyhow).
//! Each workspace crate has a rank; a crate may depend only on crates of a lower rank.
//!
//! **Modules of the core** (the `crate::` paths in `src/`, tests excluded): each top-level
//! module has a rank along the data flow — the host (composition root) over the per-VM device
//! over channels over counters over {mmio, shadow_pt} over the scheduler over memory and layout
//! over the physical-GPU boundary. A module may use modules of its own rank or lower, and the
//! module graph must have no cycle.
//!
//! When this test fails, its message says which file imports what against which rule; the fix
//! is to pass a narrow view or a returned value down (as `channels::ChanCx` and
//! `channels::Effect` do) or to invert the call through a trait the lower layer defines (as
//! `vgpu::GpuPort` does), not to add an exception here. `docs/design.md` draws the layers.

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
    ("gpuvm-standalone", 5, "the gpuvm command and the KVM VMM"),
];

/// Crates the core must not depend on, directly or through anything it links.
const NOT_IN_CORE: &[&str] = &[
    "gpuvm-guest",
    "gpuvm-sim",
    "gpuvm-vfio",
    "gpuvm-trace",
    "gpuvm-harness",
    "gpuvm-standalone",
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
    ("phys_seq", 6, "register sequences on the physical GPU"),
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
fn normal_deps() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .current_dir(root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
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
