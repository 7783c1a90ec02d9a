//! `gpuvm regs`: the BAR0 region table of the virtual GPU and its trap policy.

use clap::Args;
use gpuvm::mmio::regions::{Policy, Region, BAR0_REGIONS, BOARD_REGIONS};
use serde::Serialize;

use crate::table::{self, Table};

/// Options of `gpuvm regs`.
#[derive(Args, Debug)]
pub struct RegsArgs {
    /// Print a JSON array (one object per region: offset, offset_hex, size, name, policy)
    /// instead of the table.
    #[arg(long)]
    json: bool,
}

/// One row of the JSON output.
#[derive(Serialize)]
struct RegionJson {
    offset: u32,
    offset_hex: String,
    size: u32,
    name: &'static str,
    policy: Policy,
}

const POLICIES: [Policy; 4] = [
    Policy::Virtual,
    Policy::Shadowed,
    Policy::Forwarded,
    Policy::Denied,
];

fn policy_name(p: Policy) -> &'static str {
    match p {
        Policy::Virtual => "virtual",
        Policy::Shadowed => "shadowed",
        Policy::Forwarded => "forwarded",
        Policy::Denied => "denied",
    }
}

fn policy_meaning(p: Policy) -> &'static str {
    match p {
        Policy::Virtual => "emulated from per-VM state; the physical GPU is never touched",
        Policy::Shadowed => "translated and validated, then applied to the GPU or to shadows",
        Policy::Forwarded => "passed to the physical GPU as is (read-only global state)",
        Policy::Denied => "refused: reads return 0xbad00100, writes dropped and counted",
    }
}

/// Runs the command; always `Ok(true)`.
pub fn run(args: &RegsArgs) -> anyhow::Result<bool> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json(&all_regions()))?);
    } else {
        print!("{}", render(&all_regions()));
    }
    Ok(true)
}

fn json(regions: &[Region]) -> Vec<RegionJson> {
    regions
        .iter()
        .map(|r| RegionJson {
            offset: r.offset,
            offset_hex: format!("{:#08x}", r.offset),
            size: r.size,
            name: r.name,
            policy: r.policy,
        })
        .collect()
}

fn render(regions: &[Region]) -> String {
    // The name comes first: `Table` left-aligns only its first column.
    let mut t = Table::new(["region", "offset", "last", "size", "policy"]);
    for r in regions {
        t.row([
            r.name.to_string(),
            format!("{:#08x}", r.offset),
            format!("{:#08x}", r.end() - 1),
            table::bytes(u64::from(r.size)),
            policy_name(r.policy).to_string(),
        ]);
    }
    let mut out = t.render();
    let covered: u64 = regions.iter().map(|r| u64::from(r.size)).sum();
    out += &format!(
        "\n{} regions covering {} of the {} BAR0, by policy:\n",
        regions.len(),
        table::bytes(covered),
        table::bytes(gf100::pci::BAR0_SIZE)
    );
    for p in POLICIES {
        let n = regions.iter().filter(|r| r.policy == p).count();
        out += &format!("  {:<9}  {n:>3}  {}\n", policy_name(p), policy_meaning(p));
    }
    out += &format!(
        "\nDeny by default: a BAR0 offset in no region reads {:#010x} (the GPU's bad-register\n\
         code) and a write to it is dropped and counted as a violation -- never forwarded to the\n\
         physical GPU (GPUvm forwarded unknown registers, an isolation hole).\n",
        gf100::BAD_REGISTER
    );
    out += &format!(
        "{:#x} GPUVM_PV is not hardware: gpuvm's para-virtual page-table interface\n\
         (gf100::pv), offered to vGPUs whose profile uses shadow mode `pv`; otherwise its ID\n\
         register reads the bad-register code.\n",
        gpuvm::mmio::regions::PV_BASE
    );
    out
}

/// Both region tables (the main one and the board registers a real driver needs), by offset.
fn all_regions() -> Vec<Region> {
    let mut v: Vec<Region> = BAR0_REGIONS.iter().chain(BOARD_REGIONS).copied().collect();
    v.sort_by_key(|r| r.offset);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lists_every_region_and_counts_policies() {
        let out = render(BAR0_REGIONS);
        for r in BAR0_REGIONS {
            assert!(out.contains(r.name), "{} missing", r.name);
        }
        let total: usize = POLICIES
            .iter()
            .map(|&p| BAR0_REGIONS.iter().filter(|r| r.policy == p).count())
            .sum();
        assert_eq!(total, BAR0_REGIONS.len());
        assert!(out.contains("0xbad00100"), "{out}");
        assert!(out.contains("Deny by default"), "{out}");
    }

    #[test]
    fn json_policy_names_match_the_table() {
        for p in POLICIES {
            assert_eq!(
                serde_json::to_value(p).unwrap(),
                serde_json::Value::from(policy_name(p))
            );
        }
        let j = json(BAR0_REGIONS);
        assert_eq!(j[0].offset_hex, "0x000000");
    }
}
