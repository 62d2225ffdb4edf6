//! Compiles every `kernels/*.cu` for sm_60 and embeds PTX (compute_60) plus cubin (sm_60).
//!
//! Compiler choice, first that works:
//! 1. nvcc from a CUDA 11/12 toolkit (`NVCC`, `CUDA_HOME`/`CUDA_PATH`, then `PATH`). nvcc 13+
//!    cannot target sm_60: a warning says so and the build falls back.
//! 2. NVRTC from the PyPI wheels (`PN_NVRTC_ROOT`, set by `scripts/cuda-toolchain.sh`), loaded by
//!    absolute path, plus `ptxas` from the same wheels.
//! 3. Nothing: the crate builds without kernels and reports that at run time.
//!
//! `ptxas -v` (registers, spills per kernel) goes to `OUT_DIR/ptxas-report.txt`, is embedded in
//! the crate (`pn_kernels::ptxas_report()`), is printed by `pn-kernels-info`, and is copied to
//! `<target dir>/pn-kernels-ptxas.txt` for CI logs.
//! A configured compiler that fails (a syntax error, a missing wheel) fails the build: a silent
//! fallback would let CI pass without kernels. `PN_KERNELS_REQUIRE=1` also fails the build when no
//! compiler is found at all.

use std::env;
use std::ffi::{c_char, c_int, CStr, CString};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const ENV_VARS: &[&str] = &[
    "NVCC",
    "CUDA_HOME",
    "CUDA_PATH",
    "PN_NVRTC_ROOT",
    "PN_PTXAS",
    "PN_KERNELS_DISABLE",
    "PN_KERNELS_REQUIRE",
];

/// One compiled `.cu` file.
struct Compiled {
    stem: String,
    ptx_path: PathBuf,
    cubin_path: PathBuf,
    kernels: Vec<KernelStats>,
}

/// What `ptxas -v` says about one entry function.
#[derive(Default)]
struct KernelStats {
    name: String,
    registers: u32,
    spill_stores: u32,
    spill_loads: u32,
    stack: u32,
    smem: u32,
}

enum Compiler {
    Nvcc {
        nvcc: PathBuf,
        ptxas: PathBuf,
        version: String,
    },
    Nvrtc {
        lib: PathBuf,
        includes: Vec<PathBuf>,
        ptxas: PathBuf,
    },
}

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kdir = manifest.join("kernels");

    for v in ENV_VARS {
        println!("cargo:rerun-if-env-changed={v}");
    }
    // The folder itself, so that a new .cu file triggers a rebuild, and each source/header.
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=host");
    let mut sources = Vec::new();
    for entry in fs::read_dir(&kdir).expect("kernels/ exists") {
        let path = entry.expect("readable kernels/ entry").path();
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if ext == "cu" || ext == "cuh" {
            println!("cargo:rerun-if-changed={}", path.display());
        }
        if ext == "cu" {
            sources.push(path);
        }
    }
    sources.sort();

    build_host_shim(&manifest);

    let (compiled, compiler_desc, reason) = match select_compiler() {
        Ok(Some(compiler)) => {
            let desc = match &compiler {
                Compiler::Nvcc { version, .. } => format!("nvcc {version}"),
                Compiler::Nvrtc { lib, .. } => format!("nvrtc {}", nvrtc_version(lib)),
            };
            let mut compiled = Vec::new();
            for src in &sources {
                match compile_one(&compiler, src, &kdir, &out) {
                    Ok(c) => compiled.push(c),
                    Err(e) => panic!("pn-kernels: compiling {} failed:\n{e}", src.display()),
                }
            }
            (compiled, desc, String::new())
        }
        Ok(None) => {
            let why = "no CUDA compiler found (set PN_NVRTC_ROOT via `eval \"$(scripts/cuda-toolchain.sh)\"`, or install a CUDA 12.x toolkit)".to_string();
            if env::var("PN_KERNELS_REQUIRE").is_ok_and(|v| v == "1") {
                panic!("pn-kernels: PN_KERNELS_REQUIRE=1 but {why}");
            }
            println!("cargo:warning=pn-kernels: building WITHOUT CUDA kernels: {why}");
            (Vec::new(), "none".to_string(), why)
        }
        Err(e) => panic!("pn-kernels: {e}"),
    };

    write_report_and_registry(&out, &compiled, &compiler_desc, &reason);
}

