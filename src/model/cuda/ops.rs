//! CUDA side of `ops.rs`: kernels/fused.cu, compiled once by NVRTC, launched through cudarc.

use std::ops::Deref;
use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};

use super::launch::Args;
use crate::model::ops::{AddRmsNorm, Attention, QkvPrep, SiluMul};
use candle_core::Device;
use half::bf16;

pub const SOURCE: &str = include_str!("../../../kernels/fused.cu");
const MODULE: &str = "unmask_fused";

fn ptx(dev: &CudaDevice) -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let r = PTX.get_or_init(|| {
        // compute_90 where the kernels can let the next one launch early (see fused.cu), compute_80
        // where the split attention's tensor-core products exist
        let arch = super::launch::nvrtc_arch_tensor(dev).map_err(|e| e.to_string())?;
        super::nvrtc::compile_ptx(SOURCE, "fused.cu", arch, super::launch::chosen().kernels)
    });
    match r {
        Ok(s) => Ok(s.as_str()),
        Err(e) => candle_core::bail!("NVRTC could not compile kernels/fused.cu: {e}"),
    }
}

/// Compiles kernels/fused.cu now; an error means the fused ops cannot run here.
pub fn probe(dev: &CudaDevice) -> Result<()> {
    ptx(dev).map(drop)
}

fn suffix(dt: DType) -> Result<&'static str> {
    match dt {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        other => candle_core::bail!("fused kernels take f32 or bf16, not {other:?}"),
    }
}

fn view<'a, T: CudaDType + DeviceRepr>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{what}: input must be contiguous");
    };
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

fn func_name(name: &str, dt: DType) -> Result<String> {
    Ok(format!("{name}_{}", suffix(dt)?))
}

/// A view of a tensor that is not one of the op's operands, from its held storage
/// (`Tensor::storage_and_layout`), so that a kernel with several such tensors needs no closure
/// per tensor.
fn held_view<'a, T: CudaDType + DeviceRepr>(
    held: &'a (impl Deref<Target = Storage>, &Layout),
    what: &str,
) -> Result<CudaView<'a, T>> {
    let (s, l) = super::launch::held_storage(held, what)?;
    view::<T>(s, l, what)
}

fn wrap<T: CudaDType + DeviceRepr>(out: CudaSlice<T>, dev: &CudaDevice) -> CudaStorage {
    T::wrap_cuda_slice(out, dev.clone())
}

pub fn qkv_prep(
    op: &QkvPrep,
    t_len: usize,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    (s3, l3): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device().clone();
    let (h, kv, d) = (op.heads, op.kv_heads, op.head_dim);
    let nh = h + 2 * kv;
    let n = nh * t_len * d;
    let dt = s1.dtype();
    // a warp per head where the head is 128 wide (every Qwen3, LLaDA2) with a rotary width the
    // warp's lanes split evenly, and the rows 8-byte aligned
    let by_warp = dt == DType::BF16
        && d == 128
        && warp_rotary(op.rotary)
        && [l1, l2, l3].iter().all(|l| l.start_offset() % 4 == 0);
    let (name, blocks, smem) = if by_warp {
        ("unmask_qkv_prep_bf16_d128".to_string(), nh.div_ceil(4), 0)
    } else {
        (func_name("unmask_qkv_prep", dt)?, nh, 3 * d * 4)
    };
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, t_len as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let f = dev.get_or_load_custom_func(&name, MODULE, ptx(&dev)?)?;
    let stream = dev.cuda_stream();
    let (t_i, h_i, kv_i, d_i) = (t_len as i32, h as i32, kv as i32, d as i32);
    macro_rules! go {
        ($T:ty) => {{
            let qkv = view::<$T>(s1, l1, "qkv-prep")?;
            let cos = view::<$T>(s2, l2, "qkv-prep cos")?;
            let sin = view::<$T>(s3, l3, "qkv-prep sin")?;
            let mut out = unsafe { dev.alloc::<$T>(n)? };
            let held = [&op.q_norm, &op.k_norm].map(Tensor::storage_and_layout);
            let (qn, kn) =
                (held_view::<$T>(&held[0], "q_norm")?, held_view::<$T>(&held[1], "k_norm")?);
            let mut b = Args::new(&stream);
            b.input(&qkv).input(&qn).input(&kn).input(&cos).input(&sin).output(&mut out);
            b.i32(t_i).i32(h_i).i32(kv_i);
            if !by_warp {
                b.i32(d_i);
            }
            b.i32(op.rotary as i32).f32(op.eps);
            unsafe { b.launch(&f, cfg) }?;
            wrap(out, &dev)
        }};
    }
    let st = match dt {
        DType::F32 => go!(f32),
        DType::BF16 => go!(half::bf16),
        other => candle_core::bail!("qkv-prep: {other:?}"),
    };
    Ok((st, Shape::from((nh, t_len, d))))
}

