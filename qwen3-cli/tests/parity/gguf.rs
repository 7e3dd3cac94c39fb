//! llama.cpp's GGUF files of the fixtures, run as they are: the same checks as an export's.

use super::*;

/// llama.cpp's converter's GGUF of fixture `name` in `dtype` (fixtures/gguf/, lossless: the
/// checkpoint's own dtype or f32), run in place as the model file it maps to: HF's logits at
/// every position, within the f32 bound, and HF's greedy tokens.
fn check_gguf(name: &str, dtype: DType) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/gguf")
        .join(format!("{name}-{dtype}.gguf"));
    let f = check_full_logits(name, dtype, KvType::F32, None, &path, &load_reference(name));
    println!("{name} GGUF {dtype}: {}", f.summary(export_bound(None)));
}

#[test]
fn tiny_f32_tied_gqa2_as_llama_cpps_gguf() {
    check_gguf("tiny-f32-tied-gqa2", DType::F32);
}

#[test]
fn tiny_bf16_untied_mha_as_llama_cpps_gguf() {
    check_gguf("tiny-bf16-untied-mha", DType::Bf16);
}

/// llama.cpp's converter's Q8_0 GGUF of tiny-f32-tied-gqa2 (`--outtype q8_0`: every matrix
/// Q8_0), its blocks taken apart at open into q8 in groups of 32: bounded as our own q8 export
/// is, by the noise of its own rounding (the logits within the f32 tolerance plus [`SIGMAS`]
/// sigmas of that noise), and exact on its own weights.
#[test]
fn tiny_f32_tied_gqa2_as_llama_cpps_q8_0_gguf() {
    check_q8_0_gguf("tiny-f32-tied-gqa2");
}

/// Qwen3-MoE (llama.cpp's `qwen3moe`): the converter stacks each layer's experts into one
/// `[experts, rows, cols]` tensor a projection, which runs as the model file's per-expert
/// matrices, each a slice of it; its router stays f32. HF's logits and greedy tokens.
#[test]
fn tiny_qwen3moe_bf16_tied_as_llama_cpps_gguf() {
    check_gguf("tiny-qwen3moe-bf16-tied", DType::Bf16);
}

/// The same mixture of experts as Q8_0: every stacked expert's blocks taken apart at open,
/// expert by expert, into q8 in groups of 32, held as the Q8_0 file above is (the noise model's
/// draws re-route as the rounding does).
#[test]
fn tiny_qwen3moe_bf16_tied_as_llama_cpps_q8_0_gguf() {
    check_q8_0_gguf("tiny-qwen3moe-bf16-tied");
}

