//! CUDA side of `moe_grouped.rs`: the grouped expert kernels of kernels/gemv.cu (kernels/moe.cuh
//! has the routing), launched through [`Args`] like every kernel of the streamed layer (so
//! under programmatic dependent launch unless `UNMASK_PDL=0`).
//!
//! A sparse layer after its router product is four kernels: the routing, gate|up and down from
//! its table, the combine. The down kernel reads the table and loads its first weights before
//! waiting for gate|up (kernels/gemv.cu, GRP). Two shorter chains, the routing in every gate|up
//! block and the combine in the down kernel's last blocks, were slower than these four
//! kernels.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaView, CudaViewMut, LaunchConfig,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, CudaStorage, Layout, Result, StorageRef};
use half::bf16;

use super::launch::{aligned, held_aligned, held_storage, Args};
use crate::model::fast::moe_grouped::{
    expert_layout, route_grouped_scratch_bytes, route_scratch_bytes, ExpertsDownInto,
    ExpertsUpInto, RouteRule, MAX_SLOTS, STATS_WORDS, TABLE_WORDS,
};
use crate::model::gemv::{entry_name, grouped_split, Epilogue, Split};

/// The words `[at, at + len)` of the tables buffer, from its guard (`storage_and_layout`: the
/// ops hold the buffer, it is not an operand): a layer's table, the counters. The kernels write
/// through them.
fn words<'a>(g: &'a (StorageRef<'_>, &Layout), at: usize, len: usize) -> Result<CudaView<'a, u32>> {
    let (s, l) = held_storage(g, "moe: the tables")?;
    let at = l.start_offset() + at;
    Ok(s.as_cuda_slice::<u32>()?.slice(at..at + len))
}

/// A grouped kernel of the gemv module with its dynamic shared memory allowed; grid (tiles, T
/// * k slots: blocks past the pass's distinct experts return).
fn grouped_fn(
    dev: &CudaDevice,
    name: &str,
    s: &Split,
    smem: usize,
    t: usize,
    k: usize,
) -> Result<(impl std::ops::Deref<Target = CudaFunction>, LaunchConfig)> {
    let f = dev.get_or_load_custom_func(name, super::gemv::MODULE, super::gemv::ptx(dev)?)?;
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )
    .w()?;
    super::launch::carveout(&f)?;
    let slots = (t * k).min(MAX_SLOTS) as u32;
    let cfg = LaunchConfig {
        grid_dim: (s.blocks as u32, slots, 1),
        block_dim: (s.threads() as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
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
    let (x, w) =
        (aligned::<bf16>(sx, lx, "moe: x")?, aligned::<bf16>(sw, lw, "moe: expert gate|up")?);
    let Some((a, b)) = la.contiguous_offsets() else {
        candle_core::bail!("moe up: act must be contiguous")
    };
    let mut act = sa.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
    let s = grouped_split(i, h, Epilogue::SiluMul);
    route(op, (t, e), &dev)?;
    let smem = s.smem_bytes(t, h, Epilogue::SiluMul, true);
    let (f, cfg) = grouped_fn(
        &dev,
        &entry_name("unmask_gemv_moe_up_u4", expert_layout(lw)),
        &s,
        smem,
        t,
        op.k,
    )?;
    let tg = op.tables.storage_and_layout();
    let table = words(&tg, op.layer * TABLE_WORDS, TABLE_WORDS)?;
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(&w)
        .input(&x)
        .output(&mut act)
        .input(&table)
        .i32(t as i32)
        .i32(i as i32)
        .i32((h / 8) as i32)
        .i32(s.ks as i32)
        .f32(op.eps);
    // SAFETY: kernels/gemv.cu's unmask_gemv_moe_up_u4[_p](w, x, act, MoeTable*, t_len, n, k8,
    // ks, eps); the op's dims checked w (E x 2 I x H), x and act; the route kernel before it
    // wrote the table (expert ids < E).
    unsafe { b.launch(&f, cfg) }
}

/// The routing: one block of 32 T threads writes the layer's table, by the softmax router
/// (`unmask_moe_route`) or LLaDA2's grouped sigmoid one (`unmask_moe_route_grouped`).
fn route(op: &ExpertsUpInto<'_>, (t, e): (usize, usize), dev: &CudaDevice) -> Result<()> {
    let (name, smem) = match op.rule {
        RouteRule::Softmax { .. } => ("unmask_moe_route", route_scratch_bytes(e)),
        RouteRule::GroupedSigmoid { .. } => {
            ("unmask_moe_route_grouped", route_grouped_scratch_bytes(e, t))
        }
    };
    let f = dev.get_or_load_custom_func(name, super::gemv::MODULE, super::gemv::ptx(dev)?)?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32 * t as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let n = op.tables.elem_count();
    let (lg, tg) = (op.logits.storage_and_layout(), op.tables.storage_and_layout());
    let logits = held_aligned::<bf16>(&lg, "moe: router logits")?;
    let (table, stats) = (
        words(&tg, op.layer * TABLE_WORDS, TABLE_WORDS)?,
        words(&tg, n - STATS_WORDS, STATS_WORDS)?,
    );
    let bias_held = match op.rule {
        RouteRule::GroupedSigmoid { bias, .. } => Some(bias.storage_and_layout()),
        RouteRule::Softmax { .. } => None,
    };
    let bias =
        bias_held.as_ref().map(|g| held_aligned::<f32>(g, "moe: router bias")).transpose()?;
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    match (op.rule, &bias) {
        (RouteRule::Softmax { norm }, _) => {
            b.input(&logits)
                .input(&table)
                .input(&stats)
                .i32(t as i32)
                .i32(e as i32)
                .i32(op.k as i32)
                .i32(i32::from(norm));
            // SAFETY: kernels/gemv.cu's unmask_moe_route(logits [t, e] bf16, MoeTable*, u64[2],
            // t, e, k, norm); the up op's dims checked t <= 8, k <= 8, e <= 1024 and that the
            // tables hold the layer; the scratch fits e experts (at most 4.8 KB).
            unsafe { b.launch(&f, cfg) }
        }
        (RouteRule::GroupedSigmoid { router, .. }, Some(bias)) => {
            b.input(&logits)
                .input(bias)
                .input(&table)
                .input(&stats)
                .i32(t as i32)
                .i32(e as i32)
                .i32(op.k as i32)
                .i32(router.groups as i32)
                .i32(router.keep as i32)
                .f32(router.scale);
            // SAFETY: kernels/gemv.cu's unmask_moe_route_grouped(logits [t, e] bf16, bias [e]
            // f32, MoeTable*, u64[2], t, e, k, groups, keep, scale); the up op's dims checked t
            // <= 8, k <= 8, e <= 1024, the tables hold the layer, and (`check_rule`) the bias
            // [e] f32, at most 32 groups dividing e into groups of two or more, k within the
            // kept groups; the scratch fits e experts and t rows (at most 37.6 KB, under the 48
            // KB a block has without opting in).
            unsafe { b.launch(&f, cfg) }
        }
        (RouteRule::GroupedSigmoid { .. }, None) => {
            candle_core::bail!("moe route: the grouped router's bias is not held")
        }
    }
}

pub fn experts_down(
    op: &ExpertsDownInto<'_>,
    (t, _e, i, h): (usize, usize, usize, usize),
    (so, lo): (&mut CudaStorage, &Layout),
    (sa, la): (&CudaStorage, &Layout),
    (sw, lw): (&CudaStorage, &Layout),
) -> Result<()> {
    let dev = sa.device().clone();
    let (act, w) =
        (aligned::<bf16>(sa, la, "moe: act")?, aligned::<bf16>(sw, lw, "moe: expert down")?);
    let Some((a, b)) = lo.contiguous_offsets() else {
        candle_core::bail!("moe down: out must be contiguous")
    };
    let mut out = so.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
    let s = grouped_split(h, i, Epilogue::Plain);
    let smem = s.smem_bytes(t, i, Epilogue::Plain, false);
    let (f, cfg) = grouped_fn(
        &dev,
        &entry_name("unmask_gemv_moe_down_u8", expert_layout(lw)),
        &s,
        smem,
        t,
        op.k,
    )?;
    let (pg, tg) = (op.part.storage_and_layout(), op.tables.storage_and_layout());
    let (part, table) =
        (held_aligned::<f32>(&pg, "moe: part")?, words(&tg, op.layer * TABLE_WORDS, TABLE_WORDS)?);
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(&w)
        .input(&act)
        .input(&part)
        .input(&table)
        .i32(t as i32)
        .i32(h as i32)
        .i32((i / 8) as i32)
        .i32(s.ks as i32);
    // SAFETY: kernels/gemv.cu's unmask_gemv_moe_down_u8[_p](w, x, part [t k, h] f32, MoeTable*,
    // t_len, n, k8, ks); the op's dims checked act, w and part; the table was written by this
    // layer's route kernel (expert ids < E), which has finished when this kernel starts: the up
    // kernel between them lets it launch only after its own wait (the table is read before
    // this kernel's wait).
    unsafe { b.launch(&f, cfg) }?;
    combine(op, (t, h), &mut out, &dev)
}

/// The combine: `out = bf16(bf16(Σ_j part) + res)`, a thread an element.
fn combine(
    op: &ExpertsDownInto<'_>,
    (t, h): (usize, usize),
    out: &mut CudaViewMut<'_, bf16>,
    dev: &CudaDevice,
) -> Result<()> {
    let f = dev.get_or_load_custom_func(
        "unmask_moe_combine",
        super::gemv::MODULE,
        super::gemv::ptx(dev)?,
    )?;
    let cfg = LaunchConfig {
        grid_dim: ((t * h).div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let (pg, rg) = (op.part.storage_and_layout(), op.res.storage_and_layout());
    let (part, res) =
        (held_aligned::<f32>(&pg, "moe: part")?, held_aligned::<bf16>(&rg, "moe: residual")?);
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(&part).input(&res).output(out).i32(t as i32).i32(h as i32).i32(op.k as i32);
    // SAFETY: kernels/gemv.cu's unmask_moe_combine(part [t k, h] f32, res [t, h] bf16, out [t,
    // h] bf16, t, h, k); the down op's dims checked the shapes.
    unsafe { b.launch(&f, cfg) }
}