/// Grid (H, T), 512 threads (kernels/fused.cu says why), the scores and q of a row in dynamic
/// shared memory.
fn attention_cfg(op: &Attention, t_len: usize) -> Result<LaunchConfig> {
    let (h, d, keys) = (op.heads, op.head_dim, op.keys);
    // the callers asked ops::attention_takes; this says which bound a pass broke if one did not
    if !crate::model::ops::cuda_attention_takes(keys, d) {
        candle_core::bail!(
            "attention kernel: head_dim {d} with {keys} keys (takes a head_dim that is a multiple of 8 up to 256, \
             and up to {} keys plus it: 48 KiB of shared memory)",
            crate::model::ops::ATTENTION_MAX_KEYS_PLUS_D
        );
    }
    let smem = (d + keys + 16 * d) * 4;
    Ok(LaunchConfig {
        grid_dim: (h as u32, t_len as u32, 1),
        block_dim: (512, 1, 1),
        shared_mem_bytes: smem as u32,
    })
}

pub fn attention(
    op: &Attention,
    t_len: usize,
    cap: usize,
    (sq, lq): (&CudaStorage, &Layout),
    (skv, lkv): (&CudaStorage, &Layout),
    mask: Option<(&CudaStorage, &Layout)>,
) -> Result<(CudaStorage, Shape)> {
    let dev = sq.device().clone();
    let (h, kv, d, keys) = (op.heads, op.kv_heads, op.head_dim, op.keys);
    let cfg = attention_cfg(op, t_len)?;
    let dt = sq.dtype();
    let f = dev.get_or_load_custom_func(&func_name("unmask_attention", dt)?, MODULE, ptx(&dev)?)?;
    let (t_i, h_i, kv_i, d_i, cap_i, keys_i) =
        (t_len as i32, h as i32, kv as i32, d as i32, cap as i32, keys as i32);
    let stream = dev.cuda_stream();
    macro_rules! go {
        ($T:ty) => {{
            let q = view::<$T>(sq, lq, "attention q")?;
            let kvv = view::<$T>(skv, lkv, "attention kv")?;
            let (kpart, vpart) =
                (kvv.slice(0..kv * cap * d), kvv.slice(kv * cap * d..2 * kv * cap * d));
            let mut out = unsafe { dev.alloc::<$T>(t_len * h * d)? };
            let m = mask.map(|(s, l)| view::<$T>(s, l, "attention mask")).transpose()?;
            let mut b = Args::new(&stream);
            b.input(&q).input(&kpart).input(&vpart);
            match &m {
                Some(m) => b.input(m),
                None => b.null(),
            };
            b.output(&mut out)
                .i32(t_i)
                .i32(h_i)
                .i32(kv_i)
                .i32(d_i)
                .i32(cap_i)
                .i32(keys_i)
                .f32(op.scale);
            unsafe { b.launch(&f, cfg) }?;
            wrap(out, &dev)
        }};
    }
    let st = match dt {
        DType::F32 => go!(f32),
        DType::BF16 => go!(half::bf16),
        other => candle_core::bail!("attention: {other:?}"),
    };
    Ok((st, Shape::from((t_len, h * d))))
}

pub fn silu_mul(
    op: &SiluMul,
    t_len: usize,
    (s, l): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = s.device().clone();
    let i = op.intermediate;
    let n = t_len * i;
    let blocks = n.div_ceil(256).min(65535) as u32;
    let cfg =
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let dt = s.dtype();
    let f = dev.get_or_load_custom_func(&func_name("unmask_silu_mul", dt)?, MODULE, ptx(&dev)?)?;
    let (t_i, i_i) = (t_len as i32, i as i32);
    let stream = dev.cuda_stream();
    macro_rules! go {
        ($T:ty) => {{
            let x = view::<$T>(s, l, "silu-mul")?;
            let mut out = unsafe { dev.alloc::<$T>(n)? };
            let mut b = Args::new(&stream);
            b.input(&x).output(&mut out).i32(t_i).i32(i_i);
            unsafe { b.launch(&f, cfg) }?;
            wrap(out, &dev)
        }};
    }
    let st = match dt {
        DType::F32 => go!(f32),
        DType::BF16 => go!(half::bf16),
        other => candle_core::bail!("silu-mul: {other:?}"),
    };
    Ok((st, Shape::from((t_len, i))))
}

