//! Fused layer pieces as candle custom ops: one implementation per backend, the CUDA one in
//! kernels/fused.cu (launched from `cuda/ops.rs`), the CPU one here, written as the kernel's
//! algorithm in Rust. [`Model`](super::Model) calls these on every device; with the fused path
//! turned off (`UNMASK_FUSED=0`, paths.rs) it uses the equivalent chains of generic candle ops
//! instead (the path the fused ops are checked against, on the CPU by tests and on the GPU by
//! `unmask check-device`).
//!
//! - [`qkv_prep`]: `[T, (H + 2 KV) * d]` (the stacked q/k/v projection) -> `[H + 2 KV, T, d]`:
//!   q and k heads RMS-normalised (their own weights) and rotated (RoPE over each head's first
//!   `rotary` dimensions, the rest as normed), v heads copied.
//! - [`attention`]: `q [H, T, d]` over the cache `[2, KV, cap, d]` slots `[0, keys)`, with an
//!   optional additive `[T, keys]` mask -> `[T, H * d]`.
//! - [`silu_mul`]: `[T, 2 I]` (gate | up) -> `[T, I]`.
//! - [`add_rms_norm`]: `x + delta` and its RMSNorm in one pass -> `[2, T, h]`.
//! - [`kv_write`]: a pass's K/V into its cache slots, in place (every path uses it).

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor,
};

/// Dtypes the CUDA kernels take.
pub fn cuda_dtype_ok(dt: DType) -> bool {
    matches!(dt, DType::F32 | DType::BF16)
}

#[derive(Clone, Debug)]
pub struct QkvPrep {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The leading dimensions of a head RoPE rotates (rotate-half within them): `head_dim`, or
    /// fewer for a partial rotary embedding (LLaDA2's half). Even.
    pub rotary: usize,
    pub eps: f32,
    /// `[d]` weights of the q and k RMSNorms.
    pub q_norm: Tensor,
    pub k_norm: Tensor,
}

/// Longest cache (plus head size) the CUDA attention kernel takes: its scores and q live in
/// dynamic shared memory, 4 bytes each, beside 16 warps' partial sums (16 KiB at d = 256),
/// within the default 48 KiB. Longer caches run the generic chain there.
pub const ATTENTION_MAX_KEYS_PLUS_D: usize = 6 * 1024;

/// Whether [`attention`] takes `keys` keys of head size `d` on `device`: the CPU kernel
/// (cpu_attention.rs) any number, the CUDA one [`cuda_attention_takes`]; the rest run the
/// generic chain. (The CPU once shared the CUDA limit and fell back past 6k keys to the generic
/// chain, whose `[heads, rows, keys]` scores made a 16k-key denoising pass 5.5x its floor.)
pub fn attention_takes(device: &candle_core::Device, keys: usize, d: usize) -> bool {
    device.is_cpu() || cuda_attention_takes(keys, d)
}

/// The CUDA attention kernel's shapes (kernels/fused.cu: 16-byte loads of 8 values, at most
/// two chunks a half-warp): a head size that is a multiple of 8 up to 256, and up to
/// [`ATTENTION_MAX_KEYS_PLUS_D`] keys plus it. (Without this check a model of head size 4 on the
/// GPU stopped at its first pass with the kernel's error instead of running the chain.)
pub fn cuda_attention_takes(keys: usize, d: usize) -> bool {
    d.is_multiple_of(8) && d <= 256 && keys + d <= ATTENTION_MAX_KEYS_PLUS_D
}

#[derive(Clone, Debug)]
pub struct Attention {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub keys: usize,
    pub scale: f32,
}

#[derive(Clone, Debug)]
pub struct SiluMul {
    pub intermediate: usize,
}

/// `qkv [T, (H + 2 KV) * d]`, `cos`/`sin [T, rotary / 2]` -> `[H + 2 KV, T, d]`.
pub fn qkv_prep(qkv: &Tensor, cos: &Tensor, sin: &Tensor, op: &QkvPrep) -> Result<Tensor> {
    qkv.apply_op3_no_bwd(cos, sin, op)
}

