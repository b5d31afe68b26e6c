//! Measurements of another process from `/proc` (Linux only): resident memory
//! (`VmRSS`, and its high-water mark `VmHWM`, from `/proc/<pid>/status`) and CPU
//! time (`utime + stime` from `/proc/<pid>/stat`, in clock ticks converted with
//! `getconf CLK_TCK`).

use anyhow::{Context, Result, anyhow};
use std::sync::OnceLock;

/// One sample of a process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Current resident set size, KiB.
    pub rss_kib: u64,
    /// Peak resident set size so far, KiB.
    pub hwm_kib: u64,
    /// User + system CPU seconds so far.
    pub cpu_s: f64,
}

fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|v| *v > 0.0)
            .unwrap_or(100.0)
    })
}

/// `VmRSS`/`VmHWM` lines of a `/proc/<pid>/status` text, in KiB.
pub fn parse_status(text: &str) -> Result<(u64, u64)> {
    let field = |name: &str| -> Result<u64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| anyhow!("{name} missing in /proc status"))?;
        line[name.len()..]
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("{name}: cannot parse {line:?}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` text, in ticks.
/// The command name (field 2) may contain spaces and parentheses, so fields are
/// counted after the LAST `)`.
pub fn parse_stat_ticks(text: &str) -> Result<u64> {
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("/proc stat without ')'"))?;
    // rest starts with field 3 (state): utime is field 14 -> index 11 here.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| -> Result<u64> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("/proc stat field {} missing", i + 3))
    };
    Ok(get(11)? + get(12)?)
}

/// Samples process `pid`.
pub fn sample(pid: u32) -> Result<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let (rss_kib, hwm_kib) = parse_status(&status)?;
    let cpu_s = parse_stat_ticks(&stat)? as f64 / clk_tck();
    Ok(Sample {
        rss_kib,
        hwm_kib,
        cpu_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_stat() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_status(status).ok(), Some((1024, 2048)));
        assert!(parse_status("Name: x\n").is_err());
        let stat = "42 (a b) c) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0";
        assert_eq!(parse_stat_ticks(stat).ok(), Some(175));
        assert!(parse_stat_ticks("42 (x) S 1").is_err());
    }

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id()).expect("sample self");
        assert!(s.rss_kib > 0 && s.hwm_kib >= s.rss_kib);
    }
}