pub fn add_rms_norm(
    op: &AddRmsNorm,
    t_len: usize,
    h: usize,
    (sx, lx): (&CudaStorage, &Layout),
    (sd, ld): (&CudaStorage, &Layout),
    (sw, lw): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let dev = sx.device().clone();
    let dt = sx.dtype();
    // 8 values a thread in whole warps where h is a multiple of 256 (every Qwen3 hidden size);
    // else kernels/fused.cu's NORM_PER_THREAD (16) values a thread in registers
    let v8 = dt == DType::BF16 && h.is_multiple_of(256) && h <= 8 * 1024;
    if v8 && ![lx, ld, lw].iter().all(|l| l.start_offset() % 8 == 0) {
        candle_core::bail!("add-rms-norm: inputs must start 16-byte aligned");
    }
    if h > 16 * 1024 {
        candle_core::bail!("add-rms-norm kernel: hidden size {h} (takes up to 16384)");
    }
    let (name, threads) = match (v8, h <= 16 * 256) {
        (true, _) => ("unmask_add_rms_norm_bf16_v8".to_string(), (h / 8) as u32),
        (false, true) => (func_name("unmask_add_rms_norm", dt)?, 256),
        (false, false) => (func_name("unmask_add_rms_norm", dt)?, 1024),
    };
    let cfg = LaunchConfig {
        grid_dim: (t_len as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = dev.get_or_load_custom_func(&name, MODULE, ptx(&dev)?)?;
    let (t_i, h_i) = (t_len as i32, h as i32);
    let stream = dev.cuda_stream();
    macro_rules! go {
        ($T:ty) => {{
            let x = view::<$T>(sx, lx, "add-rms-norm x")?;
            let d = view::<$T>(sd, ld, "add-rms-norm delta")?;
            let w = view::<$T>(sw, lw, "add-rms-norm w")?;
            let mut out = unsafe { dev.alloc::<$T>(2 * t_len * h)? };
            let mut b = Args::new(&stream);
            b.input(&x).input(&d).input(&w).output(&mut out).i32(t_i).i32(h_i).f32(op.eps);
            unsafe { b.launch(&f, cfg) }?;
            wrap(out, &dev)
        }};
    }
    let st = match dt {
        DType::F32 => go!(f32),
        DType::BF16 => go!(half::bf16),
        other => candle_core::bail!("add-rms-norm: {other:?}"),
    };
    Ok((st, Shape::from((2, t_len, h))))
}

pub fn kv_write(
    (rows, t_len, d, cap): (usize, usize, usize, usize),
    (sc, lc): (&mut CudaStorage, &Layout),
    (sk, lk): (&CudaStorage, &Layout),
    (sp, lp): (&CudaStorage, &Layout),
) -> Result<()> {
    let dev = sc.device().clone();
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, t_len as u32, 1),
        block_dim: (d.min(1024) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let dt = sc.dtype();
    let f = dev.get_or_load_custom_func(&func_name("unmask_kv_write", dt)?, MODULE, ptx(&dev)?)?;
    let (t_i, d_i, cap_i) = (t_len as i32, d as i32, cap as i32);
    let pos = view::<u32>(sp, lp, "kv-write positions")?;
    let stream = dev.cuda_stream();
    macro_rules! go {
        ($T:ty) => {{
            let k = view::<$T>(sk, lk, "kv-write block")?;
            let (a, b) = lc.contiguous_offsets().expect("checked contiguous");
            let mut c = sc.as_cuda_slice_mut::<$T>()?.slice_mut(a..b);
            let mut bld = Args::new(&stream);
            bld.output(&mut c).input(&k).input(&pos).i32(t_i).i32(d_i).i32(cap_i);
            unsafe { bld.launch(&f, cfg) }?;
        }};
    }
    match dt {
        DType::F32 => go!(f32),
        DType::BF16 => go!(half::bf16),
        other => candle_core::bail!("kv-write: {other:?}"),
    }
    Ok(())
}

/// [`crate::model::ops::qkv_prep_into_cache`]'s kernel: an in-place op on the cache (the K/V slots it
/// writes) with the stacked projection and the positions as operands. `q_out` is written too,
/// through the pointer of a tensor the op only holds: it is the pass's own scratch buffer,
/// which nothing else reads or writes while the pass runs.
pub struct QkvPrepCache<'a> {
    pub prep: &'a QkvPrep,
    pub q_out: &'a Tensor,
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
}

/// Whether the warp-a-head kernels of heads of 128 (kernels/fused.cu, `prep_head_d128`) rotate
/// `rotary` dimensions: 8, 16, 32, 64 or 128, so that half of them is a power-of-two count of
/// lanes and a lane's partner is a shuffle away.
fn warp_rotary(rotary: usize) -> bool {
    rotary.is_power_of_two() && (8..=128).contains(&rotary)
}

impl QkvPrepCache<'_> {
    /// bf16 on the GPU, heads of 128 (the kernel's warp a head) with a rotary width it takes,
    /// every row 8-byte aligned.
    pub fn fits(op: &QkvPrep, q_out: &Tensor, qkv: &Tensor) -> bool {
        let ok = |t: &Tensor| {
            t.dtype() == DType::BF16
                && t.is_contiguous()
                && t.layout().start_offset().is_multiple_of(4)
        };
        q_out.device().is_cuda()
            && op.head_dim == 128
            && warp_rotary(op.rotary)
            && ok(q_out)
            && ok(qkv)
    }
}

