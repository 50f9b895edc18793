//! Conversions between Python values and the host's vocabulary: dtype names,
//! config dicts, JSON stats.

use std::{collections::BTreeMap, ffi::CStr};

use pyo3::{
    prelude::*,
    types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple},
};
use shardport_abi::DType;

use crate::errors::{py_err, Kind};

/// Every dtype the binding carries, once: its NumPy/torch name, DLPack
/// `(code, bits)` and PEP 3118 buffer format (`None` where the struct
/// module has none: bfloat16, float8). NumPy names; bf16 and the float8
/// types are ml_dtypes' names (and torch's). Every dtype conversion below
/// reads this table.
struct Row {
    dtype: DType,
    name: &'static str,
    dlpack: (u8, u8),
    format: Option<&'static CStr>,
}

const fn row(
    dtype: DType,
    name: &'static str,
    dlpack: (u8, u8),
    format: Option<&'static CStr>,
) -> Row {
    Row {
        dtype,
        name,
        dlpack,
        format,
    }
}

const DTYPES: &[Row] = &[
    row(DType::BOOL, "bool", (6, 8), Some(c"?")),
    row(DType::U8, "uint8", (1, 8), Some(c"B")),
    row(DType::I8, "int8", (0, 8), Some(c"b")),
    row(DType::U16, "uint16", (1, 16), Some(c"H")),
    row(DType::I16, "int16", (0, 16), Some(c"h")),
    row(DType::U32, "uint32", (1, 32), Some(c"I")),
    row(DType::I32, "int32", (0, 32), Some(c"i")),
    row(DType::U64, "uint64", (1, 64), Some(c"Q")),
    row(DType::I64, "int64", (0, 64), Some(c"q")),
    row(DType::F16, "float16", (2, 16), Some(c"e")),
    row(DType::BF16, "bfloat16", (4, 16), None),
    row(DType::F32, "float32", (2, 32), Some(c"f")),
    row(DType::F64, "float64", (2, 64), Some(c"d")),
    row(DType::F8E4M3FN, "float8_e4m3fn", (10, 8), None),
    row(DType::F8E5M2, "float8_e5m2", (12, 8), None),
    row(DType::F8E4M3FNUZ, "float8_e4m3fnuz", (11, 8), None),
    row(DType::F8E5M2FNUZ, "float8_e5m2fnuz", (13, 8), None),
    row(DType::F8E8M0FNU, "float8_e8m0fnu", (14, 8), None),
    row(DType::C64, "complex64", (5, 64), Some(c"Zf")),
    row(DType::C128, "complex128", (5, 128), Some(c"Zd")),
];

fn row_of(d: DType) -> Option<&'static Row> {
    DTYPES.iter().find(|r| r.dtype == d)
}

/// The NumPy name of a dtype (`bfloat16`, `float8_e4m3fn`, `uint32`).
pub(crate) fn dtype_name(d: DType) -> String {
    row_of(d).map_or_else(|| format!("dtype#{}", d.0), |r| r.name.to_owned())
}

/// Parses a dtype name: NumPy's (`float32`), torch's (`torch.bfloat16`,
/// `half`) or shardport's (`bf16`, `f32`).
pub(crate) fn parse_dtype(name: &str) -> PyResult<DType> {
    let n = name.strip_prefix("torch.").unwrap_or(name);
    let alias = match n {
        "half" => "float16",
        "float" => "float32",
        "double" => "float64",
        "long" => "int64",
        "int" => "int32",
        "short" => "int16",
        "cfloat" => "complex64",
        "cdouble" => "complex128",
        other => other,
    };
    DTYPES
        .iter()
        .find(|r| r.name == alias)
        .map(|r| r.dtype)
        .or_else(|| DType::from_name(n))
        .ok_or_else(|| {
            py_err(
                Kind::InvalidInput,
                format!(
                    "unsupported dtype `{name}` (supported: {})",
                    DTYPES.iter().map(|r| r.name).collect::<Vec<_>>().join(", ")
                ),
            )
        })
}

/// Bytes per element.
pub(crate) fn itemsize(d: DType) -> usize {
    d.bits().map_or(1, |b| (b as usize).div_ceil(8))
}

/// DLPack `(code, bits)` of a dtype.
pub(crate) fn dlpack_dtype(d: DType) -> Option<(u8, u8)> {
    row_of(d).map(|r| r.dlpack)
}

/// The PEP 3118 format of a dtype; `None` where the struct module has none
/// (bfloat16, float8).
pub(crate) fn buffer_format(d: DType) -> Option<&'static CStr> {
    row_of(d)?.format
}

