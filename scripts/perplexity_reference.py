"""HuggingFace's values for `qwen3 perplexity`'s test: fixtures/text/perplexity-reference.json.

On a tiny fixture checkpoint (float32), transformers (eager attention) scores
fixtures/text/eval.md as `qwen3 perplexity` does: the text tokenized by the fixture's
tokenizer.json (with the post-processor's special tokens, as `encode(text)`), cut into chunks of
CTX tokens, each run from an empty cache, the second half of each chunk scored (position i
predicts token i + 1, for i in CTX/2 .. CTX-2, as llama.cpp's llama-perplexity). It records:

- the perplexity of the float32 model: exp(mean of -log_softmax(logits)[next]);
- against the same model with every matrix rounded to bfloat16 (norm weights stay float32, as
  `qwen3 export --dtype bf16` writes them) and run in float32: the mean KL divergence
  KL(p_f32 || p_bf16) and how many positions have the same most likely token.

log_softmax in float64 of the float32 logits, as the command computes it.

The same for a hybrid, fixtures/text/perplexity-reference-qwen3_5moe.json: the Qwen3.5 MoE
fixture (float32 weights, so bfloat16 rounding moves its logits), each chunk run from an empty
cache and a zero recurrent state, as `Qwen3_5MoeForConditionalGeneration` runs text, tokenized
by transformers' own tokenizer for it (Qwen3.5's pre-tokenizer and NFC are built in code, not
read from tokenizer.json).

Developer-only (CI never runs it; it reads the committed fixtures and writes a small JSON):
    ../venv-torch/bin/python scripts/perplexity_reference.py
(requirements: scripts/requirements-fixtures.txt)
"""

import json
import sys
from pathlib import Path

import tokenizers
import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import fixture_qwen3_5  # noqa: E402
import fixture_specs  # noqa: E402

CTX = 64
CHUNKS = 8
# (fixture, output file under fixtures/text/)
MODELS = [
    ("tiny-f32-tied-gqa2", "perplexity-reference.json"),
    ("tiny-qwen3_5moe-f32-sharded", "perplexity-reference-qwen3_5moe.json"),
]


def spec_of(name):
    return next(s for s in fixture_specs.SPECS if s["name"] == name)


def keeps_f32(name, p):
    """What `qwen3 export --dtype bf16` keeps in float32: vectors (norms, biases, A_log,
    dt_bias), the MoE routers and the shared expert's gate, and the Gated DeltaNets'
    convolution filters; every other matrix (the experts' too) is rounded."""
    return (
        p.dim() < 2
        or name.endswith("mlp.gate.weight")
        or name.endswith("shared_expert_gate.weight")
        or ".conv1d." in name
    )


def load(ckpt, bf16):
    spec = spec_of(ckpt.name)
    if spec.get("arch", "").startswith("qwen3_5") or spec.get("arch") == "qwen3_next":
        model = fixture_qwen3_5.load_reference_model(ckpt, torch.float32, spec)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(ckpt), dtype=torch.float32, attn_implementation="eager"
        )
    model.eval()
    if bf16:
        for name, p in model.named_parameters():
            if not keeps_f32(name, p):
                p.data = p.data.to(torch.bfloat16).to(torch.float32)
    return model


def token_ids(ckpt, text):
    spec = spec_of(ckpt.name)
    if spec.get("arch", "").startswith("qwen3_5"):
        return transformers.AutoTokenizer.from_pretrained(str(ckpt))(text)["input_ids"]
    return tokenizers.Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode(text).ids


@torch.no_grad()
def reference(model_name, file_name):
    ckpt = ROOT / "fixtures" / "models" / model_name
    text = (ROOT / "fixtures" / "text" / "eval.md").read_text()
    ids = token_ids(ckpt, text)
    f32, bf16 = load(ckpt, False), load(ckpt, True)
    nll, kl, same, positions = 0.0, 0.0, 0, 0
    for k in range(CHUNKS):
        chunk = ids[k * CTX : (k + 1) * CTX]
        inp = torch.tensor([chunk])
        p = torch.log_softmax(f32(input_ids=inp).logits[0].double(), -1)
        q = torch.log_softmax(bf16(input_ids=inp).logits[0].double(), -1)
        for i in range(CTX // 2, CTX - 1):
            positions += 1
            nll -= float(p[i, chunk[i + 1]])
            kl += float((p[i].exp() * (p[i] - q[i])).sum())
            same += int(torch.argmax(p[i]) == torch.argmax(q[i]))
    out = {
        "model": model_name,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "text": "fixtures/text/eval.md",
        "tokens": len(ids),
        "ctx": CTX,
        "chunks": CHUNKS,
        "positions": positions,
        "perplexity_f32": float(torch.tensor(nll / positions).exp()),
        "bf16_vs_f32": {"kl_mean": kl / positions, "top1_same": same},
    }
    path = ROOT / "fixtures" / "text" / file_name
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


def main():
    for model_name, file_name in MODELS:
        reference(model_name, file_name)


if __name__ == "__main__":
    main()
