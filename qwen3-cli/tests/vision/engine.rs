//! The engine serves image requests beside text ones, drafts and the prefix cache included,
//! each request's tokens as alone.

use super::*;

/// A [`Prompt`] as the engine takes it.
fn prompt_images(p: &Prompt) -> qwen3_inference::engine::PromptImages {
    use qwen3_inference::engine::{PromptImage, PromptImages};
    PromptImages {
        images: p
            .images
            .iter()
            .map(|(row, v, ds)| PromptImage::new(*row, v.clone(), ds.clone()))
            .collect(),
        positions: p.positions.thw.clone(),
        next: p.positions.next,
    }
}

/// Requests with images through the engine, several at once beside a text request, each
/// answering transformers' greedy tokens (with prompt-lookup drafts too); the prefix cache
/// reuses a prompt's image only when the image is the same. Qwen3-VL's DeepStack features go
/// with its vectors through chunks that split an image.
#[test]
fn the_engine_serves_images_beside_text() {
    for name in NAMES {
        engine_serves_images_beside_text(name);
    }
}

fn engine_serves_images_beside_text(name: &str) {
    use qwen3_inference::backend::{CpuBackend, KvType};
    use qwen3_inference::engine::{Draft, Engine, EngineConfig, Event, Request};
    use qwen3_inference::model::{Forward, Model, MAX_BATCH};
    use qwen3_inference::sampler::SamplerConfig;
    use std::collections::HashMap;

    let dir = tempdir("qwen3-vision", &format!("engine-{name}"));
    let file = ModelFile::open(&export_fixture(name, &dir, DType::F32, 0)).unwrap();
    let model = Model::load(&file).unwrap();
    let tower = VisionTower::from_file(&file).unwrap().unwrap();
    let reference = json(&fixture(name).join("images-reference.json"));
    let cpu = CpuBackend::new();
    let slots = 4;
    let fwd = Forward::new(&cpu, &model, 256, MAX_BATCH, slots + 4, KvType::F32).unwrap();
    let cfg = EngineConfig {
        slots,
        max_queue: 8,
        prefill_chunk: 8,
    };
    let mut engine = Engine::new(fwd, cfg).unwrap();
    let request = |prompt: Vec<u32>, images, draft| Request {
        prompt,
        max_tokens: 8,
        sampler: SamplerConfig::greedy(),
        stop_ids: vec![],
        logprobs: None,
        constraint: None,
        prompt_logprobs: None,
        last_logits: true,
        draft,
        images,
    };
    // Runs requests together; each one's tokens, the prompt tokens its slot had cached, and
    // its last prompt position's logits.
    type Answer = (Vec<u32>, usize, Vec<f32>);
    let mut run = |reqs: Vec<Request>| -> Vec<Answer> {
        let ids: Vec<u64> = reqs
            .into_iter()
            .map(|r| engine.submit(r).unwrap())
            .collect();
        let mut out: HashMap<u64, Answer> = HashMap::new();
        let mut events = Vec::new();
        while !engine.is_idle() {
            engine.step(&mut events);
            for e in events.drain(..) {
                match e {
                    Event::Started { id, cached } => out.entry(id).or_default().1 = cached,
                    Event::Token { id, token, .. } => out.entry(id).or_default().0.push(token),
                    Event::Logits { id, logits } => out.entry(id).or_default().2 = logits,
                    Event::Failed { error, .. } => panic!("{error}"),
                    _ => {}
                }
            }
        }
        ids.iter().map(|id| out[id].clone()).collect()
    };
    let cases = reference["cases"].as_array().unwrap();
    let prompts: Vec<Prompt> = cases
        .iter()
        .map(|c| prompt(name, &file, &tower, c))
        .collect();
    let greedy: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| serde_json::from_value(c["greedy"].clone()).unwrap())
        .collect();
    // Three prompts with images and a text one at once, twice (the second time with drafts).
    let text: Vec<u32> = (100..140).collect();
    let alone = run(vec![request(text.clone(), None, Draft::None)]);
    for draft in [Draft::None, Draft::Ngram { max: 3 }] {
        let mut reqs: Vec<Request> = prompts
            .iter()
            .map(|p| request(p.ids.clone(), Some(prompt_images(p)), draft.clone()))
            .collect();
        reqs.push(request(text.clone(), None, draft.clone()));
        let got = run(reqs);
        for (i, want) in greedy.iter().enumerate() {
            assert_eq!(&got[i].0, want, "{} ({draft:?})", cases[i]["name"]);
        }
        assert_eq!(
            got[prompts.len()].0,
            alone[0].0,
            "the text request beside images ({draft:?})"
        );
    }

    // The prefix cache: the first case's prompt (its image at rows 4 to 9) and 125 text
    // tokens (a hybrid model resumes at a multiple of 64: 128; Qwen3-VL at any token); again
    // with the same image, then with another image at the same tokens.
    let p = &prompts[0];
    // The long prompt, its image's vectors `vectors` of a grid of `grid` patches (6 tokens
    // either way).
    let long = |vectors: &[f32], deepstack: &[Vec<f32>], grid: [usize; 3]| -> Prompt {
        let mut ids = p.ids.clone();
        ids.extend(200..325);
        let is_image: Vec<bool> = ids.iter().map(|&t| t == 509).collect();
        Prompt {
            positions: vision::positions::mrope_positions(&is_image, &[grid], 2).unwrap(),
            images: vec![(p.images[0].0, vectors.to_vec(), deepstack.to_vec())],
            ids,
        }
    };
    let same = long(&p.images[0].1, &p.images[0].2, [1, 4, 6]);
    let first = run(vec![request(
        same.ids.clone(),
        Some(prompt_images(&same)),
        Draft::None,
    )]);
    let again = run(vec![request(
        same.ids.clone(),
        Some(prompt_images(&same)),
        Draft::None,
    )]);
    assert_eq!(again[0].0, first[0].0);
    let past = p.images[0].0 + 6;
    assert!(
        again[0].1 > past,
        "the same image: the prefix reused past it"
    );
    // Another picture at the same tokens: the third case's first image (96 x 64: 3 x 2 tokens).
    let other = long(&prompts[2].images[0].1, &prompts[2].images[0].2, [1, 6, 4]);
    let fresh = run(vec![request(
        other.ids.clone(),
        Some(prompt_images(&other)),
        Draft::None,
    )]);
    assert!(
        fresh[0].1 <= p.images[0].0,
        "another image: nothing reused past it"
    );
    // ... answered as a fresh engine answers it.
    let cpu2 = CpuBackend::new();
    let fwd = Forward::new(&cpu2, &model, 256, MAX_BATCH, 4, KvType::F32).unwrap();
    let mut clean = Engine::new(
        fwd,
        EngineConfig {
            slots: 1,
            max_queue: 1,
            prefill_chunk: 64,
        },
    )
    .unwrap();
    clean
        .submit(request(
            other.ids.clone(),
            Some(prompt_images(&other)),
            Draft::None,
        ))
        .unwrap();
    let (mut tokens, mut logits, mut events) = (Vec::new(), Vec::new(), Vec::new());
    while !clean.is_idle() {
        clean.step(&mut events);
        for e in events.drain(..) {
            match e {
                Event::Token { token, .. } => tokens.push(token),
                Event::Logits { logits: l, .. } => logits = l,
                _ => {}
            }
        }
    }
    assert_eq!((&fresh[0].0, &fresh[0].2), (&tokens, &logits));
    let moved = qwen3_test_support::max_abs(&fresh[0].2, &first[0].2);
    assert!(moved > 1e-3, "another image, other logits ({moved:.1e})");
    // A text model refuses images; the engine checks their rows.
    let mut bad = prompt_images(p);
    bad.images[0].row = p.ids.len() - 1;
    let e = engine_refusal(&model, request(p.ids.clone(), Some(bad), Draft::None));
    assert!(e.contains("does not fit"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn engine_refusal(
    model: &qwen3_inference::model::Model,
    r: qwen3_inference::engine::Request,
) -> String {
    use qwen3_inference::backend::{CpuBackend, KvType};
    use qwen3_inference::engine::Engine;
    let cpu = CpuBackend::new();
    let mut e = Engine::one_sequence(&cpu, model, 64, KvType::F32).unwrap();
    e.submit(r).unwrap_err().to_string()
}
