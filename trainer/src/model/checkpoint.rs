//! Loads a Hugging Face safetensors checkpoint (single file or sharded with an index) into a
//! `VarStore` whose variable names are the checkpoint's tensor names.
//!
//! Each shard is memory-mapped and every tensor is copied once, straight from the mapping into its
//! (already allocated) variable, converting dtype and device in that one copy: the file is never
//! read into a buffer, so peak host memory stays at the page cache plus one variable's transfer.
//!
//! Extra tensors: buffers transformers itself ignores (`*.rotary_emb.inv_freq`, and `lm_head.weight`
//! when embeddings are tied, since transformers re-ties it to the embedding) are skipped. Any other
//! tensor the model does not declare is an error, because it means the checkpoint has structure we
//! do not compute (a bias, an extra norm, another head) and silently dropping it would give wrong
//! logits with no sign of why.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

/// The file names transformers writes.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The shard index transformers writes next to sharded checkpoints.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Why checkpoint weights could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Neither `model.safetensors` nor `model.safetensors.index.json` is in the directory.
    #[error("{dir}: no {SINGLE_FILE} or {INDEX_FILE} found")]
    NoWeights {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// A file could not be opened, mapped or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// The shard index is not valid JSON of the expected form.
    #[error("cannot parse {path}: {source}")]
    Index {
        /// The index file.
        path: PathBuf,
        /// The parse failure.
        source: serde_json::Error,
    },
    /// The index names a shard that is not in the directory.
    #[error("shard file {shard} named in {index} (for tensor {tensor}) does not exist")]
    MissingShard {
        /// The missing shard.
        shard: PathBuf,
        /// The index that names it.
        index: PathBuf,
        /// One tensor the index places in that shard.
        tensor: String,
    },
    /// A file is not valid safetensors.
    #[error("{path} is not a valid safetensors file: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What the safetensors parser reported.
        reason: String,
    },
    /// A tensor the model needs is in none of the files.
    #[error("tensor {tensor} is missing from the checkpoint (searched {searched})")]
    MissingTensor {
        /// The tensor's name.
        tensor: String,
        /// The files searched.
        searched: String,
    },
    /// A tensor's shape differs from what config.json implies.
    #[error(
        "tensor {tensor} in {file} has shape {found:?}, expected {expected:?} from config.json"
    )]
    ShapeMismatch {
        /// The tensor's name.
        tensor: String,
        /// The file holding it.
        file: PathBuf,
        /// The shape the model declares.
        expected: Vec<i64>,
        /// The shape in the file.
        found: Vec<i64>,
    },
    /// A tensor is stored in a dtype other than f32, f16 or bf16.
    #[error("tensor {tensor} in {file} has unsupported dtype {dtype}; expected F32, F16 or BF16")]
    UnsupportedDtype {
        /// The tensor's name.
        tensor: String,
        /// The file holding it.
        file: PathBuf,
        /// The stored dtype.
        dtype: String,
    },
    /// A tensor the model does not declare (see the module docs for why this is an error).
    #[error(
        "tensor {tensor} in {file} is not a parameter of this model; the checkpoint does not match config.json's architecture"
    )]
    UnexpectedTensor {
        /// The tensor's name.
        tensor: String,
        /// The file holding it.
        file: PathBuf,
    },
    /// libtorch failed while copying a tensor.
    #[error("copying tensor {tensor} from {file}: {source}")]
    Copy {
        /// The tensor's name.
        tensor: String,
        /// The file holding it.
        file: PathBuf,
        /// libtorch's error.
        source: tch::TchError,
    },
}

#[derive(Debug, Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// What a load did, for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadReport {
    /// The safetensors files read, in order.
    pub files: Vec<PathBuf>,
    /// Variables filled.
    pub loaded: usize,
    /// Tensors skipped as ignorable buffers.
    pub skipped: Vec<String>,
}

