#!/usr/bin/env python3
"""Train a small Qwen3 for a quarter of an hour on text, for quality comparisons that a
random-weight checkpoint cannot make.

A random checkpoint's logits span hundreds, so any rounding moves a token's loss by nats and two
runtimes' perplexities of one quantized file differ by far more than either does wrong
(docs/gguf.md, "Quality beside llama.cpp"). A model trained even briefly predicts text with the
peaked, small-logit distributions of a real one; the same quantized file in two runtimes then
shows what their rounding costs. Where no trained checkpoint can be downloaded, this makes one:

    python3 scripts/make_trained_model.py --qwen3-tokenizer TOK_DIR OUT_DIR

(with PyTorch and transformers 5 installed). A Qwen3ForCausalLM of hidden 256 (4 layers, 4 query
heads and 2 key-value heads of 64, an MLP of 768: every width a multiple of 256, as GGUF's
K-quants need), with the real Qwen3 vocabulary and tokenizer from TOK_DIR (tied embeddings);
with --arch qwen3_5 a Qwen3_5ForCausalLM of the same widths instead (three Gated DeltaNets of 4
key and 4 value heads of 64 and a gated attention layer), still with Qwen3's vocabulary, which is
not Qwen3.5's 248,320 rows, and slower to train (the reference PyTorch delta rule); with --arch
qwen3_5_moe a Qwen3_5MoeForCausalLM of those widths whose every MLP is sparse, 16 experts of 256
with 4 a token and a shared expert of 256, trained with the router's load-balancing loss
(weight 0.001, HF's default) against its sending every token to a few experts. Trained on the
repository's own documentation as it is when the script runs (README.md, ARCHITECTURE.md,
docs/*.md) except docs/transformer.md, whose opening is fixtures/text/eval.md, the evaluation
text: next-token loss, AdamW, --batch sequences of 256 tokens a step (4), --steps steps (120),
seeded by --seed (0). The corpus changes with the docs: the figures in the docs name the commit
whose docs they trained on. OUT_DIR gets config.json, generation_config.json, model.safetensors
(bf16) and the tokenizer files (tokenizer.json, tokenizer_config.json, and chat_template.jinja
where TOK_DIR has one). Prints the loss as it trains and eval.md's perplexity at the end. Do not
commit the output (90 MB; the MoE's 107 MB).
"""

import argparse
import math
import shutil
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
SEQ = 256


def corpus_ids(tok) -> list[int]:
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md"]
    files += sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "transformer.md")
    text = "\n\n".join(p.read_text() for p in files)
    return tok(text)["input_ids"]


def make_model(arch: str):
    """The untrained model: Qwen3, or Qwen3.5's text model (three Gated DeltaNets of 4 key and 4
    value heads of 64 and a gated attention layer, RoPE on a quarter of each head, as
    make_bench_model.py's qwen3.5 shapes but small), dense or with a sparse MLP in every layer."""
    common = dict(
        vocab_size=151936,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    )
    if arch == "qwen3":
        config = transformers.Qwen3Config(rope_theta=1000000.0, intermediate_size=768, **common)
        return transformers.Qwen3ForCausalLM(config)
    qwen3_5 = dict(
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        full_attention_interval=4,
        linear_num_key_heads=4,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        attn_output_gate=True,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": [3, 3, 2],
        },
        **common,
    )
    if arch == "qwen3_5":
        config = transformers.Qwen3_5TextConfig(intermediate_size=768, **qwen3_5)
        return transformers.Qwen3_5ForCausalLM(config)
    # Every layer sparse (Qwen3.5-MoE has no dense layers): 16 experts of 256, 4 a token, so that
    # the router has real choices to lose at q4, and a shared expert of 256 as Qwen3.5-MoE has.
    # The load-balancing loss (HF's weight, 0.001) is on: without it a router can send every token
    # to a few experts, and its re-routing would be that of a router with few near ties.
    config = transformers.Qwen3_5MoeTextConfig(
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
        output_router_logits=True,
        router_aux_loss_coef=0.001,
        **qwen3_5,
    )
    return transformers.Qwen3_5MoeForCausalLM(config)


def held_out_ppl(model, ids: list[int]) -> float:
    model.eval()
    losses, n = 0.0, 0
    with torch.no_grad():
        for at in range(0, len(ids) - 1, SEQ):
            chunk = torch.tensor([ids[at : at + SEQ]])
            if chunk.shape[1] < 2:
                break
            # The loss over tokens 1.. given those before, from the logits: the MoE's `loss` adds
            # the router's load-balancing term, which is no part of the perplexity.
            logits = model(chunk).logits[0, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits, chunk[0, 1:])
            losses += loss.item() * (chunk.shape[1] - 1)
            n += chunk.shape[1] - 1
    model.train()
    return math.exp(losses / n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--qwen3-tokenizer", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--arch", choices=["qwen3", "qwen3_5", "qwen3_5_moe"], default="qwen3")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.qwen3_tokenizer)
    ids = corpus_ids(tok)
    eval_ids = tok((ROOT / "fixtures/text/eval.md").read_text())["input_ids"]
    print(f"corpus: {len(ids)} tokens; eval.md: {len(eval_ids)} tokens")
    model = make_model(args.arch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    data = torch.tensor(ids)
    start = time.time()
    for step in range(args.steps):
        lr = 3e-3 * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        at = torch.randint(0, len(data) - SEQ - 1, (args.batch,))
        batch = torch.stack([data[a : a + SEQ] for a in at])
        out = model(batch, labels=batch)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            # For the MoE, `loss` is the next-token loss plus 0.001 times the balance loss (`aux`,
            # 4, the experts a token, when the router spreads the tokens evenly; more when not).
            aux = getattr(out, "aux_loss", None)
            aux = f", aux {aux.item():.3f}" if aux is not None else ""
            took = time.time() - start
            print(f"step {step}: loss {out.loss.item():.3f}{aux} ({took:.0f} s)", flush=True)
    ppl = held_out_ppl(model, eval_ids)
    print(f"eval.md perplexity (transformers, f32, chunks of {SEQ}): {ppl:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
        if (args.qwen3_tokenizer / name).exists():
            shutil.copy(args.qwen3_tokenizer / name, args.out / name)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
