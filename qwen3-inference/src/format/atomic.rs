//! Files that appear complete or not at all.
//!
//! Every output (model file, tokenizer file, template file) is written to a temporary name in the
//! destination directory and renamed over the final name only after the last byte is written and
//! synced. An interrupted or failed write leaves, at worst, a `*.tmp` file (removed on drop when
//! we get the chance), never a truncated file under the real name.
//!
//! The bytes reach the file in whole chunks of [`CHUNK`] bytes at multiples of [`CHUNK`] (the last
//! one shorter). Linux caches written pages in folios the size of the writes that made them, and
//! only 2 MiB folios can later be mapped with 2 MiB pages, which decode streams faster (see
//! `crate::pages`): written this way, a freshly exported model file runs at full speed without first
//! leaving the page cache. (A `BufWriter` passes large writes straight through, at whatever offset
//! the previous one ended.)

use anyhow::{Context, Result};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bytes per `write(2)`: a multiple of the 2 MiB huge page.
const CHUNK: usize = 4 << 20;

/// A file under a temporary name that becomes `path` on [`AtomicFile::commit`].
pub struct AtomicFile {
    /// `None` once committed.
    file: Option<File>,
    /// Bytes not yet written, fewer than [`CHUNK`].
    pending: Vec<u8>,
    tmp: PathBuf,
    path: PathBuf,
}

impl AtomicFile {
    pub fn create(path: &Path) -> Result<AtomicFile> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            anyhow::bail!(
                "{}: cannot write: directory {} does not exist",
                path.display(),
                dir.display()
            );
        }
        let name = path
            .file_name()
            .with_context(|| format!("{}: not a file path", path.display()))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = dir.join(tmp_name);
        let file = File::create(&tmp)
            .with_context(|| format!("{}: cannot create temporary file", tmp.display()))?;
        Ok(AtomicFile {
            file: Some(file),
            pending: Vec::with_capacity(CHUNK),
            tmp,
            path: path.to_path_buf(),
        })
    }

    /// The final path this file will have.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the last bytes, syncs and renames the temporary file to its final name.
    pub fn commit(mut self) -> Result<()> {
        let mut file = self.file.take().expect("file present until commit");
        let written = file.write_all(&self.pending);
        // From here the temporary file is ours to remove on failure (drop no longer does).
        let synced = written.and_then(|()| file.sync_all());
        drop(file);
        if let Err(e) = synced {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(e).with_context(|| format!("{}: write failed", self.path.display()));
        }
        if let Err(e) = std::fs::rename(&self.tmp, &self.path) {
            let _ = std::fs::remove_file(&self.tmp);
            return Err(e)
                .with_context(|| format!("{}: cannot rename into place", self.path.display()));
        }
        Ok(())
    }
}

impl Write for AtomicFile {
    /// Takes all of `buf`, writing every [`CHUNK`] it completes.
    fn write(&mut self, mut buf: &[u8]) -> std::io::Result<usize> {
        let file = self.file.as_mut().expect("not committed");
        let taken = buf.len();
        while !buf.is_empty() {
            let n = (CHUNK - self.pending.len()).min(buf.len());
            self.pending.extend_from_slice(&buf[..n]);
            buf = &buf[n..];
            if self.pending.len() == CHUNK {
                file.write_all(&self.pending)?;
                self.pending.clear();
            }
        }
        Ok(taken)
    }

    /// Does nothing: a partial chunk written early would misalign every later one, and
    /// [`AtomicFile::commit`] writes the rest.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(bytes)
        .with_context(|| format!("{}: write failed", path.display()))?;
    f.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_file_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("pq-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("out.bin");
        {
            let mut f = AtomicFile::create(&p).unwrap();
            f.write_all(b"half").unwrap();
        }
        assert!(!p.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        write_atomic(&p, b"whole").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"whole");
        // Writes of every size, straddling chunk boundaries, arrive in order.
        let bytes: Vec<u8> = (0..3 * CHUNK + 12345).map(|i| (i % 251) as u8).collect();
        let mut f = AtomicFile::create(&p).unwrap();
        let mut at = 0;
        for len in [1, CHUNK - 2, 7, 2 * CHUNK, 5] {
            f.write_all(&bytes[at..at + len]).unwrap();
            at += len;
        }
        f.write_all(&bytes[at..]).unwrap();
        f.commit().unwrap();
        assert!(std::fs::read(&p).unwrap() == bytes);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_directory_is_an_error() {
        let e = AtomicFile::create(Path::new("/nonexistent-dir-xyz/out.bin"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
    }
}
