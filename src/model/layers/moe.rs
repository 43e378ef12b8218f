//! The sparse feed-forward block of Qwen3-MoE (SDAR-MoE) and LLaDA2: a router picks, for each
//! row, `top_k` of `experts` SwiGLUs, and the row's output is their weighted sum, plus (LLaDA2)
//! a shared expert every row goes through.
//!
//! Router logits `x Gᵀ` → in f32 the route of router.rs ([`Routing`]: softmax top-k as
//! transformers' `Qwen3MoeSparseMoeBlock`, or LLaDA2's grouped sigmoid router; equal values in
//! the order PyTorch's CPU `torch.topk` leaves them: topk.rs) → weights cast to the compute dtype
//! → each chosen expert's SwiGLU of the row times its weight, summed expert by expert in
//! ascending index order → plus the shared expert's SwiGLU of the row, where the block has one.

use anyhow::Result;
use candle_core::Tensor;

use super::router::Routing;
use super::swiglu::SwiGlu;
use crate::model::gemv::{experts_dims, pack_experts, packable, unpack_experts, WeightLayout};
use crate::model::linear::Linear;
use crate::model::loader::Loader;

pub struct MoeBlock {
    /// `mlp.gate.weight` `[experts, hidden]` as a projection: `x -> [T, experts]` logits.
    router: Linear,
    experts: Vec<SwiGlu>,
    top_k: usize,
    routing: Routing,
    /// The shared expert (LLaDA2's `shared_experts`, `num_shared_experts` of them as one SwiGLU
    /// of their summed width), added to every row's routed sum.
    pub shared: Option<SwiGlu>,
    /// The grouped router's `expert_bias` on the block's device, f32: what the device route reads.
    bias: Option<Tensor>,
    /// The experts stacked for the streamed layer's grouped kernels (fast/moe_grouped.rs), where the
    /// projections are kept `[out, in]` for the gemv kernel; each expert's projections are then
    /// views into these.
    grouped: Option<Grouped>,
}

/// Every expert of a layer in one tensor per product, as the grouped kernels index them: rows,
/// or each expert packed for the gemv (gemv.rs, `experts_dims`; [`MoeBlock::pack`]).
pub struct Grouped {
    /// `[experts, 2 I, hidden]`: each expert's gate rows then its up rows.
    pub gate_up: Tensor,
    /// `[experts, hidden, I]`.
    pub down: Tensor,
}

/// The experts one row was routed to at one layer, best first, with their weights: the step
/// events' type, which `--routing` records as the block computes it.
pub use crate::trace::events::Route;

/// One sparse layer's routing of a pass: each row's experts and weights.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerRoutes {
    pub layer: usize,
    pub rows: Vec<Route>,
}

impl LayerRoutes {
    /// How many distinct experts the rows were routed to: the experts whose weights the layer
    /// read.
    pub fn distinct_experts(&self) -> usize {
        let mut all: Vec<u32> = self.rows.iter().flat_map(|r| r.experts.iter().copied()).collect();
        all.sort_unstable();
        all.dedup();
        all.len()
    }
}

impl MoeBlock {
    /// `{prefix}.gate.weight` and `{prefix}.experts.N.{gate,up,down}_proj.weight`, routed by
    /// softmax top-k (Qwen3-MoE).
    pub fn load(
        b: &Loader,
        prefix: &str,
        hidden: usize,
        shape: (usize, usize, usize),
        norm_topk_prob: bool,
    ) -> Result<Self> {
        Self::load_routed(b, prefix, hidden, shape, Routing::Softmax { norm: norm_topk_prob }, None)
    }

