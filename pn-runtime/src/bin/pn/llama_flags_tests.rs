//! Every llama.cpp spelling of the table parses to what pn's long flag does; the refused ones
//! are refused by name; the defaults are llama.cpp's; the README shows this very table.

use super::*;
use crate::{Cli, Command};
use clap::Parser;

/// What a command needs besides the flag under test to parse at all.
fn base_args(command: &str, long: &str) -> Vec<&'static str> {
    match (command, long) {
        ("perplexity", "--file") => vec![],
        ("perplexity", "--kl-divergence") => vec!["--kl-divergence-base", "b.kld"],
        ("perplexity", _) => vec!["--tokens", "t.json"],
        ("tokenize", "--prompt" | "--file") => vec![],
        ("tokenize", _) => vec!["-p", "x"],
        ("logits", _) => vec!["--tokens", "t.json", "--out", "o.f32"],
        ("template", _) => vec!["--messages", "m.json"],
        _ => vec![],
    }
}

/// `pn` parsed as `main` parses it: normalised, then clap; the command's Debug form.
fn parse(argv: &[&str]) -> Result<String, String> {
    let args = normalise(argv.iter().map(OsString::from)).map_err(|e| e.to_string())?;
    Cli::try_parse_from(args)
        .map(|cli| format!("{:?}", cli.command))
        .map_err(|e| e.to_string())
}

fn argv<'a>(
    command: &'a str,
    base: &[&'a str],
    flag: &'a str,
    value: Option<&'a str>,
) -> Vec<&'a str> {
    let mut v = vec!["pn", command];
    v.extend_from_slice(base);
    v.push(flag);
    v.extend(value);
    v
}

#[test]
fn every_spelling_parses_to_its_long_flag() {
    let mut checked = 0;
    for f in FLAGS {
        for &command in f.commands {
            let base = base_args(command, f.long);
            let want = parse(&argv(command, &base, f.long, f.example))
                .unwrap_or_else(|e| panic!("pn {command} {} {:?}: {e}", f.long, f.example));
            // The flag changes something: its setting is what is compared.
            let mut without = vec!["pn", command];
            without.extend_from_slice(&base);
            assert_ne!(
                parse(&without).ok(),
                Some(want.clone()),
                "{command} {}",
                f.long
            );
            for &spelling in f.spellings {
                let got = parse(&argv(command, &base, spelling, f.example))
                    .unwrap_or_else(|e| panic!("pn {command} {spelling}: {e}"));
                assert_eq!(got, want, "pn {command} {spelling} vs {}", f.long);
                checked += 1;
                // `--flag=value` and `-xx=value` too.
                if let Some(v) = f.example {
                    let joined = format!("{spelling}={v}");
                    if spelling.starts_with("--") || spelling.len() > 2 {
                        let got = parse(&argv(command, &base, &joined, None))
                            .unwrap_or_else(|e| panic!("pn {command} {joined}: {e}"));
                        assert_eq!(got, want, "pn {command} {joined}");
                        checked += 1;
                    }
                }
            }
        }
    }
    eprintln!("{checked} spellings checked");
    assert!(checked > 150, "{checked}");
}

#[test]
fn refused_flags_are_named() {
    for u in UNSUPPORTED {
        for &flag in u.spellings {
            let e = normalise(["pn", "run", flag, "1"].map(OsString::from)).unwrap_err();
            assert_eq!(e.flag, flag);
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("`{flag}`")) && msg.contains("not supported by pn"),
                "{msg}"
            );
            // Refused flags are not pn flags either (the table cannot shadow one).
            assert!(FLAGS.iter().all(|f| !f.spellings.contains(&flag)), "{flag}");
        }
    }
}

