//! The command line a newcomer types, end to end through the binary, on
//! `fixtures/models/tiny-qwen3-fullvocab` (random weights, the real Qwen3 tokenizer and template):
//! the short sampling flags (`-t 0.7 -p 0.8 -s 42`), the common aliases, `-n -1`, prompts from a
//! file or stdin, and `qwen3 chat` / `qwen3 generate` as the `inference -m` forms.

mod common;

use common::{binary_dir, fullvocab_model};
use qwen3_test_support::{lossy as text, run_with_stdin};
use std::process::{Command, Output};

/// `qwen3 <args>` with `stdin` fed (then end of input).
fn qwen3_stdin(args: &[&str], stdin: &str) -> Output {
    run_with_stdin(Command::new(env!("CARGO_BIN_EXE_qwen3")).args(args), stdin)
}

fn qwen3(args: &[&str]) -> Output {
    qwen3_stdin(args, "")
}

/// stdout of a run that must succeed.
fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", text(&o.stderr));
    text(&o.stdout)
}

/// The one-line error of a run that must fail (exit 1 or clap's 2), without a panic.
fn fails(o: Output) -> String {
    assert!(!o.status.success(), "succeeded: {}", text(&o.stdout));
    let err = text(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    err
}

const PROMPT: &str = "The capital of France is";

#[test]
fn the_documented_sampling_line_works_and_equals_the_long_flags() {
    let m = fullvocab_model();
    let short = ok(qwen3(&[
        "inference",
        m,
        "-t",
        "0.7",
        "-p",
        "0.8",
        "-s",
        "42",
        "-i",
        PROMPT,
        "-n",
        "8",
    ]));
    assert!(!short.trim().is_empty());
    let long = ok(qwen3(&[
        "inference",
        m,
        "--temperature",
        "0.7",
        "--top-p",
        "0.8",
        "--seed",
        "42",
        "--input",
        PROMPT,
        "--max-tokens",
        "8",
    ]));
    assert_eq!(short, long);
    // The aliases people carry over from llama.cpp and the OpenAI API.
    let alias = ok(qwen3(&[
        "inference",
        m,
        "--temp",
        "0.7",
        "-p",
        "0.8",
        "-s",
        "42",
        "--prompt",
        PROMPT,
        "-n",
        "8",
    ]));
    assert_eq!(short, alias);
    // Another seed samples something else (the seed is used, not ignored).
    let other: Vec<String> = (1..=3)
        .map(|s| {
            let s = s.to_string();
            ok(qwen3(&[
                "inference",
                m,
                "-t",
                "1.5",
                "-s",
                &s,
                "-i",
                PROMPT,
                "-n",
                "8",
            ]))
        })
        .collect();
    assert!(other.iter().any(|o| o != &other[0]), "{other:?}");
    // `-s -1`: a random seed (llama.cpp's convention), shown by --verbose; not clap's tip.
    let seed = |o: &Output| {
        let err = text(&o.stderr);
        assert!(o.status.success(), "{err}");
        let line = err.lines().find(|l| l.starts_with("sampler:")).unwrap();
        line.rsplit("seed ").next().unwrap().to_string()
    };
    let run = || {
        qwen3(&[
            "inference",
            m,
            "-s",
            "-1",
            "-i",
            PROMPT,
            "-n",
            "1",
            "--verbose",
        ])
    };
    let (a, b) = (seed(&run()), seed(&run()));
    assert_ne!(a, b, "-s -1 gave the same seed twice");
    let err = fails(qwen3(&["inference", m, "-s", "-2", "-i", PROMPT]));
    assert!(err.contains("-1 for random"), "{err}");
}

#[test]
fn chat_and_generate_are_the_inference_modes() {
    let m = fullvocab_model();
    let g = ok(qwen3(&["generate", m, "-i", PROMPT, "-n", "6", "-t", "0"]));
    let i = ok(qwen3(&[
        "inference",
        m,
        "-m",
        "generate",
        "-i",
        PROMPT,
        "-n",
        "6",
        "-t",
        "0",
    ]));
    assert_eq!(g, i);
    let c = ok(qwen3_stdin(
        &["chat", m, "-n", "5", "-t", "0", "--thinking", "off"],
        "Hi\nAnd then?\n",
    ));
    let i = ok(qwen3_stdin(
        &[
            "inference",
            m,
            "-m",
            "chat",
            "-n",
            "5",
            "-t",
            "0",
            "--thinking",
            "off",
        ],
        "Hi\nAnd then?\n",
    ));
    assert_eq!(c, i);
    // -m may repeat the command's mode but not contradict it.
    ok(qwen3(&[
        "generate", m, "-m", "generate", "-i", PROMPT, "-n", "1",
    ]));
    let err = fails(qwen3(&["chat", m, "-m", "generate", "-i", PROMPT]));
    assert!(
        err.contains("qwen3 chat is `qwen3 inference -m chat`"),
        "{err}"
    );
}

#[test]
fn prompts_come_from_a_file_or_stdin() {
    let m = fullvocab_model();
    let want = ok(qwen3(&["generate", m, "-i", PROMPT, "-n", "6", "-t", "0"]));
    let f = binary_dir().join("prompt.txt");
    std::fs::write(&f, PROMPT).unwrap();
    let from_file = ok(qwen3(&[
        "generate",
        m,
        "-f",
        f.to_str().unwrap(),
        "-n",
        "6",
        "-t",
        "0",
    ]));
    assert_eq!(from_file, want);
    for flag in ["-i", "-f", "--file"] {
        let o = qwen3_stdin(&["generate", m, flag, "-", "-n", "6", "-t", "0"], PROMPT);
        assert_eq!(ok(o), want, "{flag} -");
    }
    // tokenize and chat-template read `-` as stdin too.
    let ids = ok(qwen3(&["tokenize", m, PROMPT]));
    assert_eq!(ok(qwen3_stdin(&["tokenize", m, "-"], PROMPT)), ids);
    assert_eq!(ok(qwen3_stdin(&["tokenize", m, "-f", "-"], PROMPT)), ids);
    let messages = r#"[{"role": "user", "content": "Hi"}]"#;
    let mf = binary_dir().join("messages.json");
    std::fs::write(&mf, messages).unwrap();
    let rendered = ok(qwen3(&["chat-template", m, mf.to_str().unwrap()]));
    assert!(
        rendered.contains("<|im_start|>user\nHi<|im_end|>"),
        "{rendered}"
    );
    assert_eq!(
        ok(qwen3_stdin(&["chat-template", m, "-"], messages)),
        rendered
    );
    // A missing file and non-UTF-8 input name what they are about.
    let err = fails(qwen3(&["generate", m, "-f", "/nonexistent/prompt.txt"]));
    assert!(
        err.contains("/nonexistent/prompt.txt: cannot read"),
        "{err}"
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qwen3"));
    let err = fails(run_with_stdin(
        cmd.args(["generate", m, "-f", "-"]),
        b"\xff\xfe",
    ));
    assert!(err.contains("stdin: not valid UTF-8 text"), "{err}");
    // -i and -f together are ambiguous.
    fails(qwen3(&["generate", m, "-i", PROMPT, "-f", "-"]));
}

#[test]
fn n_minus_one_runs_until_the_context_is_full() {
    let m = fullvocab_model();
    let o = qwen3(&[
        "generate", m, "-i", PROMPT, "-n", "-1", "-t", "0", "-c", "24", "--top-k", "0",
    ]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("[stopped: context full (24 positions")
            || err.contains("[stopped: end-of-sequence"),
        "{err}"
    );
    // Other negative counts get a message that says what -n takes.
    let err = fails(qwen3(&["generate", m, "-i", PROMPT, "-n", "-2"]));
    assert!(err.contains("-1 for until the context is full"), "{err}");
}

#[test]
fn bench_takes_no_letter_that_means_something_else_in_inference() {
    // -t is the temperature and -p the top-p elsewhere; bench takes --threads and
    // --prompt-tokens.
    for flag in ["-t", "-p"] {
        let err = fails(qwen3(&["bench", fullvocab_model(), flag, "1"]));
        assert!(
            err.contains(&format!("unexpected argument '{flag}'")),
            "{err}"
        );
    }
}

#[test]
fn stop_strings_and_json_output_for_scripts() {
    let m = fullvocab_model();
    let args = ["generate", m, "-i", PROMPT, "-n", "12", "-t", "0"];
    let full = ok(qwen3(&args));
    let full = full.strip_suffix('\n').unwrap();
    // A stop string from the middle of the answer: the output ends just before it.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 6, "{full:?}");
    let stop: String = chars[4..6].iter().collect();
    let cut = &full[..full.find(&stop).unwrap()];
    let o = qwen3(&[&args[..], &["--stop", &stop, "--stop", "never-seen"]].concat());
    let err = text(&o.stderr);
    assert_eq!(ok(o), format!("{cut}\n"));
    assert!(err.contains("[stopped: stop string]"), "{err}");

    // --json: one object with the text, the ids, why it stopped, counts and timings.
    let v: serde_json::Value =
        serde_json::from_str(&ok(qwen3(&[&args[..], &["--json"]].concat()))).unwrap();
    assert_eq!(v["text"], full);
    let n = v["generated_tokens"].as_u64().unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len() as u64, n);
    if n == 12 {
        assert_eq!(
            (v["finish_reason"].as_str(), v["stop"].as_str()),
            (Some("length"), Some("max_tokens"))
        );
    } else {
        assert_eq!(
            (v["finish_reason"].as_str(), v["stop"].as_str()),
            (Some("stop"), Some("eos"))
        );
    }
    assert!(v["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(v["timings"]["decode_tok_s"].as_f64().is_some());
    let v: serde_json::Value = serde_json::from_str(&ok(qwen3(
        &[&args[..], &["--json", "--stop", &stop]].concat(),
    )))
    .unwrap();
    assert_eq!(v["text"], cut);
    assert_eq!(
        (v["finish_reason"].as_str(), v["stop"].as_str()),
        (Some("stop"), Some("stop_string"))
    );

    // Where they do not apply, a clear error.
    let err = fails(qwen3(&[
        "generate",
        m,
        "--prompt-ids",
        "[1, 2]",
        "--stop",
        "x",
    ]));
    assert!(err.contains("--stop needs a text prompt"), "{err}");
    let err = fails(qwen3(&["chat", m, "--json"]));
    assert!(
        err.contains("--stop, --json and --logprobs are for -m generate"),
        "{err}"
    );
}
