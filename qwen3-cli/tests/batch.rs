//! `qwen3 batch` end to end: an OpenAI Batch API file through the binary on the fullvocab
//! fixture: answers equal the CLI's (the same engine), 4xx answers and invalid lines become
//! result lines, nothing but results on a pipe, and a rerun after an interruption completes the
//! file without repeating anything.

mod common;

use common::{binary_dir, fullvocab_model};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

fn qwen3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qwen3"))
        .args(args)
        .output()
        .unwrap()
}

const PROMPTS: [&str; 6] = [
    "The capital of France is",
    "Once upon a time",
    "fn main() {",
    "1, 2, 3, 4,",
    "Hello",
    "The weather today",
];

fn input_lines() -> Vec<String> {
    let mut lines: Vec<String> = PROMPTS
        .iter()
        .enumerate()
        .map(|(i, p)| {
            json!({"custom_id": format!("c{i}"), "method": "POST", "url": "/v1/completions",
                   "body": {"prompt": p, "max_tokens": 6, "temperature": 0}})
            .to_string()
        })
        .collect();
    lines.push(
        json!({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
               "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                        "temperature": 0}})
        .to_string(),
    );
    lines.push("{not json".to_string());
    lines.push(
        json!({"custom_id": "u1", "method": "POST", "url": "/v1/images/generations", "body": {}})
            .to_string(),
    );
    lines.push(lines[0].clone()); // c0 again
    lines.push(
        json!({"custom_id": "e1", "method": "POST", "url": "/v1/completions",
               "body": {"prompt": "x", "temperature": 9}})
        .to_string(),
    );
    lines
}

/// The result lines of `path`, by custom_id (`null` for a line that had none).
fn results(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn run_batch(input: &Path, output: &Path) -> Output {
    qwen3(&[
        "batch",
        fullvocab_model(),
        input.to_str().unwrap(),
        "-o",
        output.to_str().unwrap(),
        "--parallel",
        "3",
        "--threads",
        "1",
    ])
}

#[test]
fn a_batch_file_answers_as_the_server_and_resumes() {
    let input = binary_dir().join("in.jsonl");
    std::fs::write(&input, input_lines().join("\n") + "\n").unwrap();
    let output = binary_dir().join("out.jsonl");
    let o = run_batch(&input, &output);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // On a pipe: the results in the file, and one summary line.
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("qwen3 batch: 11 written to ")
            && err.contains("(3 of them invalid lines), 0 already there, 0 failed"),
        "{err}"
    );
    assert!(o.stdout.is_empty());
    let all = results(&output);
    assert_eq!(all.len(), 11, "{all:#?}");
    let mut by_id: HashMap<String, Vec<Value>> = HashMap::new();
    for r in &all {
        let id = r["custom_id"].as_str().unwrap_or("null").to_string();
        by_id.entry(id).or_default().push(r.clone());
    }
    // Each completion equals what `qwen3 generate -t 0` prints for its prompt.
    for (i, p) in PROMPTS.iter().enumerate() {
        let r = &by_id[&format!("c{i}")];
        let ok: Vec<&Value> = r.iter().filter(|v| v["error"].is_null()).collect();
        assert_eq!(ok.len(), 1, "{r:?}");
        assert_eq!(ok[0]["response"]["status_code"], 200);
        let cli = qwen3(&["generate", fullvocab_model(), "-i", p, "-n", "6", "-t", "0"]);
        let cli = String::from_utf8(cli.stdout).unwrap();
        assert_eq!(
            ok[0]["response"]["body"]["choices"][0]["text"]
                .as_str()
                .unwrap(),
            cli.strip_suffix('\n').unwrap(),
            "{p}"
        );
        assert_eq!(
            ok[0]["response"]["request_id"],
            ok[0]["response"]["body"]["id"]
        );
    }
    // The duplicate of c0 is an error line with its custom_id.
    let dup: Vec<&Value> = by_id["c0"]
        .iter()
        .filter(|v| !v["error"].is_null())
        .collect();
    assert!(dup[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("appears twice"));
    let chat = &by_id["chat"][0]["response"];
    assert_eq!(chat["status_code"], 200);
    assert_eq!(chat["body"]["object"], "chat.completion");
    // A request the server refuses is a result with its 4xx and OpenAI's error object.
    let e1 = &by_id["e1"][0]["response"];
    assert_eq!(e1["status_code"], 400);
    assert_eq!(e1["body"]["error"]["param"], "temperature");
    // Lines that are not requests: error lines naming the line.
    let u1 = &by_id["u1"][0];
    assert!(u1["response"].is_null());
    assert!(u1["error"]["message"]
        .as_str()
        .unwrap()
        .contains("line 9: url must be"));
    let bad = &by_id["null"][0];
    assert!(bad["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("line 8: not valid JSON"));

    // Rerun on the complete output: nothing new.
    let before = std::fs::read_to_string(&output).unwrap();
    assert!(run_batch(&input, &output).status.success());
    assert_eq!(std::fs::read_to_string(&output).unwrap(), before);

    // An interrupted run: the first 4 results, and half of the fifth. The rerun drops the cut
    // line, runs the rest, and every result is there once.
    let lines: Vec<&str> = before.lines().collect();
    let cut = format!(
        "{}\n{}",
        lines[..4].join("\n"),
        &lines[4][..lines[4].len() / 2]
    );
    std::fs::write(&output, cut).unwrap();
    let o = run_batch(&input, &output);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let again = results(&output);
    assert_eq!(again.len(), 11);
    let key = |v: &Value| {
        (
            v["custom_id"].to_string(),
            v["error"]["message"].to_string(),
            v["response"]["body"]["choices"].to_string(),
        )
    };
    let mut a: Vec<_> = all.iter().map(key).collect();
    let mut b: Vec<_> = again.iter().map(key).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    // Result ids stay unique across the runs that wrote the file.
    let ids: std::collections::HashSet<&str> =
        again.iter().map(|v| v["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), again.len(), "{again:#?}");

    // A line fixed after its error line: the rerun answers it, and says which error line the
    // answer supersedes.
    let error_line = again.iter().find(|v| v["custom_id"] == "u1").unwrap()["id"].clone();
    let mut fixed = input_lines();
    fixed[8] = json!({"custom_id": "u1", "method": "POST", "url": "/v1/completions",
                      "body": {"prompt": "x", "max_tokens": 2}})
    .to_string();
    std::fs::write(&input, fixed.join("\n") + "\n").unwrap();
    let o = run_batch(&input, &output);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("qwen3 batch: 1 written"), "{err}");
    let last = results(&output).pop().unwrap();
    assert_eq!(last["custom_id"], "u1");
    assert_eq!(last["response"]["status_code"], 200);
    assert_eq!(last["supersedes"], error_line);
}

#[test]
fn bad_arguments_are_one_line_errors() {
    let input = binary_dir().join("args-in.jsonl");
    std::fs::write(&input, "").unwrap();
    let o = qwen3(&[
        "batch",
        fullvocab_model(),
        input.to_str().unwrap(),
        "-o",
        input.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("that is the input file"));
    let o = qwen3(&[
        "batch",
        fullvocab_model(),
        "/nonexistent/in.jsonl",
        "-o",
        binary_dir().join("x.jsonl").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/in.jsonl: cannot read"));
}

/// `/v1/embeddings` lines on an embedding model (the Qwen3-Embedding-shaped fixture): each
/// result holds sentence-transformers' vector of its text (1e-4).
#[test]
fn a_batch_of_embeddings() {
    use qwen3_inference::format::DType;
    let dir = qwen3_test_support::tempdir("pq-batch", "embed");
    let model = qwen3_test_support::export_fixture("tiny-qwen3-embedding", &dir, DType::F32, 0);
    let refr: Value = serde_json::from_str(
        &std::fs::read_to_string(
            qwen3_test_support::fixture("tiny-qwen3-embedding").join("reference.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let cases = refr["cases"].as_array().unwrap();
    let lines: Vec<String> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"custom_id": format!("e{i}"), "method": "POST", "url": "/v1/embeddings",
                   "body": {"input": c["text"]}})
            .to_string()
        })
        .collect();
    let input = dir.join("in.jsonl");
    let output = dir.join("out.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let o = qwen3(&[
        "batch",
        model.to_str().unwrap(),
        input.to_str().unwrap(),
        "-o",
        output.to_str().unwrap(),
        "--threads",
        "1",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = results(&output);
    assert_eq!(out.len(), cases.len());
    for r in out {
        let i: usize = r["custom_id"].as_str().unwrap()[1..].parse().unwrap();
        let body = &r["response"]["body"];
        assert_eq!(r["response"]["status_code"], 200, "{body}");
        let got = body["data"][0]["embedding"].as_array().unwrap();
        let want = cases[i]["embedding"].as_array().unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g.as_f64().unwrap() - w.as_f64().unwrap()).abs() < 1e-4,
                "e{i}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
