//! Which device path a model takes: the fused ops (kernels/fused.cu, launched from cuda/ops.rs;
//! their CPU bodies in ops.rs), the gemv kernel's `[out, in]` projections and the streamed layer
//! (kernels/gemv.cu, cuda/gemv.rs; gemv.rs), the CPU's bf16 panels (linear.rs), and how the
//! runner drives a decode (engine/runner.rs). [`PathChoices`] holds every choice; the commands
//! read it from the environment once ([`PathChoices::from_env`]) and hand it to the model (in
//! its [`Compute`](super::Compute)) and the runner, so that a maintainer can turn one path off
//! to compare it with the others, and tests pick a path by value.

use std::borrow::Cow;
use std::path::Path;

use anyhow::{bail, Result};
use candle_core::{DType, Device};

use super::ops;

/// The device paths a process takes. [`PathChoices::DEFAULT`] is the fastest path of each
/// device; each field names the environment switch that changes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathChoices {
    /// `UNMASK_FUSED`: the fused ops, where their kernels take the dtype and compile (see
    /// [`fused_here`]); off, the generic candle chains they are checked against.
    pub fused: bool,
    /// `UNMASK_GEMV`: projections `[out, in]` for the gemv kernel and the streamed layer on a
    /// GPU in bf16 (see [`gemv_here`]); off, cuBLAS and the standard layer.
    pub gemv: bool,
    /// `UNMASK_PACKED`: the streamed layer's weights in the gemv kernel's packed order; off,
    /// in rows.
    pub packed: bool,
    /// `UNMASK_BF16_WEIGHTS`: bf16 panels for projections stored in bf16 on the CPU computing
    /// in f32; off, the weights widened to f32 through gemm.
    pub bf16_weights: bool,
    /// `UNMASK_PDL`: programmatic dependent launch on GPUs that have it (cuda/launch.rs).
    pub pdl: bool,
    /// `UNMASK_KERNELS=DIR`: the kernel sources NVRTC compiles come from DIR (a copy of
    /// kernels/) instead of the copy built into the binary (see [`kernel_source`]).
    pub kernels: Option<&'static Path>,
    /// `UNMASK_DEVICE_SAMPLER`: sample on the device; unset, on a GPU only.
    pub device_sampler: Option<bool>,
    /// `UNMASK_FIXED_PASSES`: block passes over fixed buffers; unset, on a GPU only.
    pub fixed_passes: Option<bool>,
    /// `UNMASK_CUDA_GRAPH`: fixed passes replayed as CUDA graphs; unset, on a GPU only.
    pub cuda_graph: Option<bool>,
}

impl Default for PathChoices {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl PathChoices {
    /// Every path on where the device has it.
    pub const DEFAULT: PathChoices = PathChoices {
        fused: true,
        gemv: true,
        packed: true,
        bf16_weights: true,
        pdl: true,
        kernels: None,
        device_sampler: None,
        fixed_passes: None,
        cuda_graph: None,
    };

    /// The choices the environment makes: each switch `0` (off) or `1` (on), unset for the
    /// default; `UNMASK_KERNELS` a folder. Any other value is an error naming the switch.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// [`PathChoices::from_env`] over `var`, which gives a variable's value if it is set.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let flag = |name: &str| -> Result<Option<bool>> {
            match var(name).as_deref() {
                None => Ok(None),
                Some("0") => Ok(Some(false)),
                Some("1") => Ok(Some(true)),
                Some(other) => bail!("{name}={other}: takes 0 (off) or 1 (on)"),
            }
        };
        let on =
            |name: &str, default: bool| Ok::<bool, anyhow::Error>(flag(name)?.unwrap_or(default));
        let d = Self::DEFAULT;
        let kernels = match var("UNMASK_KERNELS") {
            None => None,
            Some(dir) if Path::new(&dir).is_dir() => {
                // leaked once: a process compiles its kernels from one folder, and the choices
                // stay `Copy` for the model's `Compute`
                Some(&*Box::leak(Path::new(&dir).to_path_buf().into_boxed_path()))
            }
            Some(dir) => bail!("UNMASK_KERNELS={dir}: not a folder"),
        };
        Ok(PathChoices {
            fused: on("UNMASK_FUSED", d.fused)?,
            gemv: on("UNMASK_GEMV", d.gemv)?,
            packed: on("UNMASK_PACKED", d.packed)?,
            bf16_weights: on("UNMASK_BF16_WEIGHTS", d.bf16_weights)?,
            pdl: on("UNMASK_PDL", d.pdl)?,
            kernels,
            device_sampler: flag("UNMASK_DEVICE_SAMPLER")?,
            fixed_passes: flag("UNMASK_FIXED_PASSES")?,
            cuda_graph: flag("UNMASK_CUDA_GRAPH")?,
        })
    }

    /// Hands the choices the kernels' launches and their compile take (PDL, the kernel folder)
    /// to the CUDA side when `device` is a GPU (cuda/launch.rs, `choose`): they hold for the
    /// whole process, because the kernels compile once and candle keeps each loaded module.
    pub fn launch_on(&self, device: &Device) {
        #[cfg(feature = "cuda")]
        if device.is_cuda() {
            let want = super::cuda::launch::LaunchChoices { pdl: self.pdl, kernels: self.kernels };
            if let Err(e) = super::cuda::launch::choose(want) {
                crate::notice::warn(e);
            }
        }
        #[cfg(not(feature = "cuda"))]
        let _ = device;
    }
}