impl candle_core::InplaceOp3 for QkvPrepCache<'_> {
    fn name(&self) -> &'static str {
        "unmask-qkv-prep-cache"
    }

    fn cpu_fwd(
        &self,
        _: &mut candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        candle_core::bail!(
            "qkv-prep-cache is the GPU kernel; the CPU composes qkv_prep and kv_write"
        )
    }

    fn cuda_fwd(
        &self,
        sc: &mut CudaStorage,
        lc: &Layout,
        sq: &CudaStorage,
        lq: &Layout,
        sp: &CudaStorage,
        lp: &Layout,
    ) -> Result<()> {
        let op = self.prep;
        let (h, kv, d) = (op.heads, op.kv_heads, op.head_dim);
        let (t_len, width) = lq.shape().dims2()?;
        let (two, ckv, cap, cd) = lc.shape().dims4()?;
        if width != (h + 2 * kv) * d || (two, ckv, cd) != (2, kv, d) || lp.shape().dims1()? != t_len
        {
            candle_core::bail!(
                "qkv-prep-cache: qkv {:?}, cache {:?}, positions {:?}",
                lq.shape(),
                lc.shape(),
                lp.shape()
            );
        }
        if self.q_out.dims() != [h, t_len, d]
            || !warp_rotary(op.rotary)
            || self.cos.dims() != [t_len, op.rotary / 2]
            || self.sin.dims() != [t_len, op.rotary / 2]
        {
            candle_core::bail!(
                "qkv-prep-cache: q buffer {:?}, cos {:?} for {t_len} rows",
                self.q_out.shape(),
                self.cos.shape()
            );
        }
        let dev = sq.device().clone();
        let nh = h + 2 * kv;
        let cfg = LaunchConfig {
            grid_dim: (nh.div_ceil(4) as u32, t_len as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = dev.get_or_load_custom_func("unmask_qkv_prep_kv_bf16_d128", MODULE, ptx(&dev)?)?;
        let stream = dev.cuda_stream();
        let qkv = view::<bf16>(sq, lq, "qkv-prep qkv")?;
        let pos = view::<u32>(sp, lp, "qkv-prep positions")?;
        let Some((a, b)) = lc.contiguous_offsets() else {
            candle_core::bail!("qkv-prep-cache: the cache must be contiguous")
        };
        let mut cache = sc.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
        let held = [self.q_out, self.cos, self.sin, &op.q_norm, &op.k_norm]
            .map(Tensor::storage_and_layout);
        let [q_out, cos, sin, qn, kn] = &held;
        let (q_out, cos, sin) = (
            held_view::<bf16>(q_out, "q buffer")?,
            held_view::<bf16>(cos, "cos")?,
            held_view::<bf16>(sin, "sin")?,
        );
        let (qn, kn) = (held_view::<bf16>(qn, "q_norm")?, held_view::<bf16>(kn, "k_norm")?);
        let mut b = Args::new(&stream);
        b.input(&qkv)
            .input(&qn)
            .input(&kn)
            .input(&cos)
            .input(&sin)
            .input(&q_out)
            .output(&mut cache);
        b.input(&pos)
            .i32(t_len as i32)
            .i32(h as i32)
            .i32(kv as i32)
            .i32(cap as i32)
            .i32(op.rotary as i32)
            .f32(op.eps);
        // SAFETY: kernels/fused.cu's unmask_qkv_prep_kv_bf16_d128 signature; shapes
        // checked above, slots checked by the caller (positions < capacity).
        unsafe { b.launch(&f, cfg) }
    }
}

/// q/k prep folded into the staged attention ([`crate::model::ops::prep_attention_into`]'s
/// kernel, kernels/fused.cu's unmask_attention_prep_bf16_d128): in place on the cache `[2, KV,
/// cap, 128]` (the pass's K/V rows, at `positions`), with the q|k|v product `[T, (H + 2 KV) *
/// 128]` and the positions as operands; attention's output goes to `out [T, H * 128]`, which
/// the kernel writes through a held view (as [`QkvPrepCache`] writes its q buffer: an in-place
/// op has one target).
pub struct PrepAttentionInto<'a> {
    pub prep: &'a QkvPrep,
    pub op: &'a Attention,
    pub mask: Option<&'a Tensor>,
    pub out: &'a Tensor,
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
}

