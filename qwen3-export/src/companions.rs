//! A model file's companions (its tokenizer and chat template files, `format::companion_paths`)
//! written under temporary names and moved into place only once the model file is complete: an
//! export that fails or is interrupted leaves no companion of a model file that is not there,
//! and no half-written one beside an older model file.

use anyhow::{Context, Result};
use qwen3_inference::format::{companion_paths, CompanionPaths};
use std::path::{Path, PathBuf};

/// Where an export writes the companions of `out` until the model file is complete.
pub(crate) struct Companions {
    /// Their final names.
    pub paths: CompanionPaths,
    /// The tokenizer's temporary name (`dir/.name.partial`).
    pub tokenizer: PathBuf,
    /// The template's temporary name; an export that writes nothing there has no template.
    pub template: PathBuf,
}

impl Companions {
    /// The companions of `out`, with no temporary file left from an export that was killed
    /// (one would otherwise be moved into place as this export's).
    pub fn beside(out: &Path) -> Companions {
        let paths = companion_paths(out);
        let c = Companions {
            tokenizer: temp_sibling(&paths.tokenizer),
            template: temp_sibling(&paths.template),
            paths,
        };
        c.discard();
        c
    }

    /// Removes what was written (the export failed).
    pub fn discard(&self) {
        let _ = std::fs::remove_file(&self.tokenizer);
        let _ = std::fs::remove_file(&self.template);
    }

    /// Moves what was written into place (the model file is complete): the tokenizer, and the
    /// template if this export wrote one. Without one, an older export's template file beside
    /// the model file would be taken for this model's: it goes.
    pub fn into_place(self, wrote_template: bool) -> Result<CompanionPaths> {
        let rename = |tmp: &Path, fin: &Path| {
            std::fs::rename(tmp, fin)
                .with_context(|| format!("{}: cannot rename into place", fin.display()))
        };
        let moved =
            rename(&self.tokenizer, &self.paths.tokenizer).and_then(|()| match wrote_template {
                true => rename(&self.template, &self.paths.template),
                false if self.paths.template.exists() => std::fs::remove_file(&self.paths.template)
                    .with_context(|| format!("{}: cannot remove", self.paths.template.display())),
                false => Ok(()),
            });
        if moved.is_err() {
            self.discard();
        }
        moved.map(|()| self.paths)
    }
}

/// `dir/.name.partial`: where a companion file waits for the model file to be complete.
fn temp_sibling(path: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(".partial");
    path.with_file_name(name)
}
