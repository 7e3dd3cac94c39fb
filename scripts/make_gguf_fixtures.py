"""A tiny GGUF file for the GGUF reader's end-to-end test, fixtures/gguf/tiny-header.gguf, and
gguf-py's dequantization of each block type the hub's Qwen GGUFs use,
fixtures/gguf/dequant-reference.json.

Written with gguf-py's GGUFWriter (llama.cpp's own Python writer, `pip install gguf`), so that
the reader is checked against a file the reference writer made, not only against files the tests
build byte by byte. It holds a Qwen3 header's keys (architecture, hyperparameters, a three-token
tokenizer, a chat template) and two tensors: an F32 norm weight and a [2, 64] matrix quantized to
Q8_0 by gguf-py's reference quantizer. Its values mean nothing; the file is 2 KiB.

The dequantization goldens: for F16, BF16, Q8_0, Q4_0 and Q5_0, a random [2, 256] matrix quantized
by gguf-py's reference quantizer; for Q4_K, Q5_K and Q6_K (which gguf-py dequantizes but does not
quantize), two blocks of random bytes with their f16 scales set to random finite values. Each
case records the blocks' bytes (hex) and the f32 bits gguf-py's `quants.dequantize` gives.

fixtures/gguf/tiny-f32-tied-gqa2-f32.gguf is llama.cpp's own converter's output for the f32
fixture, made once by hand (llama.cpp 0c1e570; the converter knows the fixture's small BPE
vocabulary by no hash, so its pre-tokenizer check was told "qwen2": the fixture's tokenizer.json
splits with Qwen2's regex):

    import sys; sys.path[:0] = [LLAMA_CPP, LLAMA_CPP + "/gguf-py"]
    import conversion.base as base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    import convert_hf_to_gguf
    sys.argv = ["convert_hf_to_gguf.py", "fixtures/models/tiny-f32-tied-gqa2", "--outtype", "f32",
                "--outfile", "fixtures/gguf/tiny-f32-tied-gqa2-f32.gguf"]
    convert_hf_to_gguf.main()

and so, with `--outtype bf16`, tiny-bf16-untied-mha-bf16.gguf; with `--outtype f32`,
tiny-qwen2-f32-tied-gqa2-f32.gguf (the Qwen2 fixture; its tokenizer.json splits with the same
regex); and with `--outtype q8_0` and `--outtype f16` on tiny-f32-tied-gqa2,
tiny-f32-tied-gqa2-q8_0.gguf and tiny-f32-tied-gqa2-f16.gguf; and with `--outtype bf16` and
`--outtype q8_0` on the Qwen3-MoE fixture tiny-qwen3moe-bf16-tied (llama.cpp's `qwen3moe`, its
experts stacked), tiny-qwen3moe-bf16-tied-bf16.gguf and tiny-qwen3moe-bf16-tied-q8_0.gguf; and,
with the pre-tokenizer told "qwen35" (the name the converter gives Qwen3.5's), `--outtype bf16`
and `--outtype q8_0` on tiny-qwen3_5-bf16 and `--outtype f32` on tiny-qwen3_5moe-f32-sharded
(llama.cpp's `qwen35` and `qwen35moe`), tiny-qwen3_5-bf16-bf16.gguf, tiny-qwen3_5-bf16-q8_0.gguf
and tiny-qwen3_5moe-f32-sharded-f32.gguf; and with `--outtype bf16 --no-mtp` (the fixture has
no MTP weights) on tiny-qwen3next-sparse-bf16 (llama.cpp's `qwen3next`),
tiny-qwen3next-sparse-bf16-bf16.gguf.
fixtures/gguf/tiny-bf16-tied-k256-q4_k_m.gguf is llama-quantize's Q4_K_M of the converter's
`--outtype bf16` GGUF of tiny-bf16-tied-k256 (a checkpoint whose rows are whole blocks of 256):

    llama-quantize tiny-bf16-tied-k256-bf16.gguf fixtures/gguf/tiny-bf16-tied-k256-q4_k_m.gguf Q4_K_M

and so, with `Q5_K_M` and `Q4_0`, tiny-bf16-tied-k256-q5_k_m.gguf and
tiny-bf16-tied-k256-q4_0.gguf; and with `Q4_K_M` on
fixtures/gguf/tiny-f32-tied-gqa2-f32.gguf, tiny-f32-tied-gqa2-q4_k_m.gguf (its 64-wide rows take
llama-quantize's fallbacks, Q5_0 and Q8_0); and tiny-bf16-tied-k256-mixed.gguf, a Q4_K_M that
keeps some matrices finer, as the hub's "dynamic" and "_L" quantizations do:

    llama-quantize --token-embedding-type bf16 --tensor-type attn_v=f16 --tensor-type ffn_up=q8_0 \
        tiny-bf16-tied-k256-bf16.gguf fixtures/gguf/tiny-bf16-tied-k256-mixed.gguf Q4_K_M

fixtures/gguf/split/tiny-f32-tied-gqa2-q8_0-0000K-of-00003.gguf are tiny-f32-tied-gqa2-q8_0.gguf
cut in three parts by gguf-py's writer with `split_max_tensors` (`split()` below: the writer
behind `convert_hf_to_gguf.py --split-max-tensors`; llama.cpp's `gguf-split` writes the same
keys and names): the first part holds every metadata key, each part `split.no`, `split.count`
and `split.tensors.count` and its own tensors.

Developer-only (CI never runs it):
    ../venv-torch/bin/python scripts/make_gguf_fixtures.py
"""

