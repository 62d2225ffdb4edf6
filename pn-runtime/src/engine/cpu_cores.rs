//! How many physical cores this process may use: the default thread count.
//!
//! llama.cpp defaults to the physical cores, not the logical ones: the matrix kernels keep a
//! core's execution units busy, so a second hyper-thread on the same core adds contention and
//! no throughput. On Linux the cores are read from sysfs (`topology/core_cpus_list`, or the older
//! `thread_siblings_list`: the logical CPUs sharing one core), else from `/proc/cpuinfo`
//! (distinct `physical id` + `core id` pairs), counting only the CPUs the process may run on;
//! elsewhere, or when neither can be read, [`std::thread::available_parallelism`].

use std::collections::BTreeSet;

/// Physical cores among the CPUs this process may run on, at most
/// [`available_parallelism`](std::thread::available_parallelism) (which also honours a cgroup
/// CPU quota), and at least 1. Read once per process (it reads a sysfs file per CPU).
pub fn physical_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(count_physical_cores)
}

fn count_physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    linux_physical_cores()
        .filter(|&n| n > 0)
        .map_or(logical, |n| n.min(logical))
        .max(1)
}

/// The physical cores of the allowed CPUs from sysfs, else from `/proc/cpuinfo`; `None` when
/// neither can be read (not Linux, a restricted `/sys` and `/proc`).
fn linux_physical_cores() -> Option<usize> {
    let allowed = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| allowed_cpus(&s))
        .or_else(|| {
            let online = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
            parse_cpu_list(&online)
        })?;
    let sysfs = allowed.iter().map(|cpu| {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
        std::fs::read_to_string(format!("{dir}/core_cpus_list"))
            .or_else(|_| std::fs::read_to_string(format!("{dir}/thread_siblings_list")))
            .ok()
    });
    if let Some(n) = count_cores(sysfs.collect::<Option<Vec<_>>>()) {
        return Some(n);
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpuinfo_cores(&cpuinfo, &allowed)
}

/// The CPUs of `Cpus_allowed_list:` in `/proc/self/status` text (the affinity mask).
fn allowed_cpus(status: &str) -> Option<BTreeSet<usize>> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    parse_cpu_list(line)
}

/// A kernel CPU list (`0-3,8,10-11`) as a set; `None` if malformed or empty.
fn parse_cpu_list(text: &str) -> Option<BTreeSet<usize>> {
    let mut cpus = BTreeSet::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                // A list wider than any machine is malformed, not a reason to allocate.
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => {
                cpus.insert(part.trim().parse().ok()?);
            }
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Distinct cores among per-CPU sibling lists (each CPU's `core_cpus_list`: every CPU of one
/// core has the same list).
fn count_cores(siblings: Option<Vec<String>>) -> Option<usize> {
    let lists = siblings?;
    let mut cores = BTreeSet::new();
    for list in &lists {
        cores.insert(parse_cpu_list(list)?);
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// Distinct (`physical id`, `core id`) pairs of the `allowed` processors in `/proc/cpuinfo`
/// text; `None` when the file has no such fields (some architectures).
fn cpuinfo_cores(cpuinfo: &str, allowed: &BTreeSet<usize>) -> Option<usize> {
    let mut cores = BTreeSet::new();
    for block in cpuinfo.split("\n\n") {
        let field = |name: &str| {
            block.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().parse::<usize>().ok())?
            })
        };
        let Some(cpu) = field("processor") else {
            continue;
        };
        if !allowed.contains(&cpu) {
            continue;
        }
        cores.insert((field("physical id")?, field("core id")?));
    }
    (!cores.is_empty()).then_some(cores.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[usize]) -> BTreeSet<usize> {
        v.iter().copied().collect()
    }

    #[test]
    fn cpu_lists_parse_like_the_kernel_writes_them() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(set(&[0, 1, 2, 3, 8, 10, 11]))
        );
        assert_eq!(parse_cpu_list("5"), Some(set(&[5])));
        for bad in ["", "x", "3-1", "0-99999999", "1,,a"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
        let status = "Name:\tpn\nCpus_allowed:\tff\nCpus_allowed_list:\t0-1,4\n";
        assert_eq!(allowed_cpus(status), Some(set(&[0, 1, 4])));
    }

    /// Two hyper-threads per core: 8 logical CPUs are 4 cores (sibling lists written both ways
    /// the kernel does).
    #[test]
    fn hyper_thread_siblings_count_once() {
        let lists = ["0,4", "1,5", "2-3", "2-3", "0,4", "1,5", "6", "7"];
        let lists = lists.iter().map(|s| s.to_string()).collect();
        assert_eq!(count_cores(Some(lists)), Some(5));
        assert_eq!(count_cores(None), None);
    }

    #[test]
    fn cpuinfo_pairs_count_cores_of_allowed_processors() {
        // Two sockets, two cores each, two threads per core.
        let mut text = String::new();
        for cpu in 0..8 {
            let (socket, core) = (cpu / 4, (cpu % 4) / 2);
            text.push_str(&format!(
                "processor\t: {cpu}\nmodel name\t: X\nphysical id\t: {socket}\ncore id\t\t: {core}\n\n"
            ));
        }
        assert_eq!(cpuinfo_cores(&text, &(0..8).collect()), Some(4));
        assert_eq!(cpuinfo_cores(&text, &set(&[0, 1])), Some(1));
        assert_eq!(cpuinfo_cores(&text, &set(&[0, 2, 4])), Some(3));
        // No topology fields (some ARM kernels): unknown.
        assert_eq!(cpuinfo_cores("processor\t: 0\n\n", &set(&[0])), None);
    }

    #[test]
    fn the_count_is_at_least_one_and_at_most_the_logical_cpus() {
        let n = physical_cores();
        let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(n >= 1 && n <= logical, "{n} of {logical}");
    }
}