/// Whether a block of `dev` may take `bytes` of dynamic shared memory (opted in past 48 KiB).
fn smem_fits(dev: &CudaDevice, bytes: usize) -> Result<bool> {
    let max = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .w()?;
    Ok(bytes <= max as usize)
}

/// kernels/fused.cu's ATT_PREP_SMEM: the staged kernel's, the pass rows' v heads (15 of 256
/// bytes) and a pass row index a key (2 bytes).
fn prep_smem(keys: usize) -> usize {
    staged_smem(keys) + 15 * 32 * 8 + keys * 2
}

impl PrepAttentionInto<'_> {
    /// Whether the fused kernel runs this pass: bf16 heads of 128 on the GPU, at most 512 keys
    /// and 15 rows, its shared memory within the GPU's. Any other pass runs q/k prep, then the
    /// attention kernel ([`AttentionInto`]).
    pub fn fits(prep: &QkvPrep, op: &Attention, qkv: &Tensor, out: &Tensor) -> bool {
        let (Device::Cuda(dev), Ok(t)) = (qkv.device(), qkv.dim(0)) else { return false };
        let ok = |x: &Tensor| {
            x.dtype() == DType::BF16
                && x.is_contiguous()
                && x.layout().start_offset().is_multiple_of(8)
        };
        prep.head_dim == 128
            && warp_rotary(prep.rotary)
            && op.head_dim == 128
            && op.keys <= 512
            && t <= 15
            && ok(qkv)
            && ok(out)
            && smem_fits(dev, prep_smem(op.keys)).unwrap_or(false)
    }
}

impl candle_core::InplaceOp3 for PrepAttentionInto<'_> {
    fn name(&self) -> &'static str {
        "unmask-prep-attention-into"
    }

    fn cpu_fwd(
        &self,
        _: &mut candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        candle_core::bail!(
            "prep-attention-into is the GPU kernel; the CPU composes q/k prep and attention"
        )
    }

    fn cuda_fwd(
        &self,
        sc: &mut CudaStorage,
        lc: &Layout,
        sq: &CudaStorage,
        lq: &Layout,
        sp: &CudaStorage,
        lp: &Layout,
    ) -> Result<()> {
        let (prep, op) = (self.prep, self.op);
        let (h, kv, keys) = (op.heads, op.kv_heads, op.keys);
        let (t_len, width) = lq.shape().dims2()?;
        let (two, ckv, cap, cd) = lc.shape().dims4()?;
        // the kernel's own limits too (a warp a pass row beside warp 0, a thread a key), not only `fits`'s
        let fits = t_len <= 15
            && keys <= 512
            && width == (h + 2 * kv) * 128
            && (two, ckv, cd) == (2, kv, 128)
            && (prep.heads, prep.kv_heads) == (h, kv)
            && keys <= cap
            && h % kv == 0
            && lp.shape().dims1()? == t_len
            && self.out.dims() == [t_len, h * 128]
            && warp_rotary(prep.rotary)
            && self.cos.dims() == [t_len, prep.rotary / 2]
            && self.sin.dims() == [t_len, prep.rotary / 2]
            && self.mask.is_none_or(|m| m.dims() == [t_len, keys]);
        if !fits {
            candle_core::bail!(
                "prep-attention-into: qkv {:?}, cache {:?}, positions {:?}, out {:?} for {op:?}",
                lq.shape(),
                lc.shape(),
                lp.shape(),
                self.out.shape()
            );
        }
        let dev = sq.device().clone();
        let smem = prep_smem(keys);
        let f =
            dev.get_or_load_custom_func("unmask_attention_prep_bf16_d128", MODULE, ptx(&dev)?)?;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .w()?;
        super::launch::carveout(&f)?;
        let cfg = LaunchConfig {
            grid_dim: (h as u32, t_len as u32, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let stream = dev.cuda_stream();
        let qkv = view::<bf16>(sq, lq, "prep-attention qkv")?;
        let pos = view::<u32>(sp, lp, "prep-attention positions")?;
        let Some((a, b)) = lc.contiguous_offsets() else {
            candle_core::bail!("prep-attention-into: the cache must be contiguous")
        };
        let mut cache = sc.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
        let (mut k_half, mut v_half) = cache.split_at_mut(kv * cap * 128);
        let held = [self.out, self.cos, self.sin, &prep.q_norm, &prep.k_norm]
            .map(Tensor::storage_and_layout);
        let [out, cos, sin, qn, kn] = &held;
        let (out, cos, sin) = (
            held_view::<bf16>(out, "attention output")?,
            held_view::<bf16>(cos, "cos")?,
            held_view::<bf16>(sin, "sin")?,
        );
        let (qn, kn) = (held_view::<bf16>(qn, "q_norm")?, held_view::<bf16>(kn, "k_norm")?);
        let mask_held = self.mask.map(Tensor::storage_and_layout);
        let mask =
            mask_held.as_ref().map(|m| held_view::<bf16>(m, "attention mask")).transpose()?;
        let mut b = Args::new(&stream);
        b.input(&qkv)
            .input(&qn)
            .input(&kn)
            .input(&cos)
            .input(&sin)
            .output(&mut k_half)
            .output(&mut v_half);
        match &mask {
            Some(m) => b.input(m),
            None => b.null(),
        };
        b.input(&pos).input(&out);
        b.i32(t_len as i32)
            .i32(h as i32)
            .i32(kv as i32)
            .i32(cap as i32)
            .i32(keys as i32)
            .i32(prep.rotary as i32)
            .f32(op.scale)
            .f32(prep.eps);
        // SAFETY: kernels/fused.cu's unmask_attention_prep_bf16_d128 signature; shapes checked
        // above (T <= 15, keys <= 512 within the cache, heads of 128) and by `fits` (8-byte
        // aligned rows, the shared memory within the GPU's); the slots are below the capacity
        // (the caller's positions). The kernel
        // writes `out` (held, never read) and the cache's rows at the slots.
        unsafe { b.launch(&f, cfg) }
    }
}

/// [`crate::model::ops::attention_into`]'s kernel: in place on the output `[T, H * d]`, with q and
/// the cache as operands and the optional mask held by the op.
pub struct AttentionInto<'a> {
    pub op: &'a Attention,
    pub mask: Option<&'a Tensor>,
    /// The pass's cache slots `[T]` u32 (the staged kernel re-reads them after its wait).
    pub positions: &'a Tensor,
}

