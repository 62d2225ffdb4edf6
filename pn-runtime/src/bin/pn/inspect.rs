//! `pn inspect FILE`: a GGUF's header, metadata and tensor table (like llama.cpp's gguf-dump),
//! optionally as JSON, optionally validating every PN tensor row.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use gguf_io::{Array, GgmlType, GgufFile, TensorView, Value};
use pn_format::PnType;
use serde_json::{json, Value as Json};

/// Arrays longer than this are summarised in the human-readable output.
const HUMAN_ARRAY_LIMIT: usize = 16;

/// Print a GGUF file's metadata and tensor table.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GGUF file.
    pub file: PathBuf,
    /// Check every row of every PN tensor (pn3t/pn4t) with pn-format's validator.
    #[arg(long)]
    pub validate: bool,
    /// Print JSON: {"version", "alignment", "data_offset", "metadata": [{"key", "type",
    /// "value"}], "tensors": [{"name", "type", "type_id", "dims", "offset", "bytes"}]}.
    #[arg(long)]
    pub json: bool,
    /// In JSON, cut arrays longer than N to their first N elements; such a value becomes
    /// {"count", "truncated": true, "first": [...]}. Default: arrays are printed whole.
    #[arg(long, value_name = "N")]
    pub json_max_array: Option<usize>,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let f = GgufFile::open(&args.file).map_err(|e| format!("{}: {e}", args.file.display()))?;
    let validation = if args.validate {
        Some(validate(&f))
    } else {
        None
    };
    let out = if args.json {
        let mut j = to_json(&f, args.json_max_array);
        if let Some(v) = &validation {
            j["validation"] = json!({
                "pn_tensors": v.pn_tensors,
                "rows": v.rows,
                "errors": v.errors,
            });
        }
        serde_json::to_string_pretty(&j)? + "\n"
    } else {
        let mut s = human(&f, &args.file);
        if let Some(v) = &validation {
            let _ = writeln!(
                s,
                "\nvalidation: {} PN tensors, {} rows, {} errors",
                v.pn_tensors,
                v.rows,
                v.errors.len()
            );
            for e in &v.errors {
                let _ = writeln!(s, "  {e}");
            }
        }
        s
    };
    // A closed pipe (`pn inspect f | head`) is not an error worth a message.
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r?,
    }
    match validation {
        Some(v) if !v.errors.is_empty() => {
            Err(format!("{} invalid PN rows", v.errors.len()).into())
        }
        _ => Ok(()),
    }
}

struct Validation {
    pn_tensors: usize,
    rows: u64,
    errors: Vec<String>,
}

fn pn_type(ty: GgmlType) -> Option<PnType> {
    match ty {
        GgmlType::Pn3t => Some(PnType::Pn3t),
        GgmlType::Pn4t => Some(PnType::Pn4t),
        _ => None,
    }
}

fn validate(f: &GgufFile) -> Validation {
    let mut v = Validation {
        pn_tensors: 0,
        rows: 0,
        errors: Vec::new(),
    };
    for t in f.tensors() {
        let Some(pt) = pn_type(t.ty) else { continue };
        v.pn_tensors += 1;
        validate_tensor(&t, pt, &mut v);
    }
    v
}

fn validate_tensor(t: &TensorView<'_>, pt: PnType, v: &mut Validation) {
    // An empty tensor can claim 2^60 rows of zero bytes: there is nothing to check, and the
    // row loop below must stay bounded by the file size.
    if t.bytes.is_empty() {
        return;
    }
    for r in 0..t.n_rows() as usize {
        let Some(row) = t.row(r) else { break };
        v.rows += 1;
        if let Err(e) = pn_format::validate_row(pt, row) {
            v.errors.push(format!("tensor {:?} row {r}: {e}", t.name));
        }
    }
}

fn value_json(v: &Value, max: Option<usize>) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => float_json(f64::from(*x)),
        Value::F64(x) => float_json(*x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => array_json(a, max),
    }
}

/// JSON has no NaN or infinity: those become the strings "nan", "inf", "-inf".
fn float_json(x: f64) -> Json {
    if x.is_finite() {
        json!(x)
    } else if x.is_nan() {
        json!("nan")
    } else if x > 0.0 {
        json!("inf")
    } else {
        json!("-inf")
    }
}