/// `q [H, T, d]`, `kv [2, KV, cap, d]`, `mask [T, keys]` -> `[T, H * d]`.
pub fn attention(q: &Tensor, kv: &Tensor, mask: Option<&Tensor>, op: &Attention) -> Result<Tensor> {
    match mask {
        Some(m) => q.apply_op3_no_bwd(kv, m, op),
        None => q.apply_op2_no_bwd(kv, op),
    }
}

pub fn silu_mul(gate_up: &Tensor, op: &SiluMul) -> Result<Tensor> {
    gate_up.apply_op1_no_bwd(op)
}

#[derive(Clone, Debug)]
pub struct AddRmsNorm {
    pub eps: f32,
}

/// `(x + delta, rms_norm(x + delta) * w)`, the sum rounded to the storage dtype first (as an
/// unfused add then norm would see it).
pub fn add_rms_norm(
    x: &Tensor,
    delta: &Tensor,
    w: &Tensor,
    op: &AddRmsNorm,
) -> Result<(Tensor, Tensor)> {
    let both = x.apply_op3_no_bwd(delta, w, op)?;
    Ok((both.get(0)?, both.get(1)?))
}

/// Writes a pass's K/V block `[2, KV, T, d]` into the cache `[2, KV, cap, d]` at the slots
/// `positions [T]` (u32), in place: one copy kernel on the GPU, where candle's generic scatter
/// (which walks the scattered dimension serially per thread) cost 7 us per layer.
#[derive(Clone, Copy, Debug)]
pub struct KvWrite;

pub fn kv_write(cache: &Tensor, kv: &Tensor, positions: &Tensor) -> Result<()> {
    cache.inplace_op3(kv, positions, &KvWrite)
}

impl KvWrite {
    /// `(kv_heads * 2, T, d, cap)`, after checking shapes and contiguity. The slots themselves
    /// are checked against the cache by the CPU body; on the GPU, by the caller.
    fn check(lc: &Layout, lk: &Layout, lp: &Layout) -> Result<(usize, usize, usize, usize)> {
        let (two, kv, cap, d) = lc.shape().dims4()?;
        let (two_k, kv_k, t, d_k) = lk.shape().dims4()?;
        if two != 2 || (two_k, kv_k, d_k) != (2, kv, d) || lp.shape().dims1()? != t {
            candle_core::bail!(
                "kv-write: cache {:?}, block {:?}, positions {:?}",
                lc.shape(),
                lk.shape(),
                lp.shape()
            );
        }
        if !lc.is_contiguous() || !lk.is_contiguous() || !lp.is_contiguous() {
            candle_core::bail!("kv-write: inputs must be contiguous");
        }
        Ok((2 * kv, t, d, cap))
    }
}

impl candle_core::InplaceOp3 for KvWrite {
    fn name(&self) -> &'static str {
        "unmask-kv-write"
    }

    fn cpu_fwd(
        &self,
        sc: &mut CpuStorage,
        lc: &Layout,
        sk: &CpuStorage,
        lk: &Layout,
        sp: &CpuStorage,
        lp: &Layout,
    ) -> Result<()> {
        let (rows, t, d, cap) = Self::check(lc, lk, lp)?;
        let CpuStorage::U32(pos) = sp else {
            candle_core::bail!("kv-write: positions must be u32")
        };
        let pos = &pos[lp.start_offset()..lp.start_offset() + t];
        if let Some(&p) = pos.iter().find(|&&p| p as usize >= cap) {
            candle_core::bail!("kv-write: slot {p} outside a cache of {cap}");
        }
        fn copy<T: Copy>(
            c: &mut [T],
            k: &[T],
            pos: &[u32],
            (rows, t, d, cap): (usize, usize, usize, usize),
        ) {
            for r in 0..rows {
                for (i, &p) in pos.iter().enumerate() {
                    let (dst, src) = ((r * cap + p as usize) * d, (r * t + i) * d);
                    c[dst..dst + d].copy_from_slice(&k[src..src + d]);
                }
            }
        }
        let (co, ko) = (lc.start_offset(), lk.start_offset());
        let dims = (rows, t, d, cap);
        match (sc, sk) {
            (CpuStorage::F32(c), CpuStorage::F32(k)) => copy(&mut c[co..], &k[ko..], pos, dims),
            (CpuStorage::BF16(c), CpuStorage::BF16(k)) => copy(&mut c[co..], &k[ko..], pos, dims),
            (CpuStorage::F16(c), CpuStorage::F16(k)) => copy(&mut c[co..], &k[ko..], pos, dims),
            _ => candle_core::bail!("kv-write: cache and block must share a float dtype"),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        sc: &mut candle_core::CudaStorage,
        lc: &Layout,
        sk: &candle_core::CudaStorage,
        lk: &Layout,
        sp: &candle_core::CudaStorage,
        lp: &Layout,
    ) -> Result<()> {
        let dims = Self::check(lc, lk, lp)?;
        super::cuda::ops::kv_write(dims, (sc, lc), (sk, lk), (sp, lp))
    }
}

