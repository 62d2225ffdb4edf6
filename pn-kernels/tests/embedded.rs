//! What build.rs embedded: with a compiler, every `kernels/*.cu` and every `extern "C"` kernel in
//! it, as sm_60 cubin (ELF) plus compute_60 PTX; without one, nothing, and `build_info` says so.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

fn kernel_names_in_source(src: &str) -> BTreeSet<String> {
    // Every `__global__ void ... name(` inside the extern "C" blocks.
    src.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("extern \"C\" ").unwrap_or(l);
            let rest = l.strip_prefix("__global__ void ")?;
            let rest = rest
                .strip_prefix("__launch_bounds__(")
                .map(|r| &r[r.find(')').unwrap() + 1..])
                .unwrap_or(rest)
                .trim_start();
            Some(rest[..rest.find('(')?].trim().to_string())
        })
        .collect()
}

#[test]
fn every_kernel_source_is_embedded_or_none_is() {
    let kdir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut sources = BTreeSet::new();
    for e in std::fs::read_dir(&kdir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "cu") {
            sources.insert(p);
        }
    }
    assert!(!sources.is_empty());
    if !pn_kernels::kernels_available() {
        assert!(pn_kernels::modules().is_empty());
        assert!(
            pn_kernels::build_info().contains("none"),
            "{}",
            pn_kernels::build_info()
        );
        eprintln!("build without kernels: {}", pn_kernels::build_info());
        return;
    }
    assert_eq!(pn_kernels::modules().len(), sources.len());
    let mut total = 0;
    for p in &sources {
        let stem = p.file_stem().unwrap().to_str().unwrap();
        let m = pn_kernels::module(stem).unwrap_or_else(|| panic!("{stem}.cu not embedded"));
        assert!(
            m.ptx.contains(".target sm_60"),
            "{stem}: PTX not for compute_60"
        );
        assert_eq!(
            &m.cubin[..4],
            b"\x7fELF",
            "{stem}: cubin is not an ELF image"
        );
        let want = kernel_names_in_source(&common::expand_pasting_macros(
            &std::fs::read_to_string(p).unwrap(),
        ));
        let got: BTreeSet<String> = m.kernels.iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want, "{stem}: kernels");
        for k in m.kernels {
            assert!(
                m.ptx.contains(&format!(".entry {k}(")),
                "{stem}: {k} not in PTX"
            );
        }
        total += m.kernels.len();
    }
    let info = pn_kernels::build_info();
    assert!(
        info.contains(&format!("{total} in {} modules", sources.len())) && info.contains("sm_60"),
        "{info}"
    );
    assert!(pn_kernels::ptxas_report().contains("pn3t_gemv_h2_r2"));
}

#[test]
fn the_name_scan_expands_token_pasting_macros() {
    let src = "#define K(bits, t) \\\n    __global__ void __launch_bounds__(256, 1) pn##bits##t_b##t(int a) { f<bits, t>(a); }\n\
               K(3, 2) K(4, 8)\n#define S(b, t) if (eq(n, \"pn\" #b \"t_b\" #t)) pn##b##t_b##t(x);\nS(3, 2)\n\
               __global__ void plain(int a) {}\n";
    let out = common::expand_pasting_macros(src);
    let names = kernel_names_in_source(&out);
    let want: BTreeSet<String> = ["pn3t_b2", "pn4t_b8", "plain"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, want, "{out}");
    assert!(out.contains("eq(n, \"pn3t_b2\")) pn3t_b2(x);"), "{out}");
    assert!(!out.contains("#define"), "{out}");
}
