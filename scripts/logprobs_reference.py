"""HuggingFace's log-probabilities for the logprobs tests: fixtures/models/<name>/logprobs.json.

For each fixture prompt, transformers (float32, eager attention, as scripts/make_fixtures.py's
references) prefills the prompt and decodes greedily; at every step it records
`torch.log_softmax(logits, -1)` of the chosen token and the 5 most likely tokens. Those are the
values `logprobs` must report (before temperature and the other sampling settings), to 1e-4.
It also records the same for every prompt token after the first (`prompt`: the log-probability of
prompt token i+1 under the logits at position i), which `echo` with `logprobs` reports.

Developer-only (CI never runs it; it reads the committed fixtures and writes a small JSON):
    ../venv-torch/bin/python scripts/logprobs_reference.py
(requirements: scripts/requirements-fixtures.txt)
"""

import json
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["tiny-qwen3-fullvocab", "tiny-f32-tied-gqa2"]
STEPS = 8
TOP = 5


@torch.no_grad()
def main():
    for name in MODELS:
        ckpt = ROOT / "fixtures" / "models" / name
        ref = json.loads((ckpt / "reference.json").read_text())
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(ckpt), dtype=torch.float32, attn_implementation="eager"
        )
        model.eval()
        cases = []
        for case in ref["cases"]:
            ids = list(case["prompt_ids"])
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
            prompt = []
            for i in range(1, len(ids)):
                lp = torch.log_softmax(logits[i - 1].double(), -1)
                top = torch.topk(lp, TOP)
                prompt.append(
                    {
                        "token": ids[i],
                        "logprob": float(lp[ids[i]]),
                        "top": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
                    }
                )
            steps = []
            for _ in range(STEPS):
                logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
                lp = torch.log_softmax(logits.double(), -1)
                nxt = int(torch.argmax(logits))
                top = torch.topk(lp, TOP)
                steps.append(
                    {
                        "token": nxt,
                        "logprob": float(lp[nxt]),
                        "top": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
                    }
                )
                ids.append(nxt)
            cases.append({"prompt_ids": case["prompt_ids"], "prompt": prompt, "steps": steps})
        out = {
            "model": name,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "how": "float32 model, eager attention; log_softmax in float64 of the float32 logits "
            "of a full forward over prompt + greedy tokens so far",
            "cases": cases,
        }
        path = ckpt / "logprobs.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(path, len(cases), "cases")


if __name__ == "__main__":
    main()