/// The dtype of a PEP 3118 format with its item size (native or
/// little-endian, one element per item).
pub(crate) fn dtype_of_format(format: &str, itemsize: usize) -> Result<DType, String> {
    let f = format.trim_start_matches(['@', '=', '<']);
    if format.starts_with(['>', '!']) {
        return Err(format!(
            "big-endian data (buffer format `{format}`); convert it first, e.g. `a.astype(a.dtype.newbyteorder(\"<\"))`"
        ));
    }
    // The integer codes name a C type whose size the item size tells: the
    // table's own code of that size and signedness.
    let sized = |codes: [&'static str; 4]| match itemsize {
        1 => Some(codes[0]),
        2 => Some(codes[1]),
        4 => Some(codes[2]),
        8 => Some(codes[3]),
        _ => None,
    };
    let canonical = match f {
        "c" => Some("B"),
        "b" | "h" | "i" | "l" | "q" | "n" => sized(["b", "h", "i", "q"]),
        "B" | "H" | "I" | "L" | "Q" | "N" => sized(["B", "H", "I", "Q"]),
        other => Some(other),
    };
    let d = canonical.and_then(|c| {
        DTYPES
            .iter()
            .find(|r| r.format.is_some_and(|rf| rf.to_bytes() == c.as_bytes()))
    });
    match d {
        Some(r) if itemsize == self::itemsize(r.dtype) => Ok(r.dtype),
        _ => Err(format!(
            "unsupported element type (buffer format `{format}`, {itemsize} bytes per item): shardport carries bool, integers, floats (incl. bfloat16 and float8 via ml_dtypes) and complex"
        )),
    }
}

/// A Python config dict as TOML text (tables, arrays of tables, scalars).
pub(crate) fn dict_to_toml(d: &Bound<'_, PyDict>) -> PyResult<String> {
    let table = dict_to_table(d, "")?;
    toml::to_string(&table).map_err(|e| {
        py_err(
            Kind::Config,
            format!("config dict cannot be written as TOML: {e}"),
        )
    })
}

fn dict_to_table(d: &Bound<'_, PyDict>, path: &str) -> PyResult<toml::Table> {
    let mut t = toml::Table::new();
    for (k, v) in d.iter() {
        let key: String = k.extract().map_err(|_| {
            py_err(
                Kind::Config,
                format!("config key at `{path}` is not a string: {k}"),
            )
        })?;
        let dotted = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        t.insert(key, to_toml(&v, &dotted)?);
    }
    Ok(t)
}

fn to_toml(v: &Bound<'_, PyAny>, path: &str) -> PyResult<toml::Value> {
    Ok(if v.is_instance_of::<PyBool>() {
        toml::Value::Boolean(v.extract()?)
    } else if v.is_instance_of::<PyInt>() {
        toml::Value::Integer(v.extract()?)
    } else if v.is_instance_of::<PyFloat>() {
        toml::Value::Float(v.extract()?)
    } else if v.is_instance_of::<PyString>() {
        toml::Value::String(v.extract()?)
    } else if let Ok(d) = v.downcast::<PyDict>() {
        toml::Value::Table(dict_to_table(d, path)?)
    } else if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for (i, item) in v.try_iter()?.enumerate() {
            items.push(to_toml(&item?, &format!("{path}[{i}]"))?);
        }
        toml::Value::Array(items)
    } else {
        return Err(py_err(
            Kind::Config,
            format!(
                "config value at `{path}` has type {}; expected str, int, float, bool, list or dict",
                v.get_type().name()?
            ),
        ));
    })
}

/// A JSON value as the equivalent Python object.
pub(crate) fn json_to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<PyObject> {
    use serde_json::Value as V;
    Ok(match v {
        V::Null => py.None(),
        V::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
        V::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any().unbind()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any().unbind()
            } else {
                n.as_f64()
                    .unwrap_or(f64::NAN)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind()
            }
        }
        V::String(s) => PyString::new(py, s).into_any().unbind(),
        V::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(json_to_py(py, x)?)?;
            }
            l.into_any().unbind()
        }
        V::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any().unbind()
        }
    })
}

/// Routing tags from a Python dict of str -> str.
pub(crate) fn tags(t: Option<&Bound<'_, PyDict>>) -> PyResult<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if let Some(t) = t {
        for (k, v) in t.iter() {
            let (Ok(k), Ok(v)) = (k.extract::<String>(), v.extract::<String>()) else {
                return Err(py_err(
                    Kind::InvalidInput,
                    format!("tags must map str to str; got {}: {}", k.repr()?, v.repr()?),
                ));
            };
            out.insert(k, v);
        }
    }
    Ok(out)
}
