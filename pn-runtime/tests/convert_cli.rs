//! `pn convert` and `pn quantize CHECKPOINT_DIR`: the command line gives the library's file, and
//! quantizing the checkpoint folder directly gives the same bytes as converting it first.

mod convert_fixture;

use convert_fixture::write_tiny_checkpoint;
use pn_runtime::convert::{convert_checkpoint, ConvertOptions, OutType};
use pn_runtime::quantize::no_progress;
use pn_tests::paths::scratch_dir;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;

fn pn(args: &[&std::ffi::OsStr]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(args)
        .output()
        .expect("run pn");
    assert!(
        out.status.success(),
        "pn {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn os(p: &Path) -> &std::ffi::OsStr {
    p.as_os_str()
}

#[test]
fn pn_convert_writes_the_library_file_and_quantize_reads_checkpoints_directly() {
    let dir = scratch_dir("pn-convert-cli");
    let ck = dir.join("tiny-qwen35");
    std::fs::create_dir_all(&ck).unwrap();
    write_tiny_checkpoint(&ck);

    // `pn convert` (default --outtype f16; the name comes from the folder, title-cased).
    let cli = dir.join("cli.gguf");
    let o = pn(&["convert".as_ref(), os(&ck), os(&cli), "--quiet".as_ref()]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("124 tensors"));
    let lib = dir.join("lib.gguf");
    let mut opts = ConvertOptions::new(&ck, &lib);
    opts.outtype = Some(OutType::F16);
    convert_checkpoint(&opts, &no_progress, &AtomicBool::new(false)).unwrap();
    assert!(std::fs::read(&cli).unwrap() == std::fs::read(&lib).unwrap());
    let f = gguf_io::GgufFile::open(&cli).unwrap();
    assert_eq!(f.get_str("general.name").unwrap(), "Tiny Qwen35");
    // An existing output is refused without --force.
    let again = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["convert".as_ref(), os(&ck), os(&cli)])
        .output()
        .unwrap();
    assert!(!again.status.success());

    // Checkpoint -> PN in one command equals convert (auto: the checkpoint's F16) then quantize.
    let via_file = dir.join("via-file.pn3.gguf");
    let direct = dir.join("direct.pn3.gguf");
    let auto = dir.join("auto.gguf");
    pn(&[
        "convert".as_ref(),
        os(&ck),
        os(&auto),
        "--outtype".as_ref(),
        "auto".as_ref(),
        "--quiet".as_ref(),
    ]);
    let q = |input: &Path, out: &Path| {
        pn(&[
            "quantize".as_ref(),
            os(input),
            os(out),
            "--threads".as_ref(),
            "2".as_ref(),
            "--quiet".as_ref(),
        ])
    };
    q(&auto, &via_file);
    q(&ck, &direct);
    assert!(std::fs::read(&via_file).unwrap() == std::fs::read(&direct).unwrap());
    // Only the outputs are on disk: no intermediate GGUF beside them.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "auto.gguf",
            "cli.gguf",
            "direct.pn3.gguf",
            "lib.gguf",
            "tiny-qwen35",
            "via-file.pn3.gguf"
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