/// [`qkv_prep`] with its outputs where the pass needs them: the q heads into `q_out [H, T, d]`,
/// the k/v heads straight into the cache `[2, KV, cap, d]` at the slots `positions`. On the GPU
/// (bf16, d = 128) one kernel, with no tensor allocated; elsewhere [`qkv_prep`], a copy of its
/// q heads and [`kv_write`], which is what that kernel is checked against.
pub fn qkv_prep_into_cache(
    q_out: &Tensor,
    cache: &Tensor,
    (qkv, cos, sin): (&Tensor, &Tensor, &Tensor),
    positions: &Tensor,
    op: &QkvPrep,
) -> Result<()> {
    #[cfg(feature = "cuda")]
    if super::cuda::ops::QkvPrepCache::fits(op, q_out, qkv) {
        let fused = super::cuda::ops::QkvPrepCache { prep: op, q_out, cos, sin };
        return cache.inplace_op3(qkv, positions, &fused);
    }
    let (h, kv, d) = (op.heads, op.kv_heads, op.head_dim);
    let t = qkv.dim(0)?;
    if q_out.dims() != [h, t, d] {
        candle_core::bail!("qkv-prep: q buffer {:?} for {h} heads of {t} x {d}", q_out.shape());
    }
    let all = qkv_prep(qkv, cos, sin, op)?;
    q_out.slice_set(&all.narrow(0, 0, h)?, 0, 0)?;
    kv_write(cache, &all.narrow(0, h, 2 * kv)?.reshape((2, kv, t, d))?, positions)
}

/// q/k prep then attention of a streamed pass: the q heads' and the pass's K/V rows' RMSNorm and
/// RoPE (the K/V rows into the cache at `positions`), then [`attention_into`] `out`. On the GPU
/// (bf16, heads of 128, at most 512 keys and 15 rows) one kernel does both, reading the q|k|v
/// product itself (cuda/ops.rs, `PrepAttentionInto`); elsewhere [`qkv_prep_into_cache`] into
/// `q_buf` then [`attention_into`], which is what that kernel is checked against.
#[allow(clippy::too_many_arguments)]
pub fn prep_attention_into(
    out: &Tensor,
    q_buf: &Tensor,
    cache: &Tensor,
    (qkv, cos, sin): (&Tensor, &Tensor, &Tensor),
    mask: Option<&Tensor>,
    positions: &Tensor,
    prep: &QkvPrep,
    op: &Attention,
) -> Result<()> {
    #[cfg(feature = "cuda")]
    if super::cuda::ops::PrepAttentionInto::fits(prep, op, qkv, out) {
        let fused = super::cuda::ops::PrepAttentionInto { prep, op, mask, out, cos, sin };
        return cache.inplace_op3(qkv, positions, &fused);
    }
    qkv_prep_into_cache(q_buf, cache, (qkv, cos, sin), positions, prep)?;
    attention_into(out, q_buf, cache, mask, positions, op)
}

