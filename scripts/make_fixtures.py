#!/usr/bin/env python3
"""Build the tiny random-weight Qwen3, Qwen3-MoE and Qwen2 checkpoints in fixtures/models/ and
their HF references.

Run once by a developer (never by CI; CI has no PyTorch):

    python3 -m venv ../venv-torch
    ../venv-torch/bin/pip install -r scripts/requirements-fixtures.txt
    ../venv-torch/bin/python scripts/make_fixtures.py [--only NAME] [--qwen3-tokenizer DIR]

Each checkpoint directory is a self-contained HuggingFace checkpoint (config.json,
generation_config.json, safetensors, tokenizer.json, tokenizer_config.json) plus reference.json:
logits and greedy continuations computed by transformers in float32 with eager attention, from the
files as saved (so a bf16/f16 checkpoint is upcast exactly; a model is never cast to bf16 in
memory, which would also round its rotary inv_freq buffer). fixtures/README.md documents the
checkpoints and the reference.json schema.

Seeds: for each checkpoint the script tries weight seeds base, base+1, ... and keeps the first one
where every greedy step's top-1 minus top-2 logit gap is >= MIN_GREEDY_GAP, no EOS id appears in
any greedy continuation (so a CLI that stops at EOS still produces all GREEDY_STEPS tokens), and
the logits of one full-sequence forward equal those of prefill + KV-cache decode within
MAX_INCREMENTAL_DIFF (f32 rounding noise is ~1e-6 relative to the logit size). For the MoE
checkpoints it also requires every routed token's top-k router choice to be clear of a tie by
MIN_ROUTER_TOPK_GAP, and the YaRN and MoE checkpoints reject a greedy continuation with fewer than
MIN_DISTINCT_GREEDY distinct ids.
"""

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import safetensors
import safetensors.torch
import tokenizers
import torch
import transformers
from huggingface_hub import split_torch_state_dict_into_shards
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

REPO = Path(__file__).resolve().parent.parent
OUT_ROOT = REPO / "fixtures" / "models"
# The real Qwen3 tokenizer files, in `shared/` beside the repository.
DEFAULT_QWEN3_TOKENIZER = Path(__file__).resolve().parents[2] / "shared" / "qwen3-tokenizer"

GREEDY_STEPS = 24
# A correct f32 implementation can differ from torch by ~1e-5 in a logit (different summation
# order); a gap of 3e-3 leaves two orders of magnitude of room before the greedy choice can flip.
MIN_GREEDY_GAP = 3e-3
# Full-sequence forward vs prefill + KV-cache decode in torch itself. Both are f32 evaluations of
# the same math in a different order, so they differ by f32 rounding noise; measured against a
# float64 evaluation of the same files, that noise is 0.5e-5 to 3e-5 on these checkpoints (logits
# up to ~15, residual stream up to ~10). 1e-5 absolute rejected nearly every seed of the 3-layer
# checkpoint; a KV-cache misuse shows up as O(1) differences, so 5e-5 still catches it.
MAX_INCREMENTAL_DIFF = 5e-5
# MoE checkpoints: at every sparse layer and every routed token, the k-th largest router
# probability must exceed the (k+1)-th by this much. Two correct f32 implementations differ in a
# router probability by ~1e-6 at most, so a port picks the same experts as torch; a near tie could
# flip an expert, and with it the logits by O(1).
MIN_ROUTER_TOPK_GAP = 1e-3
# That condition costs seeds: with iid Gaussian router logits of std s over 8 experts, a token
# misses it with probability ~1.1% for top-2 (s = 1.5..2) and ~2.5% for top-3 (s = 1..1.5), the
# best over s (larger s makes the top-1 win but shrinks the k-th and (k+1)-th probabilities
# together; smaller s makes them all ~1/8 and close), and measured rates on these checkpoints
# match. A seed passes only if all of its ~170-250 routed token-layers do, so MoE specs get more
# tries (max_seed_tries) and the top-3 checkpoint fewer, shorter prompts.
# Checkpoints that set min_distinct_greedy (the YaRN and MoE ones) also reject a seed whose greedy
# continuation settles into repeating one to three tokens: a run of one token feeds attention
# identical keys and values (before RoPE), so a wrong rotation changes less, and a repeated token
# routes the same way every step. (Random MoE weights loop often: requiring 8 distinct ids
# rejected ~80% of seeds.)
MIN_DISTINCT_GREEDY = 4
MAX_SEED_TRIES = 200

# The five Qwen3 added tokens the chat template uses, with Qwen3's own `special` flags
# (tokenizer.json of Qwen3: <think> and </think> are added but not special).
SMALL_ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
]

# Fixed training text for the small BPE tokenizer (deterministic, no download). Mixed scripts and
# digits so the merges exercise the split regex and multi-byte UTF-8.
TRAIN_TEXT = """\
The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.
Once upon a time, there was a little model that wanted to run on every computer in the world.
It read its weights from a file, one tensor at a time, and it never forgot a token it had seen.
Beautiful is better than ugly. Explicit is better than implicit. Simple is better than complex.
Complex is better than complicated. Flat is better than nested. Sparse is better than dense.
Readability counts. Special cases aren't special enough to break the rules.
Although practicality beats purity. Errors should never pass silently. Unless explicitly silenced.
In the face of ambiguity, refuse the temptation to guess. There should be one obvious way to do it.
Now is better than never. Although never is often better than *right* now.
If the implementation is hard to explain, it's a bad idea. If it is easy to explain, it may be good.
def main():\n    for i in range(10):\n        print(i * 2, "hello world")\n    return 0\n
fn main() {\n    let x: Vec<u32> = (0..10).collect();\n    println!("{:?}", x);\n}\n
1 + 1 = 2, 2 + 2 = 4, 3 * 7 = 21, 100 / 4 = 25, 2024-11-22 12:34:56, 3.14159, 2.71828
user: What is the weather like today? assistant: I don't know; I can't see outside.
system: You are a helpful assistant. user: Give me three colours. assistant: red, green, blue.
Le renard brun rapide saute par-dessus le chien paresseux. Où est la bibliothèque ? Ça va très bien.
Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München!
El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la estación?
Быстрая коричневая лиса прыгает через ленивую собаку.
我们今天去公园散步。天气很好，阳光明媚。你好，世界！
今日はいい天気ですね。こんにちは世界。
안녕하세요 세계. 🙂 👍 ✨
"""

# Text prompts. Tiny checkpoints get one extra case whose prompt is text encoded by their own
# small tokenizer (for end-to-end CLI tests); the full-vocab checkpoint uses text prompts only.
TEXT_PROMPT_TINY = "The capital of France is"
TEXT_PROMPTS_FULLVOCAB = [
    "The capital of France is",
    "Hello",
    "Once upon a time, there was a little model that wanted to run on every computer in the world. It",
]

