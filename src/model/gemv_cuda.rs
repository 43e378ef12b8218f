//! CUDA side of `gemv.rs`: kernels/gemv.cu, compiled once by NVRTC, launched through cudarc.
//! An ordinary launch: programmatic dependent launch (which the kernel supports: it asks for its
//! first weights before griddepcontrol.wait) sped up a chain of projections alone on the H200,
//! but showed no gain inside a forward (docs/perf.md, session 4).

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, Layout, Result};

use super::gemv::{split, Epilogue};

pub const SOURCE: &str = include_str!("../../kernels/gemv.cu");
const MODULE: &str = "unmask_gemv";

fn ptx(dev: &CudaDevice) -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let r = PTX.get_or_init(|| {
        // mma.sync on bf16 is sm_80 and later; the driver JITs this PTX for the card in hand.
        let arch = super::launch_cuda::nvrtc_arch(dev, Some("compute_80")).map_err(|e| e.to_string())?;
        let opts = CompileOptions { name: Some("gemv.cu".into()), arch, ..Default::default() };
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
    ptx(dev).map(drop)
}

pub fn launch(
    epilogue: Epilogue,
    t: usize,
    n: usize,
    k: usize,
    (sx, lx): (&CudaStorage, &Layout),
    (sw, lw): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let dev = sx.device().clone();
    let n_out = epilogue.out_rows(n);
    let s = split(n_out, k, epilogue);
    let name = match (epilogue, s.u) {
        (Epilogue::Plain, 8) => "unmask_gemv_u8",
        (Epilogue::Plain, _) => "unmask_gemv_u4",
        (Epilogue::SiluMul, _) => "unmask_gemv_silu_u4",
    };
    let f = dev.get_or_load_custom_func(name, MODULE, ptx(&dev)?)?;
    let smem = s.smem_bytes(t, k, epilogue);
    // x staged whole: past the default 48 KiB for K = 6144 and 8 rows
    f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32).w()?;
    let (Some((xa, xb)), Some((wa, wb))) = (lx.contiguous_offsets(), lw.contiguous_offsets()) else {
        candle_core::bail!("gemv: x and w must be contiguous");
    };
    if xa % 8 != 0 || wa % 8 != 0 {
        candle_core::bail!("gemv: x and w must start 16-byte aligned");
    }
    let x = sx.as_cuda_slice::<half::bf16>()?.slice(xa..xb);
    let w = sw.as_cuda_slice::<half::bf16>()?.slice(wa..wb);
    let y = unsafe { dev.alloc::<half::bf16>(t * n_out)? };
    let (t_i, n_i, k8, ks) = (t as i32, n_out as i32, (k / 8) as i32, s.ks as i32);
    let cfg = LaunchConfig { grid_dim: (s.blocks as u32, 1, 1), block_dim: (s.threads() as u32, 1, 1), shared_mem_bytes: smem as u32 };
    let mut b = f.builder();
    b.arg(&w).arg(&x).arg(&y).arg(&t_i).arg(&n_i).arg(&k8).arg(&ks);
    unsafe { b.launch(cfg) }.w()?;
    Ok(half::bf16::wrap_cuda_slice(y, dev))
}