/// [`attention`] written into `out [T, H * d]`: on the GPU the kernel stores there directly
/// (no tensor allocated between the pass's kernels); elsewhere a copy of [`attention`]'s result.
/// `positions`: the cache slots `[T]` this pass has just written; the GPU kernel copies the
/// rest of the cache before the kernel writing them has finished, and these after.
pub fn attention_into(
    out: &Tensor,
    q: &Tensor,
    kv: &Tensor,
    mask: Option<&Tensor>,
    positions: &Tensor,
    op: &Attention,
) -> Result<()> {
    #[cfg(feature = "cuda")]
    if out.device().is_cuda() {
        return out.inplace_op3(q, kv, &super::cuda::ops::AttentionInto { op, mask, positions });
    }
    let _ = positions;
    out.slice_set(&attention(q, kv, mask, op)?, 0, 0)
}

// ---------------------------------------------------------------------------------------------
// CPU implementations: f32 math whatever the storage dtype, like the kernels.

/// The f32 view of a contiguous input: borrowed when it already is f32 (the KV cache is read
/// on every pass; copying it each time cost a quarter of a CPU forward), converted otherwise.
fn to_f32<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<std::borrow::Cow<'a, [f32]>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("{what}: input must be contiguous");
    };
    Ok(match s {
        CpuStorage::F32(v) => std::borrow::Cow::Borrowed(&v[a..b]),
        CpuStorage::BF16(v) => v[a..b].iter().map(|x| x.to_f32()).collect(),
        CpuStorage::F16(v) => v[a..b].iter().map(|x| x.to_f32()).collect(),
        _ => candle_core::bail!("{what}: unsupported dtype"),
    })
}

fn from_f32(v: Vec<f32>, like: &CpuStorage) -> CpuStorage {
    match like {
        CpuStorage::BF16(_) => CpuStorage::BF16(v.into_iter().map(half::bf16::from_f32).collect()),
        CpuStorage::F16(_) => CpuStorage::F16(v.into_iter().map(half::f16::from_f32).collect()),
        _ => CpuStorage::F32(v),
    }
}

