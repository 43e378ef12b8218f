//! The MoE block of a streamed block pass, as the GPU runs it (the grouped forms of
//! kernels/gemv.cu around kernels/moe.cuh, launched from `cuda/moe.rs`): after the router's
//! product, [`ExpertsUpInto`] routes on the device into a table and multiplies every touched
//! expert's gate|up, [`ExpertsDownInto`] multiplies their down products and adds them up with
//! the residual: two kernels each (`cuda/moe.rs`).
//! Nothing comes back to the host and every shape depends only on (T, experts, k), so a
//! captured CUDA graph replays the whole pass.
//!
//! The CPU bodies here are the same algorithm in Rust, written to be read against the kernels;
//! they are what CI runs (the GPU has no CI), and `check-device` compares the kernels with them.
//!
//! Numbers as the kernels round them: router logits bf16 (the norm-folded gemv), softmax in f32,
//! the top k ranked by logit (equal logits: the lower expert id first, a fixed rule the kernel
//! can apply cheaply; PyTorch's own order on exact ties is that of its sorts, which the CPU path
//! reproduces in topk.rs, so the two can differ only where two router logits are bit-equal);
//! or LLaDA2's grouped sigmoid router ([`RouteRule::GroupedSigmoid`], layers/router.rs) in f32
//! with the same rule on ties (of groups and of experts);
//! each expert's gate and up products rounded to bf16 before
//! silu(gate) * up, the down product rounded to bf16 then times the routing weight in f32, the
//! k choices of a row summed in order in f32, rounded to bf16, plus the residual.

use candle_core::{CpuStorage, DType, Layout, Result, Tensor};
use half::bf16;

use crate::model::layers::router::{best_two_sum, sigmoid, GroupedSigmoid};

use crate::model::gemv::{
    experts_dims, gemv_scaled, halves_fit, rms_inv_rows, rows_of, silu_mul_rows, WeightLayout,
};

/// Rows a block pass has at most (the gemv kernel's 8 columns).
pub const MAX_ROWS: usize = 8;
/// Choices a row has at most (num_experts_per_tok).
pub const MAX_CHOICES: usize = 8;
/// (row, choice) slots of a pass.
pub const MAX_SLOTS: usize = MAX_ROWS * MAX_CHOICES;
/// Experts a layer may have (the route kernel's taken-flags are 32 words of 32 bits).
pub const MAX_EXPERTS: usize = 1024;
/// u32 words of one routing table: kernels/gemv.cu's `MoeTable`, field by field.
pub const TABLE_WORDS: usize = 2 + MAX_SLOTS + MAX_SLOTS + MAX_SLOTS * 8 + MAX_SLOTS + MAX_SLOTS;
// The u64 counters follow the tables (`tables_len`) and the route kernel adds to them with
// 64-bit atomics: an odd table would misalign them after an odd number of layers
// (CUDA_ERROR_MISALIGNED_ADDRESS).
const _: () =
    assert!(TABLE_WORDS.is_multiple_of(2), "a routing table must be an even number of u32 words");
/// The two u64 counters at the end of the tables buffer: distinct experts summed over passes,
/// passes.
pub const STATS_WORDS: usize = 4;

/// Shared memory the route kernel takes for `e` experts: kernels/moe.cuh's
/// ROUTE_SCRATCH_WORDS(e) u32 words.
pub fn route_scratch_bytes(e: usize) -> usize {
    (3 * MAX_SLOTS + e) * 4
}

/// Shared memory the grouped route kernel takes for `e` experts and `t` rows (a warp a row):
/// kernels/moe.cuh's ROUTE_GROUPED_SCRATCH_WORDS(e, t) u32 words, at most 37.6 KB.
pub fn route_grouped_scratch_bytes(e: usize, t: usize) -> usize {
    route_scratch_bytes(e) + t * e * 4
}

/// Groups the grouped route kernel takes at most (a lane a group).
pub const MAX_GROUPS: usize = 32;

/// How the route op ranks and weighs a row's experts (a
/// [`MoeBlock`](crate::model::layers::moe::MoeBlock)'s routing): softmax top-k, or LLaDA2's
/// grouped sigmoid router, whose bias the kernel reads from `bias` (the router's `[experts]` f32
/// on the device; the CPU body reads the router's own).
#[derive(Clone, Copy, Debug)]
pub enum RouteRule<'a> {
    Softmax { norm: bool },
    GroupedSigmoid { router: &'a GroupedSigmoid, bias: &'a Tensor },
}

/// One layer's routing of one pass (kernels/gemv.cu's `MoeTable`).
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    pub k: usize,
    /// Distinct experts in first-seen order (row-major over (row, choice)).
    pub experts: Vec<u32>,
    /// Per distinct expert, the bitmask of the rows that chose it.
    pub rows: Vec<u32>,
    /// Per distinct expert, per row, the flat slot `t * k + j` that chose it (rows not in the
    /// mask: unspecified; the kernel leaves them as they were).
    pub slot: Vec<[i32; 8]>,
    /// Per slot `t * k + j`: the expert and its weight.
    pub topk: Vec<u32>,
    pub weight: Vec<f32>,
}

impl Table {
    /// The table as the kernels lay it out.
    pub fn to_words(&self) -> Vec<u32> {
        let mut w = vec![0u32; TABLE_WORDS];
        w[0] = self.experts.len() as u32;
        w[1] = self.k as u32;
        let (expert, rows, slot) = (2, 2 + MAX_SLOTS, 2 + 2 * MAX_SLOTS);
        let (topk, weight) = (slot + MAX_SLOTS * 8, slot + MAX_SLOTS * 9);
        for (u, &e) in self.experts.iter().enumerate() {
            w[expert + u] = e;
            w[rows + u] = self.rows[u];
            for t in 0..8 {
                w[slot + u * 8 + t] = self.slot[u][t] as u32;
            }
        }
        for (s, (&e, &p)) in self.topk.iter().zip(&self.weight).enumerate() {
            w[topk + s] = e;
            w[weight + s] = p.to_bits();
        }
        w
    }

