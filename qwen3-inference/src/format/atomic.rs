//! Files that appear complete or not at all.
//!
//! Every output (model file, tokenizer file, template file) is written to a temporary name in the
//! destination directory and renamed over the final name only after the last byte is written and
//! synced. An interrupted or failed write leaves, at worst, a `*.tmp` file (removed on drop when
//! we get the chance), never a truncated file under the real name.

use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A buffered file under a temporary name that becomes `path` on [`AtomicFile::commit`].
pub struct AtomicFile {
    writer: Option<BufWriter<File>>,
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
            writer: Some(BufWriter::with_capacity(1 << 20, file)),
            tmp,
            path: path.to_path_buf(),
        })
    }

    /// The final path this file will have.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes, syncs and renames the temporary file to its final name.
    pub fn commit(mut self) -> Result<()> {
        let w = self.writer.take().expect("writer present until commit");
        let file = w
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("{}: write failed", self.path.display()))?;
        file.sync_all()
            .with_context(|| format!("{}: sync failed", self.path.display()))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("{}: cannot rename into place", self.path.display()))?;
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer.as_mut().expect("not committed").write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.writer.as_mut().expect("not committed").flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.writer.take().is_some() {
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
