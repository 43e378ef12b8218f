//! Launching the fused kernels (kernels/fused.cu) and the gemv kernel (kernels/gemv.cu), on
//! compute capability 9.0+ with programmatic dependent launch unless the start-up choices turn
//! it off (`UNMASK_PDL=0`, paths.rs). It matters most to the streamed layer, whose six kernels a
//! layer are all launched here; the standard layer's projections are cuBLAS's, launched
//! normally, so it gains little.
//!
//! A block pass is a chain of short kernels; each one's launch (block scheduling, its
//! prologue) normally starts only when the kernel before it has finished. Launched this way, a
//! kernel may start as soon as every block of the previous one has executed
//! griddepcontrol.launch_dependents (every fused kernel does, after its own wait) or exited,
//! and its first instruction, griddepcontrol.wait, holds it until that kernel has finished and
//! its writes are visible: the launch overlaps the previous kernel's tail, and nothing is read
//! early. A CUDA graph captured from the stream keeps these relaxed edges.
//!
//! cudarc's launch builder has no launch attributes, so [`Args`] collects the parameters itself
//! (one 8-byte slot each; the driver reads as many bytes as the kernel's parameter has) and
//! calls `cuLaunchKernelEx`. [`aligned`] gives the gemv and MoE kernels their operands.

use std::ffi::c_void;
use std::ops::Deref;
use std::path::Path;
use std::sync::OnceLock;

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaStream, CudaView, DevicePtr, DevicePtrMut, LaunchConfig, SyncOnDrop,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, Layout, Result, Storage};

/// Whether the GPU of `stream` runs programmatic dependent launch (Hopper and later).
fn has_pdl(stream: &CudaStream) -> Result<bool> {
    let (major, _) = stream.context().compute_capability().w()?;
    Ok(major >= 9)
}

/// The NVRTC target for `dev`'s kernels: compute_90 where griddepcontrol exists (the kernels'
/// `__CUDA_ARCH__ >= 900` branches), else `fallback`.
pub fn nvrtc_arch(
    dev: &CudaDevice,
    fallback: Option<&'static str>,
) -> Result<Option<&'static str>> {
    Ok(if has_pdl(&dev.cuda_stream())? { Some("compute_90") } else { fallback })
}

/// The NVRTC target for kernels that use the tensor cores where the GPU has them: compute_90 on
/// Hopper and later, compute_80 on Ampere (mma.sync on bf16, ldmatrix), else NVRTC's default.
pub fn nvrtc_arch_tensor(dev: &CudaDevice) -> Result<Option<&'static str>> {
    let (major, _) = dev.cuda_stream().context().compute_capability().w()?;
    nvrtc_arch(dev, (major >= 8).then_some("compute_80"))
}

/// What the kernels' launches and their NVRTC compile take from the start-up choices
/// (paths.rs, `PathChoices`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchChoices {
    /// Programmatic dependent launch where the GPU has it.
    pub pdl: bool,
    /// The folder the kernel sources come from, else the copy built into the binary.
    pub kernels: Option<&'static Path>,
}

static CHOSEN: OnceLock<LaunchChoices> = OnceLock::new();

/// Sets the process's launch choices (each model load on a GPU hands its own over). One set a
/// process: the kernels compile once and candle keeps each loaded module, so choices that
/// differ from the first are refused with the reason, and the first stay.
pub fn choose(want: LaunchChoices) -> std::result::Result<(), String> {
    let have = *CHOSEN.get_or_init(|| want);
    if have != want {
        return Err(format!(
            "kernel launch choices {want:?} ignored: this process already launches with {have:?}"
        ));
    }
    Ok(())
}

/// The process's launch choices: those [`choose`] was given first, else every path on and the
/// built-in kernels.
pub fn chosen() -> LaunchChoices {
    *CHOSEN.get_or_init(|| LaunchChoices { pdl: true, kernels: None })
}

/// Whether kernels launch with programmatic dependent launch on `stream`: on a GPU that has
/// it, unless [`chosen`] turns it off. The GPU is only asked when it is on (this runs at every
/// launch).
fn pdl(stream: &CudaStream) -> Result<bool> {
    Ok(chosen().pdl && has_pdl(stream)?)
}

/// The preferred split of an SM between L1 and shared memory that the streamed layer's gemv
/// and attention kernels ask for, in percent of the most shared memory (132 KiB on an H200).
/// The gemvs need L1 (their loads in flight pass through it) and room for several blocks: the
/// largest L1 and the largest shared memory were both slower than the driver's choice, this
/// split faster.
const CARVEOUT_PERCENT: i32 = 58;