    /// Reads a table back (`t` rows) from the kernels' layout.
    pub fn from_words(w: &[u32], t: usize) -> Result<Self> {
        if w.len() < TABLE_WORDS {
            candle_core::bail!("moe table: {} words, expected {TABLE_WORDS}", w.len());
        }
        let (count, k) = (w[0] as usize, w[1] as usize);
        if count > MAX_SLOTS || k > MAX_CHOICES || t * k > MAX_SLOTS {
            candle_core::bail!("moe table: {count} experts, k {k}, {t} rows out of range");
        }
        let (expert, rows, slot) = (2, 2 + MAX_SLOTS, 2 + 2 * MAX_SLOTS);
        let (topk, weight) = (slot + MAX_SLOTS * 8, slot + MAX_SLOTS * 9);
        Ok(Table {
            k,
            experts: w[expert..expert + count].to_vec(),
            rows: w[rows..rows + count].to_vec(),
            slot: (0..count).map(|u| std::array::from_fn(|t| w[slot + u * 8 + t] as i32)).collect(),
            topk: w[topk..topk + t * k].to_vec(),
            weight: w[weight..weight + t * k].iter().map(|&b| f32::from_bits(b)).collect(),
        })
    }

    /// `(expert, weight)` of row `t`'s choices, in rank order.
    pub fn row(&self, t: usize) -> impl Iterator<Item = (u32, f32)> + '_ {
        (0..self.k).map(move |j| (self.topk[t * self.k + j], self.weight[t * self.k + j]))
    }
}

/// Routes `t` rows of router logits `[t, e]`: softmax over all experts in f32, the top `k` by
/// logit (exact ties: the lower id; see the module's note), renormalised to sum 1 if `norm`. The table the kernels read.
pub fn route(logits: &[f32], t: usize, e: usize, k: usize, norm: bool) -> Table {
    table_of(logits, t, e, k, |z| {
        let mx = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = z.iter().map(|v| (v - mx).exp()).sum();
        let mut order: Vec<usize> = (0..e).collect();
        // stable: equal logits keep the lower id first
        order.sort_by(|&a, &b| z[b].total_cmp(&z[a]));
        let mut probs: Vec<f32> = order[..k].iter().map(|&i| (z[i] - mx).exp() / sum).collect();
        if norm {
            let s: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= s);
        }
        order.truncate(k);
        (order, probs)
    })
}

/// Routes `t` rows of router logits `[t, e]` by LLaDA2's grouped sigmoid router `g`, as
/// kernels/moe.cuh's route_grouped_block does: scores sigmoid(z) in f32, biased scores plus
/// `g.bias` (a NaN ranks as -inf), each group ranked by its two best biased scores summed, the
/// `g.keep` best groups' experts ranked by biased score, the top `k` weighted by their scores
/// over their sum (+ 1e-20, for k > 1) times `g.scale`; equal values rank the lower group or
/// expert first (layers/router.rs follows `torch.topk`'s order instead). The table the kernels
/// read.
pub fn route_grouped(logits: &[f32], t: usize, e: usize, k: usize, g: &GroupedSigmoid) -> Table {
    // larger first; equal ones keep their order (a stable sort: the lower id first)
    let desc = |a: f32, b: f32| b.partial_cmp(&a).unwrap_or(std::cmp::Ordering::Equal);
    let size = e / g.groups;
    table_of(logits, t, e, k, |z| {
        let scores: Vec<f32> = z.iter().map(|&x| sigmoid(x)).collect();
        let biased: Vec<f32> = (scores.iter().zip(&g.bias))
            .map(|(s, b)| s + b)
            .map(|b| if b.is_nan() { f32::NEG_INFINITY } else { b })
            .collect();
        let group_scores: Vec<f32> = biased.chunks(size).map(best_two_sum).collect();
        let mut groups: Vec<usize> = (0..g.groups).collect();
        groups.sort_by(|&a, &b| desc(group_scores[a], group_scores[b]));
        let mut kept = vec![false; g.groups];
        groups[..g.keep].iter().for_each(|&x| kept[x] = true);
        let masked: Vec<f32> =
            (0..e).map(|i| if kept[i / size] { biased[i] } else { f32::NEG_INFINITY }).collect();
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &b| desc(masked[a], masked[b]));
        order.truncate(k);
        let mut weights: Vec<f32> = order.iter().map(|&i| scores[i]).collect();
        let sum: f32 = weights.iter().sum();
        for w in &mut weights {
            *w = if k > 1 { *w / (sum + 1e-20) } else { *w } * g.scale;
        }
        (order, weights)
    })
}

/// The table of `t` rows of router logits `[t, e]`, each row's `k` experts (best first) and
/// their weights from `pick`.
fn table_of(
    logits: &[f32],
    t: usize,
    e: usize,
    k: usize,
    pick: impl Fn(&[f32]) -> (Vec<usize>, Vec<f32>),
) -> Table {
    let mut table = Table {
        k,
        experts: Vec::new(),
        rows: Vec::new(),
        slot: Vec::new(),
        topk: Vec::new(),
        weight: Vec::new(),
    };
    for r in 0..t {
        let (order, probs) = pick(&logits[r * e..(r + 1) * e]);
        for (j, (&ex, p)) in order.iter().zip(probs).enumerate() {
            let sl = (r * k + j) as i32;
            let u = match table.experts.iter().position(|&x| x as usize == ex) {
                Some(u) => u,
                None => {
                    table.experts.push(ex as u32);
                    table.rows.push(0);
                    table.slot.push([-1; 8]);
                    table.experts.len() - 1
                }
            };
            table.rows[u] |= 1 << r;
            table.slot[u][r] = sl;
            table.topk.push(ex as u32);
            table.weight.push(p);
        }
    }
    table
}

/// Checks the shared preconditions of the grouped ops: `t` rows, `k` choices.
fn check_rows(t: usize, k: usize) -> Result<()> {
    if t == 0 || t > MAX_ROWS || k == 0 || k > MAX_CHOICES {
        candle_core::bail!(
            "moe: {t} rows and {k} choices; the kernels take 1..={MAX_ROWS} and 1..={MAX_CHOICES}"
        );
    }
    Ok(())
}

