//! ExecuTorch `ScalarType` codes (`schema/scalar_type.fbs`); the MLX schema reuses them.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarType {
    Byte,
    Char,
    Short,
    Int,
    Long,
    Half,
    Float,
    Double,
    Bool,
    QInt8,
    QUInt8,
    QInt32,
    BFloat16,
    QUInt4x2,
    QUInt2x4,
    Bits16,
    Float8E5M2,
    Float8E4M3Fn,
    Float8E5M2Fnuz,
    Float8E4M3Fnuz,
    UInt16,
    UInt32,
    UInt64,
}

impl ScalarType {
    pub fn from_code(code: i8) -> Option<Self> {
        use ScalarType::*;
        Some(match code {
            0 => Byte,
            1 => Char,
            2 => Short,
            3 => Int,
            4 => Long,
            5 => Half,
            6 => Float,
            7 => Double,
            11 => Bool,
            12 => QInt8,
            13 => QUInt8,
            14 => QInt32,
            15 => BFloat16,
            16 => QUInt4x2,
            17 => QUInt2x4,
            22 => Bits16,
            23 => Float8E5M2,
            24 => Float8E4M3Fn,
            25 => Float8E5M2Fnuz,
            26 => Float8E4M3Fnuz,
            27 => UInt16,
            28 => UInt32,
            29 => UInt64,
            _ => return None,
        })
    }

    /// Bytes per element (sub-byte packed types count one byte per packed element pair).
    pub fn size(self) -> usize {
        use ScalarType::*;
        match self {
            Byte | Char | Bool | QInt8 | QUInt8 | QUInt4x2 | QUInt2x4 => 1,
            Float8E5M2 | Float8E4M3Fn | Float8E5M2Fnuz | Float8E4M3Fnuz => 1,
            Short | Half | BFloat16 | Bits16 | UInt16 => 2,
            Int | Float | QInt32 | UInt32 => 4,
            Long | Double | UInt64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        use ScalarType::*;
        match self {
            Byte => "u8",
            Char => "i8",
            Short => "i16",
            Int => "i32",
            Long => "i64",
            Half => "f16",
            Float => "f32",
            Double => "f64",
            Bool => "bool",
            QInt8 => "qint8",
            QUInt8 => "quint8",
            QInt32 => "qint32",
            BFloat16 => "bf16",
            QUInt4x2 => "quint4x2",
            QUInt2x4 => "quint2x4",
            Bits16 => "bits16",
            Float8E5M2 => "f8e5m2",
            Float8E4M3Fn => "f8e4m3fn",
            Float8E5M2Fnuz => "f8e5m2fnuz",
            Float8E4M3Fnuz => "f8e4m3fnuz",
            UInt16 => "u16",
            UInt32 => "u32",
            UInt64 => "u64",
        }
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
