//! Typed metadata getters on [`GgufFile`]. Errors name the key and the expected and found types.

use crate::error::GgufError;
use crate::reader::GgufFile;
use crate::value::{Array, Value};

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_description(),
    }
}

fn out_of_range(key: &str, expected: &'static str, value: impl std::fmt::Display) -> GgufError {
    GgufError::OutOfRange {
        key: key.to_string(),
        expected,
        value: value.to_string(),
    }
}

impl GgufFile {
    /// The value of `key`, or `MissingKey`.
    pub fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn get_integer(&self, key: &str, expected: &'static str) -> Result<i128, GgufError> {
        let v = self.require(key)?;
        v.as_integer().ok_or_else(|| wrong_type(key, expected, v))
    }

    /// An unsigned 32-bit value; any integer type is accepted if the value fits.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.get_integer(key, "an integer fitting u32")?;
        u32::try_from(v).map_err(|_| out_of_range(key, "u32", v))
    }

    /// An unsigned 64-bit value; any integer type is accepted if the value fits.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.get_integer(key, "an integer fitting u64")?;
        u64::try_from(v).map_err(|_| out_of_range(key, "u64", v))
    }

    /// A signed 64-bit value; any integer type is accepted if the value fits.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        let v = self.get_integer(key, "an integer fitting i64")?;
        i64::try_from(v).map_err(|_| out_of_range(key, "i64", v))
    }

    /// A float; `FLOAT32` and `FLOAT64` are accepted (the latter rounded to f32).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            v => Err(wrong_type(key, "FLOAT32 or FLOAT64", v)),
        }
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(wrong_type(key, "BOOL", v)),
        }
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(wrong_type(key, "STRING", v)),
        }
    }

    /// An array of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(wrong_type(key, "ARRAY", v)),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        match self.require(key)? {
            Value::Array(Array::String(v)) => Ok(v.iter().map(String::as_str).collect()),
            v => Err(wrong_type(key, "ARRAY[STRING]", v)),
        }
    }

    /// An array of integers of any element type, as i64 (a UINT64 element above `i64::MAX` is
    /// an `OutOfRange` error).
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        let v = self.require(key)?;
        let ints = match v {
            Value::Array(a) => a.integers(),
            _ => None,
        }
        .ok_or_else(|| wrong_type(key, "ARRAY of integers", v))?;
        ints.into_iter()
            .map(|x| i64::try_from(x).map_err(|_| out_of_range(key, "i64", x)))
            .collect()
    }

    /// An array of floats (`FLOAT32`, or `FLOAT64` rounded to f32).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        match self.require(key)? {
            Value::Array(Array::F32(v)) => Ok(v.clone()),
            Value::Array(Array::F64(v)) => Ok(v.iter().map(|&x| x as f32).collect()),
            v => Err(wrong_type(key, "ARRAY[FLOAT32] or ARRAY[FLOAT64]", v)),
        }
    }
}
