//! CUDA side of `moe_grouped.rs`: the grouped expert kernels of kernels/gemv.cu (kernels/moe.cuh
//! has the routing and the combine), launched through [`Args`] like every kernel of the
//! streamed layer (so under programmatic dependent launch unless `UNMASK_PDL=0`).
//!
//! A sparse layer after its router product runs in one of two forms ([`fused`]): four kernels
//! (the routing, gate|up and down from its table, the combine: session 18's, measured on the
//! H100, docs/perf.md) or two (the routing inside every gate|up block, the
//! combine inside the down kernel's last block of each column range), which removes two
//! launches and their drains from every sparse layer's chain. The two-kernel form is written
//! and compiled but not yet run on a GPU (no device in session 19): `UNMASK_MOE_FUSED=1` picks
//! it, and check-device checks both, so the next GPU session measures it and keeps one.

use std::sync::{Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaView, CudaViewMut, LaunchConfig};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, CudaStorage, Layout, Result, StorageRef};
use half::bf16;

use super::launch::{aligned, held_aligned, held_storage, Args};
use crate::model::gemv::{entry_name, grouped_split, Epilogue, Split};
use crate::model::moe_grouped::{expert_layout, route_scratch_bytes, ExpertsDownInto, ExpertsUpInto, DONE_WORDS, MAX_SLOTS, STATS_WORDS, TABLE_WORDS};

/// A sparse layer's kernels after its router product (a trial switch, `UNMASK_MOE_FORM`, a
/// comma-separated list of these flags; none: the four kernels). `route_up`: the routing in
/// every gate|up block (no route kernel); `down_sum`: the combine in the down kernel's last
/// blocks (no combine kernel); `early`: with a route kernel, gate|up lets the down kernel launch
/// only after its wait, and the down kernel reads the table and loads its first weights before
/// waiting for the activations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Form {
    pub route_up: bool,
    pub down_sum: bool,
    pub early: bool,
}

impl Form {
    pub fn parse(s: &str) -> Form {
        let has = |f: &str| s.split(',').any(|x| x.trim() == f);
        Form { route_up: has("route_up"), down_sum: has("down_sum"), early: has("early") }
    }
    /// Whether the down kernel reads the table early (only a route kernel's table can be).
    fn early(self) -> bool {
        self.early && !self.route_up
    }
}

static CHOICE: Mutex<Option<Form>> = Mutex::new(None);

/// The form: what [`set_form`] chose, else `UNMASK_MOE_FORM` (read once).
pub fn form() -> Form {
    static ENV: OnceLock<Form> = OnceLock::new();
    let chosen = *CHOICE.lock().unwrap_or_else(|e| e.into_inner());
    chosen.unwrap_or_else(|| *ENV.get_or_init(|| Form::parse(&std::env::var("UNMASK_MOE_FORM").unwrap_or_default())))
}

/// Picks the form for the passes that follow (check-device runs the MoE model in each);
/// `None` goes back to the environment's. A captured CUDA graph keeps the form it was
/// captured with.
pub fn set_form(f: Option<Form>) {
    *CHOICE.lock().unwrap_or_else(|e| e.into_inner()) = f;
}