/// Compiles `host/shim.cpp`, which includes the `__host__ __device__` headers as plain C++ so the
/// CPU-side tests can check the kernels' layout math bit for bit.
fn build_host_shim(manifest: &Path) {
    println!("cargo:rerun-if-changed=host/shim.cpp");
    cc::Build::new()
        .cpp(true)
        .file(manifest.join("host/shim.cpp"))
        .include(manifest.join("kernels"))
        .flag_if_supported("-std=c++17")
        // IEEE semantics on the host too: the shim is the reference for the device code.
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        // The emulator's fibers switch with swapcontext (a returns-twice call); its locals are
        // re-read after each switch, so the clobber warning does not apply.
        .flag_if_supported("-Wno-clobbered")
        .warnings(true)
        .compile("pn_kernels_host_shim");

    // The kernel sources themselves under the SIMT emulator (host/simt_emu.h): __CUDACC__ makes
    // them take their device code paths, PN_EMU gives the counting shared-memory pointers, and
    // host/emu (first on the include path) stands in for <cuda_fp16.h>. Optimised even in debug
    // builds: the host tests run whole launches.
    let mut emu = cc::Build::new();
    emu.cpp(true)
        .include(manifest.join("host/emu"))
        .include(manifest.join("kernels"))
        .include(manifest.join("host"))
        .define("__CUDACC__", None)
        .define("PN_EMU", None)
        .opt_level(2)
        // CUDA code type-puns through pointer casts (uint4 -> __half2, u32 words of bytes).
        .flag_if_supported("-fno-strict-aliasing")
        .flag_if_supported("-std=c++17")
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unknown-pragmas")
        .flag_if_supported("-Wno-clobbered")
        .warnings(true);
    for f in [
        "emu_pn_gemv.cpp",
        "emu_norm.cpp",
        "emu_attention.cpp",
        "emu_ops.cpp",
        "emu_fuse.cpp",
        "emu_mixer.cpp",
        "emu_q8_group.cpp",
        "emu_delta_conv.cpp",
    ] {
        println!("cargo:rerun-if-changed=host/{f}");
        emu.file(manifest.join("host").join(f));
    }
    emu.compile("pn_kernels_host_emu");
}

fn select_compiler() -> Result<Option<Compiler>, String> {
    if env::var("PN_KERNELS_DISABLE").is_ok_and(|v| v == "1") {
        return Ok(None);
    }
    if let Some(nvcc) = find_nvcc() {
        match nvcc_version(&nvcc) {
            Some((major, minor)) if major <= 12 => {
                let ptxas = nvcc.with_file_name("ptxas");
                if !ptxas.exists() {
                    return Err(format!("{} has no ptxas next to it", nvcc.display()));
                }
                return Ok(Some(Compiler::Nvcc { nvcc, ptxas, version: format!("{major}.{minor}") }));
            }
            Some((major, minor)) => println!(
                "cargo:warning=pn-kernels: {} is CUDA {major}.{minor}; CUDA 13+ cannot target sm_60 (Tesla P100). Falling back to NVRTC 12.9 (PN_NVRTC_ROOT).",
                nvcc.display()
            ),
            None => println!("cargo:warning=pn-kernels: could not read the version of {}; ignoring it", nvcc.display()),
        }
    }
    let Ok(root) = env_nonempty("PN_NVRTC_ROOT") else {
        return Ok(None);
    };
    let root = PathBuf::from(root);
    let lib = root.join("cuda_nvrtc/lib/libnvrtc.so.12");
    let includes = vec![
        root.join("cuda_runtime/include"),
        root.join("cuda_cccl/include"),
    ];
    for p in std::iter::once(&lib).chain(&includes) {
        if !p.exists() {
            return Err(format!(
                "PN_NVRTC_ROOT={} but {} is missing; rerun scripts/cuda-toolchain.sh",
                root.display(),
                p.display()
            ));
        }
    }
    let ptxas = match env_nonempty("PN_PTXAS") {
        Ok(p) => PathBuf::from(p),
        Err(_) => {
            let wheel = root.join("cuda_nvcc/bin/ptxas");
            if wheel.exists() {
                wheel
            } else {
                which("ptxas").ok_or(
                    "PN_NVRTC_ROOT is set but no ptxas was found (PN_PTXAS, the nvcc wheel, PATH)",
                )?
            }
        }
    };
    Ok(Some(Compiler::Nvrtc {
        lib,
        includes,
        ptxas,
    }))
}

