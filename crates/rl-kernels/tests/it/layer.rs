//! The fused decoder layer equals the same layer composed of candle's differentiable ops (forward
//! and the gradients of the input and of every weight), for every family's variant (q/k norm;
//! q/k/v and output biases; neither) over independent and prefix-shared rows, and its gradients
//! match finite differences in f64. With low-rank adapters the same holds for the adapters'
//! gradients, and frozen base weights get none.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use rl_kernels::ops::{self, LayerAdapters, LayerWeights, Rope, composed};
use rl_kernels::{AttnShape, Dropout, LayerShape, LoraShape, Proj, RowLayout};

use crate::{check_grads, max_abs_diff, probe, rand};

struct Weights {
    ln1: Var,
    q: Var,
    k: Var,
    v: Var,
    bias: Option<[Var; 3]>,
    norms: Option<[Var; 2]>,
    o: Var,
    o_bias: Option<Var>,
    ln2: Var,
    gate: Var,
    up: Var,
    down: Var,
}

fn var(shape: &[usize], seed: u64, scale: f64) -> Var {
    Var::from_tensor(&rand(shape, seed, scale, DType::F64)).unwrap()
}

impl Weights {
    fn new(sh: LayerShape) -> Self {
        let (h, d, i) = (sh.hidden, sh.attn.head_dim, sh.intermediate);
        let (qd, kd) = (sh.attn.ldq(), sh.attn.ldk());
        let norm = |seed| Var::from_tensor(&(rand(&[h], seed, 0.3, DType::F64) + 1.0).unwrap()).unwrap();
        Weights {
            ln1: norm(1),
            q: var(&[qd, h], 2, 0.5),
            k: var(&[kd, h], 3, 0.5),
            v: var(&[kd, h], 4, 0.5),
            bias: sh.qkv_bias.then(|| [var(&[qd], 5, 0.2), var(&[kd], 6, 0.2), var(&[kd], 7, 0.2)]),
            norms: sh.qk_norm.then(|| [var(&[d], 8, 1.0), var(&[d], 9, 1.0)]),
            o: var(&[h, qd], 10, 0.5),
            o_bias: sh.o_bias.then(|| var(&[h], 11, 0.2)),
            ln2: norm(12),
            gate: var(&[i, h], 13, 0.5),
            up: var(&[i, h], 14, 0.5),
            down: var(&[h, i], 15, 0.5),
        }
    }

    fn all(&self) -> Vec<&Var> {
        let mut v = vec![&self.ln1, &self.q, &self.k, &self.v];
        v.extend(self.bias.iter().flatten());
        v.extend(self.norms.iter().flatten());
        v.push(&self.o);
        v.extend(&self.o_bias);
        v.extend([&self.ln2, &self.gate, &self.up, &self.down]);
        v
    }

    fn flat(&self) -> Tensor {
        fn t(v: &Var) -> &Tensor {
            v.as_tensor()
        }
        LayerWeights {
            ln1: t(&self.ln1),
            q: t(&self.q),
            k: t(&self.k),
            v: t(&self.v),
            qkv_bias: self.bias.as_ref().map(|[a, b, c]| [t(a), t(b), t(c)]),
            qk_norm: self.norms.as_ref().map(|[a, b]| [t(a), t(b)]),
            o: t(&self.o),
            o_bias: self.o_bias.as_ref().map(t),
            ln2: t(&self.ln2),
            gate: t(&self.gate),
            up: t(&self.up),
            down: t(&self.down),
        }
        .flat()
        .unwrap()
    }
}

fn shapes() -> Vec<LayerShape> {
    let attn = AttnShape { q_heads: 4, kv_heads: 2, head_dim: 4 };
    let base =
        LayerShape { hidden: 12, attn, intermediate: 10, eps: 1e-6, qkv_bias: false, qk_norm: true, o_bias: false };
    vec![
        base,
        LayerShape { qk_norm: false, qkv_bias: true, ..base },
        LayerShape { qk_norm: false, qkv_bias: true, o_bias: true, ..base },
        LayerShape { qk_norm: false, ..base },
    ]
}

fn layouts() -> Vec<Arc<RowLayout>> {
    vec![
        Arc::new(RowLayout::packed(&[5, 4])),
        Arc::new(RowLayout::new(&[5, 3, 2, 4], &[None, Some(0), Some(0), None]).unwrap()),
    ]
}

