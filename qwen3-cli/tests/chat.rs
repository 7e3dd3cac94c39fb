//! `qwen3 inference -m chat` end to end through the binary, with piped stdin, on
//! `fixtures/models/tiny-qwen3-fullvocab` (random weights, the real Qwen3 tokenizer and template)
//! exported as f32.
//!
//! The golden prompt ids are HuggingFace's: `fixtures/chat/chat-ui-cases.json` was written by
//! `scripts/chat_reference.py`, which renders each conversation with transformers'
//! `apply_chat_template` and tokenizes it with HF's tokenizer. Our chat contributed only the
//! assistant texts (the model's greedy answers), which the file also records.

use qwen3_test_support::{lossy as text, run_with_stdin};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn qwen3() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
}

/// The fixture exported once per test binary (f32, so the greedy answers match the ones recorded
/// in the cases file).
fn model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("pq-chatui-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("m.bin");
        let o = qwen3()
            .arg("export")
            .arg(repo().join("fixtures/models/tiny-qwen3-fullvocab"))
            .arg(&out)
            .args(["--dtype", "f32"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        out
    })
}

/// Runs the chat with `args` and feeds `stdin` (then end of input).
fn chat(args: &[&str], stdin: &str) -> Output {
    let mut cmd = qwen3();
    cmd.arg("inference")
        .arg(model())
        .args(["-m", "chat"])
        .args(args);
    run_with_stdin(&mut cmd, stdin)
}

/// The values of the stderr lines starting with `prefix`, parsed as JSON.
fn json_lines<T: serde::de::DeserializeOwned>(stderr: &str, prefix: &str) -> Vec<T> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(|v| serde_json::from_str(v).unwrap())
        .collect()
}

/// `(run, reused)` of each summary line `[..; prompt: R tokens run, K reused]`.
fn reuse_counts(stderr: &str) -> Vec<(usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| l.split_once("; prompt: "))
        .map(|(_, rest)| {
            let w: Vec<&str> = rest.split_whitespace().collect();
            (w[0].parse().unwrap(), w[3].parse().unwrap())
        })
        .collect()
}