/// The words `[at, at + len)` of the tables buffer, from its guard (`storage_and_layout`: the
/// ops hold the buffer, it is not an operand): a layer's table, the down kernel's block counts,
/// the counters. The kernels write through them.
fn words<'a>(g: &'a (StorageRef<'_>, &Layout), at: usize, len: usize) -> Result<CudaView<'a, u32>> {
    let (s, l) = held_storage(g, "moe: the tables")?;
    let at = l.start_offset() + at;
    Ok(s.as_cuda_slice::<u32>()?.slice(at..at + len))
}

/// A grouped kernel of the gemv module with its dynamic shared memory allowed; grid (tiles, T
/// * k slots: blocks past the pass's distinct experts return).
fn grouped_fn(dev: &CudaDevice, name: &str, s: &Split, smem: usize, t: usize, k: usize) -> Result<(impl std::ops::Deref<Target = CudaFunction>, LaunchConfig)> {
    let f = dev.get_or_load_custom_func(name, super::gemv::MODULE, super::gemv::ptx(dev)?)?;
    f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
    super::launch::carveout(&f)?;
    let slots = (t * k).min(MAX_SLOTS) as u32;
    let cfg = LaunchConfig { grid_dim: (s.blocks as u32, slots, 1), block_dim: (s.threads() as u32, 1, 1), shared_mem_bytes: smem as u32 };
    Ok((f, cfg))
}

pub fn experts_up(
    op: &ExpertsUpInto<'_>,
    (t, e, i, h): (usize, usize, usize, usize),
    (sa, la): (&mut CudaStorage, &Layout),
    (sx, lx): (&CudaStorage, &Layout),
    (sw, lw): (&CudaStorage, &Layout),
) -> Result<()> {
    let dev = sx.device().clone();
    let (x, w) = (aligned::<bf16>(sx, lx, "moe: x")?, aligned::<bf16>(sw, lw, "moe: expert gate|up")?);
    let Some((a, b)) = la.contiguous_offsets() else { candle_core::bail!("moe up: act must be contiguous") };
    let mut act = sa.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
    let s = grouped_split(i, h, Epilogue::SiluMul);
    let n = op.tables.elem_count();
    let form = form();
    if !form.route_up {
        route(op, (t, e), &dev)?;
        let smem = s.smem_bytes(t, h, Epilogue::SiluMul, true);
        let (f, cfg) = grouped_fn(&dev, &entry_name("unmask_gemv_moe_up_u4", expert_layout(lw)), &s, smem, t, op.k)?;
        let tg = op.tables.storage_and_layout();
        let table = words(&tg, op.layer * TABLE_WORDS, TABLE_WORDS)?;
        let stream = dev.cuda_stream();
        let mut b = Args::new(&stream);
        b.input(&w).input(&x).output(&mut act).input(&table).i32(t as i32).i32(i as i32).i32((h / 8) as i32).i32(s.ks as i32).f32(op.eps);
        b.i32(i32::from(form.early()));
        // SAFETY: kernels/gemv.cu's unmask_gemv_moe_up_u4[_p](w, x, act, MoeTable*, t_len, n,
        // k8, ks, eps, early); the op's dims checked w (E x 2 I x H), x and act; the route kernel
        // before it wrote the table (expert ids < E).
        return unsafe { b.launch(&f, cfg) };
    }
    // the staged x, the K split's sums, and first the routing's scratch
    let smem = s.smem_bytes(t, h, Epilogue::SiluMul, true).max(route_scratch_bytes(e));
    let (f, cfg) = grouped_fn(&dev, &entry_name("unmask_moe_route_up_u4", expert_layout(lw)), &s, smem, t, op.k)?;
    let (lg, tg) = (op.logits.storage_and_layout(), op.tables.storage_and_layout());
    let logits = held_aligned::<bf16>(&lg, "moe: router logits")?;
    let (table, stats) = (words(&tg, op.layer * TABLE_WORDS, TABLE_WORDS)?, words(&tg, n - STATS_WORDS, STATS_WORDS)?);
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(&logits).input(&table).input(&stats).i32(e as i32).i32(op.k as i32).i32(i32::from(op.norm));
    b.input(&w).input(&x).output(&mut act).i32(t as i32).i32(i as i32).i32((h / 8) as i32).i32(s.ks as i32).f32(op.eps);
    // SAFETY: kernels/gemv.cu's unmask_moe_route_up_u4[_p](logits [t, e] bf16, MoeTable*, u64[2],
    // e, k, norm, w, x, act, t_len, n, k8, ks, eps); the op's dims checked the logits, w (E x 2
    // I x H, rows or packed), x, act and that the tables hold the layer; the table and the
    // counters are words of the tables buffer, which nothing else touches while the pass runs;
    // the shared memory covers the routing's scratch.
    unsafe { b.launch(&f, cfg) }
}

/// The four-kernel form's routing: one block of 32 T threads writes the layer's table.
fn route(op: &ExpertsUpInto<'_>, (t, e): (usize, usize), dev: &CudaDevice) -> Result<()> {
    let f = dev.get_or_load_custom_func("unmask_moe_route", super::gemv::MODULE, super::gemv::ptx(dev)?)?;
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32 * t as u32, 1, 1), shared_mem_bytes: route_scratch_bytes(e) as u32 };
    let n = op.tables.elem_count();
    let (lg, tg) = (op.logits.storage_and_layout(), op.tables.storage_and_layout());
    let logits = held_aligned::<bf16>(&lg, "moe: router logits")?;
    let (table, stats) = (words(&tg, op.layer * TABLE_WORDS, TABLE_WORDS)?, words(&tg, n - STATS_WORDS, STATS_WORDS)?);
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(&logits).input(&table).input(&stats).i32(t as i32).i32(e as i32).i32(op.k as i32).i32(i32::from(op.norm));
    // SAFETY: kernels/gemv.cu's unmask_moe_route(logits [t, e] bf16, MoeTable*, u64[2], t, e, k,
    // norm); the up op's dims checked t <= 8, k <= 8, e <= 1024 and that the tables hold the
    // layer; the scratch fits e experts (at most 4.8 KB).
    unsafe { b.launch(&f, cfg) }
}