#[test]
fn the_fused_layer_equals_the_composed_layer_with_every_gradient() {
    let rope = Rope::new(4, 10_000.0, 64, DType::F64, &Device::Cpu).unwrap();
    for sh in shapes() {
        for layout in layouts() {
            let positions: Arc<[u32]> = layout.positions().into();
            let x = Var::from_tensor(&rand(&[layout.len(), sh.hidden], 20, 1.5, DType::F64)).unwrap();
            let w = Weights::new(sh);
            let fused = ops::decoder_layer(&x, &w.flat(), layout.clone(), positions.clone(), &rope, sh, 0.5).unwrap();
            let comp = composed::decoder_layer(&x, &w.flat(), &layout, &positions, &rope, sh, 0.5).unwrap();
            assert!(max_abs_diff(&fused, &comp) < 1e-10, "{sh:?}: outputs differ");
            let (gf, gc) = (probe(&fused, 21).backward().unwrap(), probe(&comp, 21).backward().unwrap());
            let mut vars = w.all();
            vars.push(&x);
            for (i, v) in vars.iter().enumerate() {
                let (a, b) =
                    (gf.get(v.as_tensor()).expect("fused grad"), gc.get(v.as_tensor()).expect("composed grad"));
                let scale = 1.0 + b.abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
                assert!(max_abs_diff(a, b) < 1e-10 * scale, "{sh:?}: gradient {i} differs by {}", max_abs_diff(a, b));
            }
        }
    }
}

#[test]
fn fused_layer_gradients_match_finite_differences() {
    let rope = Rope::new(4, 10_000.0, 64, DType::F64, &Device::Cpu).unwrap();
    for sh in [shapes()[0], shapes()[2]] {
        let layout = layouts()[1].clone();
        let positions: Arc<[u32]> = layout.positions().into();
        let x = Var::from_tensor(&rand(&[layout.len(), sh.hidden], 22, 1.5, DType::F64)).unwrap();
        let w = Weights::new(sh);
        let mut vars: Vec<Var> = w.all().into_iter().cloned().collect();
        vars.push(x.clone());
        check_grads(&vars, || {
            let y = ops::decoder_layer(&x, &w.flat(), layout.clone(), positions.clone(), &rope, sh, 0.5).unwrap();
            probe(&y, 23)
        });
    }
}

#[test]
fn mismatched_buffers_and_positions_beyond_the_tables_are_errors() {
    let rope = Rope::new(4, 10_000.0, 8, DType::F64, &Device::Cpu).unwrap();
    let sh = shapes()[0];
    let layout = Arc::new(RowLayout::packed(&[3]));
    let w = Weights::new(sh).flat();
    let x = rand(&[3, sh.hidden], 24, 1.0, DType::F64);
    let far: Arc<[u32]> = vec![0, 1, 9].into();
    let err = ops::decoder_layer(&x, &w, layout.clone(), far, &rope, sh, 0.5).unwrap_err().to_string();
    assert!(err.contains("position 9"), "{err}");
    let short = w.narrow(0, 0, 10).unwrap();
    let err = ops::decoder_layer(&x, &short, layout, vec![0, 1, 2].into(), &rope, sh, 0.5).unwrap_err().to_string();
    assert!(err.contains("weights"), "{err}");
}

/// Adapters on `targets`, one variable per matrix (A then B of each, in the flat order).
fn adapters(sh: LayerShape, targets: [bool; 7], seed: u64) -> (LoraShape, Vec<Var>) {
    let lora = LoraShape { rank: 3, scale: 16.0 / 3.0, targets };
    let vars = lora
        .parts(&sh)
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            let s = seed + 10 * i as u64;
            [var(&[lora.rank, p.inp], s, 0.3), var(&[p.out, lora.rank], s + 1, 0.1)]
        })
        .collect();
    (lora, vars)
}

fn flat(vars: &[Var]) -> Tensor {
    let parts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().flatten_all().unwrap()).collect();
    Tensor::cat(&parts, 0).unwrap()
}

fn target_sets() -> Vec<[bool; 7]> {
    vec![[true; 7], [true, false, true, false, false, false, false], [false, true, false, true, true, false, true]]
}

/// The adapters `a` of shape `lora`, with `dropout` on their inputs.
fn with(a: &Tensor, lora: LoraShape, dropout: Option<Dropout>) -> Option<LayerAdapters<'_>> {
    Some(LayerAdapters { values: a, shape: lora, dropout })
}