# The added tokens of the Qwen2 checkpoints: Qwen2.5 has no <think>, and its tool calls are
# wrapped in <tool_call> ... </tool_call> (added, not special, in Qwen2.5's tokenizer.json as in
# Qwen3's, whose flags are copied).
QWEN2_ADDED_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
]

# A DeepSeek-R1-Distill-Qwen-style tokenizer: its post-processor puts a BOS token before every
# encoded text (TemplateProcessing, as LlamaTokenizerFast's tokenizer.json does), and its chat
# template writes {{ bos_token }} itself. The BOS is a special added token of its own.
DISTILL_BOS = "<｜begin▁of▁sentence｜>"
DISTILL_ADDED_TOKENS = SMALL_ADDED_TOKENS + [(DISTILL_BOS, True), ("<｜User｜>", False), ("<｜Assistant｜>", False)]
DISTILL_TEMPLATE = REPO / "fixtures" / "chat" / "deepseek-r1-0528-qwen3.chat_template.jinja"
# Conversations rendered and tokenized by apply_chat_template for that checkpoint.
DISTILL_CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "The capital of France?"}],
]

# Qwen2.5-Instruct's chat template (fixtures/chat/README.md says where it comes from).
QWEN25_TEMPLATE = REPO / "fixtures" / "chat" / "qwen2.5-instruct.chat_template.jinja"

# Qwen3-0.6B's generation_config.json (values; ids are per tokenizer).
QWEN3_GENERATION = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}


# ----------------------------------------------------------------------------------------------
# Checkpoint specifications
# ----------------------------------------------------------------------------------------------

SPECS = [
    dict(
        name="tiny-f32-tied-gqa2",
        config_style="hub",
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=32,  # not hidden/heads (16)
        write_head_dim=True,
        layers=2,
        intermediate=160,
        vocab=512,
        tied=True,
        rope_theta=1000000,
        eps=1e-6,
        max_pos=256,
        dtype="float32",
        shards=1,
        eos_in_config="single",
        base_seed=1000,
        random_prompt_lens=[1, 6, 20],
    ),
    dict(
        name="tiny-bf16-untied-mha",
        config_style="transformers5",
        hidden=64,
        heads=4,
        kv_heads=4,
        # No head_dim key in config.json. Qwen3Config (transformers 5.23.0, and 4.x) then uses its
        # class default head_dim = 128, NOT hidden/heads (= 16): the weights are shaped for 128.
        head_dim=128,
        write_head_dim=False,
        layers=3,
        intermediate=128,
        vocab=512,
        tied=False,
        rope_theta=500000.0,
        eps=1e-6,
        max_pos=512,
        dtype="bfloat16",
        shards=1,
        eos_in_config="list",
        base_seed=2000,
        random_prompt_lens=[1, 6, 21],
    ),
    dict(
        name="tiny-f16-sharded-gqa4",
        config_style="hub",
        hidden=64,
        heads=8,
        kv_heads=2,
        head_dim=16,  # not hidden/heads (8)
        write_head_dim=True,
        layers=2,
        intermediate=96,
        vocab=512,
        tied=False,
        rope_theta=10000,
        eps=1e-5,
        max_pos=128,
        dtype="float16",
        shards=3,
        eos_in_config="single",
        base_seed=3000,
        random_prompt_lens=[1, 6, 19],
    ),
    # Qwen2 (Qwen2ForCausalLM): q/k/v biases, no q/k norms, head_dim = hidden / heads (no key).
    # Between them: both config layouts, tied and untied, GQA 2 and 4, rope_theta 1e6 and 1e4,
    # eps 1e-6 and 1e-5, one file and two shards.
    dict(
        name="tiny-qwen2-f32-tied-gqa2",
        arch="qwen2",
        config_style="hub",
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=16,
        write_head_dim=False,
        layers=2,
        intermediate=160,
        vocab=512,
        tied=True,
        rope_theta=1000000.0,
        eps=1e-6,
        max_pos=256,
        dtype="float32",
        shards=1,
        eos_in_config="single",
        base_seed=5000,
        random_prompt_lens=[1, 6, 20],
    ),
    dict(
        name="tiny-qwen2-bf16-untied-gqa4-sharded",
        arch="qwen2",
        config_style="transformers5",
        hidden=128,
        heads=8,
        kv_heads=2,
        head_dim=16,
        write_head_dim=False,
        layers=2,
        intermediate=96,
        vocab=512,
        tied=False,
        rope_theta=10000.0,
        eps=1e-5,
        max_pos=128,
        dtype="bfloat16",
        shards=2,
        eos_in_config="list",
        base_seed=6000,
        random_prompt_lens=[1, 6, 19],
    ),
    # The first Qwen2 checkpoint's shapes with a DeepSeek-R1-Distill-style tokenizer (see
    # DISTILL_BOS): its text prompt starts with the BOS the post-processor adds.
    dict(
        name="tiny-qwen2-bos-tokenizer",
        arch="qwen2",
        distill_tokenizer=True,
        config_style="hub",
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=16,
        write_head_dim=False,
        layers=2,
        intermediate=160,
        vocab=512,
        tied=True,
        rope_theta=1000000.0,
        eps=1e-6,
        max_pos=256,
        dtype="float32",
        shards=1,
        eos_in_config="single",
        base_seed=7000,
        random_prompt_lens=[],
    ),
    dict(
        name="tiny-qwen3-fullvocab",
        config_style="hub",
        hidden=32,
        heads=4,
        kv_heads=2,
        head_dim=16,
        write_head_dim=True,
        layers=2,
        intermediate=64,
        vocab=151936,
        tied=True,
        rope_theta=1000000,
        eps=1e-6,
        max_pos=40960,
        dtype="bfloat16",
        shards=1,
        eos_in_config="single",
        base_seed=4000,
        random_prompt_lens=[],
        full_vocab=True,
    ),
    # YaRN in the hub dialect, the way Qwen3's model cards say to enable it: top-level rope_theta
    # plus a rope_scaling dict. factor 4 = max_pos 256 / original 64, and the 100-id prompt takes
    # positions well past the original 64 (YaRN is static in transformers: the same scaled
    # inv_freq and cos/sin factor at every position, short prompts included).
    dict(
        name="tiny-qwen3-yarn",
        config_style="hub",
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=32,
        write_head_dim=True,
        layers=2,
        intermediate=128,
        vocab=512,
        tied=True,
        rope_theta=10000,
        eps=1e-6,
        max_pos=256,
        dtype="float32",
        shards=1,
        eos_in_config="single",
        base_seed=8000,
        random_prompt_lens=[1, 6, 100],
        min_distinct_greedy=MIN_DISTINCT_GREEDY,
    ),
    # YaRN on Qwen2, the way Qwen2.5's model cards say to enable it: the hub config.json (Qwen2.5's
    # keys) plus "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
    # "type": "yarn"}, with the older key `type` (not `rope_type`) that transformers still reads.
    # Scaled down to an original 64 positions (factor 4 = max_pos 256 / 64; Qwen2.5 itself keeps
    # max_position_embeddings = the original 32768, and transformers 5 uses the explicit factor
    # either way); rope_theta 1e6 as in Qwen2.5, and the 100-id prompt takes positions well past 64.
    dict(
        name="tiny-qwen2-yarn",
        arch="qwen2",
        config_style="hub",
        rope_scaling={"factor": 4.0, "original_max_position_embeddings": 64, "type": "yarn"},
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=16,
        write_head_dim=False,
        layers=2,
        intermediate=160,
        vocab=512,
        tied=True,
        rope_theta=1000000.0,
        eps=1e-6,
        max_pos=256,
        dtype="float32",
        shards=1,
        eos_in_config="single",
        base_seed=11000,
        random_prompt_lens=[1, 6, 100],
        min_distinct_greedy=MIN_DISTINCT_GREEDY,
    ),
    # Qwen3MoeForCausalLM exactly as Qwen/Qwen3-30B-A3B ships it: the hub config keys and one
    # tensor per expert and projection (model.layers.N.mlp.experts.E.gate_proj.weight ...), which
    # transformers 5 fuses on load. `moe` holds the MoE config values; `experts` the file layout.
    dict(
        name="tiny-qwen3moe-bf16-tied",
        arch="qwen3_moe",
        config_style="hub",
        moe=dict(num_experts=8, top_k=2, moe_intermediate=32, norm_topk_prob=True,
                 decoder_sparse_step=1, mlp_only_layers=[], router_gain=2.0),
        experts="per_expert",
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=32,
        write_head_dim=True,
        layers=2,
        intermediate=96,  # config.json's intermediate_size; no layer uses it (all are sparse)
        vocab=512,
        tied=True,
        rope_theta=1000000.0,
        eps=1e-6,
        max_pos=256,
        dtype="bfloat16",
        shards=1,
        eos_in_config="single",
        base_seed=9000,
        random_prompt_lens=[1, 6, 20],
        min_distinct_greedy=MIN_DISTINCT_GREEDY,
        max_seed_tries=3000,
    ),
    # Qwen3MoeForCausalLM as transformers 5.23 itself describes it: its config.json dialect
    # (num_local_experts, rope_parameters with YaRN whose factor 2 is NOT max_pos / original = 4:
    # transformers uses the explicit factor and only warns), the fused expert tensors it holds in
    # memory (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]), top-3 without
    # renormalising the routing weights, and a dense layer (mlp_only_layers [1]) between two sparse
    # ones, whose MLP has intermediate_size (96), not moe_intermediate_size.
    dict(
        name="tiny-qwen3moe-f32-sharded-dense-yarn",
        arch="qwen3_moe",
        config_style="transformers5",
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 2.0,
                         "original_max_position_embeddings": 64},
        moe=dict(num_experts=8, top_k=3, moe_intermediate=24, norm_topk_prob=False,
                 decoder_sparse_step=1, mlp_only_layers=[1], router_gain=1.5),
        experts="fused",
        hidden=64,
        heads=8,
        kv_heads=2,
        head_dim=16,  # not hidden/heads (8)
        write_head_dim=True,
        layers=3,
        intermediate=96,
        vocab=512,
        tied=False,
        rope_theta=1000000.0,
        eps=1e-5,
        max_pos=256,
        dtype="float32",
        shards=2,
        eos_in_config="list",
        base_seed=10000,
        random_prompt_lens=[1, 6],
        min_distinct_greedy=MIN_DISTINCT_GREEDY,
        max_seed_tries=3000,
    ),
]

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ----------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------