/// Refuses a written tensor that shares its buffer with one the op only holds: the op locks the
/// written one for writing, then reads a held one's storage, which would wait on that lock.
fn refuse_aliases(written: &Tensor, held: &[(&Tensor, &str)], what: &str) -> Result<()> {
    let (w, _) = written.storage_and_layout();
    for (t, name) in held {
        let (h, _) = t.storage_and_layout();
        if std::ptr::eq(&*w, &*h) {
            candle_core::bail!("{what} shares its buffer with {name}");
        }
    }
    Ok(())
}

fn contiguous<'a, T>(v: &'a [T], l: &Layout, what: &str) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => candle_core::bail!("moe: {what} must be contiguous"),
    }
}

/// The routing tables of every sparse layer and the counters: `[layers * TABLE_WORDS +
/// STATS_WORDS]` u32, allocated once with the model and rewritten by each pass.
pub fn new_tables(layers: usize, device: &candle_core::Device) -> Result<Tensor> {
    Tensor::zeros(tables_len(layers), DType::U32, device)
}

/// u32 words of a tables buffer for `layers` sparse layers.
fn tables_len(layers: usize) -> usize {
    layers * TABLE_WORDS + STATS_WORDS
}

/// Whether a tables buffer laid out as `l` holds table `layer` and the words after the tables.
fn holds_layer(l: &Layout, layer: usize) -> bool {
    l.shape().elem_count() >= tables_len(layer + 1) && l.is_contiguous()
}

/// Checks that a tables buffer holds table `layer` (and the words after the tables).
fn check_tables(tables: &Tensor, layer: usize, what: &str) -> Result<()> {
    if !holds_layer(tables.layout(), layer) || tables.dtype() != DType::U32 {
        candle_core::bail!("{what}: the tables buffer does not hold layer {layer}");
    }
    Ok(())
}

/// Table `layer` of a tables buffer, read back to the host (for `--routing` and tests).
pub fn read_table(tables: &Tensor, layer: usize, t: usize) -> Result<Table> {
    let w = tables.narrow(0, layer * TABLE_WORDS, TABLE_WORDS)?.to_vec1::<u32>()?;
    Table::from_words(&w, t)
}

/// Every layer's table of a tables buffer in one copy back to the host (a copy a layer costs a
/// device round trip each: 48 of them made `--routing` a third of a 30B-A3B pass).
pub fn read_tables(tables: &Tensor, layers: usize, t: usize) -> Result<Vec<Table>> {
    let w = tables.narrow(0, 0, layers * TABLE_WORDS)?.to_vec1::<u32>()?;
    w.chunks(TABLE_WORDS).map(|c| Table::from_words(c, t)).collect()
}

/// (distinct experts summed over passes, passes) since the buffer was made.
pub fn read_stats(tables: &Tensor) -> Result<(u64, u64)> {
    let n = tables.dim(0)?;
    let w = tables.narrow(0, n - STATS_WORDS, STATS_WORDS)?.to_vec1::<u32>()?;
    Ok((w[0] as u64 | (w[1] as u64) << 32, w[2] as u64 | (w[3] as u64) << 32))
}

/// `tables[layer] = route(logits)` and the counters advanced. The CPU's step; on the GPU
/// [`ExpertsUpInto`] launches `unmask_moe_route` or `unmask_moe_route_grouped`
/// (kernels/moe.cuh), which write the same table.
pub struct RouteInto<'a> {
    pub layer: usize,
    pub k: usize,
    pub rule: RouteRule<'a>,
}

impl RouteInto<'_> {
    pub fn run(&self, tables: &Tensor, logits: &Tensor) -> Result<()> {
        tables.inplace_op2(logits, self)
    }

    /// `(t, e)`, after checking the logits and that the tables hold this layer.
    pub fn dims(&self, lt: &Layout, ll: &Layout) -> Result<(usize, usize)> {
        let (t, e) = ll.shape().dims2()?;
        check_rows(t, self.k)?;
        if e > MAX_EXPERTS || self.k > e {
            candle_core::bail!(
                "moe route: {e} experts, top {}; at most {MAX_EXPERTS} experts",
                self.k
            );
        }
        check_rule(&self.rule, e, self.k)?;
        if !holds_layer(lt, self.layer) {
            candle_core::bail!("moe route: the tables buffer does not hold layer {}", self.layer);
        }
        Ok((t, e))
    }
}

/// Checks a grouped router against `e` experts and `k` choices: its bias one value an expert,
/// its groups at most [`MAX_GROUPS`] and dividing the experts into groups of two or more, its
/// kept groups holding `k` experts.
fn check_rule(rule: &RouteRule, e: usize, k: usize) -> Result<()> {
    let RouteRule::GroupedSigmoid { router: g, bias } = rule else { return Ok(()) };
    let ok = g.bias.len() == e
        && bias.dims() == [e]
        && bias.dtype() == DType::F32
        && bias.is_contiguous()
        && (1..=MAX_GROUPS).contains(&g.groups)
        && e.is_multiple_of(g.groups)
        && e / g.groups >= 2
        && (1..=g.groups).contains(&g.keep)
        && k <= g.keep * (e / g.groups);
    if !ok {
        candle_core::bail!(
            "moe route: a grouped router of {} groups ({} kept, at most {MAX_GROUPS}), bias {:?} {:?}, for {e} experts, top {k}",
            g.groups,
            g.keep,
            bias.shape(),
            bias.dtype()
        );
    }
    Ok(())
}