    /// [`MoeBlock::load`] with the routing rule `routing` and, where `shared` gives its
    /// intermediate size, the shared expert `{prefix}.shared_experts.{gate,up,down}_proj.weight`
    /// (read after the experts).
    pub fn load_routed(
        b: &Loader,
        prefix: &str,
        hidden: usize,
        (experts, top_k, intermediate): (usize, usize, usize),
        routing: Routing,
        shared: Option<usize>,
    ) -> Result<Self> {
        let router = b.proj(&[(format!("{prefix}.gate.weight"), experts)], hidden)?;
        let experts = (0..experts)
            .map(|e| SwiGlu::load(b, &format!("{prefix}.experts.{e}"), hidden, intermediate))
            .collect::<Result<Vec<_>>>()?;
        let shared = shared
            .map(|i| SwiGlu::load(b, &format!("{prefix}.shared_experts"), hidden, i))
            .transpose()?;
        let bias = match &routing {
            Routing::GroupedSigmoid(g) => {
                Some(Tensor::from_slice(&g.bias, g.bias.len(), b.device())?)
            }
            Routing::Softmax { .. } => None,
        };
        let mut block = MoeBlock { router, experts, top_k, routing, shared, bias, grouped: None };
        block.group()?;
        Ok(block)
    }

    /// Stacks the experts for the grouped kernels where every projection is `[out, in]`
    /// ([`Linear::Rows`]): one copy, after which each expert's projections are views into the
    /// stacks (so the standard layer and the streamed one read the same memory).
    pub fn group(&mut self) -> Result<()> {
        let rows = |e: &SwiGlu| e.gate_up_proj.rows().is_some() && e.down_proj.rows().is_some();
        if self.grouped.is_some() || !self.experts.iter().all(rows) {
            return Ok(());
        }
        let stack = |f: &dyn Fn(&SwiGlu) -> Option<&Tensor>| -> Result<Tensor> {
            let ts: Vec<&Tensor> = self.experts.iter().filter_map(f).collect();
            Ok(Tensor::stack(&ts, 0)?.contiguous()?)
        };
        let gate_up = stack(&|e| e.gate_up_proj.rows())?;
        let down = stack(&|e| e.down_proj.rows())?;
        self.set_views(&gate_up, &down)?;
        self.grouped = Some(Grouped { gate_up, down });
        Ok(())
    }

    /// Each expert's projections as views into the stacks, in the stacks' layout.
    fn set_views(&mut self, gate_up: &Tensor, down: &Tensor) -> Result<()> {
        let view = |w: &Tensor, e: usize| -> Result<Linear> {
            let v = w.get(e)?;
            Ok(match experts_dims(w.dims()) {
                Some((.., WeightLayout::Packed)) => Linear::Packed(v),
                _ => Linear::Rows(v),
            })
        };
        for (e, x) in self.experts.iter_mut().enumerate() {
            x.gate_up_proj = view(gate_up, e)?;
            x.down_proj = view(down, e)?;
        }
        Ok(())
    }

    /// Packs the grouped experts for the gemv (gemv.rs, `pack_experts`), where they are grouped,
    /// still rows, and of whole tiles (each of gate and up too). After [`MoeBlock::fold_norm`].
    /// The router keeps its rows (the host router and the grouped route read them).
    pub fn pack(&mut self) -> Result<()> {
        let Some(g) = &self.grouped else { return Ok(()) };
        let fits = |w: &Tensor, halves| matches!(experts_dims(w.dims()), Some((_, n, k, WeightLayout::Rows)) if packable(n, k, halves));
        if !fits(&g.gate_up, 2) || !fits(&g.down, 1) {
            return Ok(());
        }
        let (gate_up, down) = (pack_experts(&g.gate_up)?, pack_experts(&g.down)?);
        self.set_views(&gate_up, &down)?;
        self.grouped = Some(Grouped { gate_up, down });
        Ok(())
    }

    /// The grouped experts back in rows (the inverse of [`MoeBlock::pack`]), if packed.
    pub fn unpack(&mut self) -> Result<()> {
        if let Some(g) = self.rows_form()? {
            self.set_views(&g.gate_up, &g.down)?;
            self.grouped = Some(g);
        }
        Ok(())
    }

