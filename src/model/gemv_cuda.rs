//! CUDA side of `gemv.rs`: kernels/gemv.cu, compiled once by NVRTC, launched through cudarc.

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, Layout, Result};

use super::gemv::{split, SMEM_BYTES, WARPS};

pub const SOURCE: &str = include_str!("../../kernels/gemv.cu");
const MODULE: &str = "unmask_gemv";

fn ptx() -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let r = PTX.get_or_init(|| {
        // mma.sync on bf16 is sm_80 and later; the driver JITs this PTX for the card in hand.
        let opts = CompileOptions { name: Some("gemv.cu".into()), arch: Some("compute_80"), ..Default::default() };
        compile_ptx_with_opts(SOURCE, opts).map(|p| p.to_src()).map_err(|e| format!("{e:?}"))
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
    ptx().map(drop)
}

pub fn launch(t: usize, n: usize, k: usize, (sx, lx): (&CudaStorage, &Layout), (sw, lw): (&CudaStorage, &Layout)) -> Result<CudaStorage> {
    let dev = sx.device().clone();
    let s = split(n);
    let f = dev.get_or_load_custom_func(&format!("unmask_gemv_ks{}", s.ks), MODULE, ptx()?)?;
    // over the default 48 KiB: the two staging buffers of every warp
    f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM_BYTES as i32).w()?;
    let (Some((xa, xb)), Some((wa, wb))) = (lx.contiguous_offsets(), lw.contiguous_offsets()) else {
        candle_core::bail!("gemv: x and w must be contiguous");
    };
    if xa % 8 != 0 || wa % 8 != 0 {
        candle_core::bail!("gemv: x and w must start 16-byte aligned");
    }
    let x = sx.as_cuda_slice::<half::bf16>()?.slice(xa..xb);
    let w = sw.as_cuda_slice::<half::bf16>()?.slice(wa..wb);
    let y = unsafe { dev.alloc::<half::bf16>(t * n)? };
    let (t_i, n_i, k_i) = (t as i32, n as i32, k as i32);
    let cfg = LaunchConfig { grid_dim: (s.blocks as u32, 1, 1), block_dim: (32 * WARPS as u32, 1, 1), shared_mem_bytes: SMEM_BYTES as u32 };
    let mut b = f.builder();
    b.arg(&w).arg(&x).arg(&y).arg(&t_i).arg(&n_i).arg(&k_i);
    unsafe { b.launch(cfg) }.w()?;
    Ok(half::bf16::wrap_cuda_slice(y, dev))
}
