#!/usr/bin/env python3
"""Write fixtures/tokenizer/qwen3_5-cases.json: what transformers' `Qwen3_5Tokenizer` does with
Qwen3's vocabulary and merges (fixtures/tokenizer/tokenizer.json) on texts full of combining
marks, decomposed accents and the other characters where Qwen3.5's pre-tokenizer differs from
Qwen2's.

Run once by a developer (never by CI):

    ../venv-torch/bin/python scripts/qwen3_5_tokenizer_cases.py

`Qwen3_5Tokenizer` (transformers 5, `models/qwen3_5/tokenization_qwen3_5.py`) keeps only the
vocabulary and merges of what it is given and builds its own pipeline: NFC, then its
`PRETOKENIZE_REGEX` (letters with their combining marks, digits one at a time), then byte-level
BPE. Qwen3.5's own 248k vocabulary is not reachable here; the pipeline is what this checks, and
Qwen3's vocabulary exercises it as well (the ids are what transformers gives for that
vocabulary). For each text the file holds the split regex's pieces of the text as it is (the
`Split` step alone, HF `tokenizers`), and the ids of the whole pipeline.
"""

import json
import random
from pathlib import Path

import tokenizers
import transformers
from tokenizers import Regex, pre_tokenizers
from transformers.models.qwen3_5 import tokenization_qwen3_5
from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "tokenizer" / "qwen3_5-cases.json"

HAND = [
    "e\u0301",  # e + combining acute: one piece with Qwen3.5, two with Qwen2
    "cafe\u0301 au lait",
    "Cafe\u0301s' re\u0301sume\u0301's",
    " \u0301x",  # a mark after a space, then a letter
    "\u0301\u0302",  # marks alone
    "a\u0301\u0302\u0303b",
    "\u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f",  # Devanagari with virama and vowel signs
    "\u0e01\u0e34\u0e19\u0e02\u0e49\u0e32\u0e27",  # Thai with vowel and tone marks
    "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd",  # Hebrew with points
    "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627",  # Arabic with harakat
    "\u2764\ufe0f \u263a\ufe0e",  # variation selectors (Mn)
    "\U0001f469\u200d\U0001f4bb",  # ZWJ sequence
    "x\u20dd y\u20e3",  # enclosing marks (Me)
    "1\u0301 2\u0302",  # a mark after a digit
    "!\u0301?",  # a mark inside punctuation
    "\n\u0301\n",
    "I'M he'LL we've it'\u0301s",
    "A\u030a\u212b\u00c5",  # NFC composes these to one letter
    "\u1100\u1161\u11a8",  # conjoining jamo: NFC composes a syllable
    "hello world\n\n  123 4567 + \u00e9\u00e8",
    "\u0391\u0301\u03b9\u0308\u0301",
    "\u0300start",
]

POOL = (
    list("abcXYZ019 '\n\t.,!?-_")
    + ["\u0301", "\u0308", "\u0327", "\u093f", "\u094d", "\u0e34", "\u05b8", "\u064e", "\ufe0f", "\u20dd"]
    + ["\u00e9", "\u0915", "\u0e01", "\u05e9", "\u0645", "\u4e2d", "\u3042", "\U0001f642", "\u200d", "\u00a0"]
)


def main():
    assert tokenization_qwen3_5.PRETOKENIZE_REGEX == (
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
    ), "transformers' Qwen3.5 regex changed: update QWEN35_SPLIT_PATTERN"
    src = json.loads((ROOT / "fixtures" / "tokenizer" / "tokenizer.json").read_text())
    vocab = src["model"]["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in src["model"]["merges"]]
    tok = Qwen3_5Tokenizer(vocab=vocab, merges=merges)
    split = pre_tokenizers.Split(Regex(tokenization_qwen3_5.PRETOKENIZE_REGEX), behavior="isolated")

    rng = random.Random(7)
    texts = HAND + ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 24))) for _ in range(300)]
    cases = []
    for text in texts:
        cases.append(
            {
                "text": text,
                "pretokens": [p for p, _ in split.pre_tokenize_str(text)],
                "ids": tok.encode(text, add_special_tokens=False),
            }
        )
    OUT.write_text(
        json.dumps(
            {
                "_comment": "written by scripts/qwen3_5_tokenizer_cases.py: transformers' "
                "Qwen3_5Tokenizer over fixtures/tokenizer/tokenizer.json's vocabulary and merges",
                "transformers_version": transformers.__version__,
                "tokenizers_version": tokenizers.__version__,
                "cases": cases,
            },
            ensure_ascii=False,
            indent=0,
        )
        + "\n"
    )
    print(f"wrote {OUT} ({len(cases)} cases, {OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
