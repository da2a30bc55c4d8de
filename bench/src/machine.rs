//! Facts about the machine the figures come from, read from `/proc`.

/// Facts about the machine the figures come from.
#[derive(Clone, Debug)]
pub struct Machine {
    /// CPUs available to this process.
    pub nproc: usize,
    /// CPU model name.
    pub cpu_model: String,
    /// Total memory, GiB.
    pub memory_gib: f64,
    /// PostgreSQL `server_version`.
    pub postgres: String,
    /// PostgreSQL `shared_buffers`.
    pub shared_buffers: String,
    /// PostgreSQL `synchronous_commit`.
    pub synchronous_commit: String,
    /// 1, 5 and 15-minute load averages when the run started.
    pub load_average: String,
    /// PostgreSQL `autovacuum`.
    pub autovacuum: String,
    /// The brokers used and their versions.
    pub brokers: String,
}

/// The value in kB of a `Name:   1234 kB` line of a `/proc` file.
pub fn field_kb(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Busy and total jiffies of all CPUs, from `/proc/stat`.
pub fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    // idle and iowait are the fourth and fifth fields.
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// The 1, 5 and 15-minute load averages, from `/proc/loadavg`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_fields() {
        let status = "Name:\toutbox\nVmHWM:\t   51234 kB\nVmRSS:\t   40000 kB\n";
        assert_eq!(field_kb(status, "VmHWM:"), Some(51234));
        assert_eq!(field_kb(status, "VmRSS:"), Some(40000));
        assert_eq!(field_kb(status, "VmSwap:"), None);
    }
}