fn cases() -> Vec<Value> {
    let path = repo().join("fixtures/chat/chat-ui-cases.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn case(name: &str) -> Value {
    cases().into_iter().find(|c| c["name"] == name).unwrap()
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Runs one recorded case and checks every turn's `prompt ids:` against HuggingFace's.
fn check_case(name: &str) -> String {
    let case = case(name);
    let mut args: Vec<&str> = case["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    args.push("--verbose-prompt");
    let lines: Vec<&str> = case["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    let o = chat(&args, &(lines.join("\n") + "\n"));
    let err = text(&o.stderr);
    assert!(o.status.success(), "{name}: {err}");

    let answers: Vec<String> = json_lines(&err, "answer: ");
    let expected_answers: Vec<String> = serde_json::from_value(case["answers"].clone()).unwrap();
    assert_eq!(
        answers, expected_answers,
        "{name}: the greedy answers changed, so the golden prompts no longer apply; if the \
         forward pass changed on purpose, re-run scripts/chat_reference.py"
    );
    let prompts: Vec<Vec<u32>> = json_lines(&err, "prompt ids: ");
    let hf: Vec<Vec<u32>> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
    assert_eq!(prompts.len(), hf.len(), "{name}: {err}");
    for (turn, (ours, theirs)) in prompts.iter().zip(&hf).enumerate() {
        assert_eq!(
            ours, theirs,
            "{name}, turn {turn}: prompt ids differ from HF"
        );
    }

    // KV reuse: each turn runs only what is not already in the cache. Whatever the cache held,
    // it held the previous prompt, so at least the part shared with it is reused; unless a
    // `/reset` came between, which empties the cache.
    let mut after_reset = vec![];
    let mut reset = false;
    for l in &lines {
        if *l == "/reset" {
            reset = true;
        } else if !l.starts_with('/') {
            after_reset.push(reset);
            reset = false;
        }
    }
    let counts = reuse_counts(&err);
    assert_eq!(counts.len(), hf.len(), "{name}: {err}");
    for (turn, &(run, reused)) in counts.iter().enumerate() {
        assert_eq!(run + reused, hf[turn].len(), "{name}, turn {turn}");
        if after_reset[turn] {
            assert_eq!(reused, 0, "{name}, turn {turn}: the cache outlived /reset");
        } else if turn > 0 {
            let shared = common_prefix(&hf[turn - 1], &hf[turn]).min(hf[turn].len() - 1);
            assert!(
                reused >= shared,
                "{name}, turn {turn}: reused {reused} < {shared}"
            );
        }
    }
    err
}

#[test]
fn three_turns_match_hf_and_reuse_the_cache() {
    let err = check_case("three_turns_default_thinking");
    let hf: Vec<Vec<u32>> =
        serde_json::from_value(case("three_turns_default_thinking")["prompt_ids"].clone()).unwrap();
    // The answers end at -n, so every answer token but the last is in the cache: the second
    // turn keeps at least the whole first prompt, and runs far less than the conversation.
    let counts = reuse_counts(&err);
    assert_eq!(counts[0], (hf[0].len(), 0));
    assert!(counts[1].1 >= hf[0].len(), "{counts:?}");
    assert!(counts[2].1 >= hf[1].len(), "{counts:?}");
    assert!(err.contains("[stopped at -n 6 tokens]"), "{err}");
}

#[test]
fn system_prompt_and_thinking_off_match_hf() {
    check_case("system_thinking_off");
}

/// `/think off`, `/system TEXT`, `/reset`, `/think on` between turns, from `--thinking on`.
#[test]
fn slash_commands_match_hf() {
    let err = check_case("thinking_on_then_commands");
    assert!(err.contains("[thinking off]"), "{err}");
    assert!(
        err.contains("[system prompt set: \"You are terse.\"; new conversation]"),
        "{err}"
    );
    assert!(err.contains("[new conversation]"), "{err}");
}

/// A context of 60 positions: the third prompt does not fit, the oldest exchange is dropped (and
/// said so), and the kept turns are re-run; the prompt is HF's rendering of the kept turns.
#[test]
fn full_context_drops_the_oldest_exchange() {
    let err = check_case("context_full_drops_oldest");
    assert!(
        err.contains("[context full (66 + 6 tokens for the answer > 60): dropped the oldest exchange, 3 messages kept]"),
        "{err}"
    );
    // The kept turns start at position 0 now: nothing before them can be reused but the first
    // tokens shared with the old start.
    let counts = reuse_counts(&err);
    assert!(counts[2].1 < 16, "{counts:?}");
}

/// A message that cannot fit even alone is refused with a clear message; the chat goes on.
#[test]
fn message_longer_than_the_context_is_refused() {
    let long = "word ".repeat(50);
    let o = chat(
        &["-c", "30", "-t", "0", "-n", "2", "--verbose-prompt"],
        &format!("{long}\nHi\n"),
    );
    let err = text(&o.stderr);
    // Piped: the exit says a message failed (piped_chat_exits_non_zero_when_a_message_failed).
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the context holds 30 (raise -c/--context)"),
        "{err}"
    );
    assert_eq!(
        json_lines::<Vec<u32>>(&err, "prompt ids: ").len(),
        1,
        "{err}"
    );
}

#[test]
fn stats_report_reused_tokens() {
    let o = chat(
        &["-t", "0", "-n", "4"],
        "What is 2 + 2?\nAnd times 3?\n/stats\n",
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("2 answers,"))
        .unwrap_or_else(|| panic!("{err}"));
    let reused: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
    // The second turn keeps at least the first prompt (16 tokens, HF's ids of that prompt in
    // chat-ui-cases.json) in the cache.
    assert!(reused >= 16, "{line}");
    assert!(err.contains("sampler: temperature 0,"), "{err}");
}

/// End of input and `/quit` end the chat with status 0; lines after `/quit` are not read.
#[test]
fn eof_and_quit_exit_zero() {
    let o = chat(&["-t", "0", "-n", "2"], "");
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(o.stdout.is_empty());

    let o = chat(
        &["-t", "0", "-n", "2", "--verbose-prompt"],
        "/quit\nHello\n",
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("prompt ids:"), "{err}");
    // Ollama's `/bye` too; piped, a line `exit` is a message like any other.
    let o = chat(&["-t", "0", "-n", "2", "--verbose-prompt"], "/bye\nHello\n");
    assert!(o.status.success());
    assert!(!text(&o.stderr).contains("prompt ids:"));
    let o = chat(&["-t", "0", "-n", "2", "--verbose-prompt"], "exit\n");
    assert!(text(&o.stderr).contains("prompt ids:"));

    let o = chat(&["-t", "0", "-n", "2"], "/help\n/nope\n/think maybe\n");
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("/system TEXT"), "{err}");
    assert!(err.contains("unknown command /nope"), "{err}");
    assert!(err.contains("usage: /think on|off|default"), "{err}");
}

/// Ctrl-C (SIGINT) during an answer stops it; the exchange is dropped, the chat goes on, and the
/// next prompt is HF's rendering of a fresh conversation.
#[cfg(unix)]
#[test]
fn sigint_stops_the_answer_and_returns_to_the_prompt() {
    let mut child = qwen3()
        .arg("inference")
        .arg(model())
        .args(["-m", "chat", "-t", "0", "-n", "100000", "--verbose-prompt"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "Tell me a long story.").unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("prompt ids:") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no prompt ids line");
    }
    // SAFETY: kill() only sends a signal to the child we spawned (its pid is still ours: we have
    // not waited on it), and takes no pointers.
    let r = unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(r, 0);
    writeln!(stdin, "What is 2 + 2?").unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{rest}");
    assert!(rest.contains("[interrupted"), "{rest}");
    // HF's ids of [{"role": "user", "content": "What is 2 + 2?"}] with the generation prompt
    // (fixtures/chat/chat-template-cases.json, case single_user_thinking_default).
    let prompts: Vec<Vec<u32>> = json_lines(&rest, "prompt ids: ");
    let hf = case("three_turns_default_thinking")["prompt_ids"][0].clone();
    let hf: Vec<u32> = serde_json::from_value(hf).unwrap();
    assert_eq!(prompts, vec![hf]);
}

/// `-m generate --chat` wraps the prompt as one user turn: with greedy sampling it gives the
/// chat's first answer, from a prompt as long as HF's rendering.
#[test]
fn generate_chat_wraps_one_user_turn() {
    let c = case("three_turns_default_thinking");
    let o = qwen3()
        .arg("inference")
        .arg(model())
        .args(["-m", "generate", "--chat", "-i", "What is 2 + 2?"])
        .args(["-t", "0", "-n", "6"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        text(&o.stdout).trim_end_matches('\n'),
        c["answers"][0].as_str().unwrap()
    );
    let n = c["prompt_ids"][0].as_array().unwrap().len();
    assert!(err.contains(&format!("prompt tokens {n},")), "{err}");

    let e = qwen3()
        .arg("inference")
        .arg(model())
        .args(["-m", "chat", "-i", "x"])
        .output()
        .unwrap();
    assert!(!e.status.success());
    assert!(text(&e.stderr).contains("-m chat reads the user's messages from stdin"));
    let e = qwen3()
        .arg("inference")
        .arg(model())
        .args(["-i", "x", "-y", "terse"])
        .output()
        .unwrap();
    assert!(!e.status.success());
    assert!(text(&e.stderr).contains("need --chat"));
}

/// Seconds from the "prompt ids:" line of a chat fed `message` to the end of its first answer,
/// with Ctrl-C sent `interrupt_after` seconds after that line if given; and the stderr after it.
#[cfg(unix)]
fn time_long_prompt(message: &str, interrupt_after: Option<f64>) -> (f64, String) {
    let mut child = qwen3()
        .arg("inference")
        .arg(model())
        .args(["-m", "chat", "-t", "0", "-n", "1", "-c", "16384"])
        .args(["--thinking", "off", "--verbose-prompt"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{message}").unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("prompt ids:") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no prompt ids line");
    }
    let start = std::time::Instant::now();
    if let Some(after) = interrupt_after {
        std::thread::sleep(std::time::Duration::from_secs_f64(after));
        // SAFETY: kill() only sends a signal to the child we spawned (not yet waited on).
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    }
    // The answer's summary line ("[N tokens, ...]") ends the turn.
    let mut rest = String::new();
    loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no summary: {rest}");
        rest.push_str(&line);
        if line.starts_with('[') && line.contains("tok/s") {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    drop(stdin);
    assert!(child.wait().unwrap().success(), "{rest}");
    (secs, rest)
}

/// Ctrl-C during a long prompt's prefill acts within a chunk of it, not after the whole prompt:
/// the time from the signal to the end of the turn is well under the full prefill's (measured
/// first on the same prompt, so the test holds on a slow machine as on a fast one).
#[cfg(unix)]
#[test]
fn sigint_during_a_long_prefill_stops_it_early() {
    let message = "lorem ipsum dolor sit amet ".repeat(2400); // ~12000 tokens
    let (full, out) = time_long_prompt(&message, None);
    assert!(!out.contains("[interrupted"), "{out}");
    let wait = full * 0.15;
    let (total, out) = time_long_prompt(&message, Some(wait));
    assert!(out.contains("[interrupted"), "{out}");
    let after_signal = total - wait;
    assert!(
        after_signal < full * 0.7,
        "Ctrl-C took {after_signal:.2} s to act; the whole prefill takes {full:.2} s"
    );
}

/// Piped messages that get no answer (here: too long for the context) make the exit non-zero,
/// after the other messages are answered.
#[test]
fn piped_chat_exits_non_zero_when_a_message_failed() {
    let long = "word ".repeat(200);
    let o = chat(
        &["-t", "0", "-n", "2", "-c", "64"],
        &format!("Hi\n{long}\nHi again\n"),
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("the context holds 64"), "{err}");
    assert!(err.contains("error: 1 message got no answer"), "{err}");
    // Both other messages were answered.
    assert_eq!(err.matches("tok/s, context").count(), 2, "{err}");
}

/// `/reset` starts over what `/stats` shows (answers, tokens, the KV cache), and counts read
/// as English ("1 answer", "1 token").
#[test]
fn reset_resets_the_stats_and_counts_are_singular_or_plural() {
    let o = chat(
        &["-t", "0", "-n", "1", "--thinking", "off"],
        "Hi\n/stats\n/reset\n/stats\n",
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("[1 token, "), "{err}");
    let stats: Vec<&str> = err.lines().filter(|l| l.starts_with("KV cache ")).collect();
    assert_eq!(stats.len(), 2, "{err}");
    assert!(stats[0].contains("conversation: 2 messages"), "{err}");
    assert!(stats[1].starts_with("KV cache 0/"), "{err}");
    assert!(stats[1].contains("conversation: 0 messages"), "{err}");
    let totals: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("tokens generated"))
        .collect();
    assert!(
        totals[0].starts_with("1 answer, tokens generated 1 "),
        "{err}"
    );
    assert!(
        totals[1].starts_with("0 answers, tokens generated 0 "),
        "{err}"
    );
}
