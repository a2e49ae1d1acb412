//! A zip archive over a tensor file's bytes (`.npz`, torch.save's `.pt`): its entries, each read
//! as a slice of the file when stored, or inflated within the file's read [`Budget`].
//!
//! Both the `.npz` reader (`formats.rs`) and the `.pt` reader (`pickle.rs`) read through it.

use crate::budget::{Budget, ReadError};
use bytes::Bytes;
use std::io::{Cursor, Read};

/// A zip archive over a file's bytes (`.npz`, `.pt`).
pub(crate) struct Archive {
    pub zip: zip::ZipArchive<Cursor<Bytes>>,
    bytes: Bytes,
}

impl Archive {
    /// The archive starts at the file's first byte (golden has sniffed its local header there).
    /// Telling the zip reader so matters: left to detect where the archive starts, it takes the
    /// central directory to begin at "end record − the directory's declared size", which in
    /// torch.save's files is 76 bytes too far (a zip64 end record and locator lie between), and
    /// when a record happens to start there (a 21-character stem) it reads the file as shifted.
    pub(crate) fn new(bytes: Bytes) -> Result<Archive, zip::result::ZipError> {
        let config = zip::read::Config {
            archive_offset: zip::read::ArchiveOffset::Known(0),
        };
        Ok(Archive {
            zip: zip::ZipArchive::with_config(config, Cursor::new(bytes.clone()))?,
            bytes,
        })
    }

    /// The bytes of entry `index` (its first `prefix` bytes, if given): a slice of the file for a
    /// stored entry, else inflated into memory after charging `budget` with the size the entry
    /// declares (no more is read, whatever the stream holds). `what` names the entry in errors.
    pub(crate) fn entry(
        &mut self,
        index: usize,
        what: &str,
        budget: &mut Budget,
        prefix: Option<usize>,
    ) -> Result<Bytes, ReadError> {
        let unreadable = |e: String| ReadError::Unreadable(format!("{what}: {e}"));
        let mut file = self
            .zip
            .by_index(index)
            .map_err(|e| unreadable(e.to_string()))?;
        if file.compression() == zip::CompressionMethod::Stored {
            let range = file
                .data_start()
                .and_then(|start| {
                    let start = usize::try_from(start).ok()?;
                    let end = start.checked_add(usize::try_from(file.compressed_size()).ok()?)?;
                    Some(start..end)
                })
                .filter(|r| r.end <= self.bytes.len())
                .ok_or_else(|| unreadable("the entry runs past the end of the archive".into()))?;
            let end = prefix.map_or(range.end, |p| range.end.min(range.start.saturating_add(p)));
            return Ok(self.bytes.slice(range.start..end));
        }
        let want = prefix.map_or(file.size(), |p| file.size().min(p as u64));
        budget.charge(&format!("{what} (inflated)"), want)?;
        let mut out = Vec::with_capacity(want.min(1 << 24) as usize);
        (&mut file)
            .take(want)
            .read_to_end(&mut out)
            .map_err(|e| unreadable(e.to_string()))?;
        Ok(out.into())
    }
}