/// kernels/fused.cu's ATT_STAGED_SMEM: K rows of 136 bf16, q, the scores, 16 partial rows.
fn staged_smem(keys: usize) -> usize {
    keys * 136 * 2 + (128 + keys + 16 * 128) * 4
}

/// The attention kernels' first operands, as views: q `[H, T, d]`, the K and V halves of the
/// cache `[2, KV, cap, d]`, and the optional mask `[T, keys]`, whose storage the caller holds
/// (`Tensor::storage_and_layout`) for as long as the views live.
struct AttentionViews<'a> {
    q: CudaView<'a, bf16>,
    k: CudaView<'a, bf16>,
    v: CudaView<'a, bf16>,
    mask: Option<CudaView<'a, bf16>>,
}

impl<'a> AttentionViews<'a> {
    fn new(
        (sq, lq): (&'a CudaStorage, &Layout),
        (skv, lkv): (&'a CudaStorage, &Layout),
        half: usize,
        mask: Option<&'a (impl Deref<Target = Storage>, &Layout)>,
    ) -> Result<Self> {
        let q = view::<bf16>(sq, lq, "attention q")?;
        let kv = view::<bf16>(skv, lkv, "attention kv")?;
        let (k, v) = (kv.slice(0..half), kv.slice(half..2 * half));
        let mask = mask.map(|m| held_view::<bf16>(m, "attention mask")).transpose()?;
        Ok(AttentionViews { q, k, v, mask })
    }

    /// q, K, V and the mask (a null pointer when there is none): every attention kernel's first
    /// four parameters.
    fn push<'b>(&'b self, b: &mut Args<'b>) {
        b.input(&self.q).input(&self.k).input(&self.v);
        match &self.mask {
            Some(m) => b.input(m),
            None => b.null(),
        };
    }
}

impl AttentionInto<'_> {
    /// Whether the staged kernel runs this attention: bf16 heads of 128, at most 512 keys (a
    /// thread a key) and 16 rows (a warp a row re-reads its slot), its shared memory within the
    /// GPU's.
    fn staged(&self, dev: &CudaDevice, t_len: usize) -> Result<bool> {
        let op = self.op;
        if op.head_dim != 128 || op.keys > 512 || t_len > 16 || self.positions.dims() != [t_len] {
            return Ok(false);
        }
        smem_fits(dev, staged_smem(op.keys))
    }

