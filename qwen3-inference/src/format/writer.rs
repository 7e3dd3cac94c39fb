//! Writes a model file, tensor by tensor, so the exporter never holds more than one tensor.
//!
//! The directory (every tensor's offset and length) is computed up front from the shapes, written
//! with the header, and then each tensor's bytes must arrive in directory order with exactly the
//! announced length. The file only gets its real name in [`ModelWriter::finish`].

use super::atomic::AtomicFile;
use super::bytes::ByteWriter;
use super::{
    align_up, tensor_nbytes, value_bytes, DType, ModelConfig, ALIGN, BYTE_ORDER_MARK, MAGIC,
};
use anyhow::{bail, ensure, Context, Result};
use std::io::Write;
use std::path::Path;

/// One tensor as announced to the writer.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Values per scale for q8, 0 otherwise.
    pub group_size: u32,
}

/// A directory entry: a spec plus where its bytes live.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub spec: TensorSpec,
    pub offset: u64,
    pub nbytes: u64,
}

/// Encodes the header (preamble, config, directory) for the given entries.
pub fn encode_header(config: &ModelConfig, entries: &[TensorEntry], file_len: u64) -> Vec<u8> {
    // The oldest version that holds the tensors' dtypes and the config's blocks.
    let version =
        super::version_for(entries.iter().map(|e| e.spec.dtype)).max(config.since_version());
    let mut body = ByteWriter::default();
    config.encode(&mut body, version);
    body.u32(entries.len() as u32);
    for e in entries {
        body.string(&e.spec.name);
        body.u8(e.spec.dtype.code());
        body.u8(e.spec.shape.len() as u8);
        for &d in &e.spec.shape {
            body.u64(d);
        }
        body.u32(e.spec.group_size);
        body.u64(e.offset);
        body.u64(e.nbytes);
    }
    let header_len = super::PREAMBLE_LEN + body.buf.len() as u64;
    let mut w = ByteWriter::default();
    w.bytes(&MAGIC);
    w.u32(version);
    w.u32(BYTE_ORDER_MARK);
    w.u64(header_len);
    w.u64(file_len);
    w.bytes(&body.buf);
    w.buf
}

/// Lays out `specs` after a header: returns the entries and the total file length.
pub fn plan_layout(
    config: &ModelConfig,
    specs: Vec<TensorSpec>,
) -> Result<(Vec<TensorEntry>, u64)> {
    let mut entries = Vec::with_capacity(specs.len());
    for spec in specs {
        let Some(nbytes) = tensor_nbytes(spec.dtype, &spec.shape, spec.group_size) else {
            bail!(
                "tensor {}: shape {:?} cannot be stored as {} with group size {}",
                spec.name,
                spec.shape,
                spec.dtype,
                spec.group_size
            );
        };
        if spec.shape.len() > 255 || spec.name.len() > u16::MAX as usize {
            bail!("tensor {}: name or rank too large", spec.name);
        }
        entries.push(TensorEntry {
            spec,
            offset: 0,
            nbytes,
        });
    }
    // Offsets are fixed-width, so encoding with zeros gives the real header length.
    let header_len = encode_header(config, &entries, 0).len() as u64;
    let mut pos = align_up(header_len).context("header too large")?;
    for e in &mut entries {
        e.offset = pos;
        pos = align_up(pos + e.nbytes).context("file too large")?;
    }
    let file_len = entries.last().map_or(pos, |e| e.offset + e.nbytes);
    Ok((entries, file_len))
}

/// Streams a model file to disk.
pub struct ModelWriter {
    file: AtomicFile,
    entries: Vec<TensorEntry>,
    next: usize,
    /// The tensor being written, between `begin` and `end`.
    current: Option<TensorEntry>,
    pos: u64,
    file_len: u64,
    /// The format version written: the oldest that holds the config and the dtypes.
    version: u32,
}

impl ModelWriter {
    /// Validates the config, plans the layout and writes the header.
    pub fn create(
        path: &Path,
        config: &ModelConfig,
        specs: Vec<TensorSpec>,
    ) -> Result<ModelWriter> {
        config.validate()?;
        // A config or dtype from a newer format than this build's is refused, rather than
        // written as a file this build cannot read back.
        let version = super::version_for(specs.iter().map(|s| s.dtype)).max(config.since_version());
        ensure!(
            version <= super::FORMAT_VERSION,
            "this config or these dtypes need format version {version}; this build writes up to {}",
            super::FORMAT_VERSION
        );
        let (entries, file_len) = plan_layout(config, specs)?;
        let header = encode_header(config, &entries, file_len);
        let mut file = AtomicFile::create(path)?;
        file.write_all(&header)
            .with_context(|| format!("{}: write failed", path.display()))?;
        Ok(ModelWriter {
            file,
            entries,
            next: 0,
            current: None,
            pos: header.len() as u64,
            file_len,
            version,
        })
    }

    /// The planned directory (for progress reports).
    pub fn entries(&self) -> &[TensorEntry] {
        &self.entries
    }