/// Sets `f`'s split of its SMs between L1 and shared memory to [`CARVEOUT_PERCENT`]. The driver
/// otherwise picks a split per kernel from the shared memory it takes, and an SM keeps a split
/// while any block runs on it, so under PDL a kernel's blocks ran under whatever split the
/// kernel before them on that SM had asked for.
pub fn carveout(f: &CudaFunction) -> Result<()> {
    f.set_attribute(
        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        CARVEOUT_PERCENT,
    )
    .w()?;
    Ok(())
}

/// The CUDA storage and layout of a tensor an op holds rather than takes as an operand, from
/// its guard (`Tensor::storage_and_layout`), so that a launch with several such tensors keeps
/// the guards side by side instead of a closure each.
pub fn held_storage<'a>(
    (st, l): &'a (impl Deref<Target = Storage>, &Layout),
    what: &str,
) -> Result<(&'a CudaStorage, &'a Layout)> {
    let Storage::Cuda(s) = &**st else { candle_core::bail!("{what}: not on the GPU") };
    Ok((s, l))
}

/// A held tensor's view ([`held_storage`]), contiguous and 16-byte aligned as [`aligned`]
/// asks of operands.
pub fn held_aligned<'a, T: CudaDType>(
    held: &'a (impl Deref<Target = Storage>, &Layout),
    what: &str,
) -> Result<CudaView<'a, T>> {
    let (s, l) = held_storage(held, what)?;
    aligned::<T>(s, l, what)
}

/// A view of a contiguous operand that starts 16-byte aligned. The alignment is in bytes
/// because that is what the hardware asks: kernels/gemv.cu reads x and W as uint4
/// (`ld.global.nc.v4.u32`, and x's 16-byte `cp.async`), which need 16-byte aligned addresses
/// whatever the element type. Buffers are allocated at least 256-byte aligned, so the start
/// offset decides. Operands the kernels read element by element (the residual, the router
/// logits, the MoE kernels' f32 slots) are held to the same rule, so one check serves every operand.
pub fn aligned<'a, T: CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{what} must be contiguous")
    };
    if !(a * std::mem::size_of::<T>()).is_multiple_of(16) {
        candle_core::bail!("{what} must start 16-byte aligned");
    }
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

/// A kernel's parameters, in order, and the cudarc guards that record the buffers' use on the
/// stream (kept until the launch is enqueued).
pub struct Args<'a> {
    stream: &'a CudaStream,
    slots: Vec<u64>,
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Args<'a> {
    pub fn new(stream: &'a CudaStream) -> Self {
        Args { stream, slots: Vec::with_capacity(16), guards: Vec::with_capacity(8) }
    }

    /// A buffer the kernel reads.
    pub fn input<T>(&mut self, v: &'a impl DevicePtr<T>) -> &mut Self {
        let (p, g) = v.device_ptr(self.stream);
        self.slots.push(p);
        self.guards.push(g);
        self
    }

    /// A buffer the kernel writes.
    pub fn output<T>(&mut self, v: &'a mut impl DevicePtrMut<T>) -> &mut Self {
        let (p, g) = v.device_ptr_mut(self.stream);
        self.slots.push(p);
        self.guards.push(g);
        self
    }

    /// A null pointer (an absent optional input).
    pub fn null(&mut self) -> &mut Self {
        self.slots.push(0);
        self
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.slots.push(v as u32 as u64);
        self
    }

    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.slots.push(v.to_bits() as u64);
        self
    }

    /// Enqueues `f` on the stream, under programmatic dependent launch where [`pdl`] says so.
    ///
    /// # Safety
    /// The parameters pushed must match `f`'s signature in number, order and type, and the
    /// kernel must stay inside the buffers it is given.
    pub unsafe fn launch(mut self, f: &CudaFunction, cfg: LaunchConfig) -> Result<()> {
        let pdl = pdl(self.stream)?;
        let mut params: Vec<*mut c_void> =
            self.slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        let mut value: sys::CUlaunchAttributeValue = std::mem::zeroed();
        value.programmaticStreamSerializationAllowed = 1;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(pdl),
        };
        self.stream.context().bind_to_thread().w()?;
        sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut())
            .result()
            .w()?;
        drop(self.guards);
        Ok(())
    }
}
