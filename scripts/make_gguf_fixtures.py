"""A tiny GGUF file for the GGUF reader's end-to-end test: fixtures/gguf/tiny-header.gguf.

Written with gguf-py's GGUFWriter (llama.cpp's own Python writer, `pip install gguf`), so that
the reader is checked against a file the reference writer made, not only against files the tests
build byte by byte. It holds a Qwen3 header's keys (architecture, hyperparameters, a three-token
tokenizer, a chat template) and two tensors: an F32 norm weight and a [2, 64] matrix quantized to
Q8_0 by gguf-py's reference quantizer. Its values mean nothing; the file is 2 KiB.

Developer-only (CI never runs it):
    ../venv-torch/bin/python scripts/make_gguf_fixtures.py
"""

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


if __name__ == "__main__":
    main()