/// The converter's Q8_0 GGUF of fixture `name` (fixtures/gguf/), against HF within its
/// rounding's noise bound and against its own weights in f32.
fn check_q8_0_gguf(name: &str) {
    let refr = load_reference(name);
    let dir = tempdir("pq-parity-gguf", name);
    let exact = ModelFile::open(&export_as(name, &dir, DType::F32)).unwrap();
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/gguf/{name}-q8_0.gguf"));
    let (kernel_err, f) = check_rounded_file(name, DType::Q8, &exact, &path, &refr, &dir);
    println!("{name} GGUF Q8_0: vs own weights in f32 {kernel_err:.1e}, {f}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// llama-quantize's Q4_K_M of tiny-bf16-tied-k256 (every row whole blocks of 256, so it keeps
/// Q4_K, with Q6_K for the embedding table and layer 1's `v` and `down`), read where its blocks
/// lie: bounded by the noise of its own rounding as the Q8_0 file is, exact on its own weights
/// within the activations' rounding, and the plain backend (f32 activations) on it equal to an
/// f32 file of its dequantized weights within the f32 tolerance.
#[test]
fn tiny_bf16_tied_k256_as_llama_quantizes_q4_k_m_gguf() {
    check_quantized_gguf(
        "tiny-bf16-tied-k256",
        "q4_k_m",
        &[DType::K(KQuant::Q4K), DType::K(KQuant::Q6K)],
    );
}

/// Its Q5_K_M (Q5_K, with Q6_K where Q4_K_M has it), held to the same.
#[test]
fn tiny_bf16_tied_k256_as_llama_quantizes_q5_k_m_gguf() {
    check_quantized_gguf(
        "tiny-bf16-tied-k256",
        "q5_k_m",
        &[DType::K(KQuant::Q5K), DType::K(KQuant::Q6K)],
    );
}

/// Its Q4_0 (Q4_0 matrices, taken apart at open into q4 in groups of 32, and a Q6_K table), held
/// to the same.
#[test]
fn tiny_bf16_tied_k256_as_llama_quantizes_q4_0_gguf() {
    check_quantized_gguf(
        "tiny-bf16-tied-k256",
        "q4_0",
        &[DType::Q4, DType::K(KQuant::Q6K)],
    );
}

/// Its Q4_K_M told to keep some matrices finer (llama-quantize's `--token-embedding-type bf16
/// --tensor-type attn_v=f16 --tensor-type ffn_up=q8_0`, as the hub's "dynamic" quantizations
/// mix types): a BF16 table and classifier, an F16 `v` (f32 at open) beside Q4_K `q` and `k`
/// that share its input, a Q8_0 `up` beside a Q4_K `gate`. Held to the same.
#[test]
fn tiny_bf16_tied_k256_as_llama_quantizes_a_mixed_gguf() {
    check_quantized_gguf(
        "tiny-bf16-tied-k256",
        "mixed",
        &[
            DType::K(KQuant::Q4K),
            DType::K(KQuant::Q6K),
            DType::Q8,
            DType::Bf16,
        ],
    );
}

/// llama.cpp's converter's F16 GGUF of tiny-f32-tied-gqa2 (`--outtype f16`, as ollama's `fp16`
/// tags are made), widened to f32 at open: bounded by the noise of its own rounding to f16, exact
/// on its own weights.
#[test]
fn tiny_f32_tied_gqa2_as_llama_cpps_f16_gguf() {
    check_quantized_gguf("tiny-f32-tied-gqa2", "f16", &[DType::F32]);
}

/// llama-quantize's Q4_K_M of a model whose rows are not whole blocks of 256 (tiny-f32-tied-gqa2,
/// 64 wide, as Qwen2.5-0.5B's are 896): every matrix falls back, Q4_K to Q5_0 and Q6_K to Q8_0,
/// both taken apart at open into q8 in groups of 32. Held to the same.
#[test]
fn tiny_f32_tied_gqa2_as_llama_quantizes_q4_k_m_gguf() {
    check_quantized_gguf("tiny-f32-tied-gqa2", "q4_k_m", &[DType::Q8]);
}

/// fixtures/gguf/`name`-`kind`.gguf, whose matrices open as `dtypes`, against HF (see
/// `tiny_bf16_tied_k256_as_llama_quantizes_q4_k_m_gguf`).
fn check_quantized_gguf(name: &str, kind: &str, dtypes: &[DType]) {
    let refr = load_reference(name);
    let dir = tempdir("pq-parity-gguf", &format!("{name}-{kind}"));
    let exact = ModelFile::open(&export_as(name, &dir, DType::F32)).unwrap();
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/gguf/{name}-{kind}.gguf"));
    let stored = ModelFile::open(&path).unwrap();
    for &d in dtypes {
        assert!(
            stored.header().tensors.iter().any(|t| t.dtype == d),
            "{kind}: no {d}"
        );
    }
    // The plain backend multiplies f32 activations by each weight as its block says: the
    // f32 path on the same values (an f32 file of the GGUF's), up to summation order.
    let deq = dir.join("plain-reference.bin");
    write_sign_flipped(&exact, &stored, None, &deq);
    let deq_file = ModelFile::open(&deq).unwrap();
    let (deq_model, model) = (
        Model::load(&deq_file).unwrap(),
        Model::load(&stored).unwrap(),
    );
    let mut plain_err = 0f32;
    for case in &refr.cases {
        let plain = our_logits_on(&PlainBackend::new(), &model, case).0;
        plain_err = plain_err.max(max_abs(&plain, &our_logits(&deq_model, case).0));
    }
    assert!(
        plain_err <= F32_TOL,
        "{kind}: plain backend: {plain_err:e} > {F32_TOL:e}"
    );
    let (kernel_err, f) = check_rounded_file(name, dtypes[0], &exact, &path, &refr, &dir);
    println!(
        "{name} GGUF {kind}: vs own weights in f32 {kernel_err:.1e} (plain backend \
         {plain_err:.1e}), {f}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Qwen2: the q, k and v biases, llama.cpp's `qwen2` architecture.
#[test]
fn tiny_qwen2_f32_tied_gqa2_as_llama_cpps_gguf() {
    check_gguf("tiny-qwen2-f32-tied-gqa2", DType::F32);
}

/// Qwen3.5 (llama.cpp's `qwen35`): Gated DeltaNets among gated attention layers. The converter
/// reorders each Gated DeltaNet's value heads (grouped by key head in HF's checkpoint, tiled in
/// the GGUF), which the kernels read in the GGUF's order; stores each gated `attn_q` as HF's
/// `q_proj` (query and gate rows per head), gathered apart at open; `ssm_a = -exp(A_log)`,
/// turned back at open; and the multi-token-prediction layer, left out. HF's logits at every
/// position (prompts longer than a chunk of the delta rule) and its greedy tokens.
#[test]
fn tiny_qwen3_5_bf16_as_llama_cpps_gguf() {
    check_gguf("tiny-qwen3_5-bf16", DType::Bf16);
}

/// The same Qwen3.5 as Q8_0 (its gated `attn_q` rows gathered, then taken apart into q8).
#[test]
fn tiny_qwen3_5_bf16_as_llama_cpps_q8_0_gguf() {
    check_q8_0_gguf("tiny-qwen3_5-bf16");
}

/// Qwen3.5-MoE (llama.cpp's `qwen35moe`): stacked experts, a shared expert and its gate, beside
/// the hybrid layers.
#[test]
fn tiny_qwen3_5moe_f32_sharded_as_llama_cpps_gguf() {
    check_gguf("tiny-qwen3_5moe-f32-sharded", DType::F32);
}

/// Qwen3-Next (llama.cpp's `qwen3next`): Qwen3.5-MoE's layers with the value heads in HF's order
/// and `b` and `a` fused in `ssm_ba`, gathered apart at open.
#[test]
fn tiny_qwen3next_sparse_bf16_as_llama_cpps_gguf() {
    check_gguf("tiny-qwen3next-sparse-bf16", DType::Bf16);
}

/// `qwen3 export FILE.gguf`: the model file holds every tensor as the GGUF runs it, byte for
/// byte (K-quant blocks, Q8_0 taken apart, gathered rows, `A_log`), the same config (Qwen3.5's
/// tiled value heads), and the GGUF's tokenizer; Qwen3.5's bf16 GGUF, exported, gives HF's
/// logits and greedy tokens as the GGUF itself does.
#[test]
fn ggufs_export_as_they_run() {
    use qwen3_inference::tokenizer::file::TokenizerData;
    let dir = tempdir("pq-parity-gguf", "export");
    for name in [
        "tiny-qwen3_5-bf16-bf16",
        "tiny-qwen3_5-bf16-q8_0",
        "tiny-qwen3_5moe-f32-sharded-f32",
        "tiny-qwen3next-sparse-bf16-bf16",
        "tiny-bf16-tied-k256-q5_k_m",
        "tiny-bf16-tied-k256-mixed",
        "tiny-f32-tied-gqa2-f16",
        "tiny-f32-tied-gqa2-q4_k_m",
    ] {
        let gguf =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/gguf/{name}.gguf"));
        let out = dir.join(format!("{name}.bin"));
        let s = qwen3_export::gguf::export_gguf(&gguf, &out, false, None).unwrap();
        let (from, to) = (
            ModelFile::open(&gguf).unwrap(),
            ModelFile::open(&out).unwrap(),
        );
        assert_eq!(
            std::fs::metadata(&out).unwrap().len(),
            s.model_bytes,
            "{name}"
        );
        assert_eq!(from.config(), to.config(), "{name}");
        assert_eq!(
            from.header().tensors.len(),
            to.header().tensors.len(),
            "{name}"
        );
        for (a, b) in from.header().tensors.iter().zip(&to.header().tensors) {
            assert_eq!(
                (&a.name, a.dtype, &a.shape, a.group_size),
                (&b.name, b.dtype, &b.shape, b.group_size),
                "{name}"
            );
            assert!(
                from.tensor_bytes(&a.name).unwrap() == to.tensor_bytes(&b.name).unwrap(),
                "{name}: {}",
                a.name
            );
        }
        let tokenizer = std::fs::read(&s.tokenizer_path).unwrap();
        let meta = qwen3_inference::gguf::GgufFile::open(&gguf).unwrap();
        let want = qwen3_inference::gguf::tokenizer::tokenizer_data(
            meta.header(),
            from.config().vocab_size,
        )
        .unwrap();
        assert_eq!(
            TokenizerData::from_bytes(&tokenizer).unwrap(),
            want,
            "{name}"
        );
        println!("{name}: exported as format version {}", s.version);
    }
    let path = dir.join("tiny-qwen3_5-bf16-bf16.bin");
    let name = "tiny-qwen3_5-bf16";
    let f = check_full_logits(
        name,
        DType::Bf16,
        KvType::F32,
        None,
        &path,
        &load_reference(name),
    );
    println!(
        "{name} GGUF bf16, exported: {}",
        f.summary(export_bound(None))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
