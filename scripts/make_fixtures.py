#!/usr/bin/env python3
"""Build the tiny random-weight Qwen3, Qwen3-MoE and Qwen2 checkpoints in fixtures/models/ and
their HF references.

Run once by a developer (never by CI; CI has no PyTorch):

    python3 -m venv ../venv-torch
    ../venv-torch/bin/pip install -r scripts/requirements-fixtures.txt
    ../venv-torch/bin/python scripts/make_fixtures.py [--only NAME] [--qwen3-tokenizer DIR]

The checkpoints are specified in scripts/fixture_specs.py, their config.json dialects written by
scripts/fixture_configs.py; this file makes the tokenizers and weights, runs transformers for the
references and chooses the seeds.

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

from fixture_configs import (  # noqa: E402 - config.json in the hub's and transformers 5's dialects
    TORCH_DTYPES,
    generation_config,
    hub_config,
    qwen2_hub_config,
    qwen3moe_hub_config,
    transformers5_config,
    write_json,
)
import fixture_qwen3_5  # noqa: E402 - Qwen3.5's checkpoint layout and weights
from fixture_specs import (  # noqa: E402 - the checkpoint specifications and their constants
    OUT_ROOT,
    DEFAULT_QWEN3_TOKENIZER,
    GREEDY_STEPS,
    MIN_GREEDY_GAP,
    MAX_INCREMENTAL_DIFF,
    MIN_ROUTER_TOPK_GAP,
    MAX_SEED_TRIES,
    SMALL_ADDED_TOKENS,
    TRAIN_TEXT,
    TEXT_PROMPT_TINY,
    TEXT_PROMPTS_FULLVOCAB,
    QWEN2_ADDED_TOKENS,
    DISTILL_BOS,
    DISTILL_ADDED_TOKENS,
    DISTILL_TEMPLATE,
    DISTILL_CHATS,
    QWEN25_TEMPLATE,
    SPECS,
)



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
    if spec.get("arch") in fixture_qwen3_5.ARCHS:
        return fixture_qwen3_5.load_reference_model(ckpt, torch.float32, spec)
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
        # Qwen3_5ForConditionalGeneration's decoder is model.model.language_model.
        decoder = getattr(self.model.model, "language_model", self.model.model)
        for l, layer in enumerate(decoder.layers):
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
    if spec.get("arch") == "qwen3_next":
        config = fixture_qwen3_5.next_config(spec, bos, eos_cfg)
    elif spec.get("arch") in fixture_qwen3_5.ARCHS:
        config = fixture_qwen3_5.hub_config(spec, bos, eos_cfg)
    elif spec["config_style"] == "hub":
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
        if spec.get("arch") in fixture_qwen3_5.ARCHS:
            weights = fixture_qwen3_5.checkpoint_weights(spec, config, seed)
        else:
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

    if spec.get("arch") in fixture_qwen3_5.ARCHS:
        model64 = fixture_qwen3_5.load_reference_model(ckpt, torch.float64, spec)
    else:
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
