#!/usr/bin/env python3
"""Build fixtures/models/tiny-qwen3-embedding: a tiny random-weight checkpoint in the layout the
hub ships Qwen3-Embedding in, and sentence-transformers' embeddings of it as the reference.

The layout (Qwen/Qwen3-Embedding-0.6B, checked against its files on the hub):
- config.json says `Qwen3ForCausalLM`, but the weights are a bare `Qwen3Model`: no `lm_head`, and
  tensor names without the `model.` prefix (`embed_tokens.weight`, `layers.0...`, `norm.weight`);
- tokenizer.json's post-processor appends `<|endoftext|>` to every text (`TemplateProcessing`,
  "$A <|endoftext|>"): the last token, whose hidden state is the embedding, is always that one;
- sentence-transformers' files say how to pool: modules.json (Transformer, Pooling, Normalize),
  1_Pooling/config.json (`pooling_mode_lasttoken`), config_sentence_transformers.json (the
  "query" instruction prompt), sentence_bert_config.json.

The reference (reference.json) is `SentenceTransformer(dir).encode(...)` in float32 on the CPU:
texts alone and in one padded batch (left padding, as the tokenizer config says), the empty
string, a text with the "query" prompt, and the token ids of each text (what the tokenizer gave,
the appended `<|endoftext|>` included).

Developer-only (CI never runs it):
    ../venv-torch/bin/pip install sentence-transformers
    ../venv-torch/bin/python scripts/make_embedding_fixture.py [--qwen3-tokenizer DIR]
(the other requirements: scripts/requirements-fixtures.txt)
"""

import argparse
import json
import shutil
from pathlib import Path

import sentence_transformers
import torch
import transformers
from tokenizers import processors

from fixture_configs import hub_config, write_json
from fixture_specs import DEFAULT_QWEN3_TOKENIZER, OUT_ROOT
from make_fixtures import build_small_tokenizer, make_weights, save_weights, small_tokenizer_config

NAME = "tiny-qwen3-embedding"
SPEC = dict(
    name=NAME,
    config_style="hub",
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=16,
    write_head_dim=True,
    layers=2,
    intermediate=128,
    vocab=512,
    tied=True,
    rope_theta=1000000,
    eps=1e-6,
    max_pos=512,
    dtype="bfloat16",
    shards=1,
    eos_in_config="single",
)
SEED = 4300
# Qwen3-Embedding's model card: the instruction is the client's to prepend to a query.
QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
TEXTS = [
    "The capital of France is Paris.",
    "Once upon a time, there was a little model.",
    "Beautiful is better than ugly.",
    "Readability counts.",
    "Simple",
    "Sparse is better than dense. Flat is better than nested. Explicit is better than implicit.",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3-tokenizer", type=Path, default=DEFAULT_QWEN3_TOKENIZER)
    args = ap.parse_args()
    real_tok = json.loads((args.qwen3_tokenizer / "tokenizer.json").read_text(encoding="utf-8"))
    real_cfg = json.loads((args.qwen3_tokenizer / "tokenizer_config.json").read_text(encoding="utf-8"))

    out = OUT_ROOT / NAME
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    # Tokenizer: the small BPE of the other tiny fixtures, with Qwen3-Embedding's post-processor.
    tok_json = build_small_tokenizer(real_tok, SPEC["vocab"])
    eot = next(a["id"] for a in tok_json["added_tokens"] if a["content"] == "<|endoftext|>")
    pp = processors.TemplateProcessing(
        single="$A <|endoftext|>",
        pair="$A <|endoftext|> $B <|endoftext|>",
        special_tokens=[("<|endoftext|>", eot)],
    )
    tok_json["post_processor"] = json.loads(pp.__getstate__())
    (out / "tokenizer.json").write_text(json.dumps(tok_json, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tok_cfg = small_tokenizer_config(real_cfg, tok_json)
    tok_cfg["padding_side"] = "left"  # as Qwen3-Embedding's tokenizer_config.json
    write_json(out / "tokenizer_config.json", tok_cfg)

    # config.json as the hub's (Qwen3ForCausalLM), weights as a bare Qwen3Model.
    write_json(out / "config.json", hub_config(SPEC, eot, eot))
    weights = make_weights(SPEC, SEED)
    weights = {k.removeprefix("model."): v for k, v in weights.items()}
    assert "lm_head.weight" not in weights
    save_weights(out, weights, torch.bfloat16, 1)

    # sentence-transformers' files, as Qwen3-Embedding ships them.
    write_json(
        out / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
    )
    (out / "1_Pooling").mkdir()
    write_json(
        out / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": SPEC["hidden"],
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": False,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": True,
            "include_prompt": True,
        },
    )
    (out / "2_Normalize").mkdir()
    write_json(out / "sentence_bert_config.json", {"max_seq_length": SPEC["max_pos"], "do_lower_case": False})
    write_json(
        out / "config_sentence_transformers.json",
        {
            "prompts": {"query": QUERY_PROMPT, "document": ""},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    )

    # The reference.
    st = sentence_transformers.SentenceTransformer(
        str(out), device="cpu", model_kwargs={"dtype": torch.float32, "attn_implementation": "eager"}
    )
    assert st.get_sentence_embedding_dimension() == SPEC["hidden"]
    enc = lambda texts, **kw: st.encode(texts, convert_to_tensor=True, batch_size=len(texts), **kw).double()
    batch = enc(TEXTS)
    cases = []
    for i, t in enumerate(TEXTS):
        alone = enc([t])[0]
        # Left padding and the attention mask make the batch's vectors the lone ones, to f32 noise.
        assert torch.allclose(alone, batch[i], atol=1e-5), (t, (alone - batch[i]).abs().max())
        ids = st.tokenizer(t)["input_ids"]
        assert ids[-1] == eot, ids
        cases.append({"text": t, "ids": ids, "embedding": alone.tolist(), "in_batch": batch[i].tolist()})
    empty = {"text": "", "ids": st.tokenizer("")["input_ids"], "embedding": enc([""])[0].tolist()}
    assert empty["ids"] == [eot], empty["ids"]
    q = TEXTS[0]
    query = {
        "text": q,
        "prompt": QUERY_PROMPT,
        "ids": st.tokenizer(QUERY_PROMPT + q)["input_ids"],
        "embedding": enc([q], prompt_name="query")[0].tolist(),
    }
    ref = {
        "model": NAME,
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seed": SEED,
        "how": "SentenceTransformer(dir, float32, eager attention).encode on the CPU: last-token "
        "pooling, then Normalize; `embedding` alone, `in_batch` in one left-padded batch of all texts",
        "endoftext_id": eot,
        "cases": cases,
        "empty": empty,
        "query": query,
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(out, "dim", SPEC["hidden"], "cases", len(cases))


if __name__ == "__main__":
    main()
