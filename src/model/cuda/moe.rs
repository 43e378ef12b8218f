//! CUDA side of `moe_grouped.rs`: kernels/moe.cu (route, combine) and the grouped forms of
//! kernels/gemv.cu (expert gate|up and down), launched through [`Args`] like every kernel of
//! the streamed layer (so under programmatic dependent launch unless `UNMASK_PDL=0`).

use std::sync::OnceLock;

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{CudaView, CudaViewMut, LaunchConfig};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, CudaStorage, Layout, Result};
use half::bf16;

use super::launch::{aligned, Args};
use crate::model::gemv::{entry_name, grouped_split, Epilogue};
use crate::model::moe_grouped::{expert_layout, CombineInto, ExpertsDownInto, ExpertsUpInto, RouteInto, MAX_SLOTS, STATS_WORDS, TABLE_WORDS};

pub const SOURCE: &str = include_str!("../../../kernels/moe.cu");
const MODULE: &str = "unmask_moe";

fn ptx(dev: &CudaDevice) -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let r = PTX.get_or_init(|| {
        let arch = super::launch::nvrtc_arch(dev, None).map_err(|e| e.to_string())?;
        super::nvrtc::compile_ptx(SOURCE, "moe.cu", arch)
    });
    match r {
        Ok(s) => Ok(s.as_str()),
        Err(e) => candle_core::bail!("NVRTC could not compile kernels/moe.cu: {e}"),
    }
}

/// The table words of `layer` (and the counters at the end) of the tables buffer `tables`.
fn with_table<R>(tables: &candle_core::Tensor, layer: usize, f: impl FnOnce(&CudaView<'_, u32>) -> Result<R>) -> Result<R> {
    let (st, l) = tables.storage_and_layout();
    let candle_core::Storage::Cuda(s) = &*st else { candle_core::bail!("moe: the tables are not on the GPU") };
    let at = l.start_offset() + layer * TABLE_WORDS;
    f(&s.as_cuda_slice::<u32>()?.slice(at..at + TABLE_WORDS))
}

pub fn route(op: &RouteInto, (t, e): (usize, usize), (st, lt): (&mut CudaStorage, &Layout), (sl, ll): (&CudaStorage, &Layout)) -> Result<()> {
    let dev = sl.device().clone();
    let logits = aligned::<bf16>(sl, ll, "moe: router logits")?;
    let n = lt.shape().elem_count();
    let base = lt.start_offset();
    let words = st.as_cuda_slice_mut::<u32>()?;
    // the table of this layer, and the u64 counters (8-byte aligned: TABLE_WORDS is even)
    let (mut head, mut tail) = words.split_at_mut(base + n - STATS_WORDS);
    let at = base + op.layer * TABLE_WORDS;
    let mut table = head.slice_mut(at..at + TABLE_WORDS);
    let mut stats = tail.slice_mut(0..STATS_WORDS);
    let f = dev.get_or_load_custom_func("unmask_moe_route", MODULE, ptx(&dev)?)?;
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32 * t as u32, 1, 1), shared_mem_bytes: 0 };
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(&logits).output(&mut table).output(&mut stats);
    b.i32(t as i32).i32(e as i32).i32(op.k as i32).i32(i32::from(op.norm));
    // SAFETY: kernels/moe.cu's unmask_moe_route(logits [t, e] bf16, MoeTable*, u64[2], t, e, k,
    // norm); RouteInto::dims checked t <= 8, k <= 8, e <= 1024 and that the tables hold layer.
    unsafe { b.launch(&f, cfg) }
}

/// Where a grouped product writes: the up form's bf16 activations, the down form's f32 slots.
enum Out<'a, 'b> {
    Bf16(&'a mut CudaViewMut<'b, bf16>),
    F32(&'a mut CudaViewMut<'b, f32>),
}