    /// The format version of the header written.
    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Starts the next tensor, which must be `name` stored as `dtype`. Its bytes then arrive
    /// through [`ModelWriter::data`] (and, for q8, [`ModelWriter::q8_scales`]) in any number of
    /// pieces, and [`ModelWriter::end`] checks the total.
    pub fn begin(&mut self, name: &str, dtype: DType) -> Result<()> {
        if self.current.is_some() {
            bail!("tensor {name} begun before the previous one ended");
        }
        let Some(e) = self.entries.get(self.next).cloned() else {
            bail!("tensor {name}: written after the last planned tensor");
        };
        if e.spec.name != name || e.spec.dtype != dtype {
            bail!(
                "tensor {name} ({dtype}) written where {} ({}) was planned",
                e.spec.name,
                e.spec.dtype
            );
        }
        self.pad_to(e.offset)?;
        self.current = Some(e);
        Ok(())
    }

    /// The next bytes of the current tensor (f32 and bf16 values, or q8 int8 values).
    pub fn data(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(e) = &self.current else {
            bail!("data written outside a tensor");
        };
        if self.pos + bytes.len() as u64 > e.offset + e.nbytes {
            bail!("tensor {}: more bytes than planned", e.spec.name);
        }
        self.raw(bytes)
    }

    /// The scales of the current q8 tensor, after all its int8 values.
    pub fn q8_scales(&mut self, scales: &[f32]) -> Result<()> {
        self.scales(bytemuck::cast_slice(scales))
    }

    /// After a q4 or q6 tensor's packed values: padding, then its f16 scales (as bits).
    pub fn f16_scales(&mut self, scales: &[u16]) -> Result<()> {
        self.scales(bytemuck::cast_slice(scales))
    }

    /// Padding to [`ALIGN`] after the values, then the scales.
    fn scales(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(e) = &self.current else {
            bail!("scales written outside a tensor");
        };
        let numel: u64 = e.spec.shape.iter().product();
        let values = value_bytes(e.spec.dtype, numel).context("tensor too large")?;
        if self.pos != e.offset + values {
            bail!("tensor {}: scales written before all values", e.spec.name);
        }
        let scales_at = align_up(self.pos).context("file too large")?;
        self.pad_to(scales_at)?;
        self.data(bytes)
    }

    /// Ends the current tensor, checking it got exactly its planned length.
    pub fn end(&mut self) -> Result<()> {
        let Some(e) = self.current.take() else {
            bail!("end without a tensor");
        };
        if self.pos != e.offset + e.nbytes {
            bail!(
                "tensor {}: wrote {} bytes, planned {}",
                e.spec.name,
                self.pos - e.offset,
                e.nbytes
            );
        }
        self.next += 1;
        Ok(())
    }

    fn pad_to(&mut self, offset: u64) -> Result<()> {
        if offset < self.pos {
            bail!("internal error: layout moved backwards");
        }
        let zeros = [0u8; ALIGN as usize];
        while self.pos < offset {
            let n = ((offset - self.pos) as usize).min(zeros.len());
            self.raw(&zeros[..n])?;
        }
        Ok(())
    }

    fn raw(&mut self, b: &[u8]) -> Result<()> {
        self.file
            .write_all(b)
            .with_context(|| format!("{}: write failed", self.file.path().display()))?;
        self.pos += b.len() as u64;
        Ok(())
    }

    /// A whole f32 tensor.
    pub fn write_f32(&mut self, name: &str, data: &[f32]) -> Result<()> {
        self.begin(name, DType::F32)?;
        self.data(bytemuck::cast_slice(data))?;
        self.end()
    }

    /// A whole bf16 tensor, given as raw 16-bit patterns.
    pub fn write_bf16(&mut self, name: &str, bits: &[u16]) -> Result<()> {
        self.begin(name, DType::Bf16)?;
        self.data(bytemuck::cast_slice(bits))?;
        self.end()
    }

    /// A whole q8 tensor: its int8 values (row-major) and one scale per group.
    pub fn write_q8(&mut self, name: &str, q: &[i8], scales: &[f32]) -> Result<()> {
        self.begin(name, DType::Q8)?;
        self.data(bytemuck::cast_slice(q))?;
        self.q8_scales(scales)?;
        self.end()
    }

    /// A whole q4 tensor: its packed values (`quant::quantize_q4`) and one f16 scale per group.
    pub fn write_q4(&mut self, name: &str, packed: &[u8], scales: &[u16]) -> Result<()> {
        self.begin(name, DType::Q4)?;
        self.data(packed)?;
        self.f16_scales(scales)?;
        self.end()
    }

    /// A whole q6 tensor: its packed values (`quant::quantize_q6`) and one f16 scale per group.
    pub fn write_q6(&mut self, name: &str, packed: &[u8], scales: &[u16]) -> Result<()> {
        self.begin(name, DType::Q6)?;
        self.data(packed)?;
        self.f16_scales(scales)?;
        self.end()
    }

    /// Checks every planned tensor was written, then gives the file its final name.
    pub fn finish(self) -> Result<()> {
        if self.next != self.entries.len() || self.current.is_some() {
            bail!(
                "{}: only {} of {} tensors written",
                self.file.path().display(),
                self.next,
                self.entries.len()
            );
        }
        debug_assert_eq!(self.pos, self.file_len);
        self.file.commit()
    }
}