#[test]
fn adapted_fused_layer_equals_the_composed_one_and_frozen_weights_get_no_gradient() {
    let rope = Rope::new(4, 10_000.0, 64, DType::F64, &Device::Cpu).unwrap();
    let drops = [None, Some(Dropout { p: 0.3, seed: 5 })];
    for ((sh, targets), drop) in
        shapes().into_iter().zip(target_sets().into_iter().cycle()).zip(drops.into_iter().cycle())
    {
        let layout = layouts()[1].clone();
        let positions: Arc<[u32]> = layout.positions().into();
        let x = Var::from_tensor(&rand(&[layout.len(), sh.hidden], 30, 1.5, DType::F64)).unwrap();
        // The base weights are a plain tensor: frozen.
        let w = Weights::new(sh).flat().detach();
        let (lora, ad) = adapters(sh, targets, 31);
        let a = flat(&ad);
        let fused =
            ops::decoder_layer_adapted(&x, &w, with(&a, lora, drop), layout.clone(), positions.clone(), &rope, sh, 0.5)
                .unwrap();
        let comp =
            composed::decoder_layer_adapted(&x, &w, with(&a, lora, drop), &layout, &positions, &rope, sh, 0.5).unwrap();
        assert!(max_abs_diff(&fused, &comp) < 1e-10, "{sh:?} {drop:?}: outputs differ");
        let plain = ops::decoder_layer(&x, &w, layout.clone(), positions.clone(), &rope, sh, 0.5).unwrap();
        assert!(max_abs_diff(&fused, &plain) > 1e-3, "{sh:?}: the adapters changed nothing");
        if drop.is_some() {
            let undropped = ops::decoder_layer_adapted(
                &x,
                &w,
                with(&a, lora, None),
                layout.clone(),
                positions.clone(),
                &rope,
                sh,
                0.5,
            )
            .unwrap();
            assert!(max_abs_diff(&fused, &undropped) > 1e-6, "{sh:?}: dropout changed nothing");
        }
        let (gf, gc) = (probe(&fused, 32).backward().unwrap(), probe(&comp, 32).backward().unwrap());
        assert!(gf.get(&w).is_none(), "a frozen weight got a gradient");
        for (i, v) in ad.iter().chain([&x]).enumerate() {
            let (a, b) = (gf.get(v.as_tensor()).expect("fused grad"), gc.get(v.as_tensor()).expect("composed grad"));
            let scale = 1.0 + b.abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
            assert!(
                max_abs_diff(a, b) < 1e-10 * scale,
                "{sh:?} {drop:?}: gradient {i} differs by {}",
                max_abs_diff(a, b)
            );
            assert!(a.abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap() > 0.0, "gradient {i} is zero");
        }
    }
}

#[test]
fn recomputed_layer_equals_the_composed_one_in_value_and_gradient() {
    // What CUDA and half precision run: the layer keeps only its inputs and recomputes itself
    // (attention a query block at a time) in the backward. Here in f64 on CPU, trainable and
    // frozen base weights, with and without adapters and dropout.
    let rope = Rope::new(4, 10_000.0, 64, DType::F64, &Device::Cpu).unwrap();
    let drops = [None, Some(Dropout { p: 0.3, seed: 5 })];
    for (((sh, targets), drop), frozen) in shapes()
        .into_iter()
        .zip(target_sets().into_iter().cycle())
        .zip(drops.into_iter().cycle())
        .zip([false, true].into_iter().cycle())
    {
        let layout = layouts()[1].clone();
        let positions: Arc<[u32]> = layout.positions().into();
        let x = Var::from_tensor(&rand(&[layout.len(), sh.hidden], 50, 1.5, DType::F64)).unwrap();
        let wv = Var::from_tensor(&Weights::new(sh).flat()).unwrap();
        let w = if frozen { wv.as_tensor().detach() } else { wv.as_tensor().clone() };
        let (lora, ad) = adapters(sh, targets, 51);
        let a = flat(&ad);
        let adapted = if frozen { with(&a, lora, drop) } else { None };
        let rec =
            ops::decoder_layer_recomputed(&x, &w, adapted, layout.clone(), positions.clone(), &rope, sh, 0.5).unwrap();
        let comp = composed::decoder_layer_adapted(&x, &w, adapted, &layout, &positions, &rope, sh, 0.5).unwrap();
        assert!(max_abs_diff(&rec, &comp) < 1e-12, "{sh:?} {drop:?}: outputs differ");
        let (gr, gc) = (probe(&rec, 52).backward().unwrap(), probe(&comp, 52).backward().unwrap());
        let mut wanted = vec![x.as_tensor().clone()];
        if frozen {
            assert!(gr.get(wv.as_tensor()).is_none(), "a frozen weight got a gradient");
            wanted.extend(ad.iter().map(|v| v.as_tensor().clone()));
        } else {
            wanted.push(wv.as_tensor().clone());
        }
        for (i, t) in wanted.iter().enumerate() {
            let (a, b) = (gr.get(t).expect("recomputed grad"), gc.get(t).expect("composed grad"));
            let scale = 1.0 + b.abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
            let err = max_abs_diff(a, b);
            assert!(err < 1e-10 * scale, "{sh:?} {drop:?}: gradient {i} differs by {err}");
        }
    }
}

