//! Which device path a model takes, decided once when it loads: the fused ops (kernels/fused.cu,
//! launched from cuda/ops.rs; their CPU bodies in ops.rs), the gemv kernel's `[out, in]`
//! projections and the streamed layer (kernels/gemv.cu, cuda/gemv.rs; gemv.rs), and the CPU's
//! bf16 panels (linear.rs). Each can be turned off by an environment switch for comparisons.

use std::borrow::Cow;
use std::path::Path;

use candle_core::{DType, Device};

use super::ops;

/// Fused ops unless turned off (`UNMASK_FUSED=0`), or their CUDA kernels cannot take this
/// dtype or compile here. On every device: on the H200 a forward costs 1.87 ms fused against
/// 2.56 ms with the generic chains (docs/perf.md, run 5).
pub fn fused_here(device: &Device, dtype: DType) -> bool {
    let wanted = ops::fused_override().unwrap_or(true);
    if !wanted {
        return false;
    }
    if device.is_cpu() {
        return true;
    }
    if !ops::cuda_dtype_ok(dtype) {
        return false;
    }
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        if let Err(e) = super::cuda::ops::probe(d) {
            crate::notice::warn(format!("fused kernels unavailable, using generic ops: {e}"));
            return false;
        }
    }
    true
}

/// Whether projections stay `[out, in]` for the gemv kernel ([`Linear::Rows`]), with the
/// norms folded in, so that block passes run the streamed layer: on a GPU in bf16 where the
/// kernel compiles, unless `UNMASK_GEMV=0` (cuBLAS and the standard layer, for comparisons).
/// On the H200 with programmatic dependent launch it is the faster path: 1.560 against 1.739
/// ms per forward, 128-token decodes (docs/perf.md, run 7).
pub fn gemv_here(device: &Device, dtype: DType) -> bool {
    if device.is_cpu() || dtype != DType::BF16 || std::env::var("UNMASK_GEMV").as_deref() == Ok("0") {
        return false;
    }
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        if let Err(e) = super::cuda::gemv::probe(d) {
            crate::notice::warn(format!("gemv kernel unavailable, using cuBLAS: {e}"));
            return false;
        }
    }
    true
}

/// Whether the streamed layer's `[out, in]` projections and MoE experts are packed in the order
/// the gemv kernel reads them (gemv.rs, `WeightLayout::Packed`), unless `UNMASK_PACKED=0` (the
/// rows, for comparisons). Asked where [`gemv_here`] holds, and for decodes whose blocks fit one
/// launch (`Model::set_packed`): on an H100 a forward took 4-9 % less
/// at SDAR-1.7B, 4B and 8B, 6.7 % less at 30B-A3B (docs/perf.md, session 17).
pub fn packed_here() -> bool {
    std::env::var("UNMASK_PACKED").as_deref() != Ok("0")
}

/// Whether projections stored in bf16 stay bf16 ([`Linear::Bf16`]): on the CPU computing in f32,
/// unless `UNMASK_BF16_WEIGHTS=0` (for comparisons: the widened f32 weights through gemm).
pub fn bf16_weights_here(device: &Device, dtype: DType) -> bool {
    device.is_cpu() && dtype == DType::F32 && std::env::var("UNMASK_BF16_WEIGHTS").as_deref() != Ok("0")
}

/// The text of kernel file `name` (kernels/fused.cu, gemv.cu, common.cuh, moe.cuh) that NVRTC
/// compiles (cuda/nvrtc.rs): DIR/name under `UNMASK_KERNELS=DIR`, else `builtin`, the copy built
/// into the binary. The GPU host has no cargo; this is how a kernel change is tried there, or two
/// versions of the kernels compared in one call, with one binary (docs/gpu.md).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // only the CUDA build compiles kernels
pub fn kernel_source<'a>(name: &str, builtin: &'a str) -> Result<Cow<'a, str>, String> {
    kernel_source_in(std::env::var_os("UNMASK_KERNELS").as_deref().map(Path::new), name, builtin)
}

fn kernel_source_in<'a>(dir: Option<&Path>, name: &str, builtin: &'a str) -> Result<Cow<'a, str>, String> {
    let Some(dir) = dir else { return Ok(Cow::Borrowed(builtin)) };
    let path = dir.join(name);
    std::fs::read_to_string(&path).map(Cow::Owned).map_err(|e| format!("UNMASK_KERNELS: cannot read {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_sources_come_from_the_folder_named_else_the_binary() {
        let dir = std::env::temp_dir().join(format!("unmask-kernels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("gemv.cu"), "// edited").unwrap();
        assert_eq!(kernel_source_in(None, "gemv.cu", "// built in").unwrap(), "// built in");
        assert_eq!(kernel_source_in(Some(&dir), "gemv.cu", "// built in").unwrap(), "// edited");
        let err = kernel_source_in(Some(&dir), "moe.cuh", "").unwrap_err();
        assert!(err.starts_with("UNMASK_KERNELS: cannot read ") && err.contains("moe.cuh"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
