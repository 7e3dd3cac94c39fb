//! `qwen3 info <model.bin>`: what a model file holds.

use anyhow::Result;
use clap::Args;
use qwen3_inference::format::{companion_paths, ModelFile};
use std::path::PathBuf;

#[derive(Args)]
pub struct InfoArgs {
    /// Model file written by `qwen3 export`.
    pub model: PathBuf,
}

fn size_of(path: &std::path::Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

pub fn run(args: InfoArgs) -> Result<()> {
    let file = ModelFile::open(&args.model)?;
    let h = file.header();
    let c = &h.config;
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    println!(
        "file                     {} ({}, format version {})",
        args.model.display(),
        human(h.file_len),
        h.version
    );
    println!("architecture             {}", c.architecture);
    println!("hidden_size              {}", c.hidden_size);
    println!("intermediate_size        {}", c.intermediate_size);
    println!("num_hidden_layers        {}", c.num_hidden_layers);
    println!("num_attention_heads      {}", c.num_attention_heads);
    println!("num_key_value_heads      {}", c.num_key_value_heads);
    println!("head_dim                 {}", c.head_dim);
    println!("vocab_size               {}", c.vocab_size);
    println!("max_position_embeddings  {}", c.max_position_embeddings);
    println!("rope_theta               {}", c.rope_theta);
    println!("rms_norm_eps             {:e}", c.rms_norm_eps);
    println!("tie_word_embeddings      {}", c.tie_word_embeddings);
    println!(
        "bos_token_id             {}",
        opt(c.bos_token_id.map(|v| v.to_string()))
    );
    println!("eos_token_ids            {:?}", c.eos_token_ids);
    let g = &c.generation;
    println!(
        "generation defaults      temperature {}, top_p {}, top_k {}, min_p {}, repetition_penalty {}, do_sample {}",
        opt(g.temperature.map(|v| v.to_string())),
        opt(g.top_p.map(|v| v.to_string())),
        opt(g.top_k.map(|v| v.to_string())),
        opt(g.min_p.map(|v| v.to_string())),
        opt(g.repetition_penalty.map(|v| v.to_string())),
        opt(g.do_sample.map(|v| v.to_string())),
    );
    match c.group_size {
        0 => println!("weights                  {}", c.dtype),
        gs => println!("weights                  {} (group size {gs})", c.dtype),
    }
    let params: u64 = h
        .tensors
        .iter()
        .map(|t| t.shape.iter().product::<u64>())
        .sum();
    println!(
        "parameters               {params} ({:.3} B), header {} bytes",
        params as f64 / 1e9,
        h.header_len
    );
    println!();
    let w = h
        .tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:<w$}  {:<14} {:<5} {:>10} {:>12}",
        "tensor", "shape", "dtype", "group", "bytes"
    );
    for t in &h.tensors {
        let shape = format!("{:?}", t.shape);
        let group = if t.group_size == 0 {
            "-".into()
        } else {
            t.group_size.to_string()
        };
        println!(
            "{:<w$}  {:<14} {:<5} {:>10} {:>12}",
            t.name,
            shape,
            t.dtype.name(),
            group,
            t.nbytes
        );
    }
    println!();
    let comp = companion_paths(&args.model);
    for (what, path) in [
        ("tokenizer", &comp.tokenizer),
        ("chat template", &comp.template),
    ] {
        match size_of(path) {
            Some(n) => println!("{what:<24} {} ({})", path.display(), human(n)),
            None => println!("{what:<24} {} (missing)", path.display()),
        }
    }
    Ok(())
}