fn find_nvcc() -> Option<PathBuf> {
    if let Ok(p) = env_nonempty("NVCC") {
        return Some(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(home) = env_nonempty(var) {
            let p = Path::new(&home).join("bin/nvcc");
            if p.exists() {
                return Some(p);
            }
        }
    }
    which("nvcc")
}

/// An environment variable that is set and not empty (an empty value counts as unset).
fn env_nonempty(name: &str) -> Result<String, env::VarError> {
    env::var(name).and_then(|v| {
        if v.is_empty() {
            Err(env::VarError::NotPresent)
        } else {
            Ok(v)
        }
    })
}

fn which(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn nvcc_version(nvcc: &Path) -> Option<(u32, u32)> {
    let out = Command::new(nvcc).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = &text[text.find("release ")? + "release ".len()..];
    let ver: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut it = ver.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn compile_one(
    compiler: &Compiler,
    src: &Path,
    kdir: &Path,
    out: &Path,
) -> Result<Compiled, String> {
    let stem = src
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or("bad file name")?
        .to_string();
    let ptx_path = out.join(format!("{stem}.ptx"));
    let cubin_path = out.join(format!("{stem}.sm_60.cubin"));
    let ptxas = match compiler {
        Compiler::Nvcc { nvcc, ptxas, .. } => {
            let o = Command::new(nvcc)
                .args(["--ptx", "-arch=compute_60", "-std=c++17", "-O3"])
                .arg(format!("-I{}", kdir.display()))
                .arg(src)
                .arg("-o")
                .arg(&ptx_path)
                .output()
                .map_err(|e| format!("running {}: {e}", nvcc.display()))?;
            if !o.status.success() {
                return Err(String::from_utf8_lossy(&o.stderr).into_owned());
            }
            ptxas
        }
        Compiler::Nvrtc {
            lib,
            includes,
            ptxas,
        } => {
            let source = fs::read_to_string(src).map_err(|e| e.to_string())?;
            let mut opts = vec![
                "--gpu-architecture=compute_60".to_string(),
                "--std=c++17".to_string(),
                // Fused multiply-add contraction is allowed (it is more accurate, not less);
                // no --use_fast_math: division, sqrt and exp keep IEEE-conforming precision.
                "--fmad=true".to_string(),
                format!("-I{}", kdir.display()),
            ];
            opts.extend(includes.iter().map(|p| format!("-I{}", p.display())));
            let ptx = nvrtc_compile(lib, &source, &format!("{stem}.cu"), &opts)?;
            fs::write(&ptx_path, ptx).map_err(|e| e.to_string())?;
            ptxas
        }
    };
    let o = Command::new(ptxas)
        .args(["-arch=sm_60", "-O3", "-v"])
        .arg(&ptx_path)
        .arg("-o")
        .arg(&cubin_path)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let log = String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        return Err(format!("ptxas failed on {}:\n{log}", ptx_path.display()));
    }
    Ok(Compiled {
        stem,
        ptx_path,
        cubin_path,
        kernels: parse_ptxas(&log),
    })
}

/// Parses the `ptxas -v` log: "Compiling entry function 'X' for 'sm_60'", then
/// "N bytes stack frame, N bytes spill stores, N bytes spill loads", "Used N registers, ...".
fn parse_ptxas(log: &str) -> Vec<KernelStats> {
    let mut out: Vec<KernelStats> = Vec::new();
    let num_before = |line: &str, key: &str| -> u32 {
        line.find(key)
            .and_then(|i| {
                line[..i]
                    .split(|c: char| !c.is_ascii_digit())
                    .rfind(|s| !s.is_empty())
            })
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    for line in log.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            let rest = &line[i + "Compiling entry function '".len()..];
            let name = rest.split('\'').next().unwrap_or("").to_string();
            out.push(KernelStats {
                name,
                ..Default::default()
            });
        } else if let Some(k) = out.last_mut() {
            if line.contains("spill stores") {
                k.stack = num_before(line, "bytes stack frame");
                k.spill_stores = num_before(line, "bytes spill stores");
                k.spill_loads = num_before(line, "bytes spill loads");
            } else if line.contains("Used ") && line.contains("registers") {
                k.registers = num_before(line, "registers");
                k.smem = num_before(line, "bytes smem");
            }
        }
    }
    out
}

fn write_report_and_registry(out: &Path, compiled: &[Compiled], compiler: &str, reason: &str) {
    let mut report = String::new();
    let n_kernels: usize = compiled.iter().map(|c| c.kernels.len()).sum();
    if compiled.is_empty() {
        let _ = writeln!(report, "pn-kernels: no kernels embedded ({reason})");
    } else {
        let _ = writeln!(report, "pn-kernels: {n_kernels} kernels in {} modules, compiler {compiler}, ptxas -v for sm_60", compiled.len());
        let _ = writeln!(
            report,
            "{:<14} {:<40} {:>5} {:>6} {:>6} {:>6} {:>6}",
            "module", "kernel", "regs", "spillS", "spillL", "stack", "smem"
        );
        for c in compiled {
            for k in &c.kernels {
                let _ = writeln!(
                    report,
                    "{:<14} {:<40} {:>5} {:>6} {:>6} {:>6} {:>6}",
                    c.stem, k.name, k.registers, k.spill_stores, k.spill_loads, k.stack, k.smem
                );
                if k.spill_stores > 0 || k.spill_loads > 0 {
                    println!(
                        "cargo:warning=pn-kernels: {} spills ({} B stores, {} B loads) on sm_60",
                        k.name, k.spill_stores, k.spill_loads
                    );
                }
            }
        }
    }
    fs::write(out.join("ptxas-report.txt"), &report).expect("write ptxas-report.txt");
    // A copy at <target>/pn-kernels-ptxas.txt for CI logs (OUT_DIR is
    // <target>/[<triple>/]<profile>/build/pn-kernels-<hash>/out). Best effort: the embedded copy
    // (`pn-kernels-info`) is the authoritative one.
    if let Some(target) = out
        .ancestors()
        .nth(4)
        .filter(|_| out.ancestors().nth(2).is_some_and(|b| b.ends_with("build")))
    {
        let target = if target.join("CACHEDIR.TAG").exists() {
            target
        } else {
            target.parent().unwrap_or(target)
        };
        let _ = fs::write(target.join("pn-kernels-ptxas.txt"), &report);
    }

    let mut reg = String::new();
    let _ = writeln!(
        reg,
        "/// Compiler that produced the embedded kernels, or \"none\"."
    );
    let _ = writeln!(reg, "pub const COMPILER: &str = {compiler:?};");
    let _ = writeln!(
        reg,
        "/// Why the build has no kernels (empty when it has them)."
    );
    let _ = writeln!(reg, "pub const NO_KERNELS_REASON: &str = {reason:?};");
    let _ = writeln!(reg, "/// Every compiled module, one per `kernels/*.cu`.");
    let _ = writeln!(reg, "pub static MODULES: &[EmbeddedModule] = &[");
    for c in compiled {
        let names: Vec<String> = c.kernels.iter().map(|k| format!("{:?}", k.name)).collect();
        let _ = writeln!(
            reg,
            "    EmbeddedModule {{ name: {:?}, ptx: include_str!({:?}), cubin: include_bytes!({:?}), kernels: &[{}] }},",
            c.stem,
            c.ptx_path.display().to_string(),
            c.cubin_path.display().to_string(),
            names.join(", ")
        );
    }
    let _ = writeln!(reg, "];");
    fs::write(out.join("kernels_registry.rs"), reg).expect("write kernels_registry.rs");
}

// ---- NVRTC through dlopen -------------------------------------------------------------------

type Prog = *mut std::ffi::c_void;
type CreateFn = unsafe extern "C" fn(
    *mut Prog,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(Prog, *mut usize) -> c_int;
type GetFn = unsafe extern "C" fn(Prog, *mut c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Prog) -> c_int;
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
type ErrStrFn = unsafe extern "C" fn(c_int) -> *const c_char;

fn nvrtc_version(lib: &Path) -> String {
    // SAFETY: loading NVRTC runs its initialisers, which have no preconditions; the symbol has
    // the documented C signature of nvrtcVersion.
    unsafe {
        let Ok(l) = libloading::Library::new(lib) else {
            return "?".into();
        };
        let Ok(f) = l.get::<VersionFn>(b"nvrtcVersion\0") else {
            return "?".into();
        };
        let (mut a, mut b) = (0, 0);
        if f(&mut a, &mut b) == 0 {
            format!("{a}.{b}")
        } else {
            "?".into()
        }
    }
}

fn nvrtc_compile(lib: &Path, src: &str, name: &str, opts: &[String]) -> Result<String, String> {
    // SAFETY: every symbol is looked up with the C signature documented in nvrtc.h; pointers
    // passed in live for the duration of each call; buffers are sized from NVRTC's own size calls.
    unsafe {
        let l =
            libloading::Library::new(lib).map_err(|e| format!("loading {}: {e}", lib.display()))?;
        let sym = |n: &[u8]| {
            format!(
                "{}: missing symbol {}",
                lib.display(),
                String::from_utf8_lossy(n)
            )
        };
        let create: libloading::Symbol<CreateFn> = l
            .get(b"nvrtcCreateProgram\0")
            .map_err(|_| sym(b"nvrtcCreateProgram"))?;
        let compile: libloading::Symbol<CompileFn> = l
            .get(b"nvrtcCompileProgram\0")
            .map_err(|_| sym(b"nvrtcCompileProgram"))?;
        let log_size: libloading::Symbol<SizeFn> = l
            .get(b"nvrtcGetProgramLogSize\0")
            .map_err(|_| sym(b"nvrtcGetProgramLogSize"))?;
        let get_log: libloading::Symbol<GetFn> = l
            .get(b"nvrtcGetProgramLog\0")
            .map_err(|_| sym(b"nvrtcGetProgramLog"))?;
        let ptx_size: libloading::Symbol<SizeFn> = l
            .get(b"nvrtcGetPTXSize\0")
            .map_err(|_| sym(b"nvrtcGetPTXSize"))?;
        let get_ptx: libloading::Symbol<GetFn> =
            l.get(b"nvrtcGetPTX\0").map_err(|_| sym(b"nvrtcGetPTX"))?;
        let destroy: libloading::Symbol<DestroyFn> = l
            .get(b"nvrtcDestroyProgram\0")
            .map_err(|_| sym(b"nvrtcDestroyProgram"))?;
        let err_str: libloading::Symbol<ErrStrFn> = l
            .get(b"nvrtcGetErrorString\0")
            .map_err(|_| sym(b"nvrtcGetErrorString"))?;
        let describe = |code: c_int| CStr::from_ptr(err_str(code)).to_string_lossy().into_owned();

        let c_src = CString::new(src).map_err(|_| "source contains a NUL byte")?;
        let c_name = CString::new(name).map_err(|_| "name contains a NUL byte")?;
        let mut prog: Prog = std::ptr::null_mut();
        let r = create(
            &mut prog,
            c_src.as_ptr(),
            c_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if r != 0 {
            return Err(format!("nvrtcCreateProgram: {}", describe(r)));
        }
        let c_opts: Vec<CString> = opts
            .iter()
            .map(|o| CString::new(o.as_str()).expect("option without NUL"))
            .collect();
        let ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
        let r = compile(prog, ptrs.len() as c_int, ptrs.as_ptr());
        let mut n = 0usize;
        log_size(prog, &mut n);
        let mut log = vec![0u8; n.max(1)];
        get_log(prog, log.as_mut_ptr().cast());
        let log =
            String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(log.len())])
                .into_owned();
        if r != 0 {
            destroy(&mut prog);
            return Err(format!("nvrtcCompileProgram: {}\n{log}", describe(r)));
        }
        if !log.trim().is_empty() {
            // sm_60 is deprecated in CUDA 12 (still supported): that warning is expected.
            for line in log
                .lines()
                .filter(|l| l.contains("warning") && !l.contains("deprecated"))
            {
                println!("cargo:warning=pn-kernels: {name}: {line}");
            }
        }
        let mut n = 0usize;
        ptx_size(prog, &mut n);
        let mut ptx = vec![0u8; n];
        get_ptx(prog, ptx.as_mut_ptr().cast());
        destroy(&mut prog);
        if let Some(z) = ptx.iter().position(|&b| b == 0) {
            ptx.truncate(z);
        }
        String::from_utf8(ptx).map_err(|_| "NVRTC returned non-UTF-8 PTX".to_string())
    }
}