fn array_json(a: &Array, max: Option<usize>) -> Json {
    let n = a.len();
    let take = max.unwrap_or(usize::MAX).min(n);
    fn list<T>(v: &[T], k: usize, f: impl Fn(&T) -> Json) -> Json {
        Json::Array(v[..k].iter().map(f).collect())
    }
    let items = match a {
        Array::U8(v) => list(v, take, |x| json!(x)),
        Array::I8(v) => list(v, take, |x| json!(x)),
        Array::U16(v) => list(v, take, |x| json!(x)),
        Array::I16(v) => list(v, take, |x| json!(x)),
        Array::U32(v) => list(v, take, |x| json!(x)),
        Array::I32(v) => list(v, take, |x| json!(x)),
        Array::U64(v) => list(v, take, |x| json!(x)),
        Array::I64(v) => list(v, take, |x| json!(x)),
        Array::F32(v) => list(v, take, |x| float_json(f64::from(*x))),
        Array::F64(v) => list(v, take, |x| float_json(*x)),
        Array::Bool(v) => list(v, take, |x| json!(x)),
        Array::String(v) => list(v, take, |x| json!(x)),
        Array::Array(v) => list(v, take, |x| array_json(x, max)),
    };
    if take < n {
        json!({ "count": n, "truncated": true, "first": items })
    } else {
        items
    }
}

fn to_json(f: &GgufFile, max: Option<usize>) -> Json {
    let metadata: Vec<Json> = f
        .metadata()
        .iter()
        .map(|e| {
            json!({
                "key": e.key,
                "type": e.value.type_description(),
                "value": value_json(&e.value, max),
            })
        })
        .collect();
    let tensors: Vec<Json> = f
        .tensor_infos()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "type_id": t.ty.id(),
                "dims": t.dims,
                "offset": t.offset,
                "bytes": t.n_bytes,
            })
        })
        .collect();
    json!({
        "version": f.version(),
        "alignment": f.alignment(),
        "data_offset": f.data_offset(),
        "metadata": metadata,
        "tensors": tensors,
    })
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => array_text(a),
        Value::F32(x) => format!("{x}"),
        Value::F64(x) => format!("{x}"),
        Value::Bool(b) => format!("{b}"),
        other => other
            .as_integer()
            .map(|i| i.to_string())
            .unwrap_or_default(),
    }
}

fn array_text(a: &Array) -> String {
    let n = a.len();
    let k = n.min(HUMAN_ARRAY_LIMIT);
    let items: Vec<String> = match a {
        Array::String(v) => v[..k].iter().map(|s| format!("{s:?}")).collect(),
        Array::F32(v) => v[..k].iter().map(|x| format!("{x}")).collect(),
        Array::F64(v) => v[..k].iter().map(|x| format!("{x}")).collect(),
        Array::Bool(v) => v[..k].iter().map(|x| format!("{x}")).collect(),
        Array::Array(v) => v[..k].iter().map(array_text).collect(),
        other => other
            .integers()
            .unwrap_or_default()
            .iter()
            .take(k)
            .map(|i| i.to_string())
            .collect(),
    };
    if k < n {
        format!("[{n} items] first {k}: [{}, ...]", items.join(", "))
    } else {
        format!("[{}]", items.join(", "))
    }
}

fn human(f: &GgufFile, path: &std::path::Path) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: GGUF v{}, {} bytes, alignment {}, data section at {}",
        path.display(),
        f.version(),
        f.file_len(),
        f.alignment(),
        f.data_offset()
    );
    let _ = writeln!(s, "\n{} metadata entries:", f.metadata().len());
    for e in f.metadata() {
        let _ = writeln!(
            s,
            "  {} ({}) = {}",
            e.key,
            e.value.type_description(),
            value_text(&e.value)
        );
    }
    let _ = writeln!(s, "\n{} tensors:", f.tensor_infos().len());
    let w = f
        .tensor_infos()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        s,
        "  {:>5}  {:<w$}  {:<7}  {:<24}  {:>12}  {:>12}",
        "#", "name", "type", "dims (ne0 first)", "bytes", "offset"
    );
    for (i, t) in f.tensor_infos().iter().enumerate() {
        let dims = format!("{:?}", t.dims);
        let _ = writeln!(
            s,
            "  {i:>5}  {:<w$}  {:<7}  {dims:<24}  {:>12}  {:>12}",
            t.name,
            t.ty.name(),
            t.n_bytes,
            t.offset
        );
    }
    let total: u64 = f.tensor_infos().iter().map(|t| t.n_bytes).sum();
    let _ = writeln!(s, "  total tensor bytes: {total}");
    s
}