import json
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main():
    out = ROOT / "fixtures" / "gguf" / "tiny-header.gguf"
    w = gguf.GGUFWriter(str(out), "qwen3")
    w.add_name("tiny header")
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(160)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.add_chat_template("{{ messages[0]['content'] }}")
    rng = np.random.default_rng(7)
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    m = rng.standard_normal((2, 64)).astype(np.float32)
    q = gguf.quants.quantize(m, gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("token_embd.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out, out.stat().st_size, "bytes")


def split():
    """The converter's Q8_0 GGUF of tiny-f32-tied-gqa2 written again in three parts."""
    source = ROOT / "fixtures" / "gguf" / "tiny-f32-tied-gqa2-q8_0.gguf"
    r = gguf.GGUFReader(source)
    out_dir = ROOT / "fixtures" / "gguf" / "split"
    out_dir.mkdir(exist_ok=True)
    per_part = -(-len(r.tensors) // 3)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = gguf.GGUFWriter(out_dir / "tiny-f32-tied-gqa2-q8_0.gguf", arch,
                        split_max_tensors=per_part)
    for field in r.fields.values():
        # The header's own fields (magic, counts) and the architecture are the writer's.
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue
        ty = field.types[0]
        sub = field.types[-1] if ty == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), ty, sub_type=sub)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data)
    w.close()
    for p in sorted(out_dir.iterdir()):
        print(p, p.stat().st_size, "bytes")


def f16_bytes(rng, n):
    """n random finite f16 values of moderate size, as bytes."""
    return (rng.standard_normal(n) * 0.05).astype(np.float16).tobytes()


def k_blocks(t, rng, n_blocks):
    """Random blocks of a K-quant with finite f16 scales where the layout keeps them."""
    T = gguf.GGMLQuantizationType
    out = b""
    for _ in range(n_blocks):
        if t == T.Q4_K:  # d, dmin, scales[12], qs[128]
            out += f16_bytes(rng, 2) + rng.bytes(12 + 128)
        elif t == T.Q5_K:  # d, dmin, scales[12], qh[32], qs[128]
            out += f16_bytes(rng, 2) + rng.bytes(12 + 32 + 128)
        elif t == T.Q6_K:  # ql[128], qh[64], scales[16] (int8), d
            out += rng.bytes(128 + 64 + 16) + f16_bytes(rng, 1)
    return out


def dequant_reference():
    T = gguf.GGMLQuantizationType
    rng = np.random.default_rng(11)
    cases = []
    for t in [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q5_0, T.Q4_K, T.Q5_K, T.Q6_K]:
        if t in (T.Q4_K, T.Q5_K, T.Q6_K):
            raw = np.frombuffer(k_blocks(t, rng, 2), dtype=np.uint8).reshape(1, -1)
        else:
            m = rng.standard_normal((2, 256)).astype(np.float32)
            raw = gguf.quants.quantize(m, t).view(np.uint8).reshape(1, -1)
        values = gguf.quants.dequantize(raw, t).astype(np.float32).reshape(-1)
        cases.append(
            {
                "type": t.name,
                "bytes": raw.tobytes().hex(),
                "f32_bits": [int(b) for b in values.view(np.uint32)],
            }
        )
    out = ROOT / "fixtures" / "gguf" / "dequant-reference.json"
    out.write_text(json.dumps({"gguf_py": "llama.cpp 0c1e570", "cases": cases}) + "\n")
    print(out, out.stat().st_size, "bytes")


def tokenizer_cases():
    """fixtures/gguf/tiny-tokenizer-cases.json: the ids HuggingFace's tokenizer gives the texts
    of fixtures/tokenizer/tokenizer-cases-dev.json (every category: combining marks, special
    tokens, digits, whitespace, emoji) with the vocabulary of the fixture that
    tiny-f32-tied-gqa2-f32.gguf was converted from, for the test that reads that GGUF's
    tokenizer (gguf/tests/)."""
    from tokenizers import Tokenizer

    source = ROOT / "fixtures/models/tiny-f32-tied-gqa2/tokenizer.json"
    tok = Tokenizer.from_file(str(source))
    texts = json.loads((ROOT / "fixtures/tokenizer/tokenizer-cases-dev.json").read_text())
    cases = [
        {"text": c["text"], "ids": tok.encode(c["text"], add_special_tokens=True).ids}
        for c in texts["cases"]
    ]
    import tokenizers

    out = {
        "meta": {
            "tokenizer_json": "fixtures/models/tiny-f32-tied-gqa2/tokenizer.json",
            "texts": "fixtures/tokenizer/tokenizer-cases-dev.json",
            "encode": "tokenizers.Tokenizer.encode(text, add_special_tokens=True).ids",
            "tokenizers": tokenizers.__version__,
        },
        "cases": cases,
    }
    path = ROOT / "fixtures/gguf/tiny-tokenizer-cases.json"
    path.write_text(json.dumps(out, ensure_ascii=False, indent=None) + "\n")
    print(f"{path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
    dequant_reference()
    tokenizer_cases()
    split()
