"""The tiny checkpoints scripts/make_fixtures.py builds: one dict per checkpoint (its shapes,
config dialect, dtype, sharding, seeds and prompts), and the constants their seeds are chosen
by. Read by make_fixtures.py; fixtures/README.md documents each checkpoint.
"""

from pathlib import Path

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

# Qwen3-Next (Qwen3NextForCausalLM): tiny-qwen3_5moe-f32-sharded's layers in Qwen3-Next's layout
# (flat config, the Gated DeltaNets' projections fused per key head, per-expert tensor names),
# bf16, with a dense MLP in layer 1 (mlp_only_layers) beside the sparse ones. Four layers: three
# Gated DeltaNets, then gated attention; key and value heads of different sizes (16 and 8), so
# that the fused rows' layout is checked with each size where it belongs.
_QWEN3NEXT = dict(
    name="tiny-qwen3next-bf16",
    arch="qwen3_next",
    config_style="hub",
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=32,
    write_head_dim=True,
    layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    linear=dict(key_heads=2, value_heads=4, key_head_dim=16, value_head_dim=8, conv_kernel=4),
    partial_rotary_factor=0.25,
    moe=dict(num_experts=8, top_k=2, moe_intermediate=32, shared_intermediate=48,
             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], router_gain=1.75),
    intermediate=96,
    vocab=512,
    tied=False,
    rope_theta=10000000,
    eps=1e-6,
    max_pos=512,
    dtype="bfloat16",
    shards=1,
    eos_in_config="single",
    base_seed=12000,
    random_prompt_lens=[1, 70],
    max_seed_tries=3000,
)

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
    # Rows of 256 and 512: every matrix is whole blocks of GGUF's K-quants, so llama-quantize's
    # Q4_K_M of it (scripts/make_gguf_fixtures.py) keeps Q4_K and Q6_K everywhere.
    dict(
        name="tiny-bf16-tied-k256",
        config_style="hub",
        hidden=256,
        heads=4,
        kv_heads=2,
        head_dim=64,
        write_head_dim=True,
        layers=2,
        intermediate=512,
        vocab=512,
        tied=True,
        rope_theta=1000000,
        eps=1e-6,
        max_pos=256,
        dtype="bfloat16",
        shards=1,
        eos_in_config="single",
        base_seed=9000,
        random_prompt_lens=[1, 6, 20],
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
    # Qwen3.5 (Qwen3_5ForConditionalGeneration, the hub's layout; scripts/fixture_qwen3_5.py):
    # three Gated DeltaNet layers to every gated attention layer, RoPE on a quarter of each head,
    # (1 + w) norms, a tiny vision tower and MTP tensors the text model leaves out. Prompts of 70
    # and 210 tokens: more than one 64-token chunk of the delta rule, and more than 200.
    dict(
        name="tiny-qwen3_5-bf16",
        arch="qwen3_5",
        config_style="hub",
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=32,
        write_head_dim=True,
        layers=8,
        layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        linear=dict(key_heads=2, value_heads=4, key_head_dim=16, value_head_dim=16, conv_kernel=4),
        partial_rotary_factor=0.25,
        # Sums to the rotated dimensions' half (32 * 0.25 / 2): text uses none of its split.
        mrope_section=[2, 1, 1],
        intermediate=128,
        vocab=512,
        tied=False,
        rope_theta=10000000,
        eps=1e-6,
        max_pos=512,
        dtype="bfloat16",
        shards=1,
        eos_in_config="single",
        base_seed=9000,
        random_prompt_lens=[1, 70, 210],
    ),
    # Qwen3.5-MoE (Qwen3_5MoeForConditionalGeneration): every MLP a mixture of experts (fused,
    # transformers 5's layout) with a shared expert behind its sigmoid gate; f32 in two shards.
    # Two layers (a Gated DeltaNet, then gated attention) keep the routed token-layers few enough
    # for a seed whose every routing has a clear top-k (MIN_ROUTER_TOPK_GAP); the 66-token
    # prompt still spans a whole chunk of the delta rule.
    dict(
        name="tiny-qwen3_5moe-f32-sharded",
        arch="qwen3_5_moe",
        config_style="hub",
        hidden=64,
        heads=4,
        kv_heads=2,
        head_dim=32,
        write_head_dim=True,
        layers=2,
        layer_types=["linear_attention", "full_attention"],
        linear=dict(key_heads=2, value_heads=4, key_head_dim=16, value_head_dim=16, conv_kernel=4),
        partial_rotary_factor=0.25,
        mrope_section=[2, 1, 1],
        moe=dict(num_experts=8, top_k=2, moe_intermediate=32, shared_intermediate=48,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_gain=1.75),
        intermediate=32,
        vocab=512,
        tied=False,
        rope_theta=10000000,
        eps=1e-6,
        max_pos=512,
        dtype="float32",
        shards=2,
        eos_in_config="single",
        base_seed=11000,
        random_prompt_lens=[1, 66],
        max_seed_tries=3000,
    ),
    _QWEN3NEXT,
    # Qwen3-Next with every layer sparse, as Qwen3-Next-80B-A3B is: the checkpoint of
    # fixtures/gguf/tiny-qwen3next-sparse-bf16-bf16.gguf (llama.cpp's converter maps no dense MLP
    # for `qwen3next`, so it cannot convert tiny-qwen3next-bf16's layer 1). Not in the parity
    # lists: the GGUF test alone reads it.
    dict(
        _QWEN3NEXT,
        name="tiny-qwen3next-sparse-bf16",
        moe=dict(_QWEN3NEXT["moe"], mlp_only_layers=[]),
        base_seed=16000,
    ),
]