//! Peak resident memory of a process from `/proc`, for the benchmarks that report it
//! (`bench` of this process, `bench serve` of the server it starts).

/// Peak resident set size (VmHWM) of process `pid` (`self` for this one), in MB; 0 when unknown
/// (no /proc, or the process is gone).
pub fn peak_rss_mb_of(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
