//! Tensors published in parts: each tensor-parallel rank of a receiver
//! takes only its slice of the tensors split for it, and only those bytes
//! move.
//!
//! A [`Split`] names, per tensor, the dimension it is split along, and the
//! number of parts. Part `i` of a tensor of size `s` along that dimension
//! holds indices `i * s / n .. (i + 1) * s / n` (`s` must divide by `n`,
//! as tensor-parallel layouts do). The publisher gathers each part into
//! its own contiguous bytes, and the parts of one index share buckets with
//! nothing else, so a rank fetches the buckets of its part and of the
//! tensors every rank takes whole.

use std::collections::HashMap;

use shardport_abi::DType;

use crate::{manifest::Part, publish::Tensor};

/// How a publish splits tensors: `parts` parts of each tensor named in
/// `dims`, along the dimension given for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// Parts of each split tensor (the receivers' tensor-parallel size).
    pub parts: u32,
    /// Tensor name to the dimension it is split along.
    pub dims: HashMap<String, usize>,
}

/// What one published entry's bytes come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Src<'a> {
    /// A tensor's bytes as they are.
    Whole(&'a [u8]),
    /// A slice along one dimension: `outer` runs of `chunk` bytes, run `o`
    /// at `o * row + start` of the tensor's bytes.
    Piece {
        bytes: &'a [u8],
        outer: usize,
        row: usize,
        start: usize,
        chunk: usize,
    },
}

impl Src<'_> {
    pub(crate) fn len(&self) -> usize {
        match *self {
            Src::Whole(b) => b.len(),
            Src::Piece { outer, chunk, .. } => outer * chunk,
        }
    }

    /// Writes the bytes, packed, into `dst` (`len()` bytes).
    pub(crate) fn write(&self, dst: &mut [u8]) {
        match *self {
            Src::Whole(b) => dst.copy_from_slice(b),
            Src::Piece {
                bytes,
                outer,
                row,
                start,
                chunk,
            } => {
                for o in 0..outer {
                    let from = o * row + start;
                    dst[o * chunk..(o + 1) * chunk].copy_from_slice(&bytes[from..from + chunk]);
                }
            }
        }
    }
}

/// One entry to publish: a tensor, or one part of it.
#[derive(Debug, Clone)]
pub(crate) struct Item<'a> {
    pub(crate) name: &'a str,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<u64>,
    pub(crate) part: Option<Part>,
    pub(crate) src: Src<'a>,
}

impl Item<'_> {
    /// The packing group: 0 for whole tensors, 1 + the part's index.
    pub(crate) fn group(&self) -> u32 {
        self.part.map_or(0, |p| p.index + 1)
    }
}

/// The entries of `tensors` under `split`, or what is wrong with the split.
pub(crate) fn items<'a>(tensors: &[Tensor<'a>], split: &Split) -> Result<Vec<Item<'a>>, String> {
    if !split.dims.is_empty() && split.parts == 0 {
        return Err("a split into 0 parts".into());
    }
    for name in split.dims.keys() {
        if !tensors.iter().any(|t| t.name == name) {
            return Err(format!("tensor {name:?} is split but not published"));
        }
    }
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let Some(&dim) = split.dims.get(t.name) else {
            out.push(Item {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape.to_vec(),
                part: None,
                src: Src::Whole(t.bytes),
            });
            continue;
        };
        let n = split.parts as u64;
        let size = *t.shape.get(dim).ok_or_else(|| {
            format!(
                "tensor {:?} has {} dimensions; it cannot be split along dimension {dim}",
                t.name,
                t.shape.len()
            )
        })?;
        if size % n != 0 {
            return Err(format!(
                "tensor {:?}: dimension {dim} of size {size} does not split into {n} equal parts",
                t.name
            ));
        }
        let bits = t.dtype.bits().unwrap_or(0);
        if bits % 8 != 0 {
            return Err(format!("tensor {:?}: a split {} tensor", t.name, t.dtype));
        }
        let item = (bits / 8) as usize;
        let outer: u64 = t.shape[..dim].iter().product();
        let inner: u64 = t.shape[dim + 1..].iter().product();
        let row = (size * inner) as usize * item;
        let chunk = (size / n * inner) as usize * item;
        for index in 0..split.parts {
            let mut shape = t.shape.to_vec();
            shape[dim] = size / n;
            out.push(Item {
                name: t.name,
                dtype: t.dtype,
                shape,
                part: Some(Part {
                    dim: dim as u8,
                    index,
                    count: split.parts,
                }),
                src: Src::Piece {
                    bytes: t.bytes,
                    outer: outer as usize,
                    row,
                    start: index as usize * chunk,
                    chunk,
                },
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_split_gathers_each_rows_slice() {
        // A 2x4 u8 matrix split into 2 parts along dimension 1 (columns).
        let bytes: Vec<u8> = (0..8).collect();
        let t = [Tensor {
            name: "w",
            dtype: DType::U8,
            shape: &[2, 4],
            bytes: &bytes,
        }];
        let split = Split {
            parts: 2,
            dims: HashMap::from([("w".to_owned(), 1)]),
        };
        let items = items(&t, &split).unwrap();
        assert_eq!(items.len(), 2);
        let packed = |i: &Item<'_>| {
            let mut d = vec![0; i.src.len()];
            i.src.write(&mut d);
            d
        };
        assert_eq!(packed(&items[0]), vec![0, 1, 4, 5]);
        assert_eq!(packed(&items[1]), vec![2, 3, 6, 7]);
        assert_eq!(items[1].shape, vec![2, 2]);
        assert_eq!((items[0].group(), items[1].group()), (1, 2));
        // Along rows: contiguous halves.
        let split = Split {
            parts: 2,
            dims: HashMap::from([("w".to_owned(), 0)]),
        };
        let items = super::items(&t, &split).unwrap();
        assert_eq!(packed(&items[1]), vec![4, 5, 6, 7]);
    }

    #[test]
    fn impossible_splits_are_refused_naming_the_tensor() {
        let bytes = [0u8; 6];
        let t = [Tensor {
            name: "b",
            dtype: DType::U8,
            shape: &[6],
            bytes: &bytes,
        }];
        let split = |dim, parts| Split {
            parts,
            dims: HashMap::from([("b".to_owned(), dim)]),
        };
        let e = items(&t, &split(0, 4)).unwrap_err();
        assert!(
            e.contains("\"b\": dimension 0 of size 6 does not split into 4"),
            "{e}"
        );
        let e = items(&t, &split(1, 2)).unwrap_err();
        assert!(e.contains("cannot be split along dimension 1"), "{e}");
        let e = items(
            &t,
            &Split {
                parts: 2,
                dims: HashMap::from([("c".to_owned(), 0)]),
            },
        )
        .unwrap_err();
        assert!(e.contains("\"c\" is split but not published"), "{e}");
    }
}
