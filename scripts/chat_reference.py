"""Expected prompt ids of scripted `qwen3 inference -m chat` sessions, rendered by HuggingFace.

Writes fixtures/chat/chat-ui-cases.json, which qwen3-cli/tests/chat.rs checks the chat against.

For each scenario (a list of stdin lines: user messages and slash commands) this
1. runs our chat on the tiny fixture model with greedy sampling and `--verbose-prompt`, only to
   learn the assistant texts the model wrote (its `answer: "..."` lines): with random weights they
   are whatever it is, and the golden prompts must contain exactly those texts;
2. replays the same lines with HuggingFace: each user message is appended, the conversation is
   rendered with `tokenizer.apply_chat_template(messages, tokenize=False,
   add_generation_prompt=True[, enable_thinking=...])` and tokenized with
   `tokenizer.encode(text, add_special_tokens=False)`; then the recorded answer is appended as
   the assistant message. `/reset` clears the messages, `/system TEXT` sets the system prompt and
   clears them, `/think on|off` sets enable_thinking for the following renders (the semantics
   documented in docs/chat.md). When the prompt plus room for the answer (`-n`, at most half
   the context) does not fit in `-c`, the oldest exchange is dropped, as the chat does.
Our code contributes only the assistant texts; every expected id comes from transformers.

Run from the repo root, after `cargo build -p qwen3-cli`, with a virtualenv outside the repo
that has transformers (e.g. ../venv-torch):

    ../venv-torch/bin/python scripts/chat_reference.py [path/to/qwen3]
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import tokenizers
import transformers
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures/models/tiny-qwen3-fullvocab"
OUT = ROOT / "fixtures/chat/chat-ui-cases.json"

# Greedy and short: random weights, so only determinism matters.
COMMON = ["-t", "0", "-n", "6", "--seed", "0"]

SCENARIOS = [
    {
        "name": "three_turns_default_thinking",
        "args": [],
        "lines": ["What is 2 + 2?", "And times 3?", "Thanks! Now divide by 5."],
    },
    {
        "name": "system_thinking_off",
        "args": ["-y", "You are terse.", "--thinking", "off"],
        "lines": ["What is 2 + 2?", "And times 3?", "Thanks! Now divide by 5."],
    },
    {
        "name": "thinking_on_then_commands",
        "args": ["--thinking", "on"],
        "lines": [
            "Hello!",
            "/think off",
            "What is 2 + 2?",
            "/system You are terse.",
            "Hello again.",
            "And now?",
            "/reset",
            "/think on",
            "Bye.",
        ],
    },
    {
        # 60 positions: the third prompt (66 tokens) does not fit, so the oldest exchange is
        # dropped and the kept turns are re-run.
        "name": "context_full_drops_oldest",
        "args": ["-c", "60"],
        "lines": ["What is 2 + 2?", "And times 3?", "Thanks! Now divide by 5."],
    },
]


def run_chat(qwen3, model, scenario):
    cmd = [qwen3, "inference", str(model), "-m", "chat", "--verbose-prompt"]
    cmd += COMMON + scenario["args"]
    stdin = "".join(line + "\n" for line in scenario["lines"])
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True)
    answers = []
    for line in p.stderr.splitlines():
        if line.startswith("answer: "):
            answers.append(json.loads(line[len("answer: "):]))
    return answers


def hf_prompts(tok, scenario, answers):
    args = scenario["args"]
    system = args[args.index("-y") + 1] if "-y" in args else None
    thinking = None
    if "--thinking" in args:
        thinking = args[args.index("--thinking") + 1] == "on"
    ctx = int(args[args.index("-c") + 1]) if "-c" in args else None
    n = int(COMMON[COMMON.index("-n") + 1])
    turns = []
    answers = list(answers)
    prompts = []
    for line in scenario["lines"]:
        if line.startswith("/"):
            cmd, _, rest = line[1:].partition(" ")
            if cmd == "reset":
                turns = []
            elif cmd == "system":
                system = rest.strip() or None
                turns = []
            elif cmd == "think":
                thinking = {"on": True, "off": False, "default": None}[rest.strip()]
            else:
                raise ValueError(line)
            continue
        turns.append({"role": "user", "content": line})
        while True:
            messages = ([{"role": "system", "content": system}] if system else []) + turns
            kwargs = {} if thinking is None else {"enable_thinking": thinking}
            text = tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **kwargs
            )
            ids = tok.encode(text, add_special_tokens=False)
            if ctx is None or len(ids) + max(1, min(n, ctx // 2)) <= ctx or len(turns) == 1:
                break
            # Drop the oldest exchange: the first user message and the answer to it.
            turns = turns[2:]
        prompts.append(ids)
        turns.append({"role": "assistant", "content": answers.pop(0)})
    assert not answers, "more answers than user messages"
    return prompts


def main():
    qwen3 = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target/debug/qwen3")
    tok = AutoTokenizer.from_pretrained(FIXTURE)
    cases = []
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "m.bin"
        subprocess.run(
            [qwen3, "export", str(FIXTURE), str(model), "--dtype", "f32"],
            check=True,
            capture_output=True,
        )
        for s in SCENARIOS:
            answers = run_chat(qwen3, model, s)
            cases.append(
                {
                    "name": s["name"],
                    "args": COMMON + s["args"],
                    "lines": s["lines"],
                    "answers": answers,
                    "prompt_ids": hf_prompts(tok, s, answers),
                }
            )
    out = {
        "meta": {
            "what": "prompt ids of scripted chats, rendered and tokenized by HuggingFace",
            "model": "fixtures/models/tiny-qwen3-fullvocab exported with --dtype f32",
            "answers": "the assistant texts our chat generated (greedy, random weights); "
            "each later prompt contains them",
            "render": "tokenizer.apply_chat_template(messages, tokenize=False, "
            "add_generation_prompt=True[, enable_thinking])",
            "tokenize": "tokenizer.encode(text, add_special_tokens=False)",
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "generator": "scripts/chat_reference.py",
        },
        "cases": cases,
    }
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"{OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
