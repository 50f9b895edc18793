//! Shard identity and metadata as they cross the plugin boundary.
//!
//! Enumerations (dtype, device kind, checksum algorithm) are carried as
//! transparent integer codes rather than Rust enums: a newer host may send a
//! code an older plugin has never heard of, and that must stay representable
//! (it prints as `unknown(N)`) instead of breaking the layout check.

use std::fmt;

use abi_stable::{
    std_types::{ROption, RVec},
    StableAbi,
};

/// A 128-bit shard id, unique per owner for the lifetime of a node.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ShardId {
    /// High 64 bits.
    pub hi: u64,
    /// Low 64 bits.
    pub lo: u64,
}

impl ShardId {
    /// Builds an id from its 128-bit value.
    pub const fn from_u128(v: u128) -> Self {
        Self {
            hi: (v >> 64) as u64,
            lo: v as u64,
        }
    }

    /// The 128-bit value.
    pub const fn as_u128(self) -> u128 {
        ((self.hi as u128) << 64) | self.lo as u128
    }
}

impl fmt::Debug for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.as_u128())
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.as_u128())
    }
}

macro_rules! dtypes {
    ($( $(#[$doc:meta])* $konst:ident = $code:literal, $name:literal, $bits:literal; )*) => {
        /// Element type of a shard, carried natively (bf16 is never upcast).
        #[repr(transparent)]
        #[derive(StableAbi, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct DType(pub u8);

        impl DType {
            $( $(#[$doc])* pub const $konst: DType = DType($code); )*

            /// Every dtype this version of the interface knows.
            pub const ALL: &'static [DType] = &[$(DType::$konst),*];

            /// Lowercase name as used in configs and JSON (`bf16`, `f8e4m3fn`, ...).
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $code => Some($name), )*
                    _ => None,
                }
            }

            /// Size of one element in bits (`bool` is stored as one byte).
            pub fn bits(self) -> Option<u32> {
                match self.0 {
                    $( $code => Some($bits), )*
                    _ => None,
                }
            }

            /// Parses a lowercase name produced by [`DType::name`].
            pub fn from_name(name: &str) -> Option<DType> {
                match name {
                    $( $name => Some(DType::$konst), )*
                    _ => None,
                }
            }
        }
    };
}

dtypes! {
    /// Boolean, one byte per element.
    BOOL = 0, "bool", 8;
    /// Unsigned 8-bit integer.
    U8 = 1, "u8", 8;
    /// Signed 8-bit integer.
    I8 = 2, "i8", 8;
    /// Unsigned 16-bit integer.
    U16 = 3, "u16", 16;
    /// Signed 16-bit integer.
    I16 = 4, "i16", 16;
    /// Unsigned 32-bit integer.
    U32 = 5, "u32", 32;
    /// Signed 32-bit integer.
    I32 = 6, "i32", 32;
    /// Unsigned 64-bit integer.
    U64 = 7, "u64", 64;
    /// Signed 64-bit integer.
    I64 = 8, "i64", 64;
    /// IEEE 754 half precision.
    F16 = 9, "f16", 16;
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16 = 10, "bf16", 16;
    /// IEEE 754 single precision.
    F32 = 11, "f32", 32;
    /// IEEE 754 double precision.
    F64 = 12, "f64", 64;
    /// FP8 E4M3, finite-only variant (OCP `float8_e4m3fn`).
    F8E4M3FN = 13, "f8e4m3fn", 8;
    /// FP8 E5M2 (OCP `float8_e5m2`).
    F8E5M2 = 14, "f8e5m2", 8;
    /// FP8 E4M3 with unsigned zero, finite-only (`float8_e4m3fnuz`).
    F8E4M3FNUZ = 15, "f8e4m3fnuz", 8;
    /// FP8 E5M2 with unsigned zero, finite-only (`float8_e5m2fnuz`).
    F8E5M2FNUZ = 16, "f8e5m2fnuz", 8;
    /// FP8 E8M0 scale type used by microscaling formats.
    F8E8M0FNU = 17, "f8e8m0fnu", 8;
    /// Complex of two f32.
    C64 = 18, "c64", 64;
    /// Complex of two f64.
    C128 = 19, "c128", 128;
}

impl fmt::Debug for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "unknown({})", self.0),
        }
    }
}