def build_small_tokenizer(real_tok_json: dict, vocab_size: int, added_tokens=SMALL_ADDED_TOKENS) -> dict:
    """Train a byte-level BPE with Qwen3's exact normalizer / pre-tokenizer / decoder.

    The BPE part gets vocab_size - 5 - 5 tokens (256 byte symbols + merges), the five added tokens
    follow it, and the last 5 ids of the model's vocab have no token at all, like Qwen3 (model
    vocab 151936 > tokenizer 151669).
    """
    split_regex = real_tok_json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    bpe_size = vocab_size - 2 * len(added_tokens)
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(TRAIN_TEXT.splitlines(keepends=True), trainer)
    n_bpe = tok.get_vocab_size()
    assert n_bpe == bpe_size, f"BPE training produced {n_bpe} tokens, wanted {bpe_size}"
    for content, special in added_tokens:
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tok.add_special_tokens([t])
        else:
            tok.add_tokens([t])

    j = json.loads(tok.to_str())
    # Copy Qwen3's component definitions verbatim so the structure is identical.
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder", "truncation", "padding"):
        j[key] = real_tok_json[key]
    real_model = real_tok_json["model"]
    model = {k: real_model[k] for k in real_model if k not in ("vocab", "merges")}
    model["vocab"] = j["model"]["vocab"]
    model["merges"] = j["model"]["merges"]
    j["model"] = model
    real_flags = {a["content"]: a for a in real_tok_json["added_tokens"]}
    added = []
    for a in j["added_tokens"]:
        # Tokens Qwen3 lacks (the distill tokenizer's) keep the flags the library wrote.
        r = dict(real_flags.get(a["content"], a))
        r["id"] = a["id"]
        added.append(r)
    j["added_tokens"] = added
    j = {k: j[k] for k in real_tok_json.keys()}  # Qwen3's key order
    # Round trip through the library to be sure it loads and agrees with what we meant.
    check = Tokenizer.from_str(json.dumps(j))
    assert check.get_vocab_size(with_added_tokens=True) == vocab_size - len(added_tokens)
    for content, _ in added_tokens:
        assert check.token_to_id(content) < vocab_size
    return j


def small_tokenizer_config(real_cfg: dict, tok_json: dict) -> dict:
    cfg = dict(real_cfg)
    cfg["added_tokens_decoder"] = {
        str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
        for a in tok_json["added_tokens"]
    }
    cfg["additional_special_tokens"] = [
        a["content"] for a in tok_json["added_tokens"] if a["special"] and a["content"] != "<|endoftext|>"
    ]
    assert cfg["eos_token"] == "<|im_end|>" and cfg["pad_token"] == "<|endoftext|>"
    return cfg


# ----------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------


def sparse_layers(spec: dict) -> set:
    """The layers Qwen3MoeDecoderLayer gives a Qwen3MoeSparseMoeBlock: not in mlp_only_layers and
    (layer + 1) % decoder_sparse_step == 0. Dense checkpoints have none."""
    moe = spec.get("moe")
    if moe is None:
        return set()
    return {
        l for l in range(spec["layers"])
        if l not in moe["mlp_only_layers"] and moe["num_experts"] > 0 and (l + 1) % moe["decoder_sparse_step"] == 0
    }


