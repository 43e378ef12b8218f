//! Compiling the model's kernel sources (kernels/fused.cu, gemv.cu) with NVRTC, with
//! kernels/common.cuh and moe.cuh handed over as named headers. gemv.cu and fused.cu include
//! common.cuh, gemv.cu moe.cuh, and on the GPU host there is no kernels/ folder to find them in
//! (the sources are built into the binary); `nvrtcCreateProgram` takes header sources by include
//! name, which cudarc's `compile_ptx_with_opts` leaves empty, hence this.
//! scripts/nvrtc_check.py does the same.
//!
//! With a kernel folder chosen at start-up (`UNMASK_KERNELS=DIR`, paths.rs) it compiles the
//! sources and headers found there (a copy of kernels/) in place of the built-in ones.

use std::ffi::{c_char, CString};
use std::mem::MaybeUninit;
use std::path::Path;

use candle_core::cuda_backend::cudarc::nvrtc::{result, sys};

use crate::model::paths::kernel_source;

/// Every header a kernel source may include, by include name.
const HEADERS: [(&str, &str); 2] = [
    ("common.cuh", include_str!("../../../kernels/common.cuh")),
    ("moe.cuh", include_str!("../../../kernels/moe.cuh")),
];

/// An NVRTC program, destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram, destroyed only here. A failure leaks it.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// The text of a NUL-terminated buffer NVRTC filled.
fn text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The PTX of the source `src` (`name`: its file name, for NVRTC's messages) for `arch`, or
/// NVRTC's default target without one, the source and headers read from `kernels` where it
/// names a folder; on failure NVRTC's error, the options and the log.
pub fn compile_ptx(
    src: &str,
    name: &str,
    arch: Option<&str>,
    kernels: Option<&Path>,
) -> Result<String, String> {
    let c = |s: &str| CString::new(s).map_err(|e| format!("{name}: {e}"));
    let (src, file) = (c(&kernel_source(kernels, name, src)?)?, c(name)?);
    let texts = HEADERS
        .iter()
        .map(|(n, t)| c(&kernel_source(kernels, n, t)?))
        .collect::<Result<Vec<_>, _>>()?;
    let names = HEADERS.iter().map(|(n, _)| c(n)).collect::<Result<Vec<_>, _>>()?;
    let headers: Vec<*const c_char> = texts.iter().map(|t| t.as_ptr()).collect();
    let includes: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let mut prog = MaybeUninit::uninit();
    // SAFETY: every pointer is a NUL-terminated string, alive until this function returns,
    // after the program is destroyed; as many headers as include names.
    unsafe {
        sys::nvrtcCreateProgram(
            prog.as_mut_ptr(),
            src.as_ptr(),
            file.as_ptr(),
            HEADERS.len() as i32,
            headers.as_ptr(),
            includes.as_ptr(),
        )
    }
    .result()
    .map_err(|e| format!("{e:?}"))?;
    // SAFETY: nvrtcCreateProgram succeeded, so it wrote the program.
    let prog = Program(unsafe { prog.assume_init() });
    let opts: Vec<String> = arch.map(|a| format!("--gpu-architecture={a}")).into_iter().collect();
    // SAFETY (the three calls below): `prog` is a live program until it is dropped.
    if let Err(e) = unsafe { result::compile_program(prog.0, &opts) } {
        let log = unsafe { result::get_program_log(prog.0) }.map(|l| text(&l)).unwrap_or_default();
        return Err(format!("{e:?} with {opts:?}: {log}"));
    }
    unsafe { result::get_ptx(prog.0) }.map(|p| text(&p)).map_err(|e| format!("{e:?}"))
}