#[test]
fn the_normaliser_leaves_values_and_the_rest_alone() {
    let n = |a: &[&str]| -> Vec<String> {
        normalise(a.iter().map(OsString::from))
            .unwrap()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect()
    };
    assert_eq!(
        n(&["pn", "run", "-ngl=99"]),
        ["pn", "run", "--n-gpu-layers=99"]
    );
    assert_eq!(
        n(&["pn", "run", "-p", "-fa", "-ctk", "q8_0"]),
        ["pn", "run", "-p", "-fa", "--cache-type-k", "q8_0"]
    );
    assert_eq!(n(&["pn", "run", "--", "-ngl"]), ["pn", "run", "--", "-ngl"]);
    assert_eq!(
        n(&["pn", "run", "-n", "-1", "-c", "64"]),
        ["pn", "run", "-n", "-1", "-c", "64"]
    );
    // A prompt that looks like a refused flag is a prompt.
    assert_eq!(
        n(&["pn", "run", "-p", "--lora"]),
        ["pn", "run", "-p", "--lora"]
    );
}

/// llama.cpp's defaults: f16 KV cache, the library's threads (physical cores), a random seed,
/// 256 tokens for `pn run` and unbounded replies in chat; `-n -1` and `--seed -1` parse.
#[test]
fn defaults_are_llama_cpps() {
    let cli = Cli::try_parse_from(["pn", "run"]).unwrap();
    let Command::Run(run) = cli.command else {
        panic!()
    };
    assert_eq!(run.model.threads, None);
    let opts = crate::engine_args::engine_options(&run.model).unwrap();
    let lib = pn_runtime::engine::EngineOptions::default();
    assert_eq!(
        opts.threads, lib.threads,
        "the CLI keeps the library's thread default"
    );
    assert_eq!(opts.kv_type_k, pn_runtime::engine::KvCacheType::F16);
    assert_eq!(opts.kv_type_v, pn_runtime::engine::KvCacheType::F16);
    assert_eq!(opts.batch, lib.batch);
    assert_eq!(run.sampling.seed, crate::engine_args::RANDOM_SEED);
    assert_ne!(
        run.sampling.resolve_seed(),
        run.sampling.resolve_seed(),
        "a random seed each run"
    );
    assert_eq!(run.n_predict, 256);
    assert!(!run.conversation);

    let cli = Cli::try_parse_from(
        normalise(
            [
                "pn", "run", "-s", "-1", "-n", "-1", "-t", "3", "-ub", "16", "-b", "8",
            ]
            .map(OsString::from),
        )
        .unwrap(),
    )
    .unwrap();
    let Command::Run(run) = cli.command else {
        panic!()
    };
    assert_eq!(run.n_predict, -1);
    assert_eq!(run.sampling.seed, -1);
    let opts = crate::engine_args::engine_options(&run.model).unwrap();
    assert_eq!((opts.threads, opts.batch), (3, 8), "-b caps -ub");
    let cli = Cli::try_parse_from(["pn", "run", "--seed", "42"]).unwrap();
    let Command::Run(run) = cli.command else {
        panic!()
    };
    assert_eq!(run.sampling.resolve_seed(), 42);
    assert_eq!(run.sampling.params().seed, 42);

    let cli = Cli::try_parse_from(["pn", "chat"]).unwrap();
    let Command::Chat(chat) = cli.command else {
        panic!()
    };
    assert_eq!(chat.n_predict, -1);
    // -ngl on the CPU: one line that says where pn runs.
    let cli =
        Cli::try_parse_from(normalise(["pn", "run", "-ngl", "99"].map(OsString::from)).unwrap())
            .unwrap();
    let Command::Run(run) = cli.command else {
        panic!()
    };
    let note = crate::engine_args::gpu_layers_note(&run.model, pn_runtime::Device::Cpu).unwrap();
    assert!(
        note.contains("-ngl 99") && note.contains("--device cuda") && !note.contains('\n'),
        "{note}"
    );
    assert!(crate::engine_args::gpu_layers_note(&run.model, pn_runtime::Device::Cuda(0)).is_none());
}

/// The README's "Coming from llama.cpp" table is this table.
#[test]
fn readme_shows_the_table() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let table = markdown_table();
    assert!(
        readme.contains(&table),
        "README.md's llama.cpp flag table is out of date; paste `pn llama-flags`:\n{table}"
    );
}
