//! Launching kernels/sampler.cu through cudarc from the candle custom op in `kernel.rs`.
//!
//! The source is compiled once per process by NVRTC at run time (the GPU host ships
//! libnvrtc.so.13; the build machine needs no nvcc for it) with `--fmad=false`, so the serial
//! tail does exactly the f32 operations of the CPU reference; candle caches the loaded module
//! per device.

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{CudaStorage, Layout, Shape};

use super::kernel::{KernelParams, NT, SEG};

pub const SOURCE: &str = include_str!("../../kernels/sampler.cu");
const MODULE: &str = "unmask_sampler";

/// The PTX of kernels/sampler.cu, compiled on first use.
pub fn ptx() -> candle_core::Result<&'static str> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    let r = PTX.get_or_init(|| {
        let opts = CompileOptions {
            fmad: Some(false),
            prec_div: Some(true),
            prec_sqrt: Some(true),
            ftz: Some(false),
            name: Some("sampler.cu".into()),
            ..Default::default()
        };
        compile_ptx_with_opts(SOURCE, opts).map(|p| p.to_src()).map_err(|e| format!("{e:?}"))
    });
    match r {
        Ok(s) => Ok(s.as_str()),
        Err(e) => candle_core::bail!("NVRTC could not compile kernels/sampler.cu: {e}"),
    }
}

pub fn launch(
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
    rows: usize,
    vocab: usize,
    p: &KernelParams,
) -> candle_core::Result<(CudaStorage, Shape)> {
    let dev = s1.device().clone();
    let (o1, _) = l1.contiguous_offsets().expect("checked by the op");
    let (o2, _) = l2.contiguous_offsets().expect("checked by the op");
    let uniforms = match &s2.slice {
        CudaStorageSlice::F32(u) => u.slice(o2..o2 + rows),
        _ => candle_core::bail!("unmask-sample: uniforms must be f32"),
    };
    let ptx = ptx()?;
    let out = unsafe { dev.alloc::<f32>(rows * 4)? };
    let part = unsafe { dev.alloc::<f32>(rows * SEG * 5)? };
    let stats = LaunchConfig {
        grid_dim: (rows as u32, SEG as u32, 1),
        block_dim: (NT as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (NT as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (vocab_u, mask, greedy) = (vocab as u32, p.mask_id, i32::from(p.greedy));
    let (inv_t, top_k, top_p, scaled, ties) =
        (p.inv_t, p.top_k, p.top_p, i32::from(p.scaled), i32::from(p.ties_kept));
    // the row statistics over SEG spans, then the decision per row
    macro_rules! go {
        ($x:expr, $suffix:literal) => {{
            let x = $x.slice(o1..o1 + rows * vocab);
            let f =
                dev.get_or_load_custom_func(concat!("unmask_sample_stats_", $suffix), MODULE, ptx)?;
            let mut b = f.builder();
            b.arg(&x).arg(&part).arg(&vocab_u).arg(&mask).arg(&greedy).arg(&inv_t);
            unsafe { b.launch(stats) }.w()?;
            let f = dev.get_or_load_custom_func(concat!("unmask_sample_", $suffix), MODULE, ptx)?;
            let mut b = f.builder();
            b.arg(&x).arg(&part).arg(&uniforms).arg(&out);
            b.arg(&vocab_u)
                .arg(&mask)
                .arg(&greedy)
                .arg(&inv_t)
                .arg(&top_k)
                .arg(&top_p)
                .arg(&scaled)
                .arg(&ties);
            unsafe { b.launch(cfg) }.w()?;
        }};
    }
    match &s1.slice {
        CudaStorageSlice::F32(x) => go!(x, "f32"),
        CudaStorageSlice::BF16(x) => go!(x, "bf16"),
        _ => candle_core::bail!("unmask-sample: logits must be f32 or bf16 on the GPU"),
    }
    Ok((CudaStorage { slice: CudaStorageSlice::F32(out), device: dev }, Shape::from((rows, 4))))
}
