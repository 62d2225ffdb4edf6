//! Constrained decoding on the demo model: output under a JSON schema parses and validates
//! (checked by an independent validator, the `jsonschema` crate) for 20 schemas; a GBNF
//! grammar, a regex and a Lark grammar are matched exactly; speculation stays off while a
//! constraint is set.
//!
//! The demo model writes Python: unconstrained, none of these outputs would be JSON.

use pn_runtime::constrain::{ConstraintFactory, Grammar};
use pn_runtime::engine::{FinishReason, StopConditions};
use pn_runtime::sampling::SamplingParams;
use pn_tests::engine::demo_engine;
use serde_json::{json, Value};
use std::sync::OnceLock;

fn factory() -> &'static ConstraintFactory {
    static F: OnceLock<ConstraintFactory> = OnceLock::new();
    F.get_or_init(|| ConstraintFactory::new(demo_engine().tokenizer()).expect("factory"))
}

/// Greedy output of the demo model for `prompt` under `grammar`, at most `max` tokens, and
/// why it ended.
fn generate(prompt: &str, grammar: &Grammar, max: usize) -> (String, FinishReason) {
    let params = SamplingParams {
        constraint: Some(factory().compile(grammar).expect("grammar compiles")),
        ..SamplingParams::greedy()
    };
    let mut session = demo_engine().session().expect("session");
    let mut g = session
        .generate(prompt, params, StopConditions::max_tokens(max))
        .expect("generate");
    let mut text = String::new();
    for e in g.by_ref() {
        text.push_str(&e.expect("token").text);
    }
    let spec = g.spec_stats().map_or(0, |s| s.drafted);
    assert_eq!(spec, 0, "no drafts while constrained");
    (text, g.finish_reason().cloned().expect("finished"))
}

fn schemas() -> Vec<Value> {
    let obj = |props: Value, required: Value| {
        json!({"type": "object", "properties": props, "required": required,
               "additionalProperties": false})
    };
    vec![
        // 1-4: scalars at the top.
        json!({"type": "integer", "minimum": -5, "maximum": 5}),
        json!({"type": "boolean"}),
        json!({"enum": ["red", "green", "blue"]}),
        json!({"type": "string", "maxLength": 8}),
        // 5-8: flat objects.
        obj(
            json!({"name": {"type": "string", "maxLength": 10}}),
            json!(["name"]),
        ),
        obj(
            json!({"age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "ok": {"type": "boolean"}}),
            json!(["age", "ok"]),
        ),
        obj(
            json!({"color": {"enum": ["red", "green", "blue"]},
                   "size": {"enum": [1, 2, 3]}}),
            json!(["color", "size"]),
        ),
        obj(
            json!({"x": {"type": "number", "minimum": 0, "maximum": 1},
                   "y": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20}}),
            json!(["x", "y"]),
        ),
        // 9-11: optional fields.
        obj(
            json!({"id": {"type": "integer", "minimum": 1, "maximum": 999},
                   "note": {"type": "string", "maxLength": 6}}),
            json!(["id"]),
        ),
        obj(
            json!({"a": {"type": "boolean"}, "b": {"type": "boolean"}}),
            json!([]),
        ),
        obj(
            json!({"kind": {"const": "point"},
                   "tag": {"type": ["string", "null"], "maxLength": 4}}),
            json!(["kind", "tag"]),
        ),
        // 12-15: arrays.
        json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
               "minItems": 1, "maxItems": 3}),
        json!({"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2, "maxItems": 2}),
        obj(
            json!({"tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                            "maxItems": 2}}),
            json!(["tags"]),
        ),
        json!({"type": "array", "prefixItems": [{"type": "boolean"}, {"const": 7}],
               "items": false}),
        // 16-18: nested objects.
        obj(
            json!({"user": {"type": "object",
                            "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "admin": {"type": "boolean"}},
                            "required": ["id", "admin"], "additionalProperties": false}}),
            json!(["user"]),
        ),
        obj(
            json!({"p": {"type": "object",
                         "properties": {"q": {"type": "object",
                                              "properties": {"r": {"enum": [true]}},
                                              "required": ["r"],
                                              "additionalProperties": false}},
                         "required": ["q"], "additionalProperties": false}}),
            json!(["p"]),
        ),
        obj(
            json!({"points": {"type": "array", "maxItems": 2, "items": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["x"], "additionalProperties": false}}}),
            json!(["points"]),
        ),
        // 19: `$ref` to `$defs`, `anyOf`.
        json!({"$defs": {"small": {"type": "integer", "minimum": 0, "maximum": 3}},
               "type": "object",
               "properties": {"v": {"anyOf": [{"$ref": "#/$defs/small"}, {"type": "null"}]}},
               "required": ["v"], "additionalProperties": false}),
        // 20: an OpenAI `strict` schema as `client.beta.chat.completions.parse` sends it
        // (pydantic: titles, every field required, additionalProperties false).
        json!({"title": "Step", "type": "object",
               "properties": {"explanation": {"title": "Explanation", "type": "string",
                                              "maxLength": 12},
                              "output": {"title": "Output", "type": "integer",
                                         "minimum": 0, "maximum": 100}},
               "required": ["explanation", "output"], "additionalProperties": false}),
    ]
}

#[test]
fn twenty_schemas_parse_and_validate() {
    let schemas = schemas();
    assert_eq!(schemas.len(), 20);
    for (i, schema) in schemas.into_iter().enumerate() {
        let validator = jsonschema::validator_for(&schema).expect("schema is valid");
        let (text, finish) = generate("data = ", &Grammar::JsonSchema(schema.clone()), 48);
        assert_eq!(
            finish,
            FinishReason::EndOfGeneration,
            "schema {}: the grammar must complete within 48 tokens: {text:?}",
            i + 1
        );
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("schema {}: {text:?} is not JSON: {e}", i + 1));
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "schema {}: {text} does not validate: {errors:?}",
            i + 1
        );
    }
}

