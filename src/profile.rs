//! vGPU profiles: what one VM gets from the physical GPU (VRAM slice, channels, share of GPU
//! time, shadow page-table mode), read from TOML like GVT-g's vGPU types or NVIDIA's profiles.
//!
//! ```toml
//! name = "q6000-1g"
//! vram_mib = 1024      # the VM's VRAM slice (the guest sees a GPU with this much VRAM)
//! channels = 16        # hardware channels owned by the VM (of 128)
//! weight = 1           # share of GPU time relative to other VMs (1-100)
//! shadow = "lazy"      # eager | lazy | incremental | pv
//! ```

use serde::{Deserialize, Serialize};

/// How a VM's GPU page tables are shadowed (DESIGN §5; all modes give identical shadows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShadowMode {
    /// Rebuild the whole shadow on every guest TLB flush (GPUvm "FV naive").
    Eager,
    /// Mark dirty on flush; rebuild before the next submission that uses it (GPUvm lazy).
    #[default]
    Lazy,
    /// Page-table pages are write-tracked; each entry write updates one shadow entry.
    Incremental,
    /// The guest sends batches of entry writes through the para-virtual interface.
    Pv,
}

impl ShadowMode {
    /// Every mode, in the order experiments report them.
    pub const ALL: [ShadowMode; 4] = [
        ShadowMode::Eager,
        ShadowMode::Lazy,
        ShadowMode::Incremental,
        ShadowMode::Pv,
    ];

    /// The mode's name as written in profiles and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ShadowMode::Eager => "eager",
            ShadowMode::Lazy => "lazy",
            ShadowMode::Incremental => "incremental",
            ShadowMode::Pv => "pv",
        }
    }
}

impl std::fmt::Display for ShadowMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ShadowMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ShadowMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!("unknown shadow mode '{s}' (expected eager, lazy, incremental or pv)")
            })
    }
}

/// What one VM gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VgpuProfile {
    /// A name for logs and reports.
    pub name: String,
    /// VRAM slice in MiB; the guest sees a GPU with this much VRAM.
    pub vram_mib: u64,
    /// Hardware channels owned by the VM.
    pub channels: u32,
    /// Share of GPU time relative to the other VMs (GVT-g uses 1-16; here 1-100).
    pub weight: u32,
    /// Shadow page-table mode.
    pub shadow: ShadowMode,
}

impl Default for VgpuProfile {
    fn default() -> Self {
        VgpuProfile {
            name: "default".into(),
            vram_mib: 512,
            channels: 16,
            weight: 1,
            shadow: ShadowMode::Lazy,
        }
    }
}

/// Why a profile was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Not valid TOML or unknown/mistyped fields.
    #[error("invalid profile: {0}")]
    Parse(#[from] toml::de::Error),
    /// A value out of range.
    #[error("invalid profile '{name}': {what}")]
    Range {
        /// Profile name.
        name: String,
        /// What is wrong.
        what: String,
    },
}

/// Smallest VRAM slice (room for the guest driver's BAR tables, USERD and a channel).
pub const MIN_VRAM_MIB: u64 = 64;

impl VgpuProfile {
    /// Parses and validates a TOML profile.
    pub fn from_toml(text: &str) -> Result<VgpuProfile, ProfileError> {
        let p: VgpuProfile = toml::from_str(text)?;
        p.validate()?;
        Ok(p)
    }

    /// Checks the values are usable.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let bad = |what: String| {
            Err(ProfileError::Range {
                name: self.name.clone(),
                what,
            })
        };
        if self.vram_mib < MIN_VRAM_MIB {
            return bad(format!(
                "vram_mib = {} is below the minimum of {MIN_VRAM_MIB}",
                self.vram_mib
            ));
        }
        if self.channels == 0 || self.channels > gf100::pfifo::CHANNELS {
            return bad(format!(
                "channels = {} must be 1..={}",
                self.channels,
                gf100::pfifo::CHANNELS
            ));
        }
        if !(1..=100).contains(&self.weight) {
            return bad(format!("weight = {} must be 1..=100", self.weight));
        }
        Ok(())
    }

    /// VRAM slice in bytes.
    pub fn vram_bytes(&self) -> u64 {
        self.vram_mib << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_profile() {
        let p = VgpuProfile::from_toml(
            "name = \"q\"\nvram_mib = 1024\nchannels = 8\nweight = 3\nshadow = \"incremental\"\n",
        )
        .unwrap();
        assert_eq!(
            p,
            VgpuProfile {
                name: "q".into(),
                vram_mib: 1024,
                channels: 8,
                weight: 3,
                shadow: ShadowMode::Incremental
            }
        );
        assert_eq!(p.vram_bytes(), 1 << 30);
    }

    #[test]
    fn missing_fields_take_defaults() {
        assert_eq!(VgpuProfile::from_toml("").unwrap(), VgpuProfile::default());
    }

    #[test]
    fn rejects_unknown_fields_and_bad_values() {
        assert!(VgpuProfile::from_toml("vram = 5")
            .unwrap_err()
            .to_string()
            .contains("unknown field"));
        assert!(VgpuProfile::from_toml("shadow = \"fast\"").is_err());
        for bad in [
            "vram_mib = 1",
            "channels = 0",
            "channels = 129",
            "weight = 0",
            "weight = 101",
        ] {
            let e = VgpuProfile::from_toml(bad).unwrap_err();
            assert!(matches!(e, ProfileError::Range { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn shadow_modes_parse_by_name() {
        for m in ShadowMode::ALL {
            assert_eq!(m.name().parse::<ShadowMode>().unwrap(), m);
        }
        assert!("naive".parse::<ShadowMode>().is_err());
    }
}
