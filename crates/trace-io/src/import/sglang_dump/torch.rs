//! A `torch.save` file as the SGLang importer needs it: the pickled object tree (tensors as
//! placeholders) and its tensors by dotted path (`records.3.topk_ids_of_layer`), both from the
//! `pytorch-reader` crate, and integer tensors read into `i64` with their size checked against the
//! file before anything is allocated.

use std::collections::HashMap;
use std::path::Path;

use pytorch_reader::{DType, PickleValue, PytorchReader, Tensor};

/// An integer tensor's values (row-major, as `i64`) and its shape.
pub(super) type Ints = (Vec<i64>, Vec<usize>);

/// The parsed file.
pub(super) struct TorchFile {
    /// The object `torch.save` was given, tensors as [`PickleValue::Unsupported`].
    pub root: PickleValue,
    /// Its tensors by dotted path: dict keys, list indices.
    pub tensors: HashMap<String, Tensor>,
    /// The file's length in bytes.
    pub len: u64,
}

impl TorchFile {
    /// Parses the pickle of the file at `path` (no tensor data is read).
    pub fn open(path: &Path) -> Result<TorchFile, String> {
        use std::io::Read;
        // torch.save writes a zip: the archive-accepting opener (other readers refuse zips).
        let file =
            crate::file::open_regular_archive(path, "give a file on disk").map_err(|e| format!("cannot open: {e}"))?;
        let len = file.metadata().map_err(|e| format!("cannot open: {e}"))?.len();
        let mut head = Vec::with_capacity(4);
        file.take(4).read_to_end(&mut head).map_err(|e| format!("cannot read: {e}"))?;
        if head != b"PK\x03\x04" {
            return Err(format!(
                "not a torch.save file (a zip archive holding data.pkl){}",
                if len == 0 { ": the file is empty" } else { "" }
            ));
        }
        let reader = PytorchReader::new(path).map_err(|e| format!("not a readable torch.save file: {e}"))?;
        let root =
            PytorchReader::read_pickle_data(path, None).map_err(|e| format!("not a readable torch.save file: {e}"))?;
        Ok(TorchFile { root, tensors: reader.into_tensors(), len })
    }

    /// The integer tensor at dotted `key` as `i64` values (row-major) with its shape; `Err` names
    /// the dtype of a non-integer tensor, a shape the file cannot hold, or a failed read.
    pub fn ints(&self, key: &str) -> Result<Option<Ints>, String> {
        let Some(t) = self.tensors.get(key) else { return Ok(None) };
        let dtype = t.dtype();
        let size = match dtype {
            DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 => 2,
            DType::I32 | DType::U32 => 4,
            DType::I64 | DType::U64 => 8,
            other => {
                return Err(format!(
                    "dtype {}: expected integer expert ids (SGLang records torch.int32)",
                    dtype_name(other)
                ));
            }
        };
        let shape = t.shape().to_vec();
        let bytes = shape
            .iter()
            .try_fold(size as u64, |acc, &d| acc.checked_mul(d as u64))
            .filter(|&b| b <= self.len)
            .ok_or_else(|| {
                format!(
                    "shape {shape:?} of {} needs more bytes than the whole file holds ({})",
                    dtype_name(dtype),
                    self.len
                )
            })?;
        let raw = t.read().map_err(|e| format!("cannot read the tensor's data ({bytes} bytes): {e}"))?;
        if raw.len() as u64 != bytes {
            return Err(format!("the tensor's data holds {} bytes, its shape {shape:?} needs {bytes}", raw.len()));
        }
        let v: Vec<i64> = match dtype {
            DType::I8 => raw.iter().map(|&b| i64::from(b as i8)).collect(),
            DType::U8 => raw.iter().map(|&b| i64::from(b)).collect(),
            DType::I16 => raw.as_chunks::<2>().0.iter().map(|c| i64::from(i16::from_ne_bytes(*c))).collect(),
            DType::U16 => raw.as_chunks::<2>().0.iter().map(|c| i64::from(u16::from_ne_bytes(*c))).collect(),
            DType::I32 => raw.as_chunks::<4>().0.iter().map(|c| i64::from(i32::from_ne_bytes(*c))).collect(),
            DType::U32 => raw.as_chunks::<4>().0.iter().map(|c| i64::from(u32::from_ne_bytes(*c))).collect(),
            DType::I64 => raw.as_chunks::<8>().0.iter().map(|c| i64::from_ne_bytes(*c)).collect(),
            _ => raw
                .as_chunks::<8>()
                .0
                .iter()
                .map(|c| i64::try_from(u64::from_ne_bytes(*c)).unwrap_or(i64::MAX))
                .collect(),
        };
        Ok(Some((v, shape)))
    }
}

/// torch's name of a dtype (`torch.float32`).
pub(super) fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F64 => "torch.float64",
        DType::F32 => "torch.float32",
        DType::F16 => "torch.float16",
        DType::BF16 => "torch.bfloat16",
        DType::I64 => "torch.int64",
        DType::I32 => "torch.int32",
        DType::I16 => "torch.int16",
        DType::I8 => "torch.int8",
        DType::U64 => "torch.uint64",
        DType::U32 => "torch.uint32",
        DType::U16 => "torch.uint16",
        DType::U8 => "torch.uint8",
        DType::Bool => "torch.bool",
    }
}

/// What a pickled value is, in Python's words.
pub(super) fn type_name(v: &PickleValue) -> String {
    match v {
        PickleValue::None => "None".into(),
        PickleValue::Bool(_) => "bool".into(),
        PickleValue::Int(_) => "int".into(),
        PickleValue::Float(_) => "float".into(),
        PickleValue::String(_) => "str".into(),
        PickleValue::List(_) => "list".into(),
        PickleValue::Dict(_) => "dict".into(),
        PickleValue::Bytes(_) => "bytes".into(),
        PickleValue::Unsupported(t) => t.clone(),
    }
}

/// A list of ints (`input_ids`, `positions`, `extend_seq_lens`).
pub(super) fn int_list(v: &PickleValue) -> Result<Vec<i64>, String> {
    let PickleValue::List(items) = v else { return Err(format!("a {}, expected a list of ints", type_name(v))) };
    items
        .iter()
        .enumerate()
        .map(|(i, x)| match x {
            PickleValue::Int(n) => Ok(*n),
            other => Err(format!("entry {i} is a {}, expected an int", type_name(other))),
        })
        .collect()
}
