//! GGUF metadata values (spec/formats.md §1.3): the 13 on-disk value types, a scalar
//! [`Value`] and a typed, homogeneous [`Array`].
//!
//! Arrays keep their element type even when empty and store elements unboxed
//! (`tokenizer.ggml.token_type` with 100k entries is one `Vec<i32>`, not 100k `Value`s).
//! Nested arrays (ARRAY of ARRAY), which the spec allows and llama.cpp rejects, are read
//! up to [`MAX_ARRAY_DEPTH`](super::reader::MAX_ARRAY_DEPTH) levels.

use std::fmt;

/// On-disk value type ids (`gguf_type` in `gguf.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    Str = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type for an on-disk id, or `None` if the id is not one of the 13 types.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => Str,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The on-disk id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Encoded size of one value of a fixed-size type; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            Str | Array => None,
        }
    }

    /// The fewest bytes one value of this type can occupy on disk: a string is at least
    /// its u64 length, an array at least its element type and count.
    pub fn min_encoded_size(self) -> usize {
        match self {
            ValueType::Str => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }

    /// Short name, as printed by `inspect` (`u32`, `str`, ...).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            Str => "str",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous array. Nested arrays hold inner arrays that may each have their own
/// element type, as the format allows.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    /// The on-disk type of this value.
    pub fn ty(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::Str(_) => ValueType::Str,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A non-negative integer of any width (writers store hyperparameters as u32, i32 or
    /// u64 interchangeably). `None` for negative values and non-integers.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A signed integer of any width that fits `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A number: either float width, or an integer converted to `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self
                .as_i64()
                .map(|v| v as f64)
                .or_else(|| self.as_u64().map(|v| v as f64)),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Applies `$body` to the vector inside every variant of an [`Array`].
macro_rules! each_array {
    ($a:expr, $v:ident => $body:expr) => {
        match $a {
            Array::U8($v) => $body,
            Array::I8($v) => $body,
            Array::U16($v) => $body,
            Array::I16($v) => $body,
            Array::U32($v) => $body,
            Array::I32($v) => $body,
            Array::F32($v) => $body,
            Array::Bool($v) => $body,
            Array::Str($v) => $body,
            Array::Array($v) => $body,
            Array::U64($v) => $body,
            Array::I64($v) => $body,
            Array::F64($v) => $body,
        }
    };
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::Str(_) => ValueType::Str,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        each_array!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a [`Value`] (cloned).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::Str(v) => Value::Str(v.get(i)?.clone()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
        })
    }

    /// Every element as a non-negative integer, for integer arrays of any width.
    /// `None` if the elements are not integers or one is negative.
    pub fn to_u64s(&self) -> Option<Vec<u64>> {
        fn conv<T: Copy>(v: &[T], f: impl Fn(T) -> Option<u64>) -> Option<Vec<u64>> {
            v.iter().map(|&x| f(x)).collect()
        }
        match self {
            Array::U8(v) => conv(v, |x| Some(x.into())),
            Array::U16(v) => conv(v, |x| Some(x.into())),
            Array::U32(v) => conv(v, |x| Some(x.into())),
            Array::U64(v) => Some(v.clone()),
            Array::I8(v) => conv(v, |x| u64::try_from(x).ok()),
            Array::I16(v) => conv(v, |x| u64::try_from(x).ok()),
            Array::I32(v) => conv(v, |x| u64::try_from(x).ok()),
            Array::I64(v) => conv(v, |x| u64::try_from(x).ok()),
            _ => None,
        }
    }

    pub fn as_bools(&self) -> Option<&[bool]> {
        match self {
            Array::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_strs(&self) -> Option<&[String]> {
        match self {
            Array::Str(v) => Some(v),
            _ => None,
        }
    }

    /// An empty array of the given element type.
    pub fn empty(elem: ValueType) -> Array {
        use ValueType as T;
        match elem {
            T::U8 => Array::U8(Vec::new()),
            T::I8 => Array::I8(Vec::new()),
            T::U16 => Array::U16(Vec::new()),
            T::I16 => Array::I16(Vec::new()),
            T::U32 => Array::U32(Vec::new()),
            T::I32 => Array::I32(Vec::new()),
            T::F32 => Array::F32(Vec::new()),
            T::Bool => Array::Bool(Vec::new()),
            T::Str => Array::Str(Vec::new()),
            T::Array => Array::Array(Vec::new()),
            T::U64 => Array::U64(Vec::new()),
            T::I64 => Array::I64(Vec::new()),
            T::F64 => Array::F64(Vec::new()),
        }
    }
}

/// Arrays up to this many elements print in full; longer ones as `[N × type]`.
pub const DISPLAY_MAX_ELEMENTS: usize = 16;

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Array(a) => write!(f, "{a}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.len();
        if n > DISPLAY_MAX_ELEMENTS {
            return write!(f, "[{n} × {}]", self.elem_type());
        }
        f.write_str("[")?;
        for i in 0..n {
            if i > 0 {
                f.write_str(", ")?;
            }
            match self {
                Array::Array(v) => write!(f, "{}", v[i])?,
                _ => {
                    // A scalar element; `get` cannot fail for `i < len`.
                    if let Some(v) = self.get(i) {
                        write!(f, "{v}")?;
                    }
                }
            }
        }
        f.write_str("]")
    }
}

macro_rules! impl_from {
    ($($t:ty => $var:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$var(v)
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Array {
                Array::$var(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Value {
                Value::Array(Array::$var(v))
            }
        }
    )*};
}

impl_from!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => Str, u64 => U64, i64 => I64, f64 => F64,
);

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.to_string())
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(Array::Str(v.into_iter().map(String::from).collect()))
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}

impl From<Vec<Array>> for Array {
    fn from(v: Vec<Array>) -> Array {
        Array::Array(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_short_and_long_arrays() {
        assert_eq!(Value::from(vec![1u32, 2, 3]).to_string(), "[1, 2, 3]");
        assert_eq!(
            Value::from(vec!["a", "b\"c"]).to_string(),
            r#"["a", "b\"c"]"#
        );
        assert_eq!(Value::from(vec![0i32; 100]).to_string(), "[100 × i32]");
        assert_eq!(Value::Array(Array::empty(ValueType::Str)).to_string(), "[]");
        let nested = Value::Array(Array::Array(vec![
            Array::U8(vec![1]),
            Array::Str(vec!["x".into()]),
        ]));
        assert_eq!(nested.to_string(), r#"[[1], ["x"]]"#);
        assert_eq!(Value::from(1.5f32).to_string(), "1.5");
        assert_eq!(Value::from("hi").to_string(), "\"hi\"");
    }

    #[test]
    fn integer_widths_convert() {
        assert_eq!(Value::I32(7).as_u64(), Some(7));
        assert_eq!(Value::I32(-7).as_u64(), None);
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::U16(9).as_f64(), Some(9.0));
        assert_eq!(Value::Str("9".into()).as_u64(), None);
        assert_eq!(Array::I16(vec![1, 2]).to_u64s(), Some(vec![1, 2]));
        assert_eq!(Array::I16(vec![1, -2]).to_u64s(), None);
        assert_eq!(Array::F32(vec![1.0]).to_u64s(), None);
    }

    #[test]
    fn type_ids_round_trip() {
        for id in 0..13 {
            assert_eq!(ValueType::from_id(id).map(ValueType::id), Some(id));
        }
        assert_eq!(ValueType::from_id(13), None);
    }
}