    /// A copy of this block whose experts (and shared expert) are rows, where they are packed
    /// (the stacks unpacked into new tensors; the router shared): for products over many rows,
    /// which would unpack each expert they route to. `None` where nothing is packed.
    pub fn unpacked(&self) -> Result<Option<MoeBlock>> {
        let (Some(g), Some(router)) = (self.rows_form()?, self.router.as_rows()?) else {
            return Ok(None);
        };
        let shared = match &self.shared {
            Some(s) => match (s.gate_up_proj.as_rows()?, s.down_proj.as_rows()?) {
                (Some(gate_up_proj), Some(down_proj)) => {
                    Some(SwiGlu { gate_up_proj, down_proj, intermediate: s.intermediate })
                }
                _ => return Ok(None),
            },
            None => None,
        };
        let experts = (self.experts.iter().enumerate())
            .map(|(e, x)| {
                Ok(SwiGlu {
                    gate_up_proj: Linear::Rows(g.gate_up.get(e)?),
                    down_proj: Linear::Rows(g.down.get(e)?),
                    intermediate: x.intermediate,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(MoeBlock {
            router,
            experts,
            top_k: self.top_k,
            routing: self.routing.clone(),
            shared,
            bias: self.bias.clone(),
            grouped: Some(g),
        }))
    }

    /// The grouped stacks as rows, if they are packed.
    fn rows_form(&self) -> Result<Option<Grouped>> {
        if !self.packed() {
            return Ok(None);
        }
        let Some(g) = &self.grouped else { return Ok(None) };
        Ok(Some(Grouped { gate_up: unpack_experts(&g.gate_up)?, down: unpack_experts(&g.down)? }))
    }

    /// Whether the grouped experts are packed ([`MoeBlock::pack`]).
    pub fn packed(&self) -> bool {
        self.grouped.as_ref().is_some_and(|g| {
            matches!(experts_dims(g.gate_up.dims()), Some((.., WeightLayout::Packed)))
        })
    }

    /// Multiplies the post-attention norm's weight `w` into the router's, every expert's and the
    /// shared expert's gate|up columns (the grouped kernels and the gemv scale each row by
    /// 1 / rms only), as the dense layer's fold does. Grouped form only.
    pub fn fold_norm(&mut self, w: &Tensor) -> Result<()> {
        let (Some(g), Some(router)) = (&mut self.grouped, self.router.rows()) else {
            anyhow::bail!("norms fold only into the grouped, [out, in] form of a MoE block");
        };
        let router = router.broadcast_mul(&w.unsqueeze(0)?)?.contiguous()?;
        g.gate_up = g.gate_up.broadcast_mul(&w.reshape((1, 1, w.elem_count()))?)?.contiguous()?;
        self.router = Linear::Rows(router);
        if let Some(s) = &mut self.shared {
            let Linear::Rows(rows) = &mut s.gate_up_proj else {
                anyhow::bail!("norms fold only into the shared expert's [out, in] rows");
            };
            *rows = rows.broadcast_mul(&w.unsqueeze(0)?)?.contiguous()?;
        }
        let (gu, dn) = (g.gate_up.clone(), g.down.clone());
        self.set_views(&gu, &dn)
    }

    /// The grouped form and the router `[experts, hidden]`, where the block has them.
    pub fn grouped(&self) -> Option<(&Grouped, &Tensor)> {
        Some((self.grouped.as_ref()?, self.router.rows()?))
    }

    /// Every projection of the block (router, each expert's gate|up and down, the shared
    /// expert's), for a change of layout before [`MoeBlock::group`].
    pub fn for_each_proj(&mut self, f: &mut dyn FnMut(&mut Linear) -> Result<()>) -> Result<()> {
        f(&mut self.router)?;
        for e in self.experts.iter_mut().chain(&mut self.shared) {
            f(&mut e.gate_up_proj)?;
            f(&mut e.down_proj)?;
        }
        Ok(())
    }

    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// How rows pick their experts.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    /// The grouped router's bias on the block's device (f32), where the routing has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Rows of each expert's activation (moe_intermediate_size).
    pub fn intermediate(&self) -> usize {
        self.experts.first().map_or(0, |e| e.intermediate)
    }

    /// `[T, hidden]` -> `[T, hidden]`, and each row's route.
    pub fn forward(&self, x: &Tensor, fused: bool) -> Result<(Tensor, Vec<Route>)> {
        let logits = self.router.forward(x)?.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;
        let routes: Vec<Route> = logits.iter().map(|l| self.routing.route(l, self.top_k)).collect();
        let groups = by_expert(&routes, self.experts.len());
        let expert = |(e, rows, weights): &(usize, Vec<u32>, Vec<f32>)| -> candle_core::Result<(Tensor, Tensor)> {
            let dev = x.device();
            let idx = Tensor::from_vec(rows.clone(), weights.len(), dev)?;
            let w = Tensor::from_vec(weights.clone(), (weights.len(), 1), dev)?.to_dtype(x.dtype())?;
            let y = self.experts[*e].forward(&x.index_select(&idx, 0)?, fused)?.broadcast_mul(&w)?;
            Ok((idx, y))
        };
        // On the CPU the experts run side by side, one a task: each is a few rows through small
        // products that forked on their own (two forks an expert, up to 32 experts a layer);
        // their sums then add up in the same expert order, so the result is the same.
        let outputs: Vec<(Tensor, Tensor)> = if x.device().is_cpu() && groups.len() > 1 {
            use rayon::prelude::*;
            groups.par_iter().map(expert).collect::<candle_core::Result<_>>()?
        } else {
            groups.iter().map(expert).collect::<candle_core::Result<_>>()?
        };
        let mut out = x.zeros_like()?;
        for (idx, y) in &outputs {
            out = out.index_add(idx, y, 0)?;
        }
        if let Some(s) = &self.shared {
            out = (out + s.forward(x, fused)?)?;
        }
        Ok((out, routes))
    }

    pub fn bytes(&self) -> usize {
        let bias = self.bias.as_ref().map_or(0, |b| b.elem_count() * 4);
        self.router.bytes()
            + bias
            + self.experts.iter().chain(&self.shared).map(SwiGlu::bytes).sum::<usize>()
    }

    pub fn experts(&self) -> usize {
        self.experts.len()
    }
}

/// For each expert some row was routed to, in ascending order: the expert, its rows (u32, for
/// `index_select`) and their weights.
fn by_expert(routes: &[Route], experts: usize) -> Vec<(usize, Vec<u32>, Vec<f32>)> {
    let mut per: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); experts];
    for (row, r) in routes.iter().enumerate() {
        for (&e, &w) in r.experts.iter().zip(&r.weights) {
            per[e as usize].0.push(row as u32);
            per[e as usize].1.push(w);
        }
    }
    per.into_iter()
        .enumerate()
        .filter(|(_, (rows, _))| !rows.is_empty())
        .map(|(e, (r, w))| (e, r, w))
        .collect()
}

/// Distinct experts `routes` touch (what the stats panel shows per pass).
pub fn distinct_experts(routes: &[Route]) -> usize {
    let mut seen: Vec<u32> = routes.iter().flat_map(|r| r.experts.iter().copied()).collect();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::{DType, Device};

    use super::*;
    use crate::model::layers::router::softmax_top_k as route;
    use crate::model::weights::WeightSource;

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-6)
    }

    #[test]
    fn route_is_softmax_then_top_k_then_renormalised() {
        let logits = [1.0f32, 3.0, 2.0, 0.5];
        let e: Vec<f64> = logits.iter().map(|&x| (x as f64).exp()).collect();
        let sum: f64 = e.iter().sum();
        let r = route(&logits, 2, false);
        assert_eq!(r.experts, vec![1, 2]);
        assert!(close(&r.weights, &[(e[1] / sum) as f32, (e[2] / sum) as f32]), "{:?}", r.weights);
        let r = route(&logits, 2, true);
        assert_eq!(r.experts, vec![1, 2]);
        let two = e[1] + e[2];
        assert!(close(&r.weights, &[(e[1] / two) as f32, (e[2] / two) as f32]), "{:?}", r.weights);
        let all = route(&logits, 4, false);
        assert_eq!(all.experts, vec![1, 2, 0, 3]);
        assert!((all.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn equal_probabilities_are_picked_as_torch_topk_picks_them() {
        // torch.topk(softmax([0, 2, 1, 2, 2]), 2) on the CPU: indices [1, 4]
        let r = route(&[0.0, 2.0, 1.0, 2.0, 2.0], 2, true);
        assert_eq!(r.experts, vec![1, 4]);
        assert_eq!(r.weights, vec![0.5, 0.5]);
        let r = route(&[0.0; 6], 3, false);
        assert_eq!(r.experts, vec![3, 5, 4]);
    }

    #[test]
    fn rows_are_grouped_by_expert_in_ascending_order() {
        let routes = vec![
            Route { experts: vec![2, 0], weights: vec![0.75, 0.25] },
            Route { experts: vec![0, 3], weights: vec![0.5, 0.5] },
        ];
        let groups = by_expert(&routes, 4);
        assert_eq!(
            groups,
            vec![
                (0, vec![0, 1], vec![0.25, 0.5]),
                (2, vec![0], vec![0.75]),
                (3, vec![1], vec![0.5])
            ]
        );
        assert_eq!(distinct_experts(&routes), 3);
    }

    /// Named f32 tensors in memory.
    struct Mem(HashMap<String, (Vec<f32>, Vec<usize>)>);

    impl WeightSource for Mem {
        fn get(
            &self,
            name: &str,
            shape: &[usize],
            dtype: DType,
            device: &Device,
        ) -> anyhow::Result<Tensor> {
            let (v, s) = self.0.get(name).ok_or_else(|| anyhow::anyhow!("no tensor {name}"))?;
            assert_eq!(s, shape, "{name}");
            Ok(Tensor::from_vec(v.clone(), s.as_slice(), device)?.to_dtype(dtype)?)
        }
        fn contains(&self, name: &str) -> bool {
            self.0.contains_key(name)
        }
    }

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed * 97)) % 2000) as f32
                    / 1000.0
                    - 1.0
            })
            .collect()
    }

    #[test]
    fn the_block_is_the_weighted_sum_of_each_rows_chosen_experts() {
        let (h, n, k, i) = (4usize, 3usize, 2usize, 5usize);
        let mut m = HashMap::new();
        m.insert("m.gate.weight".to_string(), (values(n * h, 1), vec![n, h]));
        for e in 0..n {
            for (p, shape, seed) in
                [("gate_proj", [i, h], 10), ("up_proj", [i, h], 20), ("down_proj", [h, i], 30)]
            {
                let len = shape[0] * shape[1];
                m.insert(
                    format!("m.experts.{e}.{p}.weight"),
                    (values(len, seed + e as u32), shape.to_vec()),
                );
            }
        }
        let w = Mem(m);
        let dev = Device::Cpu;
        let block =
            MoeBlock::load(&Loader::new(&w, DType::F32, &dev), "m", h, (n, k, i), true).unwrap();
        let x = values(3 * h, 7);
        let (y, routes) =
            block.forward(&Tensor::from_vec(x.clone(), (3, h), &dev).unwrap(), false).unwrap();
        let y = y.to_vec2::<f32>().unwrap();
        // The same by hand, row by row, in f64.
        let get = |name: &str| w.0[name].0.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let matvec = |wt: &[f64], rows: usize, x: &[f64]| -> Vec<f64> {
            (0..rows).map(|r| (0..x.len()).map(|c| wt[r * x.len() + c] * x[c]).sum()).collect()
        };
        for row in 0..3 {
            let xr: Vec<f64> = x[row * h..(row + 1) * h].iter().map(|&v| v as f64).collect();
            let logits: Vec<f32> =
                matvec(&get("m.gate.weight"), n, &xr).into_iter().map(|v| v as f32).collect();
            let want_route = route(&logits, k, true);
            assert_eq!(routes[row].experts, want_route.experts, "row {row}");
            let mut want = vec![0f64; h];
            for (&e, &wt) in want_route.experts.iter().zip(&want_route.weights) {
                let g = matvec(&get(&format!("m.experts.{e}.gate_proj.weight")), i, &xr);
                let u = matvec(&get(&format!("m.experts.{e}.up_proj.weight")), i, &xr);
                let act: Vec<f64> =
                    g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
                let d = matvec(&get(&format!("m.experts.{e}.down_proj.weight")), h, &act);
                want.iter_mut().zip(d).for_each(|(o, d)| *o += wt as f64 * d);
            }
            for (c, (&got, want)) in y[row].iter().zip(&want).enumerate() {
                assert!((got as f64 - want).abs() < 1e-5, "row {row} col {c}: {got} vs {want}");
            }
        }
        assert!(routes.iter().all(|r| r.experts.len() == k));
    }
}
