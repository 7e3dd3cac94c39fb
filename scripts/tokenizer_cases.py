"""Reference cases for the pico-qwen tokenizer, computed with HuggingFace `tokenizers`.

Expected ids and texts come from HF `tokenizers` 0.23.3 on fixtures/tokenizer/tokenizer.json,
never from our own encoder.

  python3 -m venv ../venv-tok && ../venv-tok/bin/pip install tokenizers==0.23.3
  # the committed extra cases:
  ../venv-tok/bin/python scripts/tokenizer_cases.py > fixtures/tokenizer/tokenizer-cases-extra.json
  # a randomized differential set (not committed; see docs/tokenizer.md):
  ../venv-tok/bin/python scripts/tokenizer_cases.py --random 20000 --seed 1 > tok-random.json

Output format: like tokenizer-cases-dev.json ("cases" with text, ids, tokens, decoded,
decoded_skip_special; "decode_cases" with ids and decoded texts), plus each case's
"pretokens": the pieces the pre-tokenizer alone cuts the raw text into (as text).
"""

import argparse
import json
import random
import sys
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_JSON = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"


def bytes_to_unicode():
    """GPT-2's byte -> character table (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


CHAR_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}


def piece_text(piece):
    """A byte-level pre-token back to text (pieces are cut at character boundaries)."""
    return bytes(CHAR_TO_BYTE[c] for c in piece).decode("utf-8")


def case(tok, cid, category, text):
    enc = tok.encode(text)
    pre = tok.pre_tokenizer.pre_tokenize_str(text)
    return {
        "id": cid,
        "category": category,
        "text": text,
        "ids": enc.ids,
        "tokens": enc.tokens,
        "decoded": tok.decode(enc.ids, skip_special_tokens=False),
        "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
        "pretokens": [piece_text(p) for p, _ in pre],
    }


def decode_case(tok, name, ids, note):
    return {
        "name": name,
        "ids": ids,
        "decoded": tok.decode(ids, skip_special_tokens=False),
        "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        "note": note,
    }


# Texts chosen for the corners of each step (see docs/tokenizer.md).
EXTRA = {
    "contractions_case": [
        "'ſa", "'S", "'LL", "'Re", "'VE", "I'M", "don'T", "'ﬅ", "'s'S'ſ", "x'll've", "''s", "' s",
        "'\u017fx", "'D'M'T", "'ﬅx", "'rex", "'REx", "'ſt",
    ],
    "whitespace": [
        "a\u3000\u3000b", "\t\tfoo", "a \u00a0b", "x\u2028y", "\x0b\x0c", "\r\n\r\n  x", " \n \n ",
        "a \n", "   ", "\n", "a  ", " \u0085 x", "\u00a0\u00a0x", "x \t y", "x\r\r\ny", "\u2003 \u2003x",
        "a\n \nb", "  \n", "1 \n 2",
    ],
    "added_tokens": [
        "  <|im_start|>  ", "<|im_start|><|im_end|>", "<|im_start", "<think></think>",
        "<tool_call>x</tool_call>", "abc<|endoftext|>def", "<|im_start|>user\nhi<|im_end|>\n",
        "<<|im_end|>>", "<|im_end|>\u0301", "e<|im_end|>\u0301", "<think>\n\n</think>\n\n",
        "<|fim_prefix|><|fim_suffix|><|fim_middle|>", "<|endoftext|><|endoftext|>",
    ],
    "nfc": [
        "e\u0301", "\u1100\u1161\u11a8", "\u212b", "\u2000x", "x\u0300b", "\u0041\u030a\u0301",
        "\u0958", "\ufb01", "\u1e9b\u0323", "\u00c5\u0301", "ñ vs n\u0303", "\u0344", "\u2126",
        "\u1119\u0306\u1df7", "a\u1df7\u0301", "e\u0301\u1df8\u0316",
    ],
    "numbers_marks": [
        "１２３", "Ⅻ", "½", "٣٤", "3.14159", "x²", "1,000,000", "\u0300\u0301", "a\u20dd",
        "1️⃣", "🇫🇷🇩🇪", "👍🏽", "\u0915\u094d\u0937", "x_y", "__init__",
    ],
    "controls": ["\x00\x01\x7f", "\ufeff", "\ufffd", "a\x00b", "\x1b[31mred\x1b[0m", "\u200b\u200d"],
    "long": [
        "a" * 3000, " " * 300, "\n" * 100, "ab" * 1000, "世界" * 700, "😀" * 200,
        "x" + "\u0301" * 200, "1" * 500, "." * 400, " " * 50 + "x",
    ],
}


def extra_cases(tok):
    cases = []
    for category, texts in EXTRA.items():
        for i, text in enumerate(texts):
            cases.append(case(tok, f"extra-{category}-{i:02d}", category, text))
    byte_ff = tok.token_to_id(bytes_to_unicode()[0xFF])
    byte_e4 = tok.token_to_id(bytes_to_unicode()[0xE4])
    think = tok.token_to_id("<think>")
    emoji = tok.encode("👨‍👩‍👧").ids
    decode_cases = [
        decode_case(tok, "byte_ff", [byte_ff], "0xFF never occurs in UTF-8"),
        decode_case(tok, "lead_byte_then_ascii", [byte_e4, 64], "0xE4 starts a 3-byte sequence"),
        decode_case(tok, "lead_byte_at_end", [64, byte_e4], "incomplete sequence at the end"),
        decode_case(tok, "think_not_special", [think, 9707], "<think> is not special"),
        decode_case(tok, "specials", [151644, 9707, 151645, 151643], "special tokens"),
        decode_case(tok, "emoji_tail", emoji[1:], "an emoji sequence missing its first token"),
        decode_case(tok, "empty", [], "no ids"),
    ]
    return cases, decode_cases


def random_text(rng):
    """A random string mixing the character classes that matter to the pipeline."""
    pools = [
        lambda: chr(rng.randint(0x20, 0x7E)),
        lambda: rng.choice(" \t\n\r\x0b\x0c\u00a0\u3000\u2028\u0085"),
        lambda: chr(rng.randint(0xA0, 0x24F)),
        lambda: chr(rng.randint(0x300, 0x36F)),
        lambda: chr(rng.randint(0x4E00, 0x9FFF)),
        lambda: chr(rng.randint(0x1F300, 0x1FAFF)),
        lambda: chr(rng.randint(0x600, 0x6FF)),
        lambda: chr(rng.randint(0x900, 0x97F)),
        lambda: chr(rng.randint(0xAC00, 0xD7A3)),
        lambda: chr(rng.randint(0x1100, 0x11FF)),
        lambda: rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'ſ"]),
        lambda: rng.choice(["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>",
                            "<tool_call>", "<|im_start", "im_end|>"]),
        lambda: rng.choice(["the", " world", "Hello", "def ", "return", "0x1F", "1234", "\u200d"]),
        lambda: chr(rng.choice([rng.randint(0, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])),
    ]
    mode = rng.random()
    n = rng.randint(0, 40)
    if mode < 0.1:
        raw = bytes(rng.randint(0, 255) for _ in range(n))
        return raw.decode("utf-8", errors="replace")
    weights = [rng.random() for _ in pools]
    out = []
    for _ in range(n):
        out.append(rng.choices(pools, weights)[0]())
    return "".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--random", type=int, default=0, help="emit this many random cases instead")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tok = Tokenizer.from_file(str(TOKENIZER_JSON))
    meta = {
        "tokenizers": tokenizers.__version__,
        "tokenizer_json": "fixtures/tokenizer/tokenizer.json",
        "encode": "Tokenizer.encode(text).ids (add_special_tokens=True)",
        "decode": "Tokenizer.decode(ids, skip_special_tokens=False|True)",
        "pretokens": "Tokenizer.pre_tokenizer.pre_tokenize_str(text), byte-level undone",
        "script": "scripts/tokenizer_cases.py",
    }
    if args.random:
        rng = random.Random(args.seed)
        cases = [case(tok, f"random-{i}", "random", random_text(rng)) for i in range(args.random)]
        decode_cases = []
        meta["random"] = {"count": args.random, "seed": args.seed}
        extra = {}
    else:
        cases, decode_cases = extra_cases(tok)
        # The pre-tokenizer pieces of the dev cases' texts too, for the splitter's own test.
        dev = json.loads((TOKENIZER_JSON.parent / "tokenizer-cases-dev.json").read_text())
        extra = {"dev_pretokens": [
            {"text": c["text"],
             "pretokens": [piece_text(p) for p, _ in tok.pre_tokenizer.pre_tokenize_str(c["text"])]}
            for c in dev["cases"]
        ]}
    json.dump({"meta": meta, "cases": cases, "decode_cases": decode_cases, **extra}, sys.stdout,
              ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