#[test]
fn dropout_is_off_at_zero_and_draws_new_masks_per_seed() {
    let rope = Rope::new(4, 10_000.0, 64, DType::F64, &Device::Cpu).unwrap();
    let sh = shapes()[0];
    let layout = layouts()[1].clone();
    let positions: Arc<[u32]> = layout.positions().into();
    let x = rand(&[layout.len(), sh.hidden], 40, 1.5, DType::F64);
    let w = Weights::new(sh).flat();
    let (lora, ad) = adapters(sh, [true; 7], 41);
    let a = flat(&ad);
    let run = |drop: Option<Dropout>| {
        ops::decoder_layer_adapted(&x, &w, with(&a, lora, drop), layout.clone(), positions.clone(), &rope, sh, 0.5)
            .unwrap()
    };
    assert_eq!(max_abs_diff(&run(None), &run(Some(Dropout { p: 0.0, seed: 9 }))), 0.0);
    let (one, again, other) = (
        run(Some(Dropout { p: 0.2, seed: 9 })),
        run(Some(Dropout { p: 0.2, seed: 9 })),
        run(Some(Dropout { p: 0.2, seed: 10 })),
    );
    assert_eq!(max_abs_diff(&one, &again), 0.0, "a seed draws one mask");
    assert!(max_abs_diff(&one, &other) > 1e-6, "another seed, another mask");
}

#[test]
fn adapted_layer_gradients_match_finite_differences() {
    let rope = Rope::new(4, 10_000.0, 64, DType::F64, &Device::Cpu).unwrap();
    // The second shape with dropout: the masks are a function of the seed, so the layer is a
    // fixed function the finite differences can probe.
    for (sh, drop) in [(shapes()[0], None), (shapes()[2], Some(Dropout { p: 0.4, seed: 11 }))] {
        let layout = layouts()[1].clone();
        let positions: Arc<[u32]> = layout.positions().into();
        let x = Var::from_tensor(&rand(&[layout.len(), sh.hidden], 33, 1.5, DType::F64)).unwrap();
        let w = Weights::new(sh);
        let (lora, ad) = adapters(sh, [true; 7], 34);
        // Base weights trainable too: both gradients at once (full fine-tuning with adapters).
        let mut vars: Vec<Var> = w.all().into_iter().cloned().collect();
        vars.extend(ad.iter().cloned());
        vars.push(x.clone());
        check_grads(&vars, || {
            let a = flat(&ad);
            let y = ops::decoder_layer_adapted(
                &x,
                &w.flat(),
                with(&a, lora, drop),
                layout.clone(),
                positions.clone(),
                &rope,
                sh,
                0.5,
            )
            .unwrap();
            probe(&y, 35)
        });
    }
}

#[test]
fn zero_b_adapters_leave_the_layer_unchanged_and_a_wrong_buffer_is_an_error() {
    let rope = Rope::new(4, 10_000.0, 64, DType::F64, &Device::Cpu).unwrap();
    let sh = shapes()[0];
    let layout = Arc::new(RowLayout::packed(&[4, 3]));
    let positions: Arc<[u32]> = layout.positions().into();
    let x = rand(&[layout.len(), sh.hidden], 36, 1.0, DType::F64);
    let w = Weights::new(sh).flat();
    let lora = LoraShape { rank: 2, scale: 2.0, targets: [true; 7] };
    let mut a = vec![0f64; lora.len(&sh)];
    for p in lora.parts(&sh) {
        a[p.a.clone()].iter_mut().enumerate().for_each(|(i, v)| *v = (i as f64 * 0.37).sin());
    }
    let a = Tensor::new(a.as_slice(), &Device::Cpu).unwrap();
    let plain = ops::decoder_layer(&x, &w, layout.clone(), positions.clone(), &rope, sh, 0.5).unwrap();
    let adapted =
        ops::decoder_layer_adapted(&x, &w, with(&a, lora, None), layout.clone(), positions.clone(), &rope, sh, 0.5)
            .unwrap();
    assert_eq!(max_abs_diff(&plain, &adapted), 0.0);
    let short = a.narrow(0, 0, 5).unwrap();
    let err = ops::decoder_layer_adapted(&x, &w, with(&short, lora, None), layout, positions, &rope, sh, 0.5)
        .unwrap_err()
        .to_string();
    assert!(err.contains("adapter values"), "{err}");
    assert_eq!(Proj::from_module("gate_proj"), Some(Proj::Gate));
}