/// The grouped gemv launch shared by the up and down forms: grid (tiles, T * k slots).
#[allow(clippy::too_many_arguments)]
fn grouped(
    dev: &CudaDevice,
    name: &str,
    epilogue: Epilogue,
    (t, k, n, kdim): (usize, usize, usize, usize),
    w: &CudaView<'_, bf16>,
    x: &CudaView<'_, bf16>,
    out: Out<'_, '_>,
    table: &CudaView<'_, u32>,
    eps: Option<f32>,
) -> Result<()> {
    let s = grouped_split(n, kdim, epilogue);
    let f = dev.get_or_load_custom_func(name, super::gemv::MODULE, super::gemv::ptx(dev)?)?;
    let smem = s.smem_bytes(t, kdim, epilogue, eps.is_some());
    f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
    super::launch::carveout(&f)?;
    let slots = (t * k).min(MAX_SLOTS) as u32;
    let cfg = LaunchConfig { grid_dim: (s.blocks as u32, slots, 1), block_dim: (s.threads() as u32, 1, 1), shared_mem_bytes: smem as u32 };
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(w).input(x);
    match out {
        Out::Bf16(v) => b.output(v),
        Out::F32(v) => b.output(v),
    };
    b.input(table).i32(t as i32).i32(n as i32).i32((kdim / 8) as i32).i32(s.ks as i32);
    if let Some(eps) = eps {
        b.f32(eps);
    }
    // SAFETY: kernels/gemv.cu's unmask_gemv_moe_{up_u4,down_u8}[_p](w, x, y, table, t_len, n,
    // k8, ks[, eps]); the ops' dims checked w (E x rows x K values, rows or packed), x, y and the table; blocks past the
    // table's count return, every expert id in it is < E (the route kernel wrote it).
    unsafe { b.launch(&f, cfg) }
}

pub fn experts_up(
    op: &ExpertsUpInto<'_>,
    (t, _e, i, h): (usize, usize, usize, usize),
    (sa, la): (&mut CudaStorage, &Layout),
    (sx, lx): (&CudaStorage, &Layout),
    (sw, lw): (&CudaStorage, &Layout),
) -> Result<()> {
    let dev = sx.device().clone();
    let (x, w) = (aligned::<bf16>(sx, lx, "moe: x")?, aligned::<bf16>(sw, lw, "moe: expert gate|up")?);
    let Some((a, b)) = la.contiguous_offsets() else { candle_core::bail!("moe up: act must be contiguous") };
    let mut act = sa.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
    with_table(op.tables, op.layer, |table| {
        let name = entry_name("unmask_gemv_moe_up_u4", expert_layout(lw));
        grouped(&dev, &name, Epilogue::SiluMul, (t, op.k, i, h), &w, &x, Out::Bf16(&mut act), table, Some(op.eps))
    })
}

pub fn experts_down(
    op: &ExpertsDownInto<'_>,
    (t, _e, i, h): (usize, usize, usize, usize),
    (sp, lp): (&mut CudaStorage, &Layout),
    (sa, la): (&CudaStorage, &Layout),
    (sw, lw): (&CudaStorage, &Layout),
) -> Result<()> {
    let dev = sa.device().clone();
    let (act, w) = (aligned::<bf16>(sa, la, "moe: act")?, aligned::<bf16>(sw, lw, "moe: expert down")?);
    let Some((a, b)) = lp.contiguous_offsets() else { candle_core::bail!("moe down: part must be contiguous") };
    let mut part = sp.as_cuda_slice_mut::<f32>()?.slice_mut(a..b);
    with_table(op.tables, op.layer, |table| {
        let name = entry_name("unmask_gemv_moe_down_u8", expert_layout(lw));
        grouped(&dev, &name, Epilogue::Plain, (t, op.k, h, i), &w, &act, Out::F32(&mut part), table, None)
    })
}

pub fn combine(
    op: &CombineInto,
    (t, h): (usize, usize),
    (so, lo): (&mut CudaStorage, &Layout),
    (sp, lp): (&CudaStorage, &Layout),
    (sr, lr): (&CudaStorage, &Layout),
) -> Result<()> {
    let dev = sp.device().clone();
    let (part, res) = (aligned::<f32>(sp, lp, "moe: part")?, aligned::<bf16>(sr, lr, "moe: residual")?);
    let Some((a, b)) = lo.contiguous_offsets() else { candle_core::bail!("moe combine: out must be contiguous") };
    let mut out = so.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
    let f = dev.get_or_load_custom_func("unmask_moe_combine", MODULE, ptx(&dev)?)?;
    let cfg = LaunchConfig { grid_dim: ((t * h).div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let stream = dev.cuda_stream();
    let mut bld = Args::new(&stream);
    bld.input(&part).input(&res).output(&mut out).i32(t as i32).i32(h as i32).i32(op.k as i32);
    // SAFETY: unmask_moe_combine(part [t * k, h] f32, res [t, h] bf16, out [t, h] bf16, t, h, k);
    // CombineInto::dims checked the shapes.
    unsafe { bld.launch(&f, cfg) }
}
