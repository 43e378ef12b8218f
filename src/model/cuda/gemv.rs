//! CUDA side of `gemv.rs`: kernels/gemv.cu, compiled once by NVRTC, launched through
//! `launch::Args` like the fused kernels (so under programmatic dependent launch unless
//! `UNMASK_PDL=0`; the kernel asks for its first weights before griddepcontrol.wait).

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{CudaView, CudaViewMut, LaunchConfig};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Tensor};
use half::bf16;

use super::launch::{aligned, held_aligned, Args};
use crate::model::gemv::{
    entry_name, kernel_name, split_for, Dims, Epilogue, GemvInto, WeightLayout,
};

pub const SOURCE: &str = include_str!("../../../kernels/gemv.cu");
pub(super) const MODULE: &str = "unmask_gemv";

pub(super) fn ptx(dev: &CudaDevice) -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let r = PTX.get_or_init(|| {
        // mma.sync on bf16 is sm_80 and later; the driver JITs this PTX for the card in hand.
        let arch = super::launch::nvrtc_arch(dev, Some("compute_80")).map_err(|e| e.to_string())?;
        super::nvrtc::compile_ptx(SOURCE, "gemv.cu", arch, super::launch::chosen().kernels)
    });
    match r {
        Ok(s) => Ok(s.as_str()),
        Err(e) => candle_core::bail!("NVRTC could not compile kernels/gemv.cu: {e}"),
    }
}

/// Whether the kernel can run on `dev` (compute capability 8.0 or later) and compiles; an
/// error means projections fall back to cuBLAS.
pub fn probe(dev: &CudaDevice) -> Result<()> {
    let (major, minor) = dev.cuda_stream().context().compute_capability().w()?;
    if major < 8 {
        candle_core::bail!("the gemv kernel needs compute capability 8.0 (tensor-core bf16), the GPU has {major}.{minor}");
    }
    ptx(dev).map(drop)
}

/// `y = …` of one form (`kernel_name`, its packed twin for a packed weight) into `y`, through [`Args`] (so under programmatic dependent
/// launch unless `UNMASK_PDL=0`: the kernel asks for its first weights before it waits).
/// `rms`: the norm forms' epsilon; `res`: the residual of the add forms.
#[allow(clippy::too_many_arguments)]
fn launch_raw(
    dev: &CudaDevice,
    epilogue: Epilogue,
    Dims { t, n, k, layout }: Dims,
    x: &CudaView<'_, bf16>,
    w: &CudaView<'_, bf16>,
    y: &mut CudaViewMut<'_, bf16>,
    rms: Option<f32>,
    res: Option<&CudaView<'_, bf16>>,
) -> Result<()> {
    let n_out = epilogue.out_rows(n);
    let s = split_for(n_out, k, epilogue, layout);
    let Some(name) = kernel_name(epilogue, rms.is_some(), res.is_some(), s.u) else {
        candle_core::bail!(
            "gemv: no kernel for {epilogue:?} with norm {} and residual {}",
            rms.is_some(),
            res.is_some()
        );
    };
    let f = dev.get_or_load_custom_func(&entry_name(name, layout), MODULE, ptx(dev)?)?;
    let smem = s.smem_bytes(t, k, epilogue, rms.is_some());
    // x staged whole: past the default 48 KiB for K = 6144 and 8 rows
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )
    .w()?;
    super::launch::carveout(&f)?;
    let cfg = LaunchConfig {
        grid_dim: (s.blocks as u32, 1, 1),
        block_dim: (s.threads() as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(w).input(x).output(y);
    match res {
        Some(r) => b.input(r),
        None => b.null(),
    };
    b.i32(t as i32).i32(n_out as i32).i32((k / 8) as i32).i32(s.ks as i32).f32(rms.unwrap_or(0.0));
    // SAFETY: the parameters follow kernels/gemv.cu's GEMV signature; the callers checked the
    // shapes (x [t, k], w n x k values in `layout`'s order, y and res [t, n_out]) and 16-byte
    // alignment.
    unsafe { b.launch(&f, cfg) }
}

pub fn launch(
    epilogue: Epilogue,
    d: Dims,
    (sx, lx): (&CudaStorage, &Layout),
    (sw, lw): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let dev = sx.device().clone();
    let (x, w) = (aligned(sx, lx, "gemv: x")?, aligned(sw, lw, "gemv: w")?);
    let mut y = unsafe { dev.alloc::<bf16>(d.t * epilogue.out_rows(d.n))? };
    launch_raw(&dev, epilogue, d, &x, &w, &mut y.as_view_mut(), None, None)?;
    Ok(bf16::wrap_cuda_slice(y, dev))
}

pub fn launch_into(
    op: &GemvInto<'_>,
    dims: Dims,
    (so, lo): (&mut CudaStorage, &Layout),
    (sx, lx): (&CudaStorage, &Layout),
    (sw, lw): (&CudaStorage, &Layout),
) -> Result<()> {
    let dev = sx.device().clone();
    let (x, w) = (aligned(sx, lx, "gemv: x")?, aligned(sw, lw, "gemv: w")?);
    let Some((a, b)) = lo.contiguous_offsets() else {
        candle_core::bail!("gemv: out must be contiguous")
    };
    let mut y = so.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
    // the residual, a tensor the op holds (not an operand), under its read lock
    let held = op.residual.map(Tensor::storage_and_layout);
    let residual = held.as_ref().map(|r| held_aligned::<bf16>(r, "gemv: residual")).transpose()?;
    launch_raw(&dev, op.epilogue, dims, &x, &w, &mut y, op.rms, residual.as_ref())
}

/// `n x k` bf16 values into layout `to` from the other (kernels/gemv.cu, `unmask_repack`; see
/// gemv.rs, `pack` and `unpack`), into a new buffer.
pub fn repack(
    to: WeightLayout,
    n: usize,
    k: usize,
    (s, l): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let dev = s.device().clone();
    let src = aligned::<bf16>(s, l, "repack: weight")?;
    let mut dst = unsafe { dev.alloc::<bf16>(n * k)? };
    let f = dev.get_or_load_custom_func("unmask_repack", MODULE, ptx(&dev)?)?;
    let fragments = n * k / 8;
    let cfg = LaunchConfig {
        grid_dim: (fragments.div_ceil(256).min(65535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let stream = dev.cuda_stream();
    let mut b = Args::new(&stream);
    b.input(&src)
        .output(&mut dst)
        .i32(n as i32)
        .i32((k / 8) as i32)
        .i32(i32::from(to == WeightLayout::Packed));
    // SAFETY: unmask_repack(src, dst, rows, k8, to_packed) over n x k bf16 values in both,
    // 16-byte aligned (checked); n is whole tiles and k whole steps (the op checked).
    unsafe { b.launch(&f, cfg) }?;
    Ok(bf16::wrap_cuda_slice(dst, dev))
}
