//! Private temporary folders: where archives are unpacked and uploads land.
//!
//! A [`Scratch`] is a folder only its user may enter (0700, made by `tempfile`), removed when it is
//! dropped — and, since a command stopped by Ctrl-C (SIGINT), SIGTERM or SIGHUP drops nothing,
//! also by a handler that [`remove_on_signal`] installs: it removes every scratch folder still
//! alive, then ends the process with the usual status (128 + the signal). Nothing is left behind
//! either way.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

/// The folders alive now, for the signal handler.
static ALIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A private temporary folder, removed on drop (and on SIGINT/SIGTERM/SIGHUP once
/// [`remove_on_signal`] has run).
#[derive(Debug)]
pub struct Scratch {
    dir: Option<tempfile::TempDir>,
}

impl Scratch {
    /// A new folder under the system's temporary folder, named `golden-<what>-…`.
    pub fn new(what: &str) -> Result<Scratch, String> {
        let prefix = format!("golden-{what}-");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(std::fs::Permissions::from_mode(0o700));
        }
        let dir = builder
            .tempdir()
            .map_err(|e| format!("cannot make a private temporary folder: {e}"))?;
        ALIVE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(dir.path().to_path_buf());
        Ok(Scratch { dir: Some(dir) })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("alive until dropped").path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_path_buf();
            let _ = dir.close();
            ALIVE
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|p| *p != path);
        }
    }
}

/// Remove every scratch folder still alive.
pub fn remove_all() {
    let alive = std::mem::take(&mut *ALIVE.lock().unwrap_or_else(|p| p.into_inner()));
    for dir in alive {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// On SIGINT, SIGTERM or SIGHUP: remove every scratch folder, then exit with 128 + the signal.
/// Installed once per process (later calls do nothing).
pub fn remove_on_signal() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
            return;
        };
        std::thread::spawn(move || {
            if let Some(signal) = signals.forever().next() {
                remove_all();
                std::process::exit(128 + signal);
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_folder_is_private_and_gone_after_use() {
        let s = Scratch::new("test").unwrap();
        let path = s.path().to_path_buf();
        std::fs::write(path.join("x"), b"1").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
        assert!(ALIVE.lock().unwrap().contains(&path));
        drop(s);
        assert!(!path.exists());
        assert!(!ALIVE.lock().unwrap().contains(&path));
    }
}
