//! What one vfio-user connection sent, by kind: the daemon logs it when the connection ends and
//! between the guest's phase markers (`backend`), which is how messages per exit and per
//! workload are measured against Cloud Hypervisor (`docs/cloud-hypervisor.md`).

/// Messages of one connection, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// REGION_READs of a BAR (each a trapped guest access: one VM exit).
    pub bar_reads: u64,
    /// REGION_WRITEs of a BAR.
    pub bar_writes: u64,
    /// REGION_READs of configuration space.
    pub config_reads: u64,
    /// REGION_WRITEs of configuration space.
    pub config_writes: u64,
    /// SET_IRQS that unmask INTx (Cloud Hypervisor: one after every BAR access).
    pub unmasks: u64,
    /// Other SET_IRQS.
    pub set_irqs: u64,
    /// DMA_MAP and DMA_UNMAP.
    pub dma: u64,
    /// Region accesses refused by content (all-ones read, dropped write); not in the counts
    /// above.
    pub refused: u64,
}

impl Traffic {
    /// Every message counted.
    pub fn messages(&self) -> u64 {
        self.bar_reads
            + self.bar_writes
            + self.config_reads
            + self.config_writes
            + self.unmasks
            + self.set_irqs
            + self.dma
            + self.refused
    }
}

impl std::ops::Sub for Traffic {
    type Output = Traffic;

    fn sub(self, o: Traffic) -> Traffic {
        Traffic {
            bar_reads: self.bar_reads - o.bar_reads,
            bar_writes: self.bar_writes - o.bar_writes,
            config_reads: self.config_reads - o.config_reads,
            config_writes: self.config_writes - o.config_writes,
            unmasks: self.unmasks - o.unmasks,
            set_irqs: self.set_irqs - o.set_irqs,
            dma: self.dma - o.dma,
            refused: self.refused - o.refused,
        }
    }
}

impl std::fmt::Display for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} messages: {} BAR reads, {} BAR writes, {} config reads, {} config writes, {} INTx unmasks, {} other SET_IRQS, {} DMA map/unmap; {} region accesses refused",
            self.messages(),
            self.bar_reads,
            self.bar_writes,
            self.config_reads,
            self.config_writes,
            self.unmasks,
            self.set_irqs,
            self.dma,
            self.refused
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_accesses_are_messages_too_and_differences_are_per_kind() {
        let a = Traffic {
            bar_writes: 10,
            unmasks: 10,
            refused: 2,
            ..Traffic::default()
        };
        let b = Traffic {
            bar_writes: 4,
            unmasks: 4,
            ..Traffic::default()
        };
        assert_eq!(a.messages(), 22);
        let d = a - b;
        assert_eq!(
            (d.bar_writes, d.unmasks, d.refused, d.messages()),
            (6, 6, 2, 14)
        );
        assert!(d
            .to_string()
            .starts_with("14 messages: 0 BAR reads, 6 BAR writes"));
    }
}
