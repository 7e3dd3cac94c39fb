//! `qwen3 info <model.bin> [--tensors]`: what a model file holds: its config, storage and
//! companion files, and with `--tensors` every tensor.

use super::args::DEFAULT_CONTEXT_CAP;
use super::serve::SERVE_SLOTS;
use super::units::bytes;
use anyhow::Result;
use clap::Args;
use qwen3_inference::backend::KvType;
use qwen3_inference::format::{
    companion_paths, expected_tensors, DType, KQuant, ModelFile, RopeScaling, TensorKind,
    ValueHeads,
};
use qwen3_inference::gguf;
use std::path::PathBuf;

#[derive(Args)]
pub struct InfoArgs {
    /// Model file written by `qwen3 export`, or a GGUF file (its metadata and tensors).
    pub model: PathBuf,
    /// Also list every tensor: name, shape, dtype, group size, bytes.
    #[arg(long)]
    pub tensors: bool,
}

fn size_of(path: &std::path::Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

pub fn run(args: InfoArgs) -> Result<()> {
    if starts_with_gguf(&args.model) {
        return gguf_info(&args);
    }
    let file = ModelFile::open(&args.model)?;
    let h = file.header();
    let c = &h.config;
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    println!(
        "file                     {} ({}, format version {})",
        args.model.display(),
        bytes(h.file_len),
        h.version
    );
    println!("architecture             {}", c.architecture);
    // The two ways the families' attention differs (docs/transformer.md).
    let attention = match (c.attention_bias, c.qk_norm) {
        (true, true) => "q/k/v biases, q/k norms",
        (true, false) => "q/k/v biases, no q/k norms",
        (false, true) => "q/k norms, no biases",
        (false, false) => "no biases, no q/k norms",
    };
    println!("attention                {attention}");
    if let Some(la) = &c.linear_attention {
        // Qwen3.5: which layers mix tokens how (docs/transformer.md, the hybrid chapter).
        let linear = c.num_hidden_layers - c.attention_layers();
        println!(
            "layers                   {linear} Gated DeltaNet ({} key and {} value heads of {} and {}, conv {}{}), {} gated attention (RoPE on {} of {} dims)",
            la.linear_num_key_heads,
            la.linear_num_value_heads,
            la.linear_key_head_dim,
            la.linear_value_head_dim,
            la.linear_conv_kernel_dim,
            // A GGUF's order (format::ValueHeads), which the kernels read as it is.
            match la.value_heads {
                ValueHeads::Grouped => "",
                ValueHeads::Tiled => ", value heads tiled as llama.cpp orders them",
            },
            c.attention_layers(),
            c.rotary_dim(),
            c.head_dim
        );
    }
    match c.embedding {
        Some(e) => println!(
            "task                     embeddings: {} values per text, the last token's{} (no text generation)",
            c.hidden_size,
            if e.normalize { ", unit length" } else { "" }
        ),
        None => println!("task                     text generation"),
    }
    if let Some(v) = &c.vision {
        // Images in (docs/vision.md): the tower's shape, the sizes an image is resized between,
        // the tokens that stand for it.
        let t = &v.tower;
        let deepstack = match t.deepstack_visual_indexes.len() {
            0 => String::new(),
            _ => format!(", DeepStack after blocks {:?}", t.deepstack_visual_indexes),
        };
        println!(
            "vision                   a tower of {} blocks of {} ({} heads, MLP {}), patches of {}x{} merged {}x{} into tokens of {}{deepstack}",
            t.depth,
            t.hidden_size,
            t.num_heads,
            t.intermediate_size,
            t.patch_size,
            t.patch_size,
            t.spatial_merge_size,
            t.spatial_merge_size,
            t.out_hidden_size
        );
        let per_token = t.patch_size * t.spatial_merge_size;
        println!(
            "images                   {} to {} pixels ({} to {} tokens), <|image_pad|> {}, M-RoPE sections {:?}",
            v.processor.min_pixels,
            v.processor.max_pixels,
            v.processor.min_pixels.div_ceil(per_token * per_token),
            v.processor.max_pixels / (per_token * per_token),
            v.image_token_id,
            v.mrope_section
        );
    }
    println!("hidden_size              {}", c.hidden_size);
    println!("intermediate_size        {}", c.intermediate_size);
    println!("num_hidden_layers        {}", c.num_hidden_layers);
    println!("num_attention_heads      {}", c.num_attention_heads);
    println!("num_key_value_heads      {}", c.num_key_value_heads);
    println!("head_dim                 {}", c.head_dim);
    println!("vocab_size               {}", c.vocab_size);
    println!("max_position_embeddings  {}", c.max_position_embeddings);
    println!("rope_theta               {}", c.rope_theta);
    if let RopeScaling::Yarn {
        factor,
        original_max_position_embeddings,
        attention_factor,
        ..
    } = c.rope_scaling
    {
        println!(
            "rope_scaling             yarn, factor {factor} over {original_max_position_embeddings} positions, attention factor {attention_factor:.4}: up to {} positions",
            c.max_context()
        );
    }
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
    // A q4 file keeps some matrices in q6 or q8 (`Q4Mix`), and a q8 or q4 file keeps in bf16
    // those whose rows the group size does not divide (`format::stays_bf16`); a GGUF's mix
    // (exported as it runs) may hold any of these types: say how many, and their share of the
    // bytes, as "29 of 197 matrices in q8 (52% of the bytes)".
    let matrix_names: std::collections::HashSet<String> = expected_tensors(c)
        .into_iter()
        .filter(|e| e.kind == TensorKind::Matrix)
        .map(|e| e.name)
        .collect();
    let matrices: Vec<_> = h
        .tensors
        .iter()
        .filter(|t| matrix_names.contains(&t.name))
        .collect();
    let all_bytes = matrices.iter().map(|t| t.nbytes).sum::<u64>() as f64;
    let mix: String = [
        DType::K(KQuant::Q6K),
        DType::Q6,
        DType::K(KQuant::Q5K),
        DType::K(KQuant::Q4K),
        DType::Q4,
        DType::Q8,
        DType::Bf16,
        DType::F32,
    ]
    .into_iter()
    .filter(|&d| d != c.dtype)
    .filter_map(|d| {
        let these: Vec<_> = matrices.iter().filter(|t| t.dtype == d).collect();
        let bytes = these.iter().map(|t| t.nbytes).sum::<u64>() as f64;
        let why = match d {
            DType::Bf16 if !c.dtype.is_k_quant() => {
                "; their rows are not a multiple of the group size"
            }
            _ => "",
        };
        (!these.is_empty()).then(|| {
            format!(
                ", {} of {} matrices in {d} ({:.0}% of the bytes{why})",
                these.len(),
                matrices.len(),
                100.0 * bytes / all_bytes
            )
        })
    })
    .collect();
    match c.group_size {
        0 => println!("weights                  {}", c.dtype),
        gs => println!(
            "weights                  {} (group size {gs}){mix}",
            c.dtype
        ),
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
    if let Some(m) = &c.moe {
        let sparse = (0..c.num_hidden_layers).filter(|&l| m.is_sparse(l)).count();
        println!(
            "experts                  {} of {} a token (norm_topk_prob {}), width {}, in {sparse} of {} layers{}{}",
            m.num_experts_per_tok,
            m.num_experts,
            m.norm_topk_prob,
            m.moe_intermediate_size,
            c.num_hidden_layers,
            match m.mlp_only_layers.is_empty() {
                true => String::new(),
                false => format!(" (dense: {:?})", m.mlp_only_layers),
            },
            match m.shared_expert_intermediate_size {
                0 => String::new(),
                w => format!("; a shared expert of width {w} behind a sigmoid gate"),
            }
        );
        let a = h.active_weights();
        println!(
            "active per token         {} parameters ({:.3} B), {} of weights",
            a.params,
            a.params as f64 / 1e9,
            bytes(a.bytes)
        );
    }
    // What a process running the model holds: the weights (mapped from the file, shared by
    // every process that maps it) and, per position a sequence holds, one key and one value
    // vector per attention layer and KV head (`Model::kv_cache_bytes`), plus, in a hybrid
    // model, each sequence's fixed state in its Gated DeltaNet layers. `qwen3 serve` can hold
    // `--parallel` sequences of `--context` positions; what a container needs is about the
    // two together.
    let position = |kv: KvType| {
        2 * c.attention_layers() as u64
            * c.num_key_value_heads as u64
            * c.head_dim as u64
            * kv.bytes() as u64
    };
    println!(
        "memory                   weights {}; keys and values {} a position in f32, {} in bf16",
        bytes(h.file_len),
        bytes(position(KvType::F32)),
        bytes(position(KvType::Bf16))
    );
    // A hybrid model's sequence holds its Gated DeltaNets' states whatever its length, and
    // `serve` keeps a second copy a slot (the prefix cache's snapshot, `Engine::reusable`), a
    // third with drafts (the states before a step that verifies them).
    let state = c.linear_state_bytes();
    if state > 0 {
        println!(
            "                         Gated DeltaNet state {} a sequence (f32), whatever its length; twice that a serving slot (three times with drafts)",
            bytes(state)
        );
    }
    let (slots, context) = (
        SERVE_SLOTS as u64,
        (c.max_context() as u64).min(DEFAULT_CONTEXT_CAP as u64),
    );
    println!(
        "serve at most            {} in f32 ({} with --kv-cache bf16): {slots} slots x {context} positions (--parallel, --context)",
        bytes(h.file_len + slots * (context * position(KvType::F32) + 2 * state)),
        bytes(h.file_len + slots * (context * position(KvType::Bf16) + 2 * state)),
    );
    let comp = companion_paths(&args.model);
    for (what, path) in [
        ("tokenizer", &comp.tokenizer),
        ("chat template", &comp.template),
    ] {
        match size_of(path) {
            Some(n) => println!("{what:<24} {} ({})", path.display(), bytes(n)),
            None => println!("{what:<24} {} (missing)", path.display()),
        }
    }
    if !args.tensors {
        println!(
            "tensors                  {} (--tensors lists them)",
            h.tensors.len()
        );
        return Ok(());
    }
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
    Ok(())
}

/// Whether the file at `path` begins with GGUF's magic (a file that cannot be read is left to
/// the model file's reader, whose error names the problem).
fn starts_with_gguf(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|_| gguf::is_gguf(&magic))
}

/// A metadata value on one line: scalars as they are, a string as it is (up to 60 characters),
/// an array as its length.
fn show(v: &gguf::Value) -> String {
    use gguf::Value as V;
    match v {
        V::Str(s) if s.chars().count() > 60 => format!("{} chars", s.chars().count()),
        V::Str(s) => s.clone(),
        V::Array(a) => format!("[{} items]", a.len()),
        V::Bool(b) => b.to_string(),
        V::F32(x) => x.to_string(),
        V::F64(x) => x.to_string(),
        v => v
            .as_u64()
            .map_or_else(|| format!("{v:?}"), |n| n.to_string()),
    }
}

/// `qwen3 info FILE.gguf`: what a GGUF file holds, read from its header: the architecture and
/// its hyperparameters, the tokenizer and template, the tensors by type.
fn gguf_info(args: &InfoArgs) -> Result<()> {
    let file = gguf::GgufFile::open(&args.model)?;
    let h = file.header();
    let len = file.len();
    println!(
        "file                     {} ({}, GGUF version {})",
        args.model.display(),
        bytes(len),
        h.version
    );
    if file.parts() > 1 {
        // Its other parts' tensors are read too (gguf::open_parts); they sit beside it.
        println!(
            "parts                    {} (this is the first; the others beside it, their bytes \
             counted above)",
            file.parts()
        );
    }
    let arch = h.architecture().unwrap_or("-");
    println!("architecture             {arch}");
    if let Some(name) = h.get("general.name") {
        println!("name                     {}", show(name));
    }
    // The architecture's own keys: its hyperparameters, in file order.
    let prefix = format!("{arch}.");
    for (k, v) in &h.metadata {
        if let Some(key) = k.strip_prefix(&prefix) {
            println!("{key:<24} {}", show(v));
        }
    }
    let count = |key: &str| match h.get(key) {
        Some(gguf::Value::Array(a)) => a.len().to_string(),
        _ => "-".into(),
    };
    let text = |key: &str| h.get(key).map_or_else(|| "-".into(), show);
    println!(
        "tokenizer                {} (pre-tokenizer {}), {} tokens, {} merges",
        text("tokenizer.ggml.model"),
        text("tokenizer.ggml.pre"),
        count("tokenizer.ggml.tokens"),
        count("tokenizer.ggml.merges")
    );
    println!(
        "chat template            {}",
        text("tokenizer.chat_template")
    );
    // Tensors by type, most bytes first.
    let mut by_type: Vec<(&str, usize, u64)> = Vec::new();
    for t in &h.tensors {
        match by_type.iter_mut().find(|(n, _, _)| *n == t.ggml_type.name) {
            Some(e) => (e.1, e.2) = (e.1 + 1, e.2 + t.nbytes),
            None => by_type.push((t.ggml_type.name, 1, t.nbytes)),
        }
    }
    by_type.sort_by_key(|&(_, _, b)| std::cmp::Reverse(b));
    let types: Vec<String> = by_type
        .iter()
        .map(|(n, k, b)| format!("{k} {n} ({})", bytes(*b)))
        .collect();
    let params: u64 = h
        .tensors
        .iter()
        .map(|t| t.dims.iter().product::<u64>())
        .sum();
    println!(
        "tensors                  {}: {}",
        h.tensors.len(),
        types.join(", ")
    );
    println!(
        "parameters               {params} ({:.3} B)",
        params as f64 / 1e9
    );
    // The model the file holds, as this runtime reads it (gguf/model.rs), or why not.
    let model = gguf::model::model_config(h).and_then(|c| {
        gguf::model::check_tensors(h, &c)?;
        Ok(c)
    });
    // Qwen3.5's multi-token-prediction layers: blocks the text model does not count.
    let mtp = gguf::model::blocks(h)
        .ok()
        .map(|b| b.mtp)
        .filter(|&n| n > 0)
        .map_or(String::new(), |n| {
            let s = if n == 1 { "" } else { "s" };
            format!(" (and {n} multi-token-prediction layer{s}, left out)")
        });
    match model {
        Ok(c) => println!(
            "model                    {}: {} layers{mtp}, hidden {}, {} / {} heads of {}, every tensor found",
            c.architecture,
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim
        ),
        Err(e) => println!("model                    not read: {e:#}"),
    }
    // Whether every command runs it: read in place as a model file (gguf::model::model_header).
    match gguf::model::model_header(h, len) {
        Ok(m) => {
            // Types no vectorized kernel reads yet run, slowly, on the scalar reference.
            let slow: std::collections::BTreeSet<String> = m
                .tensors
                .iter()
                .filter(|t| {
                    qwen3_inference::kernels::dot::scalar_only(t.dtype, t.group_size as usize)
                        .is_some()
                })
                .map(|t| t.dtype.to_string())
                .collect();
            let slow = match slow.is_empty() {
                true => String::new(),
                false => format!(
                    " ({} on the scalar reference kernels so far: many times slower than Q8_0)",
                    slow.into_iter().collect::<Vec<_>>().join(" and ")
                ),
            };
            // The matrices' types, the most common first: "Q4_K + Q6_K".
            let mut types: Vec<(&str, usize)> = Vec::new();
            for t in h.tensors.iter().filter(|t| t.dims.len() == 2) {
                match types.iter_mut().find(|(n, _)| *n == t.ggml_type.name) {
                    Some((_, k)) => *k += 1,
                    None => types.push((t.ggml_type.name, 1)),
                }
            }
            types.sort_by_key(|&(_, k)| std::cmp::Reverse(k));
            let types: Vec<&str> = types.into_iter().map(|(n, _)| n).collect();
            // F16 has no kernels: widened at open (gguf/repack.rs).
            let widened = match h.tensors.iter().any(|t| t.ggml_type.name == "F16") {
                true => " (its F16 tensors widened to f32 at open: twice their bytes in memory)",
                false => "",
            };
            println!(
                "run                      yes, {}: every command takes this file as it is{widened}{slow}",
                types.join(" + ")
            )
        }
        Err(e) => println!("run                      not yet: {e:#}"),
    }
    if args.tensors {
        for t in &h.tensors {
            println!(
                "  {:<40} {:>20} {:<8} {:>12}",
                t.name,
                format!("{:?}", t.dims),
                t.ggml_type.name,
                t.nbytes
            );
        }
    }
    Ok(())
}
