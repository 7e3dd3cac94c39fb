//! `qwen3 chat-template` end to end: the template file is built from a fixture
//! tokenizer_config.json with `export_chat_template`, then every HuggingFace reference case in
//! fixtures/chat/ is rendered through the binary and must match byte for byte.

use qwen3_export::hf::chat_template::export_chat_template;
use qwen3_test_support::tempdir;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn qwen3() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/chat")
}

/// `dir/m.bin`'s template file, exported from the fixture `tokenizer_config` named `config`.
/// The model file itself is not needed by `chat-template`, so it is not created.
fn model_with_template(dir: &Path, config: &str) -> PathBuf {
    let hf = dir.join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    std::fs::copy(fixtures().join(config), hf.join("tokenizer_config.json")).unwrap();
    export_chat_template(&hf, &dir.join("m.template.json")).unwrap();
    dir.join("m.bin")
}

fn load_cases(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["cases"].as_array().unwrap().clone()
}

/// Runs `qwen3 chat-template model <case messages> [flags]` for a reference case.
fn run_case(dir: &Path, model: &Path, case: &Value, extra: &[&str]) -> Output {
    let name = case["name"].as_str().unwrap();
    let msgs = dir.join(format!("{name}.json"));
    let body = match case["tools"] {
        Value::Null => case["messages"].clone(),
        ref tools => json!({"messages": case["messages"], "tools": tools}),
    };
    std::fs::write(&msgs, serde_json::to_string_pretty(&body).unwrap()).unwrap();
    let mut cmd = qwen3();
    cmd.arg("chat-template").arg(model).arg(&msgs);
    match case["template_kwargs"].get("enable_thinking") {
        Some(Value::Bool(true)) => {
            cmd.args(["--thinking", "on"]);
        }
        Some(Value::Bool(false)) => {
            cmd.args(["--thinking", "off"]);
        }
        _ => {}
    }
    if case["add_generation_prompt"] == false {
        cmd.arg("--no-generation-prompt");
    }
    cmd.args(extra).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Renders every case of `cases_file` with the template of `tokenizer_config` and compares the
/// text with the reference's `rendered`; `expected` is the number of cases the file holds.
fn check_rendered(dir_name: &str, tokenizer_config: &str, cases_file: &str, expected: usize) {
    let dir = tempdir("pq-chat", dir_name);
    let model = model_with_template(&dir, tokenizer_config);
    let cases = load_cases(cases_file);
    assert_eq!(cases.len(), expected);
    for case in &cases {
        let o = run_case(&dir, &model, case, &[]);
        assert!(o.status.success(), "{}: {}", case["name"], stderr(&o));
        assert_eq!(
            String::from_utf8(o.stdout).unwrap(),
            case["rendered"].as_str().unwrap(),
            "case {}",
            case["name"]
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn renders_every_hf_case_exactly() {
    check_rendered(
        "cases",
        "qwen3-tokenizer_config.json",
        "chat-template-cases.json",
        13,
    );
}

/// The DeepSeek-R1-0528-Qwen3 template (bos_token, fullwidth markers, a different reasoning rule)
/// goes through the same code: nothing in pico-qwen knows either template.
#[test]
fn renders_deepseek_r1_0528_qwen3_cases_exactly() {
    check_rendered(
        "deepseek",
        "deepseek-r1-0528-qwen3-tokenizer_config.json",
        "deepseek-r1-0528-qwen3-cases.json",
        8,
    );
}

/// Qwen3.5's template (llama.cpp's copy, made for its 4B and shared by the family): thinking on
/// by default, an empty think block with `enable_thinking: false`, content as text parts, tools
/// before the system prompt, and XML tool calls whose arguments are typed (objects and arrays as
/// JSON, the rest as text); made by scripts/make_qwen35_chat_cases.py.
#[test]
fn renders_qwen3_5_cases_exactly() {
    check_rendered(
        "qwen35",
        "qwen3.5-tokenizer_config.json",
        "qwen3.5-cases.json",
        7,
    );
}

/// A GGUF file's own template (`tokenizer.chat_template`: llama.cpp's converter copied the
/// fixture's tokenizer_config.json, Qwen3's official template): every HF case rendered exactly.
#[test]
fn a_ggufs_own_template_renders_every_hf_case() {
    let dir = tempdir("pq-chat", "gguf");
    let model = fixtures().join("../gguf/tiny-f32-tied-gqa2-f32.gguf");
    for case in load_cases("chat-template-cases.json") {
        let o = run_case(&dir, &model, &case, &[]);
        assert!(o.status.success(), "{}: {}", case["name"], stderr(&o));
        assert_eq!(
            String::from_utf8(o.stdout).unwrap(),
            case["rendered"].as_str().unwrap(),
            "case {}",
            case["name"]
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--ids` prints the ids HuggingFace's tokenizer gives for the rendered text (the `ids` of each
/// reference case: tokenizers 0.23.3 `encode(rendered, add_special_tokens=False)`).
#[test]
fn ids_of_every_hf_case() {
    let dir = tempdir("pq-chat", "ids");
    let tok_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tokenizer");
    let model = model_with_template(&dir, "qwen3-tokenizer_config.json");
    let tokenizer = qwen3_inference::format::companion_paths(&model).tokenizer;
    qwen3_export::hf::tokenizer_json::export_tokenizer(&tok_dir, &tokenizer, 151_936).unwrap();
    for case in load_cases("chat-template-cases.json") {
        let o = run_case(&dir, &model, &case, &["--ids"]);
        assert!(o.status.success(), "{}: {}", case["name"], stderr(&o));
        let stdout = String::from_utf8(o.stdout).unwrap();
        assert!(
            stdout.ends_with("]\n") && !stdout.contains(' '),
            "one JSON line: {stdout}"
        );
        let ids: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(ids, case["ids"], "case {}", case["name"]);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `qwen3 chat-template` with `messages` (as JSON text) and returns the failed output.
/// Qwen2.5-Instruct's template (a default system prompt when none is given, tools in the system
/// prompt, no thinking): the text and the ids of HuggingFace's `apply_chat_template`, made by
/// scripts/make_qwen25_chat_cases.py.
#[test]
fn renders_qwen25_cases_exactly_with_hf_ids() {
    check_rendered(
        "qwen25",
        "qwen2.5-instruct-tokenizer_config.json",
        "qwen2.5-instruct-cases.json",
        7,
    );
    // Qwen2.5's tokenizer: Qwen3's without the four added tokens Qwen3 introduced (ids 151665
    // and up: <tool_response>, </tool_response>, <think>, </think>), as the script built it.
    let dir = tempdir("pq-chat", "qwen25-ids");
    let model = model_with_template(&dir, "qwen2.5-instruct-tokenizer_config.json");
    let tok_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tokenizer");
    let mut tok: Value =
        serde_json::from_str(&std::fs::read_to_string(tok_dir.join("tokenizer.json")).unwrap())
            .unwrap();
    let added = tok["added_tokens"].as_array_mut().unwrap();
    added.retain(|a| a["id"].as_u64().unwrap() < 151_665);
    assert_eq!(added.len(), 22);
    let hf = dir.join("hf");
    std::fs::write(hf.join("tokenizer.json"), tok.to_string()).unwrap();
    let tokenizer = qwen3_inference::format::companion_paths(&model).tokenizer;
    qwen3_export::hf::tokenizer_json::export_tokenizer(&hf, &tokenizer, 151_936).unwrap();
    for case in load_cases("qwen2.5-instruct-cases.json") {
        let o = run_case(&dir, &model, &case, &["--ids"]);
        assert!(o.status.success(), "{}: {}", case["name"], stderr(&o));
        let ids: Value = serde_json::from_str(&String::from_utf8(o.stdout).unwrap()).unwrap();
        assert_eq!(ids, case["ids"], "case {}", case["name"]);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn fails(dir: &Path, model: &Path, messages: &str, extra: &[&str]) -> String {
    let msgs = dir.join("bad.json");
    std::fs::write(&msgs, messages).unwrap();
    let o = qwen3()
        .arg("chat-template")
        .arg(model)
        .arg(&msgs)
        .args(extra)
        .output()
        .unwrap();
    assert!(!o.status.success(), "expected failure for {messages}");
    let e = stderr(&o);
    assert!(!e.contains("panicked"), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "one-line error: {e}");
    e
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempdir("pq-chat", "bad");
    let model = model_with_template(&dir, "qwen3-tokenizer_config.json");
    let ok = r#"[{"role": "user", "content": "hi"}]"#;

    let e = fails(&dir, &dir.join("other.bin"), ok, &[]);
    assert!(
        e.contains("other.template.json: template file not found"),
        "{e}"
    );
    let e = fails(&dir, &model, "[{\"role\": ", &[]);
    assert!(e.contains("bad.json: malformed JSON"), "{e}");
    let e = fails(&dir, &model, "[]", &[]);
    assert!(e.contains("empty conversation"), "{e}");
    let e = fails(&dir, &model, r#"{"role": "user"}"#, &[]);
    assert!(e.contains("expected a list of messages"), "{e}");
    let e = fails(&dir, &model, r#"["hi"]"#, &[]);
    assert!(e.contains("message 0 is not a JSON object"), "{e}");
    // The Qwen3 template silently skips roles it does not know; we refuse instead.
    let e = fails(
        &dir,
        &model,
        r#"[{"role": "critic", "content": "x"}, {"role": "user", "content": "hi"}]"#,
        &[],
    );
    assert!(
        e.contains("cannot express messages with role \"critic\""),
        "{e}"
    );
    // Argument errors are clap's (usage lines follow the error line).
    std::fs::write(dir.join("ok.json"), ok).unwrap();
    let o = qwen3()
        .arg("chat-template")
        .arg(&model)
        .arg(dir.join("ok.json"))
        .args(["--thinking", "maybe"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).starts_with("error: invalid value 'maybe' for '--thinking"));
    let e = fails(&dir, &model, ok, &["--ids"]);
    assert!(
        e.contains("m.tokenizer.bin: tokenizer file not found"),
        "{e}"
    );

    let broken = dir.join("broken.template.json");
    std::fs::write(&broken, "{\"format\": \"pico-qwen chat template\"}").unwrap();
    let e = fails(&dir, &dir.join("broken.bin"), ok, &[]);
    assert!(
        e.contains("broken.template.json: not a valid template file"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The conversation builder over three turns, with the real tokenizer: after each answer the
/// cache is rewound to where that answer began (Qwen3 drops past reasoning; with thinking off it
/// also drops the empty think block), and the final prompt's ids equal HuggingFace's.
#[test]
fn conversation_rewinds_to_answer_start_and_matches_hf() {
    use qwen3_inference::chat::{reuse_len, ChatTemplate, Conversation};
    use qwen3_inference::tokenizer::Tokenizer;

    let dir = tempdir("pq-chat", "conversation");
    let model = model_with_template(&dir, "qwen3-tokenizer_config.json");
    let companions = qwen3_inference::format::companion_paths(&model);
    let tok_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tokenizer");
    qwen3_export::hf::tokenizer_json::export_tokenizer(&tok_dir, &companions.tokenizer, 151_936)
        .unwrap();
    let template = ChatTemplate::open(&companions.template).unwrap();
    let tok = Tokenizer::open(&companions.tokenizer).unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    let cases = load_cases("chat-template-cases.json");
    let case = |name: &str| cases.iter().find(|c| c["name"] == name).unwrap().clone();

    for (name, thinking) in [
        ("three_turn_past_think_stripped", None),
        ("three_turn_past_think_stripped_thinking_false", Some(false)),
    ] {
        let case = case(name);
        let msgs = case["messages"].as_array().unwrap();
        let text = |i: usize| msgs[i]["content"].as_str().unwrap().to_string();
        let mut conv = Conversation::new(None);
        conv.set_thinking(thinking);
        // What the KV cache holds: every token fed so far.
        let mut cache: Vec<u32> = Vec::new();
        let mut prompt_lens = Vec::new();
        for turn in 0..3 {
            conv.push_user(text(2 * turn));
            let ids = tok.encode(&conv.prompt(&template).unwrap());
            let keep = reuse_len(&cache, &ids);
            if turn > 0 {
                // Where the previous answer began: the end of the previous prompt, minus the
                // empty think block the template put there when thinking is off.
                let empty_block = tok.encode("<think>\n\n</think>\n\n").len();
                let answer_start = prompt_lens[turn - 1]
                    - if thinking == Some(false) {
                        empty_block
                    } else {
                        0
                    };
                assert_eq!(keep, answer_start, "{name}, turn {turn}");
            }
            cache.truncate(keep);
            cache.extend_from_slice(&ids[keep..]);
            assert_eq!(cache, ids);
            prompt_lens.push(ids.len());
            if turn < 2 {
                // The model answers with reasoning; the cache gets the answer and <|im_end|>.
                let answer = text(2 * turn + 1);
                cache.extend(tok.encode(&answer));
                cache.push(im_end);
                conv.push_assistant(answer);
            }
        }
        let hf: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(cache, hf, "{name}: the model has seen exactly HF's ids");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