def fuse_experts(weights: dict, spec: dict) -> dict:
    """The per-expert tensors of make_weights in the layout transformers 5 holds in memory (and
    writes with save_pretrained(save_original_format=False)): mlp.experts.gate_up_proj
    [E, 2I, H], each expert's gate_proj rows first, then its up_proj rows (Qwen3MoeExperts.forward
    does `.chunk(2, dim=-1)` into gate, up), and mlp.experts.down_proj [E, H, I]. No `.weight`
    suffix: they are nn.Parameters of Qwen3MoeExperts itself."""
    n = spec["moe"]["num_experts"]
    out = {}
    for k, v in weights.items():
        if ".mlp.experts." not in k:
            out[k] = v
            continue
        p = k.split("mlp.experts.")[0] + "mlp.experts."
        if p + "gate_up_proj" in out:
            continue
        # Inserted where the layer's first expert tensor was, so the key order stays layer-major.
        out[p + "gate_up_proj"] = torch.stack([
            torch.cat([weights[f"{p}{e}.gate_proj.weight"], weights[f"{p}{e}.up_proj.weight"]]) for e in range(n)
        ])
        out[p + "down_proj"] = torch.stack([weights[f"{p}{e}.down_proj.weight"] for e in range(n)])
    return out


def make_weights(spec: dict, seed: int) -> dict:
    """Random f32 weights, scaled so logits are far from uniform.

    Matrices: N(0, (gain / sqrt(fan_in))^2), gain 1 to 2 (std 0.125 to 0.25 for fan_in 64), so
    each block moves the residual stream noticeably without blowing it up (a residual of ~25
    already costs 1e-5 of f32 noise between two torch evaluation orders). q/k are followed by
    q_norm/k_norm, so their scale only matters through the norm weights. Embeddings N(0, 0.35^2)
    and lm_head gain 2.5, so logits have a std of a few units: the softmax max probability is far
    above 1/vocab. Every RMSNorm weight is U(0.5, 1.5): an
    implementation that drops it, or applies (1 + w) as Gemma does, fails the reference.
    A sparse MoE layer draws, in place of the dense MLP, its router (gain moe["router_gain"]) and
    then each expert's gate/up/down with the dense MLP's gains; dense specs draw exactly what they
    always did, in the same order.
    """
    g = torch.Generator().manual_seed(seed)
    h, hd, nh, nkv, inter, V = (spec[k] for k in ("hidden", "head_dim", "heads", "kv_heads", "intermediate", "vocab"))

    def mat(out_f, in_f, gain=2.0):
        return torch.randn(out_f, in_f, generator=g) * (gain / math.sqrt(in_f))

    def norm(n):
        return torch.rand(n, generator=g) + 0.5

    qwen2 = spec.get("arch") == "qwen2"
    sparse = sparse_layers(spec)
    w = {}
    w["model.embed_tokens.weight"] = torch.randn(V, h, generator=g) * 0.35
    for l in range(spec["layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm(h)
        # Qwen2 has no q/k norms, so the scale of q and k reaches the softmax: gain 1.
        w[p + "self_attn.q_proj.weight"] = mat(nh * hd, h, gain=1.0 if qwen2 else 2.0)
        w[p + "self_attn.k_proj.weight"] = mat(nkv * hd, h, gain=1.0 if qwen2 else 2.0)
        w[p + "self_attn.v_proj.weight"] = mat(nkv * hd, h, gain=1.0)
        if qwen2:
            # Biases N(0, 0.5^2): as large as a projection's outputs, so dropping one (or adding
            # it after RoPE) moves the logits far beyond the test tolerances.
            w[p + "self_attn.q_proj.bias"] = torch.randn(nh * hd, generator=g) * 0.5
            w[p + "self_attn.k_proj.bias"] = torch.randn(nkv * hd, generator=g) * 0.5
            w[p + "self_attn.v_proj.bias"] = torch.randn(nkv * hd, generator=g) * 0.5
        w[p + "self_attn.o_proj.weight"] = mat(h, nh * hd, gain=1.0)
        if not qwen2:
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        if l in sparse:
            moe = spec["moe"]
            # The router sees the post-attention RMSNorm output (rms ~1.04 with U(0.5, 1.5) norm
            # weights), so a token's router logits are iid N(0, (1.04 * router_gain)^2) across
            # experts: see MIN_ROUTER_TOPK_GAP for how the gain was chosen.
            w[p + "mlp.gate.weight"] = mat(moe["num_experts"], h, gain=moe["router_gain"])
            # The hub's per-expert names; build_checkpoint fuses them for an `experts="fused"` spec.
            mi = moe["moe_intermediate"]
            for e in range(moe["num_experts"]):
                q = f"{p}mlp.experts.{e}."
                w[q + "gate_proj.weight"] = mat(mi, h, gain=1.5)
                w[q + "up_proj.weight"] = mat(mi, h, gain=1.5)
                w[q + "down_proj.weight"] = mat(h, mi, gain=1.0)
            continue
        w[p + "mlp.gate_proj.weight"] = mat(inter, h, gain=1.5)
        w[p + "mlp.up_proj.weight"] = mat(inter, h, gain=1.5)
        w[p + "mlp.down_proj.weight"] = mat(h, inter, gain=1.0)
    w["model.norm.weight"] = norm(h)
    if not spec["tied"]:
        w["lm_head.weight"] = mat(V, h, gain=2.5)
    return w


def save_weights(out: Path, weights: dict, dtype: torch.dtype, shards: int) -> None:
    """Write safetensors the way transformers' save_pretrained does (metadata format=pt; sharded
    files model-0000N-of-0000M.safetensors with model.safetensors.index.json)."""
    sd = {k: v.to(dtype).contiguous() for k, v in weights.items()}
    meta = {"format": "pt"}
    if shards == 1:
        safetensors.torch.save_file(sd, str(out / "model.safetensors"), metadata=meta)
        return
    total = sum(t.numel() * t.element_size() for t in sd.values())
    # Pick the smallest shard size that yields exactly `shards` files.
    split = None
    for size in range(total // shards, total + 1, 64):
        s = split_torch_state_dict_into_shards(sd, max_shard_size=size)
        if len(s.filename_to_tensors) == shards:
            split = s
            break
    assert split is not None, "could not split into the requested number of shards"
    for fname, names in split.filename_to_tensors.items():
        safetensors.torch.save_file({n: sd[n] for n in names}, str(out / fname), metadata=meta)
    index = {
        "metadata": {"total_parameters": sum(t.numel() for t in sd.values()), **split.metadata},
        "weight_map": split.tensor_to_filename,
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------


def hub_config(spec: dict, bos: int, eos) -> dict:
    """config.json with exactly the keys (and key order) of Qwen3-0.6B's hub config.json."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "head_dim": spec["head_dim"],
        "hidden_act": "silu",
        "hidden_size": spec["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate"],
        "max_position_embeddings": spec["max_pos"],
        "max_window_layers": spec["layers"],
        "model_type": "qwen3",
        "num_attention_heads": spec["heads"],
        "num_hidden_layers": spec["layers"],
        "num_key_value_heads": spec["kv_heads"],
        "rms_norm_eps": spec["eps"],
        # null in Qwen3-0.6B; a YaRN dict where Qwen3's model cards say to add one.
        "rope_scaling": spec.get("rope_scaling"),
        "rope_theta": spec["rope_theta"],
        "sliding_window": None,
        "tie_word_embeddings": spec["tied"],
        "torch_dtype": spec["dtype"],
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec["vocab"],
    }


def qwen3moe_hub_config(spec: dict, bos: int, eos) -> dict:
    """config.json with exactly the keys (and key order) of Qwen3-30B-A3B's hub config.json:
    Qwen3-0.6B's plus the MoE keys, `num_experts` (not transformers 5's num_local_experts),
    output_router_logits and router_aux_loss_coef (training-only, but present)."""
    moe = spec["moe"]
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "decoder_sparse_step": moe["decoder_sparse_step"],
        "eos_token_id": eos,
        "head_dim": spec["head_dim"],
        "hidden_act": "silu",
        "hidden_size": spec["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate"],
        "max_position_embeddings": spec["max_pos"],
        "max_window_layers": spec["layers"],
        "mlp_only_layers": moe["mlp_only_layers"],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": moe["moe_intermediate"],
        "norm_topk_prob": moe["norm_topk_prob"],
        "num_attention_heads": spec["heads"],
        "num_experts": moe["num_experts"],
        "num_experts_per_tok": moe["top_k"],
        "num_hidden_layers": spec["layers"],
        "num_key_value_heads": spec["kv_heads"],
        "output_router_logits": False,
        "rms_norm_eps": spec["eps"],
        "rope_scaling": spec.get("rope_scaling"),
        "rope_theta": spec["rope_theta"],
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": spec["tied"],
        "torch_dtype": spec["dtype"],
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec["vocab"],
    }


def qwen2_hub_config(spec: dict, bos: int, eos) -> dict:
    """config.json with exactly the keys (and key order) of Qwen2.5-0.5B-Instruct's hub
    config.json (no head_dim: Qwen2 takes hidden / heads). Qwen2.5's config.json has no
    rope_scaling key at all (not even null); a spec with one gets the dict its model cards say to
    add for long context, placed in sorted position (before rope_theta) like every other key of
    that file, which save_pretrained writes sorted. JSON readers ignore key order."""
    assert spec["head_dim"] == spec["hidden"] // spec["heads"] and not spec["write_head_dim"]
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "hidden_act": "silu",
        "hidden_size": spec["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": spec["intermediate"],
        "max_position_embeddings": spec["max_pos"],
        "max_window_layers": spec["layers"],
        "model_type": "qwen2",
        "num_attention_heads": spec["heads"],
        "num_hidden_layers": spec["layers"],
        "num_key_value_heads": spec["kv_heads"],
        "rms_norm_eps": spec["eps"],
        "rope_theta": spec["rope_theta"],
        "sliding_window": spec["max_pos"],
        "tie_word_embeddings": spec["tied"],
        "torch_dtype": spec["dtype"],
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec["vocab"],
    }
    assert list(cfg) == sorted(cfg)
    if spec.get("rope_scaling") is not None:
        cfg["rope_scaling"] = dict(spec["rope_scaling"])
        cfg = dict(sorted(cfg.items()))
    return cfg


def transformers5_config(spec: dict, bos: int, eos) -> dict:
    """config.json as transformers 5 writes it (Qwen3Config, Qwen2Config or
    Qwen3MoeConfig.save_pretrained), minus head_dim when the spec says so (Qwen2 states none:
    hidden / heads)."""
    if spec.get("arch") == "qwen3_moe":
        return qwen3moe_transformers5_config(spec, bos, eos)
    qwen2 = spec.get("arch") == "qwen2"
    kwargs = dict(
        vocab_size=spec["vocab"],
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        max_position_embeddings=spec["max_pos"],
        rms_norm_eps=spec["eps"],
        tie_word_embeddings=spec["tied"],
        rope_parameters={"rope_type": "default", "rope_theta": spec["rope_theta"]},
        bos_token_id=bos,
        eos_token_id=eos,
        max_window_layers=spec["layers"],
    )
    if qwen2:
        assert spec["head_dim"] == spec["hidden"] // spec["heads"] and not spec["write_head_dim"]
        cfg = transformers.Qwen2Config(**kwargs)
        cfg.architectures = ["Qwen2ForCausalLM"]
    else:
        cfg = transformers.Qwen3Config(head_dim=spec["head_dim"], **kwargs)
        cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.dtype = TORCH_DTYPES[spec["dtype"]]
    d = json.loads(cfg.to_json_string(use_diff=True))  # what save_pretrained writes
    if not spec["write_head_dim"]:
        d.pop("head_dim", None)
    assert "rope_theta" not in d and "torch_dtype" not in d and d["dtype"] == spec["dtype"]
    return d


def qwen3moe_transformers5_config(spec: dict, bos: int, eos) -> dict:
    """config.json as Qwen3MoeConfig.save_pretrained writes it in transformers 5.23.0. Its
    attribute_map sends num_experts to num_local_experts, so that is the key it writes (it reads
    either). It has no max_window_layers or layer_types. head_dim is kept: without it
    Qwen3MoeAttention falls back to hidden / heads (no class default of 128, unlike Qwen3Config)."""
    moe = spec["moe"]
    assert spec["write_head_dim"]
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=spec["vocab"],
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        head_dim=spec["head_dim"],
        max_position_embeddings=spec["max_pos"],
        rms_norm_eps=spec["eps"],
        tie_word_embeddings=spec["tied"],
        # A copy: the config standardises the dict it is given in place.
        rope_parameters=dict(spec.get("rope_parameters") or {"rope_type": "default", "rope_theta": spec["rope_theta"]}),
        num_experts=moe["num_experts"],
        num_experts_per_tok=moe["top_k"],
        moe_intermediate_size=moe["moe_intermediate"],
        norm_topk_prob=moe["norm_topk_prob"],
        decoder_sparse_step=moe["decoder_sparse_step"],
        mlp_only_layers=list(moe["mlp_only_layers"]),
        bos_token_id=bos,
        eos_token_id=eos,
    )
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    cfg.dtype = TORCH_DTYPES[spec["dtype"]]
    d = json.loads(cfg.to_json_string(use_diff=True))  # what save_pretrained writes
    assert "rope_theta" not in d and "torch_dtype" not in d and d["dtype"] == spec["dtype"]
    assert d["num_local_experts"] == moe["num_experts"] and "num_experts" not in d
    assert d["rope_parameters"]["rope_theta"] == spec["rope_theta"]
    return d


def generation_config(bos: int, eos_list: list) -> dict:
    """Shaped like Qwen3-0.6B's generation_config.json."""
    return {
        "bos_token_id": bos,
        "do_sample": QWEN3_GENERATION["do_sample"],
        "eos_token_id": eos_list,
        "pad_token_id": bos,
        "temperature": QWEN3_GENERATION["temperature"],
        "top_k": QWEN3_GENERATION["top_k"],
        "top_p": QWEN3_GENERATION["top_p"],
        "transformers_version": "4.51.0",
    }


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# Reference computation
# ----------------------------------------------------------------------------------------------


ARCH_CLASS = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def reference_load_kwargs(spec: dict) -> dict:
    """from_pretrained arguments beyond the dtype. MoE: transformers 5 defaults the experts to
    "grouped_mm" (get_correct_experts_implementation), whose CPU kernel sorts tokens by expert and
    sums each token's experts in top-k order; experts_implementation="eager" sets
    config._experts_implementation, and the @use_experts_implementation dispatch then finds no
    registered function for "eager" and runs Qwen3MoeExperts' own forward, the plain loop over the
    hit experts that a port reads. load_reference_model asserts it took."""
    kw = {"attn_implementation": "eager"}
    if spec.get("arch") == "qwen3_moe":
        kw["experts_implementation"] = "eager"
    return kw


def load_reference_model(ckpt: Path, spec: dict):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(ckpt), dtype=torch.float32, output_loading_info=True, **reference_load_kwargs(spec)
    )
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"{ckpt}: loading problems {bad}"
    model.eval()
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert head_dim == spec["head_dim"], (head_dim, spec["head_dim"])
    want_arch = ARCH_CLASS[spec.get("arch", "qwen3")]
    assert type(model).__name__ == want_arch, type(model).__name__
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == spec["tied"]
    rope = spec.get("rope_scaling") or spec.get("rope_parameters")
    if rope is not None:
        check_yarn(model, spec, rope)
    if spec.get("arch") == "qwen3_moe":
        check_moe(model, ckpt, spec)
    return model


def check_yarn(model, spec: dict, rope: dict) -> None:
    """The config.json's YaRN dict reached the model (Qwen3, Qwen3-MoE or Qwen2; `rope_type` or
    Qwen2.5's older key `type`): rope_type yarn, the factor and original length as written, cos/sin
    scaled by 0.1 * ln(factor) + 1 (YaRN's attention factor), and the inverse frequencies scaled:
    the fastest one kept, the slowest divided by the factor (both outside the ramp on every
    fixture)."""
    emb = model.model.rotary_emb
    assert emb.rope_type == "yarn", emb.rope_type
    assert rope.get("rope_type", rope.get("type")) == "yarn", rope
    rp = model.config.rope_parameters
    assert rp["rope_type"] == "yarn" and rp["rope_theta"] == spec["rope_theta"], rp
    assert rp["factor"] == rope["factor"], rp
    assert rp["original_max_position_embeddings"] == rope["original_max_position_embeddings"], rp
    want = 0.1 * math.log(rope["factor"]) + 1.0
    assert emb.attention_scaling != 1.0 and abs(emb.attention_scaling - want) < 1e-12, emb.attention_scaling
    dim = spec["head_dim"]
    plain = 1.0 / (spec["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    inv = emb.inv_freq.double()
    assert inv.shape == plain.shape, (inv.shape, plain.shape)
    assert abs(inv[0] / plain[0] - 1) < 1e-6, (inv[0], plain[0])
    assert abs(inv[-1] * rope["factor"] / plain[-1] - 1) < 1e-6, (inv[-1], plain[-1])


def check_moe(model, ckpt: Path, spec: dict) -> None:
    """The sparse/dense layer pattern, the eager experts, and every parameter equal to the
    tensors on disk (per-expert files fused by transformers' conversion: gate rows, then up)."""
    moe = spec["moe"]
    c = model.config
    assert c._experts_implementation == "eager", c._experts_implementation
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob) == (
        moe["num_experts"], moe["top_k"], moe["moe_intermediate"], moe["norm_topk_prob"])
    sparse = sparse_layers(spec)
    for l, layer in enumerate(model.model.layers):
        kind = type(layer.mlp).__name__
        assert kind == ("Qwen3MoeSparseMoeBlock" if l in sparse else "Qwen3MoeMLP"), (l, kind)
    disk = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        disk.update(safetensors.torch.load_file(str(f)))
    if spec["experts"] == "per_expert":
        assert not any(k.endswith("gate_up_proj") for k in disk)
        disk = fuse_experts(disk, spec)
    sd = model.state_dict()
    want_keys = set(disk) | ({"lm_head.weight"} if spec["tied"] else set())
    assert set(sd) == want_keys, set(sd) ^ want_keys
    for k, v in disk.items():
        assert sd[k].dtype == torch.float32 and torch.equal(sd[k], v.float()), k


class RouterCapture:
    """Forward hooks on every sparse layer's router (`mlp.gate`, a Qwen3MoeTopKRouter), which
    returns (router_logits [T, E], routing weights [T, k], expert ids [T, k]); `layers` maps the
    layer index to those three. A dense model has no `mlp.gate` (its MLP has gate_proj), so this
    hooks nothing and captures nothing."""

    def __init__(self, model):
        self.model = model
        self.layers = {}
        self.handles = []

    def __enter__(self):
        for l, layer in enumerate(self.model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                self.handles.append(gate.register_forward_hook(self.hook(l)))
        return self

    def hook(self, l):
        def fn(module, args, out):
            assert l not in self.layers, "a router ran twice in one forward"
            self.layers[l] = tuple(t.detach().clone() for t in out)
        return fn

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return False


def router_topk_gap(router_logits: torch.Tensor, k: int) -> float:
    """Min over tokens of the k-th largest router probability minus the (k+1)-th, the
    probabilities being the router's own softmax (float32)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    top = torch.topk(probs, k + 1, dim=-1).values
    return float((top[:, k - 1] - top[:, k]).min())


@torch.no_grad()
def run_case(model, prompt_ids: list, eos_ids: set):
    """Prefill the prompt in one forward, then greedy-decode GREEDY_STEPS tokens through the KV
    cache (never stopping at EOS). Returns (prompt_logits [P,V], greedy_ids, greedy_logits [G,V],
    full-vs-incremental diff, routers): routers maps each sparse layer to its router outputs over
    prompt + greedy[:-1] in the full-sequence forward (empty for a dense model)."""
    ids = torch.tensor([prompt_ids])
    out = model(input_ids=ids, use_cache=True)
    prompt_logits = out.logits[0].float()
    past = out.past_key_values
    last = prompt_logits[-1]
    greedy_ids, greedy_logits = [], []
    for _ in range(GREEDY_STEPS):
        nxt = int(torch.argmax(last))
        greedy_ids.append(nxt)
        greedy_logits.append(last)
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        last = out.logits[0, -1].float()
    greedy_logits = torch.stack(greedy_logits)

    # Sanity: one full-sequence forward over prompt + greedy[:-1] gives the same logits as the
    # prefill + incremental decode above.
    # The same forward shows every token each sparse layer routed (greedy[-1] is never fed in).
    with RouterCapture(model) as routers:
        full = model(input_ids=torch.tensor([prompt_ids + greedy_ids[:-1]]), use_cache=False).logits[0].float()
    incremental = torch.cat([prompt_logits, greedy_logits[1:]])
    diff = float((full - incremental).abs().max())
    return prompt_logits, greedy_ids, greedy_logits, diff, routers.layers


@torch.no_grad()
def f64_noise(model64, prompt_ids: list, greedy_ids: list, prompt_logits, greedy_logits) -> float:
    """Max |f32 reference - float64 evaluation of the same saved weights| over all rows: the f32
    rounding noise in the reference itself, which bounds how exact any f32 implementation can be."""
    ref = torch.cat([prompt_logits, greedy_logits[1:]]).double()
    full = model64(input_ids=torch.tensor([prompt_ids + greedy_ids[:-1]]), use_cache=False).logits[0]
    return float((full - ref).abs().max())


def top2_gaps(logits: torch.Tensor) -> list:
    t = torch.topk(logits, 2, dim=-1).values
    return (t[:, 0] - t[:, 1]).tolist()


def f32_list(x: torch.Tensor):
    """Each float32 as the shortest decimal that parses back to the same float32 (numpy's
    repr), so no precision is lost (7 significant digits would be ~1e-6 off for logits ~10)."""
    a = x.detach().cpu().numpy().astype(np.float32)
    if a.ndim == 1:
        # str(np.float32) is the shortest string that round-trips to the same float32.
        return [float(str(v)) for v in a]
    return [f32_list(torch.from_numpy(r)) for r in a]


def check_f32_roundtrip(rows: list, ref: torch.Tensor) -> None:
    back = torch.tensor(rows, dtype=torch.float32)
    assert torch.equal(back, ref.float()), "float serialisation lost precision"


def top5(logits: torch.Tensor) -> list:
    v, i = torch.topk(logits, 5, dim=-1)
    out = []
    for vr, ir in zip(v, i):
        vals = f32_list(vr)
        out.append([[int(a), b] for a, b in zip(ir.tolist(), vals)])
    return out


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------


def build_checkpoint(spec: dict, real_tok_dir: Path, work: Path) -> dict:
    name = spec["name"]
    full_vocab = spec.get("full_vocab", False)
    real_tok_json = json.loads((real_tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    real_tok_cfg = json.loads((real_tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))

    if full_vocab:
        tok_json_text = None
        tokenizer = Tokenizer.from_file(str(real_tok_dir / "tokenizer.json"))
    else:
        qwen2 = spec.get("arch") == "qwen2"
        distill = spec.get("distill_tokenizer", False)
        added = DISTILL_ADDED_TOKENS if distill else QWEN2_ADDED_TOKENS if qwen2 else SMALL_ADDED_TOKENS
        tok_json = build_small_tokenizer(real_tok_json, spec["vocab"], added)
        if distill:
            bos_id = next(a["id"] for a in tok_json["added_tokens"] if a["content"] == DISTILL_BOS)
            pp = processors.TemplateProcessing(
                single=f"{DISTILL_BOS} $A", pair=f"{DISTILL_BOS} $A {DISTILL_BOS} $B",
                special_tokens=[(DISTILL_BOS, bos_id)])
            tok_json["post_processor"] = json.loads(pp.__getstate__())
        tok_json_text = json.dumps(tok_json, indent=2, ensure_ascii=False) + "\n"
        tokenizer = Tokenizer.from_str(tok_json_text)
        tok_cfg = small_tokenizer_config(real_tok_cfg, tok_json)
        if distill:
            tok_cfg["chat_template"] = DISTILL_TEMPLATE.read_text(encoding="utf-8").rstrip("\n")
            tok_cfg["bos_token"] = DISTILL_BOS
        elif qwen2:
            tok_cfg["chat_template"] = QWEN25_TEMPLATE.read_text(encoding="utf-8")
    bos = tokenizer.token_to_id("<|endoftext|>")
    im_end = tokenizer.token_to_id("<|im_end|>")
    eos_list = [im_end, bos]
    eos_ids = set(eos_list)
    eos_cfg = im_end if spec["eos_in_config"] == "single" else eos_list
    n_tok = tokenizer.get_vocab_size(with_added_tokens=True)

    qwen2 = spec.get("arch") == "qwen2"
    if spec["config_style"] == "hub":
        moe_arch = spec.get("arch") == "qwen3_moe"
        config = (qwen2_hub_config if qwen2 else qwen3moe_hub_config if moe_arch else hub_config)(spec, bos, eos_cfg)
    else:
        config = transformers5_config(spec, bos, eos_cfg)

    max_tries = spec.get("max_seed_tries", MAX_SEED_TRIES)
    for attempt in range(max_tries):
        seed = spec["base_seed"] + attempt
        ckpt = work / name
        if ckpt.exists():
            shutil.rmtree(ckpt)
        ckpt.mkdir(parents=True)
        write_json(ckpt / "config.json", config)
        write_json(ckpt / "generation_config.json", generation_config(bos, eos_list))
        if full_vocab:
            shutil.copyfile(real_tok_dir / "tokenizer.json", ckpt / "tokenizer.json")
            shutil.copyfile(real_tok_dir / "tokenizer_config.json", ckpt / "tokenizer_config.json")
        else:
            (ckpt / "tokenizer.json").write_text(tok_json_text, encoding="utf-8")
            write_json(ckpt / "tokenizer_config.json", tok_cfg)
        weights = make_weights(spec, seed)
        if spec.get("experts") == "fused":
            weights = fuse_experts(weights, spec)
        save_weights(ckpt, weights, TORCH_DTYPES[spec["dtype"]], spec["shards"])

        model = load_reference_model(ckpt, spec)
        # Prompts: random ids (from a generator seeded by the weight seed) drawn from ids that have
        # a token and are not special, then one text prompt.
        g = torch.Generator().manual_seed(seed + 7919)
        n_plain = min(n_tok, spec["vocab"]) - len(SMALL_ADDED_TOKENS)
        prompts = []
        for n in spec["random_prompt_lens"]:
            prompts.append((None, torch.randint(0, n_plain, (n,), generator=g).tolist()))
        texts = TEXT_PROMPTS_FULLVOCAB if full_vocab else [TEXT_PROMPT_TINY]
        for t in texts:
            prompts.append((t, tokenizer.encode(t, add_special_tokens=True).ids))

        cases, ok, why = [], True, ""
        for text, pids in prompts:
            pl, gids, gl, diff, routers = run_case(model, pids, eos_ids)
            ggap = top2_gaps(gl)
            if min(ggap) < MIN_GREEDY_GAP:
                ok, why = False, f"greedy gap {min(ggap):.2e}"
                break
            if diff > MAX_INCREMENTAL_DIFF:
                ok, why = False, f"full-sequence vs incremental logits differ by {diff:.2e}"
                break
            if eos_ids & set(gids):
                ok, why = False, "EOS in greedy continuation"
                break
            if len(set(gids)) < spec.get("min_distinct_greedy", 0):
                ok, why = False, f"greedy continuation has only {len(set(gids))} distinct ids"
                break
            assert set(routers) == sparse_layers(spec), sorted(routers)
            rgap = min((router_topk_gap(r[0], spec["moe"]["top_k"]) for r in routers.values()), default=None)
            if rgap is not None and rgap < MIN_ROUTER_TOPK_GAP:
                ok, why = False, f"router top-k gap {rgap:.2e}"
                break
            cases.append((text, pids, pl, gids, gl, diff, routers, rgap))
        if not ok:
            print(f"  {name}: seed {seed} rejected ({why})", flush=True)
            continue
        print(f"  {name}: seed {seed} accepted", flush=True)
        break
    else:
        sys.exit(f"{name}: no seed in {max_tries} tries met the gap/EOS conditions")

    model64 = transformers.AutoModelForCausalLM.from_pretrained(
        str(ckpt), dtype=torch.float64, **reference_load_kwargs(spec)
    ).eval()
    ref_cases, stats = [], {"greedy_gaps": [], "prompt_gaps": [], "max_prob": [], "diff": [], "distinct": [], "f64": []}
    moe_stats = {"gaps": [], "experts": {}, "sets": {}, "top1_prob": [], "topk_mass": []}
    for text, pids, pl, gids, gl, diff, routers, rgap in cases:
        noise = f64_noise(model64, pids, gids, pl, gl)
        case = {}
        if text is not None:
            case["prompt_text"] = text
        case["prompt_ids"] = pids
        if not full_vocab:
            rows = f32_list(pl)
            check_f32_roundtrip(rows, pl)
            case["prompt_logits"] = rows
        case["greedy_ids"] = gids
        if not full_vocab:
            rows = f32_list(gl)
            check_f32_roundtrip(rows, gl)
            case["greedy_logits"] = rows
        case["greedy_text"] = tokenizer.decode(gids, skip_special_tokens=False)
        case["prompt_top2_gap"] = f32_list(torch.tensor(top2_gaps(pl)))
        case["greedy_top2_gap"] = f32_list(torch.tensor(top2_gaps(gl)))
        case["top5"] = top5(torch.cat([pl, gl]))
        case["f32_vs_f64_max_abs"] = noise
        if routers:
            # Each sparse layer's choice for the last prompt token (whose logits start the greedy
            # run), in transformers' order: torch.topk of the router softmax, largest first; the
            # weights are what multiplies each expert's output (renormalised when norm_topk_prob).
            case["routing"] = [
                {"layer": l, "experts": routers[l][2][len(pids) - 1].tolist(),
                 "weights": f32_list(routers[l][1][len(pids) - 1])}
                for l in sorted(routers)
            ]
            moe_stats["gaps"].append(rgap)
            for l, (logits, _, idx) in routers.items():
                moe_stats["experts"].setdefault(l, set()).update(idx.flatten().tolist())
                moe_stats["sets"].setdefault(l, set()).update(tuple(sorted(r)) for r in idx.tolist())
                probs = torch.softmax(logits.float(), -1)
                moe_stats["top1_prob"] += probs.max(-1).values.tolist()
                moe_stats["topk_mass"] += torch.topk(probs, spec["moe"]["top_k"], -1).values.sum(-1).tolist()
        ref_cases.append(case)
        stats["f64"].append(noise)
        stats["greedy_gaps"] += top2_gaps(gl)
        stats["prompt_gaps"] += top2_gaps(pl)
        stats["max_prob"] += torch.softmax(torch.cat([pl, gl]), -1).max(-1).values.tolist()
        stats["diff"].append(diff)
        stats["distinct"].append(len(set(gids)))

    chat_cases = []
    if spec.get("distill_tokenizer"):
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
        for messages in DISTILL_CHATS:
            ids = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            rendered = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            chat_cases.append({"messages": messages, "rendered": rendered, "ids": list(ids)})
    ref = {
        "model": name,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "source_dtype": spec["dtype"],
        "seed": seed,
        "greedy_steps": GREEDY_STEPS,
        "eos_token_ids": eos_list,
    }
    if spec.get("rope_scaling") or spec.get("rope_parameters"):
        # What the port must reproduce from config.json: the scaled inverse frequencies (float32,
        # as transformers computes them) and the factor both cos and sin are multiplied by.
        emb = model.model.rotary_emb
        ref["rope"] = {"rope_type": emb.rope_type, "attention_scaling": emb.attention_scaling,
                       "inv_freq": f32_list(emb.inv_freq)}
    if moe_stats["gaps"]:
        ref["min_router_topk_gap"] = min(moe_stats["gaps"])
    ref["cases"] = ref_cases
    if chat_cases:
        ref["chat_cases"] = chat_cases
    # Compact JSON: the logits rows dominate the size; tests parse it, people read README.md.
    text = json.dumps(ref, ensure_ascii=False, separators=(",", ":"))
    (ckpt / "reference.json").write_text(text + "\n", encoding="utf-8")

    V = spec["vocab"]
    s = {
        "name": name,
        "seed": seed,
        "tries": attempt + 1,
        "min_greedy_gap": min(stats["greedy_gaps"]),
        "median_greedy_gap": float(np.median(stats["greedy_gaps"])),
        "min_prompt_gap": min(stats["prompt_gaps"]),
        "max_prob_mean": float(np.mean(stats["max_prob"])),
        "max_prob_min": float(np.min(stats["max_prob"])),
        "uniform_prob": 1.0 / V,
        "max_full_vs_incremental": max(stats["diff"]),
        "max_f32_vs_f64": max(stats["f64"]),
        "distinct_greedy_ids_per_case": stats["distinct"],
    }
    if "rope" in ref:
        s["rope_attention_scaling"] = ref["rope"]["attention_scaling"]
    if moe_stats["gaps"]:
        s["min_router_topk_gap"] = min(moe_stats["gaps"])
        s["router_top1_prob_mean"] = float(np.mean(moe_stats["top1_prob"]))
        s["router_topk_mass_mean"] = float(np.mean(moe_stats["topk_mass"]))
        s["uniform_router_prob"] = 1.0 / spec["moe"]["num_experts"]
        s["distinct_experts_per_layer"] = {l: len(v) for l, v in sorted(moe_stats["experts"].items())}
        s["distinct_topk_sets_per_layer"] = {l: len(v) for l, v in sorted(moe_stats["sets"].items())}
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", help="build only this checkpoint (repeatable)")
    ap.add_argument("--qwen3-tokenizer", type=Path, default=DEFAULT_QWEN3_TOKENIZER,
                    help="directory with the real Qwen3 tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", type=Path, default=OUT_ROOT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = []
    for spec in SPECS:
        if args.only and spec["name"] not in args.only:
            continue
        print(f"building {spec['name']}", flush=True)
        summary.append(build_checkpoint(spec, args.qwen3_tokenizer, args.out))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
