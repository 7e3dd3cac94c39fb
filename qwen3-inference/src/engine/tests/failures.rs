//! A step that fails: its requests end, and the engine goes on.

use super::*;

/// The CPU backend, except that its matrix products fail while `fail` is set: a device error
/// in the middle of a step.
struct Flaky<'a> {
    cpu: CpuBackend<'a>,
    fail: std::cell::Cell<bool>,
}

impl crate::backend::HostMemory for Flaky<'_> {}

impl<'a> crate::backend::Backend for Flaky<'a> {
    type Tensor = <CpuBackend<'a> as crate::backend::Backend>::Tensor;
    type Rope = crate::backend::RopeTable;
    type KvCache = <CpuBackend<'a> as crate::backend::Backend>::KvCache;

    fn rope_table(&self, t: crate::backend::RopeTable) -> anyhow::Result<Self::Rope> {
        self.cpu.rope_table(t)
    }
    fn kv_cache(
        &self,
        layers: usize,
        shape: crate::backend::AttentionShape,
        max_batch: usize,
        kv: KvType,
    ) -> anyhow::Result<Self::KvCache> {
        self.cpu.kv_cache(layers, shape, max_batch, kv)
    }
    fn embed(
        &self,
        x: &mut Vec<f32>,
        t: &Self::Tensor,
        ids: &[u32],
        h: usize,
    ) -> anyhow::Result<()> {
        self.cpu.embed(x, t, ids, h)
    }
    fn rmsnorm(
        &self,
        o: &mut Vec<f32>,
        x: &Vec<f32>,
        w: &Self::Tensor,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> anyhow::Result<()> {
        self.cpu.rmsnorm(o, x, w, rows, n, eps)
    }
    fn matmul(
        &self,
        y: &mut Vec<f32>,
        w: &Self::Tensor,
        x: &Vec<f32>,
        n_tok: usize,
        rows: usize,
        cols: usize,
    ) -> anyhow::Result<()> {
        if self.fail.get() {
            anyhow::bail!("device lost");
        }
        self.cpu.matmul(y, w, x, n_tok, rows, cols)
    }
    fn rope(
        &self,
        x: &mut Vec<f32>,
        t: &Self::Rope,
        n: usize,
        heads: usize,
        hd: usize,
        pos: usize,
    ) -> anyhow::Result<()> {
        self.cpu.rope(x, t, n, heads, hd, pos)
    }
    fn store_kv(
        &self,
        c: &mut Self::KvCache,
        l: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
        n: usize,
        pos: usize,
    ) -> anyhow::Result<()> {
        self.cpu.store_kv(c, l, k, v, n, pos)
    }
    fn attention(
        &self,
        o: &mut Vec<f32>,
        q: &Vec<f32>,
        c: &mut Self::KvCache,
        l: usize,
        n: usize,
        pos: usize,
    ) -> anyhow::Result<()> {
        self.cpu.attention(o, q, c, l, n, pos)
    }
    fn silu_mul(&self, g: &mut Vec<f32>, u: &Vec<f32>, n: usize) -> anyhow::Result<()> {
        self.cpu.silu_mul(g, u, n)
    }
    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, n: usize) -> anyhow::Result<()> {
        self.cpu.add(x, y, n)
    }
    fn add_bias(
        &self,
        x: &mut Vec<f32>,
        bias: &Self::Tensor,
        n_tok: usize,
        n: usize,
    ) -> anyhow::Result<()> {
        self.cpu.add_bias(x, bias, n_tok, n)
    }
}

/// A step that fails ends its requests with `Failed` (no panic, no hang), and the engine goes
/// on: the next requests get the same tokens as on a healthy engine.
#[test]
fn a_failed_step_ends_its_requests_and_the_engine_goes_on() {
    let (dir, file) = model_file("flaky", DType::F32);
    let model = Model::load(&file).unwrap();
    let flaky = Flaky {
        cpu: CpuBackend::new(),
        fail: std::cell::Cell::new(false),
    };
    let fwd = Forward::new(&flaky, &model, 64, MAX_BATCH, 2, KvType::F32).unwrap();
    let cfg = EngineConfig {
        slots: 2,
        max_queue: 8,
        prefill_chunk: 8,
    };
    let mut e = Engine::new(fwd, cfg).unwrap();
    let p = prompts();
    let a = e.submit(request(&p[1], SamplerConfig::greedy())).unwrap();
    let b = e.submit(request(&p[2], SamplerConfig::greedy())).unwrap();
    let mut events = vec![];
    e.step(&mut events);
    flaky.fail.set(true);
    events.clear();
    e.step(&mut events);
    let failed: Vec<_> = events
        .iter()
        .filter_map(|ev| match ev {
            Event::Failed { id, error } => Some((*id, error.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 2, "{events:?}");
    assert!(failed
        .iter()
        .all(|(id, e)| (*id == a || *id == b) && e.contains("device lost")));
    assert!(e.is_idle());

    flaky.fail.set(false);
    let c = e.submit(request(&p[1], SamplerConfig::greedy())).unwrap();
    let got = drain(&mut e).remove(&c).unwrap().0;
    let mut healthy = engine(&model, 1, 128);
    let h = healthy
        .submit(request(&p[1], SamplerConfig::greedy()))
        .unwrap();
    assert_eq!(got, drain(&mut healthy).remove(&h).unwrap().0);
    std::fs::remove_dir_all(dir).unwrap();
}