impl candle_core::InplaceOp2 for RouteInto<'_> {
    fn name(&self) -> &'static str {
        "unmask-moe-route"
    }

    fn cpu_fwd(
        &self,
        st: &mut CpuStorage,
        lt: &Layout,
        sl: &CpuStorage,
        ll: &Layout,
    ) -> Result<()> {
        let (t, e) = self.dims(lt, ll)?;
        let logits: Vec<f32> = match sl {
            CpuStorage::BF16(v) => {
                contiguous(v, ll, "logits")?.iter().map(|x| x.to_f32()).collect()
            }
            CpuStorage::F32(v) => contiguous(v, ll, "logits")?.to_vec(),
            _ => candle_core::bail!("moe route: logits must be bf16 or f32"),
        };
        let CpuStorage::U32(words) = st else {
            candle_core::bail!("moe route: tables must be u32")
        };
        let words = &mut words[lt.start_offset()..];
        let table = match &self.rule {
            RouteRule::Softmax { norm } => route(&logits, t, e, self.k, *norm),
            RouteRule::GroupedSigmoid { router, .. } => {
                route_grouped(&logits, t, e, self.k, router)
            }
        };
        let at = self.layer * TABLE_WORDS;
        words[at..at + TABLE_WORDS].copy_from_slice(&table.to_words());
        let n = lt.shape().elem_count();
        let stats = &mut words[n - STATS_WORDS..n];
        let add = |lo: &mut [u32], v: u64| {
            let cur = lo[0] as u64 | (lo[1] as u64) << 32;
            let next = cur + v;
            lo[0] = next as u32;
            lo[1] = (next >> 32) as u32;
        };
        add(&mut stats[0..2], table.experts.len() as u64);
        add(&mut stats[2..4], 1);
        Ok(())
    }
}

/// `tables[layer] = route(logits)`, then `act[t * k + j] = silu(gate_e · x̂_t) * (up_e · x̂_t)`
/// for every slot, `e` its expert and `x̂_t` row t normalised (the post-attention norm's weight
/// is folded into every expert's columns). On the GPU two kernels, `unmask_moe_route`
/// (kernels/moe.cuh) and the grouped `unmask_gemv_moe_up_u4`; on the CPU [`RouteInto`] and
/// then the products, since the op writes the tables, which it only holds. `w`: `[experts, 2
/// I, H]` (or each expert packed), gate rows then up rows per expert; `logits`: `[T, experts]`.
pub struct ExpertsUpInto<'a> {
    pub tables: &'a Tensor,
    pub logits: &'a Tensor,
    pub layer: usize,
    pub k: usize,
    pub rule: RouteRule<'a>,
    pub eps: f32,
}

impl ExpertsUpInto<'_> {
    pub fn run(&self, act: &Tensor, x: &Tensor, w: &Tensor) -> Result<()> {
        refuse_aliases(
            act,
            &[(self.tables, "the tables"), (self.logits, "the router logits")],
            "moe up: act",
        )?;
        if !act.device().is_cuda() {
            RouteInto { layer: self.layer, k: self.k, rule: self.rule }
                .run(self.tables, self.logits)?;
        }
        act.inplace_op3(x, w, self)
    }

    /// `(t, experts, i, h)` after checking every operand.
    pub fn dims(
        &self,
        la: &Layout,
        lx: &Layout,
        lw: &Layout,
    ) -> Result<(usize, usize, usize, usize)> {
        let (t, h) = lx.shape().dims2()?;
        let (e, i2, wh) = expert_weights(lw, "moe up")?;
        check_rows(t, self.k)?;
        check_tables(self.tables, self.layer, "moe up")?;
        if self.logits.dims() != [t, e]
            || !self.logits.is_contiguous()
            || e > MAX_EXPERTS
            || self.k > e
        {
            candle_core::bail!("moe up: router logits {:?} for {t} rows of {e} experts (at most {MAX_EXPERTS}), top {}", self.logits.shape(), self.k);
        }
        check_rule(&self.rule, e, self.k)?;
        // packed, each half (gate, up) must be whole tiles: the kernel finds up a half apart
        if wh != h
            || !halves_fit(i2, expert_layout(lw))
            || la.shape().dims2()? != (t * self.k, i2 / 2)
            || !la.is_contiguous()
        {
            candle_core::bail!(
                "moe up: x {:?}, w {:?}, act {:?} do not fit",
                lx.shape(),
                lw.shape(),
                la.shape()
            );
        }
        Ok((t, e, i2 / 2, h))
    }
}

impl candle_core::InplaceOp3 for ExpertsUpInto<'_> {
    fn name(&self) -> &'static str {
        "unmask-moe-up"
    }

    fn cpu_fwd(
        &self,
        sa: &mut CpuStorage,
        la: &Layout,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
    ) -> Result<()> {
        let (t, _, i, h) = self.dims(la, lx, lw)?;
        let layout = expert_layout(lw);
        let (CpuStorage::BF16(act), CpuStorage::BF16(x), CpuStorage::BF16(w)) = (sa, sx, sw) else {
            candle_core::bail!("moe up: act, x and w must be bf16");
        };
        let (x, w) = (contiguous(x, lx, "x")?, contiguous(w, lw, "w")?);
        let table = read_table(self.tables, self.layer, t)?;
        let act = &mut act[la.start_offset()..];
        for (u, &e) in table.experts.iter().enumerate() {
            let rows: Vec<usize> = (0..t).filter(|r| table.rows[u] >> r & 1 == 1).collect();
            let xs: Vec<bf16> =
                rows.iter().flat_map(|&r| x[r * h..(r + 1) * h].iter().copied()).collect();
            let scale = rms_inv_rows(&xs, rows.len(), h, self.eps);
            let we =
                rows_of(&w[e as usize * 2 * i * h..(e as usize + 1) * 2 * i * h], 2 * i, h, layout);
            let gu = gemv_scaled(&xs, &we, (rows.len(), 2 * i, h), &scale);
            let y = silu_mul_rows(&gu, rows.len(), i);
            for (c, &r) in rows.iter().enumerate() {
                let sl = table.slot[u][r] as usize;
                act[sl * i..(sl + 1) * i].copy_from_slice(&y[c * i..(c + 1) * i]);
            }
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        sa: &mut candle_core::CudaStorage,
        la: &Layout,
        sx: &candle_core::CudaStorage,
        lx: &Layout,
        sw: &candle_core::CudaStorage,
        lw: &Layout,
    ) -> Result<()> {
        let dims = self.dims(la, lx, lw)?;
        crate::model::cuda::moe::experts_up(self, dims, (sa, la), (sx, lx), (sw, lw))
    }
}

/// `(experts, N, K)` of stacked expert weights, rows or packed (gemv.rs, `experts_dims`).
fn expert_weights(lw: &Layout, what: &str) -> Result<(usize, usize, usize)> {
    match experts_dims(lw.dims()) {
        Some((e, n, k, _)) if lw.is_contiguous() => Ok((e, n, k)),
        _ => candle_core::bail!(
            "{what}: expert weights {:?} are neither [E, N, K] rows nor packed, contiguous",
            lw.shape()
        ),
    }
}

