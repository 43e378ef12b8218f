//! Tensors by name from one or more safetensors files, memory-mapped or embedded, with errors
//! that name the file and the tensor.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};
use safetensors::SafeTensors;

enum Bytes {
    Mapped(memmap2::Mmap),
    Static(&'static [u8]),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Static(s) => s,
            Bytes::Owned(v) => v,
        }
    }
}

struct Shard {
    /// How errors name this file.
    label: String,
    bytes: Bytes,
}

/// Where [`crate::model::Model::load`] gets its tensors: a checkpoint ([`Weights`]) or a
/// seeded random source of the same names and shapes ([`crate::model::random::RandomWeights`]).
pub trait WeightSource {
    /// The tensor `name` with shape `shape`, converted to `dtype` on `device`.
    fn get(&self, name: &str, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor>;
    fn contains(&self, name: &str) -> bool;
    /// The dtype `name` is stored in, where it is stored at all.
    fn stored(&self, _name: &str) -> Option<DType> {
        None
    }
    /// The stored bytes of `name` where it is bf16 of shape `shape` and readable in place (a
    /// mapped checkpoint): what the CPU's bf16 panels pack from without a copy between.
    fn bf16_bytes(&self, _name: &str, _shape: &[usize]) -> Option<&[u8]> {
        None
    }
    /// How errors name where `name` is (a checkpoint's file that holds it).
    fn origin(&self, _name: &str) -> String {
        "the weights".to_string()
    }
}

impl WeightSource for Weights {
    fn get(&self, name: &str, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Weights::get(self, name, shape, dtype, device)
    }
    fn contains(&self, name: &str) -> bool {
        Weights::contains(self, name)
    }
    fn stored(&self, name: &str) -> Option<DType> {
        let shard = &self.shards[*self.index.get(name)?];
        let dt = parse(shard).ok()?.tensor(name).ok()?.dtype();
        DType::try_from(dt).ok()
    }
    fn bf16_bytes(&self, name: &str, shape: &[usize]) -> Option<&[u8]> {
        let shard = &self.shards[*self.index.get(name)?];
        let view = parse(shard).ok()?.tensor(name).ok()?;
        (view.dtype() == safetensors::Dtype::BF16 && view.shape() == shape).then(|| view.data())
    }
    fn origin(&self, name: &str) -> String {
        match self.index.get(name) {
            Some(&i) => self.shards[i].label.clone(),
            None => self.describe(),
        }
    }
}

pub struct Weights {
    shards: Vec<Shard>,
    /// Tensor name -> index into `shards`.
    index: HashMap<String, usize>,
}

impl Weights {
    pub fn open_files(paths: &[impl AsRef<Path>]) -> Result<Self> {
        let mut shards = Vec::new();
        for p in paths {
            let p = p.as_ref();
            crate::limits::regular_file(p)?;
            let file =
                std::fs::File::open(p).with_context(|| format!("{}: cannot open", p.display()))?;
            // SAFETY: the checkpoint is treated as read-only input for the life of the process;
            // like every mmap-based loader we assume nobody truncates it meanwhile.
            let map = unsafe { memmap2::Mmap::map(&file) }
                .with_context(|| format!("{}: cannot map", p.display()))?;
            shards.push(Shard { label: p.display().to_string(), bytes: Bytes::Mapped(map) });
        }
        Self::index(shards)
    }

    pub fn from_static(label: &str, bytes: &'static [u8]) -> Result<Self> {
        Self::index(vec![Shard { label: label.to_string(), bytes: Bytes::Static(bytes) }])
    }

    /// A safetensors file already in memory (property tests and fuzz targets).
    pub fn from_vec(label: &str, bytes: Vec<u8>) -> Result<Self> {
        Self::index(vec![Shard { label: label.to_string(), bytes: Bytes::Owned(bytes) }])
    }

    fn index(shards: Vec<Shard>) -> Result<Self> {
        let mut index = HashMap::new();
        for (i, shard) in shards.iter().enumerate() {
            let st = parse(shard)?;
            for name in st.names() {
                if let Some(prev) = index.insert(name.to_string(), i) {
                    bail!(
                        "{}: tensor `{name}` also appears in {}",
                        shard.label,
                        shards[prev].label
                    );
                }
            }
        }
        Ok(Weights { shards, index })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Loads `name`, checks its shape, converts it to `dtype` on `device`.
    pub fn get(
        &self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| anyhow!("{}: missing tensor `{name}`", self.describe()))?;
        let shard = &self.shards[i];
        let view = parse(shard)?
            .tensor(name)
            .map_err(|e| anyhow!("{}: tensor `{name}`: {e}", shard.label))?;
        if view.shape() != shape {
            bail!(
                "{}: tensor `{name}` has shape {:?}, expected {:?}",
                shard.label,
                view.shape(),
                shape
            );
        }
        let t = view
            .load(&Device::Cpu)
            .map_err(|e| anyhow!("{}: tensor `{name}`: {e}", shard.label))?;
        // Convert on the host, then move: the device sees only the dtype it computes in.
        Ok(t.to_dtype(dtype)?.to_device(device)?)
    }

    /// The stored dtype of the first tensor (what the checkpoint "is").
    pub fn stored_dtype(&self) -> String {
        self.shards
            .first()
            .and_then(|s| {
                parse(s).ok().map(|st| st.tensors().first().map(|t| format!("{:?}", t.1.dtype())))
            })
            .flatten()
            .unwrap_or_default()
            .to_lowercase()
    }

    /// The dtype most of the checkpoint's bytes are stored in (what loading them reads).
    pub fn stored(&self) -> DType {
        let mut bytes: Vec<(safetensors::Dtype, usize)> = Vec::new();
        for st in self.shards.iter().filter_map(|s| parse(s).ok()) {
            for (_, view) in st.tensors() {
                match bytes.iter_mut().find(|(dt, _)| *dt == view.dtype()) {
                    Some((_, b)) => *b += view.data().len(),
                    None => bytes.push((view.dtype(), view.data().len())),
                }
            }
        }
        let most = bytes.into_iter().max_by_key(|&(_, b)| b).map(|(dt, _)| dt);
        most.and_then(|dt| DType::try_from(dt).ok()).unwrap_or(DType::F32)
    }

    fn describe(&self) -> String {
        match self.shards.as_slice() {
            [one] => one.label.clone(),
            many => format!("{} (and {} more shards)", many[0].label, many.len() - 1),
        }
    }
}

fn parse(shard: &Shard) -> Result<SafeTensors<'_>> {
    SafeTensors::deserialize(shard.bytes.as_slice())
        .map_err(|e| anyhow!("{}: not a valid safetensors file: {e}", shard.label))
}
