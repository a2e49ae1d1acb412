//! The process table, for the leak checks: golden's Python workers that are children of a process.

use std::time::{Duration, Instant};

/// Whether `pid` is a running process (a zombie counts as gone: it has exited).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Golden's Python workers whose parent is `parent` (running ones only).
pub fn workers_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(parent)
                && String::from_utf8_lossy(&cmdline).contains("golden_ref.worker")
                && alive(pid)
        })
        .collect()
}

/// Wait up to `limit` for every pid in `pids` to be gone; the ones still running.
pub fn wait_gone(pids: &[u32], limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The process group of `pid`, while it runs.
pub fn group_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// Where the references of `fault_ref` that start processes record their pids, for a private
/// worker of the test process `parent` (`GOLDEN_FAULT_PIDS` names another file).
pub fn fault_pid_file(parent: u32) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("golden-fault-pids-{parent}"))
}

/// The pids recorded in such a file.
pub fn recorded_pids(file: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Golden's shared-memory arenas that process `pid` holds, as descriptors or mappings: their
/// memfd names (`golden-<creator pid>-<n>`), each once.
pub fn arenas_of(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|link| link.to_string_lossy().into_owned())
        .chain(
            std::fs::read_to_string(format!("/proc/{pid}/maps"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| Some(l[l.find("/memfd:")?..].to_string()))
                .collect::<Vec<_>>(),
        )
        .filter_map(|target| {
            let name = target.strip_prefix("/memfd:")?;
            let name = name.strip_suffix(" (deleted)").unwrap_or(name);
            name.starts_with("golden-").then(|| name.to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The pid in an arena's name `golden-<pid>-<n>`.
pub fn arena_creator(name: &str) -> Option<u32> {
    name.strip_prefix("golden-")?
        .split('-')
        .next()?
        .parse()
        .ok()
}
