"""transformers' scores of Qwen3-Reranker's recipe for the rerank tests:
fixtures/models/tiny-qwen3-fullvocab/rerank.json.

Qwen3-Reranker is a causal LM asked whether a document answers a query; its model card's recipe
(Qwen/Qwen3-Reranker-0.6B, "Transformers Usage") is, for each (query, document):

    prefix = <|im_start|>system ... "yes" or "no".<|im_end|>\\n<|im_start|>user\\n
    text   = <Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {doc}
    suffix = <|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n
    ids    = encode(prefix) + tokenizer(text) + encode(suffix)   (three encodes, as the card)
    score  = softmax(logits[-1][[no, yes]])[1]

This runs that recipe, in float32 with eager attention, on the tiny random checkpoint with the
real Qwen3 tokenizer (whose "yes" and "no" are single tokens), with and without the default
instruction, and records the ids and scores (random weights: the scores mean nothing, but they
are what the recipe gives).

Developer-only (CI never runs it):
    ../venv-torch/bin/python scripts/rerank_reference.py
"""

import json
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
NAME = "tiny-qwen3-fullvocab"
PREFIX = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the '
          'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QUERY = "What is the capital of China?"
DOCUMENTS = [
    "The capital of China is Beijing.",
    "Gravity is a force that attracts two bodies towards each other.",
    "Beijing is a city in northern China.",
    "Paris",
]
INSTRUCTION = "Given a question, find the passage with its answer"


@torch.no_grad()
def main():
    ckpt = ROOT / "fixtures" / "models" / NAME
    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    prefix = tok.encode(PREFIX, add_special_tokens=False)
    suffix = tok.encode(SUFFIX, add_special_tokens=False)
    cases = []
    for instruction in [None, INSTRUCTION]:
        results = []
        for doc in DOCUMENTS:
            text = f"<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {doc}"
            ids = prefix + tok(text)["input_ids"] + suffix
            last = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
            pair = torch.log_softmax(torch.stack([last[no], last[yes]]), 0)
            results.append({"document": doc, "ids": ids, "score": float(pair[1].exp())})
        cases.append({"instruction": instruction, "query": QUERY, "results": results})
    out = {
        "model": NAME,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "yes": yes,
        "no": no,
        "how": "Qwen3-Reranker's recipe (model card): float32, eager attention; "
        "score = softmax over the last position's logits of no and yes, computed in float64",
        "cases": cases,
    }
    path = ckpt / "rerank.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(path, [[round(r["score"], 4) for r in c["results"]] for c in cases])


if __name__ == "__main__":
    main()