/// How stacked expert weights lie (checked by [`expert_weights`] first).
pub fn expert_layout(lw: &Layout) -> WeightLayout {
    experts_dims(lw.dims()).map_or(WeightLayout::Rows, |d| d.3)
}

/// `out[t] = bf16(bf16(Σ_j part[t * k + j]) + res[t])`, `part[t * k + j] = bf16(down_e ·
/// act[t * k + j]) * weight[t * k + j]` (f32) for every slot `t * k + j`, `e` its expert:
/// the down products times their routing weights, summed in order, plus the residual. On the
/// GPU two kernels, the grouped `unmask_gemv_moe_down_u8` and `unmask_moe_combine`; `part` is
/// their scratch, which the CPU keeps in its own memory. On the GPU it must follow the layer's
/// [`ExpertsUpInto`] with nothing else writing that layer's table between them: the down kernel
/// reads the table before it waits for the kernel before it, which is safe because the up
/// kernel lets later kernels launch only once the routing has finished (kernels/gemv.cu, GRP).
/// `w`: `[experts, H, I]` (or each expert packed); `res` must not be `out` (the op holds it
/// while it writes `out`).
pub struct ExpertsDownInto<'a> {
    pub tables: &'a Tensor,
    pub part: &'a Tensor,
    pub res: &'a Tensor,
    pub layer: usize,
    pub k: usize,
}

impl ExpertsDownInto<'_> {
    pub fn run(&self, out: &Tensor, act: &Tensor, w: &Tensor) -> Result<()> {
        refuse_aliases(
            out,
            &[(self.tables, "the tables"), (self.part, "part"), (self.res, "the residual")],
            "moe down: out",
        )?;
        out.inplace_op3(act, w, self)
    }

    /// `(t, experts, i, h)` after checking every operand.
    pub fn dims(
        &self,
        lo: &Layout,
        la: &Layout,
        lw: &Layout,
    ) -> Result<(usize, usize, usize, usize)> {
        let (slots, i) = la.shape().dims2()?;
        let (e, h, wi) = expert_weights(lw, "moe down")?;
        let t = slots / self.k.max(1);
        check_rows(t, self.k)?;
        check_tables(self.tables, self.layer, "moe down")?;
        let fits =
            wi == i && slots == t * self.k && lo.shape().dims2()? == (t, h) && lo.is_contiguous();
        if !fits
            || self.part.dims() != [slots, h]
            || self.part.dtype() != DType::F32
            || self.res.dims() != [t, h]
        {
            let shapes = (la.shape(), lw.shape(), lo.shape(), self.part.shape(), self.res.shape());
            candle_core::bail!(
                "moe down: act {:?}, w {:?}, out {:?}, part {:?}, res {:?} do not fit",
                shapes.0,
                shapes.1,
                shapes.2,
                shapes.3,
                shapes.4
            );
        }
        Ok((t, e, i, h))
    }
}