pub fn experts_down(
    op: &ExpertsDownInto<'_>,
    (t, _e, i, h): (usize, usize, usize, usize),
    (so, lo): (&mut CudaStorage, &Layout),
    (sa, la): (&CudaStorage, &Layout),
    (sw, lw): (&CudaStorage, &Layout),
) -> Result<()> {
    let dev = sa.device().clone();
    let (act, w) = (aligned::<bf16>(sa, la, "moe: act")?, aligned::<bf16>(sw, lw, "moe: expert down")?);
    let Some((a, b)) = lo.contiguous_offsets() else { candle_core::bail!("moe down: out must be contiguous") };
    let mut out = so.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
    let s = grouped_split(h, i, Epilogue::Plain);
    let smem = s.smem_bytes(t, i, Epilogue::Plain, false);
    let n = op.tables.elem_count();
    let form = form();
    if !form.down_sum {
        let (f, cfg) = grouped_fn(&dev, &entry_name("unmask_gemv_moe_down_u8", expert_layout(lw)), &s, smem, t, op.k)?;
        let (pg, tg) = (op.part.storage_and_layout(), op.tables.storage_and_layout());
        let (part, table) = (held_aligned::<f32>(&pg, "moe: part")?, words(&tg, op.layer * TABLE_WORDS, TABLE_WORDS)?);
        let stream = dev.cuda_stream();
        let mut b = Args::new(&stream);
        b.input(&w).input(&act).input(&part).input(&table).i32(t as i32).i32(h as i32).i32((i / 8) as i32).i32(s.ks as i32);
        b.i32(i32::from(form.early()));
        // SAFETY: kernels/gemv.cu's unmask_gemv_moe_down_u8[_p](w, x, part [t k, h] f32,
        // MoeTable*, t_len, n, k8, ks, early); the op's dims checked act, w and part; the table was
        // written by this layer's routing (expert ids < E).
        unsafe { b.launch(&f, cfg) }?;
        return combine(op, (t, h), &mut out, &dev);
    }
    if s.blocks > DONE_WORDS {
        candle_core::bail!("moe down: {} column blocks, the tables count at most {DONE_WORDS}", s.blocks);
    }
    let (f, cfg) = grouped_fn(&dev, &entry_name("unmask_moe_down_sum_u8", expert_layout(lw)), &s, smem, t, op.k)?;
    let (pg, rg, tg) = (op.part.storage_and_layout(), op.res.storage_and_layout(), op.tables.storage_and_layout());
    let (part, res) = (held_aligned::<f32>(&pg, "moe: part")?, held_aligned::<bf16>(&rg, "moe: residual")?);
    let (table, done) = (words(&tg, op.layer * TABLE_WORDS, TABLE_WORDS)?, words(&tg, n - STATS_WORDS - DONE_WORDS, DONE_WORDS)?);
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(&w).input(&act).input(&part).input(&table).input(&done).input(&res).output(&mut out);
    b.i32(t as i32).i32(h as i32).i32((i / 8) as i32).i32(s.ks as i32).i32(i32::from(form.early()));
    // SAFETY: kernels/gemv.cu's unmask_moe_down_sum_u8[_p](w, x, part [t k, h] f32, MoeTable*,
    // done [DONE_WORDS], res [t, h], out [t, h], t_len, n, k8, ks, early); the op's dims checked act,
    // w, out, part and res; the table was written by this layer's up kernel (expert ids < E);
    // at most DONE_WORDS column blocks, each count back at 0 when the kernel ends.
    unsafe { b.launch(&f, cfg) }
}

/// The four-kernel form's combine: `out = bf16(bf16(Σ_j part) + res)`, a thread an element.
fn combine(op: &ExpertsDownInto<'_>, (t, h): (usize, usize), out: &mut CudaViewMut<'_, bf16>, dev: &CudaDevice) -> Result<()> {
    let f = dev.get_or_load_custom_func("unmask_moe_combine", super::gemv::MODULE, super::gemv::ptx(dev)?)?;
    let cfg = LaunchConfig { grid_dim: ((t * h).div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (pg, rg) = (op.part.storage_and_layout(), op.res.storage_and_layout());
    let (part, res) = (held_aligned::<f32>(&pg, "moe: part")?, held_aligned::<bf16>(&rg, "moe: residual")?);
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(&part).input(&res).output(out).i32(t as i32).i32(h as i32).i32(op.k as i32);
    // SAFETY: kernels/gemv.cu's unmask_moe_combine(part [t k, h] f32, res [t, h] bf16, out [t,
    // h] bf16, t, h, k); the down op's dims checked the shapes.
    unsafe { b.launch(&f, cfg) }
}