/// The safetensors files of the checkpoint in `dir`: the shards the index names (each checked to
/// exist before anything is copied), or the single `model.safetensors`.
pub fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let index_path = dir.join(INDEX_FILE);
    if index_path.is_file() {
        let text = std::fs::read_to_string(&index_path).map_err(|source| LoadError::Io {
            path: index_path.clone(),
            source,
        })?;
        let index: ShardIndex = serde_json::from_str(&text).map_err(|source| LoadError::Index {
            path: index_path.clone(),
            source,
        })?;
        let mut shards: BTreeMap<&str, &str> = BTreeMap::new();
        for (tensor, shard) in &index.weight_map {
            shards.entry(shard.as_str()).or_insert(tensor.as_str());
        }
        let mut files = Vec::with_capacity(shards.len());
        for (shard, tensor) in shards {
            let path = dir.join(shard);
            if !path.is_file() {
                return Err(LoadError::MissingShard {
                    shard: path,
                    index: index_path,
                    tensor: tensor.to_owned(),
                });
            }
            files.push(path);
        }
        return Ok(files);
    }
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(LoadError::NoWeights {
        dir: dir.to_owned(),
    })
}

/// Tensors transformers itself drops on load.
fn ignorable(name: &str, tied_embeddings: bool) -> bool {
    name.ends_with("rotary_emb.inv_freq") || (tied_embeddings && name == "lm_head.weight")
}

fn kind_of(dtype: Dtype) -> Option<Kind> {
    match dtype {
        Dtype::F32 => Some(Kind::Float),
        Dtype::F16 => Some(Kind::Half),
        Dtype::BF16 => Some(Kind::BFloat16),
        _ => None,
    }
}

/// Fills every variable of `variables` (name → tensor, as `VarStore::variables` returns) from the
/// checkpoint in `dir`. Variables keep their kind and device; the copy converts.
pub fn load_variables(
    dir: &Path,
    variables: &HashMap<String, Tensor>,
    tied_embeddings: bool,
) -> Result<LoadReport, LoadError> {
    let files = checkpoint_files(dir)?;
    let mut pending: BTreeSet<&str> = variables.keys().map(String::as_str).collect();
    let mut skipped = Vec::new();
    for file in &files {
        let handle = File::open(file).map_err(|source| LoadError::Io {
            path: file.clone(),
            source,
        })?;
        // SAFETY: the map is read-only and lives only for this loop iteration; a concurrent writer
        // truncating the shard underneath us is the one hazard, as for any mmap-based loader
        // (transformers and candle do the same).
        let mapped = unsafe { memmap2::Mmap::map(&handle) }.map_err(|source| LoadError::Io {
            path: file.clone(),
            source,
        })?;
        let tensors =
            SafeTensors::deserialize(&mapped).map_err(|error| LoadError::Safetensors {
                path: file.clone(),
                reason: format!("{error:?}"),
            })?;
        for (name, view) in tensors.tensors() {
            let Some(variable) = variables.get(&name) else {
                if ignorable(&name, tied_embeddings) {
                    skipped.push(name);
                    continue;
                }
                return Err(LoadError::UnexpectedTensor {
                    tensor: name,
                    file: file.clone(),
                });
            };
            let found: Vec<i64> = view.shape().iter().map(|&dim| dim as i64).collect();
            let expected = variable.size();
            if found != expected {
                return Err(LoadError::ShapeMismatch {
                    tensor: name,
                    file: file.clone(),
                    expected,
                    found,
                });
            }
            let Some(kind) = kind_of(view.dtype()) else {
                return Err(LoadError::UnsupportedDtype {
                    tensor: name,
                    file: file.clone(),
                    dtype: format!("{:?}", view.dtype()),
                });
            };
            copy_into(variable, view.data(), &found, kind).map_err(|source| LoadError::Copy {
                tensor: name.clone(),
                file: file.clone(),
                source,
            })?;
            pending.remove(name.as_str());
        }
    }
    if let Some(missing) = pending.first() {
        return Err(LoadError::MissingTensor {
            tensor: (*missing).to_owned(),
            searched: files
                .iter()
                .map(|file| file.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(LoadReport {
        files,
        loaded: variables.len(),
        skipped,
    })
}

/// Copies `data` (a mapped safetensors payload of `shape` and `kind`) into `variable`.
fn copy_into(
    variable: &Tensor,
    data: &[u8],
    shape: &[i64],
    kind: Kind,
) -> Result<(), tch::TchError> {
    // SAFETY: safetensors validated that `data` holds exactly numel(shape) elements of `kind`; the
    // borrowed tensor is dropped before `data`'s mapping, and copy_ reads it once (libtorch's copy
    // kernels tolerate the unaligned start safetensors allows).
    let source = unsafe { Tensor::f_from_blob(data.as_ptr(), shape, &[], kind, Device::Cpu) }?;
    tch::no_grad(|| variable.shallow_clone().f_copy_(&source))
}