    /// kernels/fused.cu's unmask_attention_staged_bf16_d128: grid (H, T), 512 threads.
    fn launch_staged(
        &self,
        dev: &CudaDevice,
        (so, lo): (&mut CudaStorage, &Layout),
        (sq, lq): (&CudaStorage, &Layout),
        (skv, lkv): (&CudaStorage, &Layout),
        (t_len, cap): (usize, usize),
    ) -> Result<()> {
        let op = self.op;
        let (h, kv, keys) = (op.heads, op.kv_heads, op.keys);
        let smem = staged_smem(keys);
        let f =
            dev.get_or_load_custom_func("unmask_attention_staged_bf16_d128", MODULE, ptx(dev)?)?;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .w()?;
        super::launch::carveout(&f)?;
        let cfg = LaunchConfig {
            grid_dim: (h as u32, t_len as u32, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let stream = dev.cuda_stream();
        let mask_held = self.mask.map(Tensor::storage_and_layout);
        let views = AttentionViews::new((sq, lq), (skv, lkv), kv * cap * 128, mask_held.as_ref())?;
        let Some((a, b)) = lo.contiguous_offsets() else {
            candle_core::bail!("attention-into: output must be contiguous")
        };
        let mut out = so.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
        let pos_held = self.positions.storage_and_layout();
        let pos = held_view::<u32>(&pos_held, "attention positions")?;
        let mut b = Args::new(&stream);
        views.push(&mut b);
        b.input(&pos).output(&mut out);
        b.i32(t_len as i32)
            .i32(h as i32)
            .i32(kv as i32)
            .i32(cap as i32)
            .i32(keys as i32)
            .f32(op.scale);
        // SAFETY: the kernel's signature; shapes checked by the caller (`op.check`: q [H, T, 128],
        // the cache [2, KV, cap, 128], keys <= cap, the mask [T, keys]) and by `staged`
        // (positions [T], T <= 16, keys <= 512); the kernel reads a position's row only if it
        // is below `keys`.
        unsafe { b.launch(&f, cfg) }
    }
}

/// Whether the streamed layer's attention over `op.keys` keys runs the split-K kernels
/// (kernels/fused.cu, attention_split): bf16 heads of 128 over more than the staged kernel's
/// 512 keys. They take any number of keys, so the streamed layer does too.
pub fn split_applies(op: &Attention) -> bool {
    op.head_dim == 128 && op.keys > 512
}

/// Keys one block of the split kernel takes (kernels/fused.cu's SPLIT_KEYS).
const SPLIT_KEYS: usize = 128;
/// Floats a (row, chunk) takes in the split kernel's output (kernels/fused.cu's SPLIT_STRIDE).
const SPLIT_STRIDE: usize = 132;

/// Dynamic shared memory of the split kernel for `r` rows a block (kernels/fused.cu's
/// SPLIT_SMEM): the chunk's V rows (bf16, rows of SPLIT_VP), q (bf16), the scores (f32), the
/// exponentials (bf16, rows padded to 16), each row's (max, sum).
const fn split_smem(r: usize) -> usize {
    const VP: usize = 136;
    SPLIT_KEYS * VP * 2
        + r * 128 * 2
        + r * (SPLIT_KEYS + 1) * 4
        + r.div_ceil(16) * 16 * VP * 2
        + r * 2 * 4
}

impl AttentionInto<'_> {
    /// kernels/fused.cu's unmask_attention_split_r{8,16,32}_bf16_d128 over (KV heads, chunks of
    /// 128 keys, groups of query rows), then unmask_attention_merge_bf16_d128 over (H, T).
    fn launch_split(
        &self,
        dev: &CudaDevice,
        (so, lo): (&mut CudaStorage, &Layout),
        (sq, lq): (&CudaStorage, &Layout),
        (skv, lkv): (&CudaStorage, &Layout),
        (t_len, cap): (usize, usize),
    ) -> Result<()> {
        let op = self.op;
        let (h, kv, keys) = (op.heads, op.kv_heads, op.keys);
        let rows = h / kv * t_len;
        let r = match rows {
            0..=8 => 8,
            9..=16 => 16,
            _ => 32,
        };
        let chunks = keys.div_ceil(SPLIT_KEYS);
        let stream = dev.cuda_stream();
        let mask_held = self.mask.map(Tensor::storage_and_layout);
        let views = AttentionViews::new((sq, lq), (skv, lkv), kv * cap * 128, mask_held.as_ref())?;
        // (max, sum, V sum) of every row for every chunk; freed in stream order after the merge
        let mut part = unsafe { dev.alloc::<f32>(kv * chunks * rows * SPLIT_STRIDE)? };
        let f = dev.get_or_load_custom_func(
            &format!("unmask_attention_split_r{r}_bf16_d128"),
            MODULE,
            ptx(dev)?,
        )?;
        // past the default 48 KiB from 16 rows a block
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            split_smem(r) as i32,
        )
        .w()?;
        super::launch::carveout(&f)?;
        let smem = split_smem(r) as u32;
        let cfg = LaunchConfig {
            grid_dim: (kv as u32, chunks as u32, rows.div_ceil(r) as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem,
        };
        let mut b = Args::new(&stream);
        views.push(&mut b);
        b.output(&mut part)
            .i32(t_len as i32)
            .i32(h as i32)
            .i32(kv as i32)
            .i32(cap as i32)
            .i32(keys as i32)
            .f32(op.scale);
        // SAFETY: the kernel's signature; q [H, T, 128], the cache [2, KV, cap, 128] with keys
        // <= cap and the mask [T, keys] checked by `op.check`; part holds KV x chunks x rows
        // rows of SPLIT_STRIDE floats, the grid's z covers the rows R at a time.
        unsafe { b.launch(&f, cfg)? };
        let Some((a, e)) = lo.contiguous_offsets() else {
            candle_core::bail!("attention-into: output must be contiguous")
        };
        let mut out = so.as_cuda_slice_mut::<bf16>()?.slice_mut(a..e);
        let f =
            dev.get_or_load_custom_func("unmask_attention_merge_bf16_d128", MODULE, ptx(dev)?)?;
        let cfg = LaunchConfig {
            grid_dim: (h as u32, t_len as u32, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = Args::new(&stream);
        b.input(&part)
            .output(&mut out)
            .i32(t_len as i32)
            .i32(h as i32)
            .i32(kv as i32)
            .i32(chunks as i32);
        // SAFETY: unmask_attention_merge_bf16_d128(part, out [T, H * 128], T, H, KV, chunks):
        // every (row, chunk) of part was written by the split kernel above.
        unsafe { b.launch(&f, cfg) }
    }
}

impl candle_core::InplaceOp3 for AttentionInto<'_> {
    fn name(&self) -> &'static str {
        "unmask-attention-into"
    }

    fn cpu_fwd(
        &self,
        _: &mut candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<()> {
        candle_core::bail!("attention-into is the GPU kernel; the CPU copies attention's result")
    }

    fn cuda_fwd(
        &self,
        so: &mut CudaStorage,
        lo: &Layout,
        sq: &CudaStorage,
        lq: &Layout,
        skv: &CudaStorage,
        lkv: &Layout,
    ) -> Result<()> {
        let op = self.op;
        let mask_layout = self.mask.map(|m| m.layout().clone());
        let (t_len, cap) = op.check(lq, lkv, mask_layout.as_ref())?;
        let (h, kv, d, keys) = (op.heads, op.kv_heads, op.head_dim, op.keys);
        if lo.shape().dims2()? != (t_len, h * d) || sq.dtype() != DType::BF16 {
            candle_core::bail!(
                "attention-into: output {:?} ({:?}) for [{t_len}, {}] bf16",
                lo.shape(),
                sq.dtype(),
                h * d
            );
        }
        let dev = sq.device().clone();
        if self.staged(&dev, t_len)? {
            return self.launch_staged(&dev, (so, lo), (sq, lq), (skv, lkv), (t_len, cap));
        }
        if split_applies(op) {
            return self.launch_split(&dev, (so, lo), (sq, lq), (skv, lkv), (t_len, cap));
        }
        // what neither takes (another head size, more rows, a GPU whose blocks have less
        // shared memory than the staged kernel's): the plain kernel, within its own limits
        let cfg = attention_cfg(op, t_len)?;
        let f = dev.get_or_load_custom_func("unmask_attention_bf16", MODULE, ptx(&dev)?)?;
        let stream = dev.cuda_stream();
        let mask_held = self.mask.map(Tensor::storage_and_layout);
        let views = AttentionViews::new((sq, lq), (skv, lkv), kv * cap * d, mask_held.as_ref())?;
        let Some((a, b)) = lo.contiguous_offsets() else {
            candle_core::bail!("attention-into: output must be contiguous")
        };
        let mut out = so.as_cuda_slice_mut::<bf16>()?.slice_mut(a..b);
        let mut b = Args::new(&stream);
        views.push(&mut b);
        b.output(&mut out)
            .i32(t_len as i32)
            .i32(h as i32)
            .i32(kv as i32)
            .i32(d as i32)
            .i32(cap as i32)
            .i32(keys as i32)
            .f32(op.scale);
        // SAFETY: kernels/fused.cu's unmask_attention_bf16 signature, shapes checked above.
        unsafe { b.launch(&f, cfg) }
    }
}