#[test]
fn json_object_gives_an_object() {
    let (text, _) = generate("config = ", &Grammar::JsonObject, 48);
    // The model may run out of tokens inside the object; what it wrote is an object prefix.
    assert!(text.starts_with('{'), "{text:?}");
}

#[test]
fn gbnf_regex_and_lark_grammars_match() {
    let gbnf = r#"
root ::= answer " " num
answer ::= "yes" | "no"
num ::= [1-9] [0-9]?
"#;
    let (text, finish) = generate("# reply: ", &Grammar::Gbnf(gbnf.into()), 16);
    let ok = |t: &str| {
        let (a, n) = t.split_once(' ')?;
        let v: u32 = n.parse().ok()?;
        ((a == "yes" || a == "no") && (1..=99).contains(&v) && !n.starts_with('0')).then_some(())
    };
    assert!(ok(&text).is_some(), "GBNF output {text:?}");
    assert_eq!(finish, FinishReason::EndOfGeneration);

    let (text, _) = generate("x = ", &Grammar::Regex("[a-c]{3}-[0-9]{2}".into()), 16);
    let b = text.as_bytes();
    assert!(
        b.len() == 6
            && b[..3].iter().all(|c| (b'a'..=b'c').contains(c))
            && b[3] == b'-'
            && b[4..].iter().all(u8::is_ascii_digit),
        "regex output {text:?}"
    );

    let lark = "start: \"def \" NAME \"():\"\nNAME: /[a-z]{1,8}/\n";
    let (text, _) = generate("# f\n", &Grammar::Lark(lark.into()), 16);
    let name = text
        .strip_prefix("def ")
        .and_then(|t| t.strip_suffix("():"))
        .unwrap_or_else(|| panic!("lark output {text:?}"));
    assert!((1..=8).contains(&name.len()) && name.bytes().all(|c| c.is_ascii_lowercase()));
}

#[test]
fn bad_grammars_are_errors_naming_the_kind() {
    let e = factory()
        .compile(&Grammar::Gbnf("root ::= \"unterminated".into()))
        .unwrap_err();
    assert!(e.to_string().contains("grammar"), "{e}");
    let e = factory()
        .compile(&Grammar::JsonSchema(
            json!({"type": "integer", "minimum": 5, "maximum": 1}),
        ))
        .unwrap_err();
    assert!(e.to_string().contains("json_schema"), "{e}");
    let e = factory().compile(&Grammar::Regex("(".into())).unwrap_err();
    assert!(e.to_string().contains("regex"), "{e}");
}

/// The cost of constrained decoding, interleaved in one process (run with `--ignored
/// --nocapture`; timing, so not part of CI): tokens/s of greedy plain decoding against the same
/// under a JSON schema (both without speculation: a constraint turns drafting off), and the
/// grammar's own cost per token (mask + advance on the 248k-entry logits) without the model.
#[test]
#[ignore]
fn constrained_decoding_overhead() {
    use pn_runtime::speculative::Speculation;
    use std::time::Instant;
    let schema = json!({"type": "array", "minItems": 200,
                        "items": {"type": "integer", "minimum": 0, "maximum": 999}});
    let grammar = Grammar::JsonSchema(schema);
    let n = 128;
    let engine = demo_engine();
    let mut session = engine.session().expect("session");
    session.set_speculation(Speculation::None);
    let mut best = [f64::MAX; 2];
    for _ in 0..7 {
        for (i, constrained) in [false, true].into_iter().enumerate() {
            let params = SamplingParams {
                constraint: constrained.then(|| factory().compile(&grammar).unwrap()),
                ..SamplingParams::greedy()
            };
            let stop = StopConditions {
                max_tokens: Some(n),
                ignore_eog: true,
                ..StopConditions::default()
            };
            session.reset().unwrap();
            let mut g = session.generate("values = ", params, stop).unwrap();
            for e in g.by_ref() {
                e.unwrap();
            }
            let t = g.timings();
            assert_eq!(t.generated_tokens, n);
            best[i] = best[i].min(t.generation_time.as_secs_f64() / n as f64);
        }
    }
    let (plain, constrained) = (1.0 / best[0], 1.0 / best[1]);
    println!(
        "demo model, greedy, {n} tokens, best of 7: plain {plain:.1} tokens/s, schema \
         {constrained:.1} tokens/s ({:+.2}%)",
        (constrained / plain - 1.0) * 100.0
    );
    // The grammar alone: mask and advance, greedy over flat logits (no model).
    let vocab = engine.tokenizer().n_vocab();
    let mut c = factory().compile(&grammar).unwrap();
    let mut logits = vec![0.0f32; vocab];
    let t0 = Instant::now();
    for _ in 0..n {
        logits.fill(0.0);
        c.apply(&mut logits);
        let id = pn_runtime::sampling::argmax(&logits).unwrap();
        c.advance(id);
    }
    println!(
        "grammar alone: {:.1} us per token (mask of {vocab} ids + advance)",
        t0.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