fn tensor_f32(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

impl QkvPrep {
    fn check(&self, l: &Layout, lc: &Layout) -> Result<usize> {
        let (t, width) = l.shape().dims2()?;
        let (h, kv, d, rot) = (self.heads, self.kv_heads, self.head_dim, self.rotary);
        if width != (h + 2 * kv) * d
            || rot == 0
            || rot % 2 != 0
            || rot > d
            || lc.shape().dims2()? != (t, rot / 2)
        {
            candle_core::bail!(
                "qkv-prep: shapes {:?} {:?} do not fit heads {h}/{kv} x {d}, {rot} of them rotated",
                l.shape(),
                lc.shape()
            );
        }
        Ok(t)
    }
}

impl CustomOp3 for QkvPrep {
    fn name(&self) -> &'static str {
        "unmask-qkv-prep"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let t_len = self.check(l1, l2)?;
        let (h, kv, d) = (self.heads, self.kv_heads, self.head_dim);
        let nh = h + 2 * kv;
        let half = self.rotary / 2;
        let qkv = to_f32(s1, l1, "qkv-prep")?;
        let cos = to_f32(s2, l2, "qkv-prep cos")?;
        let sin = to_f32(s3, l3, "qkv-prep sin")?;
        let (qn, kn) = (tensor_f32(&self.q_norm)?, tensor_f32(&self.k_norm)?);
        let mut out = vec![0f32; nh * t_len * d];
        for hh in 0..nh {
            for t in 0..t_len {
                let row = &qkv[(t * nh + hh) * d..(t * nh + hh + 1) * d];
                let dst = &mut out[(hh * t_len + t) * d..(hh * t_len + t + 1) * d];
                if hh >= h + kv {
                    dst.copy_from_slice(row);
                    continue;
                }
                let ss: f32 = row.iter().map(|x| x * x).sum();
                let r = 1.0 / (ss / d as f32 + self.eps).sqrt();
                let w = if hh < h { &qn } else { &kn };
                let y: Vec<f32> = row.iter().zip(w).map(|(x, w)| x * r * w).collect();
                // past the rotated dimensions the normed values as they are
                dst[2 * half..].copy_from_slice(&y[2 * half..]);
                for i in 0..half {
                    let (c, s) = (cos[t * half + i], sin[t * half + i]);
                    let (a, b) = (y[i], y[i + half]);
                    dst[i] = a * c - b * s;
                    dst[i + half] = a * s + b * c;
                }
            }
        }
        Ok((from_f32(out, s1), Shape::from((nh, t_len, d))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let t_len = self.check(l1, l2)?;
        super::cuda::ops::qkv_prep(self, t_len, (s1, l1), (s2, l2), (s3, l3))
    }
}

impl Attention {
    pub(super) fn check(
        &self,
        lq: &Layout,
        lkv: &Layout,
        lm: Option<&Layout>,
    ) -> Result<(usize, usize)> {
        let (h, t, d) = lq.shape().dims3()?;
        let (two, kv, cap, d2) = lkv.shape().dims4()?;
        if h != self.heads
            || d != self.head_dim
            || two != 2
            || kv != self.kv_heads
            || d2 != d
            || self.keys > cap
        {
            candle_core::bail!(
                "attention: shapes {:?} {:?} do not fit {self:?}",
                lq.shape(),
                lkv.shape()
            );
        }
        if h % kv != 0 {
            candle_core::bail!("attention: {h} heads not a multiple of {kv} kv heads");
        }
        if let Some(lm) = lm {
            if lm.shape().dims2()? != (t, self.keys) {
                candle_core::bail!(
                    "attention: mask {:?}, expected [{t}, {}]",
                    lm.shape(),
                    self.keys
                );
            }
        }
        Ok((t, cap))
    }

    fn cpu(
        &self,
        sq: &CpuStorage,
        lq: &Layout,
        skv: &CpuStorage,
        lkv: &Layout,
        m: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let (t_len, cap) = self.check(lq, lkv, m.map(|x| x.1))?;
        let (h, kvh, d) = (self.heads, self.kv_heads, self.head_dim);
        let q = to_f32(sq, lq, "attention q")?;
        let kv = to_f32(skv, lkv, "attention kv")?;
        let mask = match m {
            Some((s, l)) => Some(to_f32(s, l, "attention mask")?),
            None => None,
        };
        let job = super::cpu_attention::Job {
            op: self,
            q: &q,
            kv: &kv,
            mask: mask.as_deref(),
            t_len,
            cap,
        };
        let tasks = job.tasks();
        let parts: Vec<Vec<f32>> = if tasks > 1
            && t_len * h * self.keys * d >= super::linear::PARALLEL_FROM
            && super::linear::threads() > 1
        {
            use rayon::prelude::*;
            (0..tasks).into_par_iter().map(|i| job.task(i)).collect()
        } else {
            (0..tasks).map(|i| job.task(i)).collect()
        };
        // Each task's [group][rows][d] to its heads' columns of its rows.
        let group = h / kvh;
        let mut out = vec![0f32; t_len * h * d];
        for (i, part) in parts.iter().enumerate() {
            let (g, rows) = (i % kvh, job.rows(i));
            for (j, o) in part.chunks_exact(d).enumerate() {
                let (hh, t) = (g * group + j / rows.len(), rows.start + j % rows.len());
                out[(t * h + hh) * d..][..d].copy_from_slice(o);
            }
        }
        Ok((from_f32(out, sq), Shape::from((t_len, h * d))))
    }
}

impl CustomOp2 for Attention {
    fn name(&self) -> &'static str {
        "unmask-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.cpu(s1, l1, s2, l2, None)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (t_len, cap) = self.check(l1, l2, None)?;
        super::cuda::ops::attention(self, t_len, cap, (s1, l1), (s2, l2), None)
    }
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "unmask-attention-masked"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.cpu(s1, l1, s2, l2, Some((s3, l3)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (t_len, cap) = self.check(l1, l2, Some(l3))?;
        super::cuda::ops::attention(self, t_len, cap, (s1, l1), (s2, l2), Some((s3, l3)))
    }
}

impl AddRmsNorm {
    fn check(&self, lx: &Layout, ld: &Layout, lw: &Layout) -> Result<(usize, usize)> {
        let (t, h) = lx.shape().dims2()?;
        if ld.shape().dims2()? != (t, h) || lw.shape().dims1()? != h {
            candle_core::bail!(
                "add-rms-norm: shapes {:?} {:?} {:?}",
                lx.shape(),
                ld.shape(),
                lw.shape()
            );
        }
        Ok((t, h))
    }
}

impl CustomOp3 for AddRmsNorm {
    fn name(&self) -> &'static str {
        "unmask-add-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (t, h) = self.check(l1, l2, l3)?;
        let x = to_f32(s1, l1, "add-rms-norm x")?;
        let d = to_f32(s2, l2, "add-rms-norm delta")?;
        let w = to_f32(s3, l3, "add-rms-norm w")?;
        let round = |v: f32| match s1 {
            CpuStorage::BF16(_) => half::bf16::from_f32(v).to_f32(),
            CpuStorage::F16(_) => half::f16::from_f32(v).to_f32(),
            _ => v,
        };
        let mut out = vec![0f32; 2 * t * h];
        for r in 0..t {
            let (sum, norm) = out.split_at_mut(t * h);
            let row = &mut sum[r * h..(r + 1) * h];
            for i in 0..h {
                row[i] = round(x[r * h + i] + d[r * h + i]);
            }
            let ss: f32 = row.iter().map(|v| v * v).sum();
            let k = 1.0 / (ss / h as f32 + self.eps).sqrt();
            for i in 0..h {
                norm[r * h + i] = row[i] * k * w[i];
            }
        }
        Ok((from_f32(out, s1), Shape::from((2, t, h))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (t, h) = self.check(l1, l2, l3)?;
        super::cuda::ops::add_rms_norm(self, t, h, (s1, l1), (s2, l2), (s3, l3))
    }
}

impl CustomOp1 for SiluMul {
    fn name(&self) -> &'static str {
        "unmask-silu-mul"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (t, w) = l.shape().dims2()?;
        let i = self.intermediate;
        if w != 2 * i {
            candle_core::bail!("silu-mul: width {w} != 2 x {i}");
        }
        let x = to_f32(s, l, "silu-mul")?;
        let mut out = vec![0f32; t * i];
        for (row, o) in x.chunks_exact(w).zip(out.chunks_exact_mut(i)) {
            let (g, u) = row.split_at(i);
            super::fastmath::silu_mul(g, u, o);
        }
        Ok((from_f32(out, s), Shape::from((t, i))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (t, w) = l.shape().dims2()?;
        if w != 2 * self.intermediate {
            candle_core::bail!("silu-mul: width {w} != 2 x {}", self.intermediate);
        }
        super::cuda::ops::silu_mul(self, t, (s, l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The CPU attention op (tasks of cpu_attention.rs on the pool, their outputs put back at
    /// their heads' columns) equals a plain softmax per (head, row) in f64: GQA groups of 3, a
    /// ragged last tile, a block-causal mask, a cache longer than the keys attended, and both
    /// tile sizes (9 rows, 40 rows).
    #[test]
    fn cpu_attention_equals_one_query_at_a_time() {
        let dev = Device::Cpu;
        for (t, keys) in [(9, 33), (40, 300)] {
            let (h, kvh, d, cap) = (6, 2, 16, keys + 7);
            let op = Attention { heads: h, kv_heads: kvh, head_dim: d, keys, scale: 0.25 };
            let q = Tensor::randn(0f32, 1.0, (h, t, d), &dev).unwrap();
            let kv = Tensor::randn(0f32, 1.0, (2, kvh, cap, d), &dev).unwrap();
            let mask =
                crate::model::layers::attention::block_causal_mask(keys - t, t, 4, keys).unwrap();
            let got =
                attention(&q, &kv, Some(&Tensor::from_slice(&mask, (t, keys), &dev).unwrap()), &op)
                    .unwrap();
            assert_eq!(got.dims(), &[t, h * d]);
            let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let (qv, kvv) = (
                q.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                kv.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            for hh in 0..h {
                let g = hh / (h / kvh);
                for r in 0..t {
                    let qr = &qv[(hh * t + r) * d..][..d];
                    let dot = |j: usize| {
                        qr.iter()
                            .zip(&kvv[(g * cap + j) * d..][..d])
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                    };
                    let sc: Vec<f64> =
                        (0..keys).map(|j| dot(j) * 0.25 + mask[r * keys + j] as f64).collect();
                    let mx = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
                    let total: f64 = w.iter().sum();
                    for i in 0..d {
                        let want = (0..keys)
                            .map(|j| w[j] * kvv[((kvh + g) * cap + j) * d + i] as f64)
                            .sum::<f64>()
                            / total;
                        let have = got[(r * h + hh) * d + i] as f64;
                        assert!(
                            (have - want).abs() < 1e-5 * (1.0 + want.abs()),
                            "t={t} head {hh} row {r} dim {i}: {have} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn only_the_cuda_kernel_has_a_longest_cache_and_head_sizes() {
        assert!(attention_takes(&Device::Cpu, 1 << 20, 128));
        assert!(attention_takes(&Device::Cpu, ATTENTION_MAX_KEYS_PLUS_D, 4));
        assert!(cuda_attention_takes(ATTENTION_MAX_KEYS_PLUS_D - 128, 128));
        assert!(!cuda_attention_takes(ATTENTION_MAX_KEYS_PLUS_D - 127, 128));
        assert!(cuda_attention_takes(64, 256) && cuda_attention_takes(64, 8));
        // the generic chain for head sizes the kernel's 16-byte loads cannot take
        assert!(
            !cuda_attention_takes(64, 4)
                && !cuda_attention_takes(64, 12)
                && !cuda_attention_takes(64, 264)
        );
    }

    #[test]
    fn kv_write_puts_each_row_at_its_slot_and_nothing_else() {
        let dev = Device::Cpu;
        let (kv, t, d, cap) = (2, 2, 3, 6);
        let cache = Tensor::zeros((2, kv, cap, d), DType::F32, &dev).unwrap();
        let block = Tensor::arange(1f32, (2 * kv * t * d) as f32 + 1.0, &dev)
            .unwrap()
            .reshape((2, kv, t, d))
            .unwrap();
        let pos = Tensor::new(&[5u32, 2], &dev).unwrap();
        kv_write(&cache, &block, &pos).unwrap();
        let got = cache.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut want = vec![0f32; 2 * kv * cap * d];
        for r in 0..2 * kv {
            for (i, p) in [5usize, 2].into_iter().enumerate() {
                for e in 0..d {
                    want[(r * cap + p) * d + e] = ((r * t + i) * d + e + 1) as f32;
                }
            }
        }
        assert_eq!(got, want);
    }

    #[test]
    fn kv_write_refuses_a_slot_outside_the_cache_and_mismatched_shapes() {
        let dev = Device::Cpu;
        let cache = Tensor::zeros((2, 1, 4, 2), DType::BF16, &dev).unwrap();
        let block = Tensor::ones((2, 1, 1, 2), DType::BF16, &dev).unwrap();
        let err = kv_write(&cache, &block, &Tensor::new(&[4u32], &dev).unwrap()).unwrap_err();
        assert!(err.to_string().contains("slot 4 outside a cache of 4"), "{err}");
        let wide = Tensor::ones((2, 1, 1, 3), DType::BF16, &dev).unwrap();
        assert!(kv_write(&cache, &wide, &Tensor::new(&[0u32], &dev).unwrap()).is_err());
        let f32_block = Tensor::ones((2, 1, 1, 2), DType::F32, &dev).unwrap();
        assert!(kv_write(&cache, &f32_block, &Tensor::new(&[0u32], &dev).unwrap()).is_err());
    }
}