impl candle_core::InplaceOp3 for ExpertsDownInto<'_> {
    fn name(&self) -> &'static str {
        "unmask-moe-down"
    }

    fn cpu_fwd(
        &self,
        so: &mut CpuStorage,
        lo: &Layout,
        sa: &CpuStorage,
        la: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
    ) -> Result<()> {
        let (t, _, i, h) = self.dims(lo, la, lw)?;
        let layout = expert_layout(lw);
        let (CpuStorage::BF16(out), CpuStorage::BF16(act), CpuStorage::BF16(w)) = (so, sa, sw)
        else {
            candle_core::bail!("moe down: out, act and w must be bf16");
        };
        let (act, w) = (contiguous(act, la, "act")?, contiguous(w, lw, "w")?);
        let table = read_table(self.tables, self.layer, t)?;
        let mut part = vec![0f32; t * self.k * h];
        for (u, &e) in table.experts.iter().enumerate() {
            let slots: Vec<usize> = (0..t)
                .filter(|r| table.rows[u] >> r & 1 == 1)
                .map(|r| table.slot[u][r] as usize)
                .collect();
            let xs: Vec<bf16> =
                slots.iter().flat_map(|&s| act[s * i..(s + 1) * i].iter().copied()).collect();
            let we = rows_of(&w[e as usize * h * i..(e as usize + 1) * h * i], h, i, layout);
            let y = gemv_scaled(&xs, &we, (slots.len(), h, i), &vec![1.0; slots.len()]);
            for (c, &s) in slots.iter().enumerate() {
                for n in 0..h {
                    part[s * h + n] = y[c * h + n].to_f32() * table.weight[s];
                }
            }
        }
        let (sr, lr) = self.res.storage_and_layout();
        let candle_core::Storage::Cpu(CpuStorage::BF16(res)) = &*sr else {
            candle_core::bail!("moe down: res must be bf16 on the CPU")
        };
        let res = contiguous(res, lr, "res")?;
        let out = &mut out[lo.start_offset()..];
        for r in 0..t {
            for c in 0..h {
                let s: f32 = (0..self.k).map(|j| part[(r * self.k + j) * h + c]).sum();
                out[r * h + c] =
                    bf16::from_f32(bf16::from_f32(s).to_f32() + res[r * h + c].to_f32());
            }
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        so: &mut candle_core::CudaStorage,
        lo: &Layout,
        sa: &candle_core::CudaStorage,
        la: &Layout,
        sw: &candle_core::CudaStorage,
        lw: &Layout,
    ) -> Result<()> {
        let dims = self.dims(lo, la, lw)?;
        crate::model::cuda::moe::experts_down(self, dims, (so, lo), (sa, la), (sw, lw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layers::router::GroupedSigmoid;
    use candle_core::Device;

    #[test]
    fn route_takes_the_top_k_renormalised_with_lower_ids_first_on_ties() {
        // row 0: experts 2 and 1 tie at the top; row 1 shares expert 3 with row 0
        let logits = [0.0, 3.0, 3.0, 2.0, -1.0, /* row 1 */ 1.0, 0.0, 0.0, 4.0, 0.5];
        let t = route(&logits, 2, 5, 3, true);
        assert_eq!(t.topk, vec![1, 2, 3, 3, 0, 4]);
        assert_eq!(t.experts, vec![1, 2, 3, 0, 4]);
        assert_eq!(t.rows, vec![0b01, 0b01, 0b11, 0b10, 0b10]);
        assert_eq!(t.slot[2][0], 2);
        assert_eq!(t.slot[2][1], 3);
        let (e3, e1, e2) = (3f32.exp(), 3f32.exp(), 2f32.exp());
        let want = [e3 / (e3 + e1 + e2), e1 / (e3 + e1 + e2), e2 / (e3 + e1 + e2)];
        for (g, w) in t.weight[..3].iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
        let s: f32 = t.weight[3..].iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
    }

    #[test]
    fn route_without_renormalising_keeps_softmax_probabilities() {
        let logits = [1.0, 2.0, 0.0, 0.5];
        let t = route(&logits, 1, 4, 2, false);
        let z: f32 = logits.iter().map(|v: &f32| v.exp()).sum();
        assert_eq!(t.topk, vec![1, 0]);
        assert!((t.weight[0] - 2f32.exp() / z).abs() < 1e-6);
        assert!((t.weight[1] - 1f32.exp() / z).abs() < 1e-6);
    }

    /// Deterministic values in [-2, 2).
    fn spread(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    /// Without ties the device route's grouped sigmoid router (the kernel's CPU body) picks what
    /// the host's (layers/router.rs) does, in the same order, with the same weights.
    #[test]
    fn the_grouped_route_equals_the_host_router_without_ties() {
        let (t, e, k) = (8, 32, 4);
        let g = GroupedSigmoid {
            bias: spread(e, 3).iter().map(|b| b * 0.05).collect(),
            groups: 8,
            keep: 3,
            scale: 2.5,
        };
        let logits = spread(t * e, 5);
        let table = route_grouped(&logits, t, e, k, &g);
        for r in 0..t {
            let want = g.route(&logits[r * e..(r + 1) * e], k);
            let (experts, weights): (Vec<u32>, Vec<f32>) = table.row(r).unzip();
            assert_eq!(experts, want.experts, "row {r}");
            for (a, b) in weights.iter().zip(&want.weights) {
                assert!((a - b).abs() < 1e-6, "row {r}: {weights:?} vs {:?}", want.weights);
            }
            // only kept groups: 3 of 8 groups of 4
            let groups: std::collections::BTreeSet<u32> = experts.iter().map(|x| x / 4).collect();
            assert!(groups.len() <= 3, "row {r}: groups {groups:?}");
        }
        assert!(table.experts.len() > k, "the rows took different experts");
    }

    /// The reference fixture's tie row (golden_llada2_router.json, layer 2, zero input): every
    /// score 0.5, groups 0 and 1 tie for the second kept group, experts 0 and 2 at the cut. The
    /// device route resolves both to the lower index: experts 5 and 0, 1.25 each.
    #[test]
    fn the_grouped_route_breaks_ties_by_the_lower_index() {
        let bias = vec![0.0625, -0.03125, 0.0625, -0.03125, 0.0, 0.09375, 0.0, -0.0625];
        let g = GroupedSigmoid { bias, groups: 4, keep: 2, scale: 2.5 };
        let table = route_grouped(&[0.0; 8], 1, 8, 2, &g);
        assert_eq!(table.row(0).collect::<Vec<_>>(), vec![(5, 1.25), (0, 1.25)]);
        // one expert a row: its score times the scale, not renormalised
        let table = route_grouped(&[0.0; 8], 1, 8, 1, &g);
        assert_eq!(table.row(0).collect::<Vec<_>>(), vec![(5, 1.25)]);
        // a NaN logit ranks last and never wins over a number
        let mut z = vec![0.0f32; 8];
        z[5] = f32::NAN;
        let experts: Vec<u32> = route_grouped(&z, 1, 8, 2, &g).row(0).map(|x| x.0).collect();
        assert!(!experts.contains(&5), "{experts:?}");
    }

    #[test]
    fn tables_round_trip_through_the_kernel_layout_and_count_passes() -> Result<()> {
        let dev = Device::Cpu;
        let tables = new_tables(3, &dev)?;
        let logits = Tensor::new(&[[0.5f32, 1.0, -2.0, 3.0], [3.0, 0.0, 1.0, 2.0]], &dev)?
            .to_dtype(DType::BF16)?;
        let op = RouteInto { layer: 1, k: 2, rule: RouteRule::Softmax { norm: true } };
        op.run(&tables, &logits)?;
        op.run(&tables, &logits)?;
        let back = read_table(&tables, 1, 2)?;
        let want = route(&[0.5, 1.0, -2.0, 3.0, 3.0, 0.0, 1.0, 2.0], 2, 4, 2, true);
        assert_eq!(back, want);
        assert_eq!(back.experts, vec![3, 1, 0]);
        assert_eq!(read_stats(&tables)?, (6, 2));
        assert_eq!(read_table(&tables, 0, 2)?.experts, Vec::<u32>::new());
        Ok(())
    }

    /// The grouped ops against the plain per-row MoE: for each row, each chosen expert's SwiGLU
    /// of the normed row times its weight, summed, plus the residual.
    #[test]
    fn grouped_ops_equal_the_per_row_reference() -> Result<()> {
        let dev = Device::Cpu;
        let (t, e, k, h, i) = (3usize, 6usize, 2usize, 64usize, 32usize);
        let rnd = |n: usize, seed: u64| -> Vec<f32> {
            let mut s = seed;
            (0..n)
                .map(|_| {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5
                })
                .collect()
        };
        let bf =
            |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape, &dev)?.to_dtype(DType::BF16);
        let x = bf(rnd(t * h, 1), &[t, h])?;
        let router = bf(rnd(e * h, 2), &[e, h])?;
        let gate_up = bf(rnd(e * 2 * i * h, 3), &[e, 2 * i, h])?;
        let down = bf(rnd(e * h * i, 4), &[e, h, i])?;
        let eps = 1e-6;
        // router logits through the norm-folded gemv (norm weight of ones)
        let xv: Vec<bf16> = x.flatten_all()?.to_vec1()?;
        let logits = gemv_scaled(
            &xv,
            &router.flatten_all()?.to_vec1::<bf16>()?,
            (t, e, h),
            &rms_inv_rows(&xv, t, h, eps),
        );
        let logits = Tensor::from_vec(logits, (t, e), &dev)?;
        let tables = new_tables(1, &dev)?;
        let act = Tensor::zeros((t * k, i), DType::BF16, &dev)?;
        let up = ExpertsUpInto {
            tables: &tables,
            logits: &logits,
            layer: 0,
            k,
            rule: RouteRule::Softmax { norm: true },
            eps,
        };
        up.run(&act, &x, &gate_up)?;
        let part = Tensor::zeros((t * k, h), DType::F32, &dev)?;
        let out = Tensor::zeros((t, h), DType::BF16, &dev)?;
        let down_op = ExpertsDownInto { tables: &tables, part: &part, res: &x, layer: 0, k };
        down_op.run(&out, &act, &down)?;
        assert_eq!(read_stats(&tables)?.1, 1, "the up op routed once");
        let got: Vec<f32> = out.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;

        // reference in f32 from the same bf16 values, one row and one expert at a time
        let f =
            |t: &Tensor| -> Result<Vec<f32>> { t.to_dtype(DType::F32)?.flatten_all()?.to_vec1() };
        let (xf, guf, dnf, lf) = (f(&x)?, f(&gate_up)?, f(&down)?, f(&logits)?);
        let table = route(&lf, t, e, k, true);
        let mut worst = 0f32;
        for r in 0..t {
            let row = &xf[r * h..(r + 1) * h];
            let rs = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / h as f32 + eps).sqrt();
            let mut acc = vec![0f32; h];
            for (ex, wt) in table.row(r) {
                let g = |n: usize| -> f32 {
                    (0..h).map(|c| guf[((ex as usize * 2 * i) + n) * h + c] * row[c] * rs).sum()
                };
                let a: Vec<f32> = (0..i)
                    .map(|n| {
                        let (gv, uv) = (g(n), g(i + n));
                        gv / (1.0 + (-gv).exp()) * uv
                    })
                    .collect();
                for (n, o) in acc.iter_mut().enumerate() {
                    *o +=
                        wt * (0..i).map(|c| dnf[(ex as usize * h + n) * i + c] * a[c]).sum::<f32>();
                }
            }
            for n in 0..h {
                let want = acc[n] + row[n];
                worst = worst.max((got[r * h + n] - want).abs() / (1.0 + want.abs()));
            }
        }
        assert!(worst < 2e-2, "grouped MoE differs from the per-row reference by {worst}");
        // every slot's activation was written (none left at zero)
        let a: Vec<f32> = f(&act)?;
        assert!((0..t * k).all(|s| a[s * i..(s + 1) * i].iter().any(|v| *v != 0.0)));
        // each expert packed: the same activations and slots, bit for bit
        let (gate_up_p, down_p) =
            (crate::model::gemv::pack_experts(&gate_up)?, crate::model::gemv::pack_experts(&down)?);
        assert_eq!(gate_up_p.dims(), &[e, 2 * i / 16, h / 32, 16, 32]);
        let (act_p, out_p) = (act.zeros_like()?, out.zeros_like()?);
        up.run(&act_p, &x, &gate_up_p)?;
        down_op.run(&out_p, &act, &down_p)?;
        assert_eq!(f(&act_p)?, a);
        assert_eq!(f(&out_p)?, f(&out)?);
        // an expert's packed slice is where the kernels look for it: expert e's rows, packed
        let one = crate::model::gemv::pack(&gate_up.get(4)?)?;
        assert_eq!(f(&gate_up_p.get(4)?)?, f(&one)?);
        Ok(())
    }

    /// A MoE model through the streamed layer (the grouped ops' CPU bodies, the router with the
    /// norm folded in) against the standard layer (MoeBlock's per-expert products): prefill,
    /// commit, cached denoise and the fixed-window pass, with a dense layer between sparse
    /// ones; and the routing read back from the tables equals the standard layer's.
    #[test]
    fn the_streamed_moe_layer_matches_the_standard_one() {
        use crate::model::random::passes;
        use crate::model::random::RandomWeights;
        use crate::model::Model;
        let cfg = crate::model::random::three_layer_moe((256, 4, 2, 1000, 512), (8, 3, 64));
        let dev = Device::Cpu;
        let load = || {
            let mut w = RandomWeights::on_host(&cfg, 9);
            w.std = 0.05; // wide enough for routes that differ row to row
            Model::load(&cfg, &w, DType::BF16, &dev).unwrap()
        };
        let (standard, mut streamed) = (load(), load());
        streamed.use_row_weights().unwrap();
        assert!(streamed.packed(), "the grouped experts and attention are packed, as on the GPU");
        assert!(!standard.streams(4, 24));
        assert!(streamed.streams(4, 24) && streamed.streams(8, 24));
        // the standard layer routes on the host: no CUDA graph; the streamed one is capturable
        assert!(!standard.capturable(4, 24) && streamed.capturable(4, 24));
        let ((a, ra), (b, rb)) = (passes::four(&streamed), passes::four(&standard));
        for (k, (x, y)) in a.iter().zip(&b).enumerate() {
            let e = passes::rel_err(x, y);
            assert!(e < 3e-2, "pass {k}: rel err {e}");
        }
        assert!(passes::distance(&a[2], &a[3]) < 1e-3, "window vs exact keys");
        // the same experts in the same order for every row of both sparse layers
        assert_eq!(ra.iter().map(|r| r.layer).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(rb.iter().map(|r| r.layer).collect::<Vec<_>>(), vec![0, 2]);
        for (x, y) in ra.iter().zip(&rb) {
            for (p, q) in x.rows.iter().zip(&y.rows) {
                assert_eq!(p.experts, q.experts, "layer {}", x.layer);
                for (u, v) in p.weights.iter().zip(&q.weights) {
                    assert!(
                        (u - v).abs() < 2e-2,
                        "layer {}: weights {:?} vs {:?}",
                        x.layer,
                        p.weights,
                        q.weights
                    );
                }
            }
        }
        let distinct: std::collections::BTreeSet<Vec<u32>> =
            ra[0].rows.iter().map(|r| r.experts.clone()).collect();
        assert!(
            distinct.len() > 1,
            "every row took the same experts: the test would not see a mix-up"
        );
        // 5 streamed passes (commit, denoise, window; prefill is standard) x 2 sparse layers
        let (touched, passes) = streamed.moe_stats().unwrap().unwrap();
        assert_eq!(passes, 6);
        assert!((3..=6 * 8).contains(&touched), "{touched}");
        assert_eq!(standard.moe_stats().unwrap(), None);
    }

    /// LLaDA2 through the streamed layer (the grouped sigmoid route, the shared expert's two
    /// gemvs before the grouped experts, q/k prep rotating half of each head) against the
    /// standard layer: the same four passes, the same experts for every row.
    #[test]
    fn the_streamed_llada2_layer_matches_the_standard_one() {
        use crate::model::random::passes;
        use crate::model::random::RandomWeights;
        use crate::model::Model;
        let cfg =
            crate::model::random::three_layer_llada2((256, 4, 2, 1000, 512), (16, 4, 64), (4, 2));
        let dev = Device::Cpu;
        // The grouped router decides at many cuts a row (groups kept, experts chosen), so the
        // two paths' bf16 roundings flip a near tie somewhere for many seeds, as they flip
        // between the standard layer in bf16 and in f32; this seed has none in any pass, so
        // the two must then agree expert for expert.
        let load = || {
            let mut w = RandomWeights::on_host(&cfg, 11);
            w.std = 0.05;
            Model::load(&cfg, &w, DType::BF16, &dev).unwrap()
        };
        let (standard, mut streamed) = (load(), load());
        streamed.use_row_weights().unwrap();
        assert!(streamed.packed(), "experts, shared expert and attention packed, as on the GPU");
        assert!(streamed.streams(4, 24) && streamed.streams(8, 24));
        let ((a, ra), (b, rb)) = (passes::four(&streamed), passes::four(&standard));
        for (k, (x, y)) in a.iter().zip(&b).enumerate() {
            let e = passes::rel_err(x, y);
            assert!(e < 2e-2, "pass {k}: rel err {e}");
        }
        assert!(passes::distance(&a[2], &a[3]) < 1e-3, "window vs exact keys");
        assert_eq!(ra.iter().map(|r| r.layer).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(rb.iter().map(|r| r.layer).collect::<Vec<_>>(), vec![1, 2]);
        for (x, y) in ra.iter().zip(&rb) {
            for (p, q) in x.rows.iter().zip(&y.rows) {
                assert_eq!(p.experts, q.experts, "layer {}", x.layer);
                for (u, v) in p.weights.iter().zip(&q.weights) {
                    assert!(
                        (u - v).abs() < 3e-2,
                        "layer {}: {:?} vs {:?}",
                        x.layer,
                        p.weights,
                        q.weights
                    );
                }
                let sum: f32 = p.weights.iter().sum();
                assert!((sum - 2.5).abs() < 1e-4, "renormalised and scaled: {sum}");
            }
        }
        let distinct: std::collections::BTreeSet<Vec<u32>> =
            ra[0].rows.iter().map(|r| r.experts.clone()).collect();
        assert!(distinct.len() > 1, "every row took the same experts");
        // the device counters count the grouped route's distinct experts, as the floor reads them
        let (touched, passes) = streamed.moe_stats().unwrap().unwrap();
        assert_eq!(passes, 6);
        assert!((4..=6 * 16).contains(&touched), "at most every expert of a layer: {touched}");
    }

    #[test]
    fn ops_refuse_a_written_tensor_that_is_one_they_hold() -> Result<()> {
        let dev = Device::Cpu;
        let (t, e, k, h, i) = (2usize, 4usize, 2usize, 32usize, 32usize);
        let tables = new_tables(1, &dev)?;
        let x = Tensor::zeros((t, h), DType::BF16, &dev)?;
        let down = Tensor::zeros((e, h, i), DType::BF16, &dev)?;
        let act = Tensor::zeros((t * k, i), DType::BF16, &dev)?;
        let part = Tensor::zeros((t * k, h), DType::F32, &dev)?;
        // out as the residual: refused with a message, not a wait on its own lock
        let err = ExpertsDownInto { tables: &tables, part: &part, res: &x, layer: 0, k }
            .run(&x, &act, &down)
            .unwrap_err()
            .to_string();
        assert!(err.contains("moe down: out shares its buffer with the residual"), "{err}");
        let logits = Tensor::zeros((t, e), DType::BF16, &dev)?;
        let gate_up = Tensor::zeros((e, 2 * i, h), DType::BF16, &dev)?;
        let up = ExpertsUpInto {
            tables: &tables,
            logits: &act,
            layer: 0,
            k,
            rule: RouteRule::Softmax { norm: true },
            eps: 1e-6,
        };
        let err = up.run(&act, &x, &gate_up).unwrap_err().to_string();
        assert!(err.contains("act shares its buffer with the router logits"), "{err}");
        ExpertsUpInto { logits: &logits, ..up }.run(&act, &x, &gate_up)?;
        Ok(())
    }

    #[test]
    fn ops_refuse_rows_and_choices_past_the_kernels() -> Result<()> {
        let dev = Device::Cpu;
        let tables = new_tables(1, &dev)?;
        let logits = Tensor::zeros((9, 4), DType::BF16, &dev)?;
        let err = RouteInto { layer: 0, k: 2, rule: RouteRule::Softmax { norm: true } }
            .run(&tables, &logits)
            .unwrap_err()
            .to_string();
        assert!(err.contains("9 rows"), "{err}");
        let logits = Tensor::zeros((2, 4), DType::BF16, &dev)?;
        let err = RouteInto { layer: 1, k: 2, rule: RouteRule::Softmax { norm: true } }
            .run(&tables, &logits)
            .unwrap_err()
            .to_string();
        assert!(err.contains("layer 1"), "{err}");
        Ok(())
    }
}