/// Fused ops unless `paths` turns them off, or their CUDA kernels cannot take this dtype or
/// compile here. On every device: a forward is about a quarter faster fused than through the
/// generic chains, whose every op is a kernel and a tensor of its own.
pub fn fused_here(device: &Device, dtype: DType, paths: &PathChoices) -> bool {
    if !paths.fused {
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
/// kernel compiles, unless `paths` turns it off (cuBLAS and the standard layer). A block pass
/// reads every weight once for a few rows, and the gemv kernel streams weights faster than
/// cuBLAS does at that shape.
///
/// [`Linear::Rows`]: super::linear::Linear::Rows
pub fn gemv_here(device: &Device, dtype: DType, paths: &PathChoices) -> bool {
    if device.is_cpu() || dtype != DType::BF16 || !paths.gemv {
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

/// Whether projections stored in bf16 stay bf16 ([`Linear::Bf16`]): on the CPU computing in
/// f32, unless `paths` turns them off (the widened f32 weights through gemm).
///
/// [`Linear::Bf16`]: super::linear::Linear::Bf16
pub fn bf16_weights_here(device: &Device, dtype: DType, paths: &PathChoices) -> bool {
    device.is_cpu() && dtype == DType::F32 && paths.bf16_weights
}

/// The text of kernel file `name` (kernels/fused.cu, gemv.cu, common.cuh, moe.cuh) that NVRTC
/// compiles (cuda/nvrtc.rs): DIR/name where `dir` is DIR ([`PathChoices::kernels`]), else
/// `builtin`, the copy built into the binary. The GPU host has no cargo; this is how a kernel
/// change is tried there, or two versions of the kernels compared, with one binary.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // only the CUDA build compiles kernels
pub fn kernel_source<'a>(
    dir: Option<&Path>,
    name: &str,
    builtin: &'a str,
) -> Result<Cow<'a, str>, String> {
    let Some(dir) = dir else { return Ok(Cow::Borrowed(builtin)) };
    let path = dir.join(name);
    std::fs::read_to_string(&path)
        .map(Cow::Owned)
        .map_err(|e| format!("UNMASK_KERNELS: cannot read {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<PathChoices> {
        let vars: Vec<(String, String)> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        PathChoices::from_vars(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn unset_switches_are_the_defaults() {
        assert_eq!(with(&[]).unwrap(), PathChoices::DEFAULT);
        assert_eq!(PathChoices::default(), PathChoices::DEFAULT);
    }

    #[test]
    fn each_switch_takes_0_or_1() {
        let c = with(&[
            ("UNMASK_GEMV", "0"),
            ("UNMASK_PDL", "0"),
            ("UNMASK_FUSED", "1"),
            ("UNMASK_CUDA_GRAPH", "0"),
            ("UNMASK_DEVICE_SAMPLER", "1"),
        ])
        .unwrap();
        assert!(!c.gemv && !c.pdl && c.fused && c.packed && c.bf16_weights);
        assert_eq!(
            (c.device_sampler, c.fixed_passes, c.cuda_graph),
            (Some(true), None, Some(false))
        );
        let c = with(&[
            ("UNMASK_PACKED", "0"),
            ("UNMASK_BF16_WEIGHTS", "0"),
            ("UNMASK_FUSED", "0"),
            ("UNMASK_FIXED_PASSES", "1"),
        ])
        .unwrap();
        assert!(!c.packed && !c.bf16_weights && !c.fused && c.gemv && c.pdl);
        assert_eq!(c.fixed_passes, Some(true));
    }

    #[test]
    fn another_value_is_an_error_naming_the_switch() {
        for (name, value) in [
            ("UNMASK_GEMV", "yes"),
            ("UNMASK_CUDA_GRAPH", ""),
            ("UNMASK_PDL", "off"),
            ("UNMASK_FUSED", "2"),
        ] {
            let err = with(&[(name, value)]).unwrap_err().to_string();
            assert_eq!(err, format!("{name}={value}: takes 0 (off) or 1 (on)"));
        }
        let err =
            with(&[("UNMASK_KERNELS", "/nonexistent/unmask-kernels")]).unwrap_err().to_string();
        assert_eq!(err, "UNMASK_KERNELS=/nonexistent/unmask-kernels: not a folder");
    }

    #[test]
    fn kernel_sources_come_from_the_folder_named_else_the_binary() {
        let dir = std::env::temp_dir().join(format!("unmask-kernels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("gemv.cu"), "// edited").unwrap();
        let c = with(&[("UNMASK_KERNELS", dir.to_str().unwrap())]).unwrap();
        assert_eq!(c.kernels, Some(dir.as_path()));
        assert_eq!(kernel_source(None, "gemv.cu", "// built in").unwrap(), "// built in");
        assert_eq!(kernel_source(c.kernels, "gemv.cu", "// built in").unwrap(), "// edited");
        let err = kernel_source(c.kernels, "moe.cuh", "").unwrap_err();
        assert!(
            err.starts_with("UNMASK_KERNELS: cannot read ") && err.contains("moe.cuh"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_path_turned_off_by_value_is_off() {
        let off =
            PathChoices { gemv: false, fused: false, bf16_weights: false, ..PathChoices::DEFAULT };
        assert!(!fused_here(&Device::Cpu, DType::F32, &off));
        assert!(fused_here(&Device::Cpu, DType::F32, &PathChoices::DEFAULT));
        assert!(!bf16_weights_here(&Device::Cpu, DType::F32, &off));
        assert!(bf16_weights_here(&Device::Cpu, DType::F32, &PathChoices::DEFAULT));
        assert!(
            !gemv_here(&Device::Cpu, DType::BF16, &PathChoices::DEFAULT),
            "the gemv path is the GPU's"
        );
    }
}