/// Kind of memory a shard lives in.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceKind(pub u8);

impl DeviceKind {
    /// Host (CPU) memory.
    pub const CPU: DeviceKind = DeviceKind(0);
    /// CUDA device memory; `Device::index` is the ordinal.
    pub const CUDA: DeviceKind = DeviceKind(1);
}

/// Where a shard's bytes live: `cpu` or `cuda:N`.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// Memory kind.
    pub kind: DeviceKind,
    /// Device ordinal (0 for `cpu`).
    pub index: u32,
}

impl Device {
    /// Host memory.
    pub const CPU: Device = Device {
        kind: DeviceKind::CPU,
        index: 0,
    };

    /// CUDA device `index`.
    pub const fn cuda(index: u32) -> Device {
        Device {
            kind: DeviceKind::CUDA,
            index,
        }
    }

    /// Parses `cpu` or `cuda:N`.
    pub fn parse(s: &str) -> Option<Device> {
        if s == "cpu" {
            return Some(Device::CPU);
        }
        let idx = s.strip_prefix("cuda:")?;
        idx.parse().ok().map(Device::cuda)
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::CPU => f.write_str("cpu"),
            DeviceKind::CUDA => write!(f, "cuda:{}", self.index),
            DeviceKind(k) => write!(f, "unknown({k}):{}", self.index),
        }
    }
}

/// Checksum algorithm of a [`Checksum`].
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ChecksumAlgo(pub u8);

impl ChecksumAlgo {
    /// CRC-32C (Castagnoli); the value occupies the low 32 bits.
    pub const CRC32C: ChecksumAlgo = ChecksumAlgo(1);
    /// XXH3 64-bit.
    pub const XXH3: ChecksumAlgo = ChecksumAlgo(2);

    /// Lowercase name (`crc32c`, `xxh3`).
    pub fn name(self) -> Option<&'static str> {
        match self {
            ChecksumAlgo::CRC32C => Some("crc32c"),
            ChecksumAlgo::XXH3 => Some("xxh3"),
            _ => None,
        }
    }
}

/// A checksum of a shard's bytes computed at put time.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Checksum {
    /// Algorithm.
    pub algo: ChecksumAlgo,
    /// Value (zero-extended to 64 bits).
    pub value: u64,
}

/// Metadata of a shard: everything a consumer needs besides the bytes.
#[repr(C)]
#[derive(StableAbi, Clone, PartialEq, Eq, Debug)]
pub struct ShardMeta {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first. Empty for a scalar.
    pub shape: RVec<u64>,
    /// Where the owner's bytes live.
    pub device: Device,
    /// Exact length of the bytes.
    pub byte_len: u64,
    /// Optional checksum computed by the owner at put time.
    pub checksum: ROption<Checksum>,
}

impl ShardMeta {
    /// Metadata for a contiguous CPU buffer of raw bytes (`u8`, 1-D).
    pub fn bytes(len: u64) -> Self {
        ShardMeta {
            dtype: DType::U8,
            shape: RVec::from(vec![len]),
            device: Device::CPU,
            byte_len: len,
            checksum: ROption::RNone,
        }
    }

    /// Number of elements implied by the shape (1 for a scalar), `None` on overflow.
    pub fn element_count(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Byte length implied by dtype and shape, `None` for an unknown dtype or overflow.
    pub fn implied_byte_len(&self) -> Option<u64> {
        let bits = u64::from(self.dtype.bits()?);
        self.element_count()?
            .checked_mul(bits)?
            .checked_add(7)
            .map(|b| b / 8)
    }
}
