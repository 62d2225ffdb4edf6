//! GGUF metadata values: the thirteen value types, scalars and (possibly nested) arrays.

/// A GGUF metadata value type id (section 1.2 of the format notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `UINT8` (0).
    U8,
    /// `INT8` (1).
    I8,
    /// `UINT16` (2).
    U16,
    /// `INT16` (3).
    I16,
    /// `UINT32` (4).
    U32,
    /// `INT32` (5).
    I32,
    /// `FLOAT32` (6).
    F32,
    /// `BOOL` (7).
    Bool,
    /// `STRING` (8).
    String,
    /// `ARRAY` (9).
    Array,
    /// `UINT64` (10).
    U64,
    /// `INT64` (11).
    I64,
    /// `FLOAT64` (12).
    F64,
}

impl ValueType {
    /// The type with GGUF id `id`.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The GGUF id of this type.
    pub fn id(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// The gguf-py name (`"UINT32"`, `"STRING"`, ...), used in errors and listings.
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "UINT8",
            ValueType::I8 => "INT8",
            ValueType::U16 => "UINT16",
            ValueType::I16 => "INT16",
            ValueType::U32 => "UINT32",
            ValueType::I32 => "INT32",
            ValueType::F32 => "FLOAT32",
            ValueType::Bool => "BOOL",
            ValueType::String => "STRING",
            ValueType::Array => "ARRAY",
            ValueType::U64 => "UINT64",
            ValueType::I64 => "INT64",
            ValueType::F64 => "FLOAT64",
        }
    }

    /// Fixed payload size in bytes; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }

    /// The fewest bytes one value of this type can take in a file (used to bound counts before
    /// allocating): a string is at least its 8-byte length, an array its 12-byte header.
    pub fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            other => other.fixed_size().unwrap_or(1) as u64,
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `FLOAT32`.
    F32(f32),
    /// `BOOL`.
    Bool(bool),
    /// `STRING` (valid UTF-8).
    String(String),
    /// `ARRAY`.
    Array(Array),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT64`.
    F64(f64),
}

impl Value {
    /// The value's GGUF type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as an `i128` if it is an integer of any width (bools are not integers).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A short description of the type for error messages (`"UINT32"`, `"ARRAY[STRING]"`).
    pub fn type_description(&self) -> &'static str {
        match self {
            Value::Array(a) => a.type_description(),
            v => v.value_type().name(),
        }
    }
}

/// A metadata array: all elements share one type. Arrays may nest (the spec allows it; model
/// files never do).
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// `UINT8` elements.
    U8(Vec<u8>),
    /// `INT8` elements.
    I8(Vec<i8>),
    /// `UINT16` elements.
    U16(Vec<u16>),
    /// `INT16` elements.
    I16(Vec<i16>),
    /// `UINT32` elements.
    U32(Vec<u32>),
    /// `INT32` elements.
    I32(Vec<i32>),
    /// `FLOAT32` elements.
    F32(Vec<f32>),
    /// `BOOL` elements.
    Bool(Vec<bool>),
    /// `STRING` elements.
    String(Vec<String>),
    /// Nested arrays.
    Array(Vec<Array>),
    /// `UINT64` elements.
    U64(Vec<u64>),
    /// `INT64` elements.
    I64(Vec<i64>),
    /// `FLOAT64` elements.
    F64(Vec<f64>),
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// `"ARRAY[<element type>]"`, for error messages and listings.
    pub fn type_description(&self) -> &'static str {
        match self.element_type() {
            ValueType::U8 => "ARRAY[UINT8]",
            ValueType::I8 => "ARRAY[INT8]",
            ValueType::U16 => "ARRAY[UINT16]",
            ValueType::I16 => "ARRAY[INT16]",
            ValueType::U32 => "ARRAY[UINT32]",
            ValueType::I32 => "ARRAY[INT32]",
            ValueType::F32 => "ARRAY[FLOAT32]",
            ValueType::Bool => "ARRAY[BOOL]",
            ValueType::String => "ARRAY[STRING]",
            ValueType::Array => "ARRAY[ARRAY]",
            ValueType::U64 => "ARRAY[UINT64]",
            ValueType::I64 => "ARRAY[INT64]",
            ValueType::F64 => "ARRAY[FLOAT64]",
        }
    }

    /// The elements as `i128` if the element type is an integer type.
    pub fn integers(&self) -> Option<Vec<i128>> {
        fn conv<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::U64(v) => conv(v),
            Array::I64(v) => conv(v),
            _ => return None,
        })
    }
}

/// One key/value pair of a file's metadata, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataEntry {
    /// The key (non-empty, unique within a file).
    pub key: String,
    /// The value.
    pub value: Value,
}

impl MetadataEntry {
    /// A pair from a key and a value.
    pub fn new(key: impl Into<String>, value: Value) -> MetadataEntry {
        MetadataEntry {
            key: key.into(),
            value,
        }
    }
}
