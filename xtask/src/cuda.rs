//! The CUDA toolchain from PyPI wheels, so no system CUDA is needed: `cargo xtask ci` uses the
//! compiler wheels to run clippy on every crate's `cuda` feature (candle's kernels compile to PTX
//! with nvcc; nothing links), and `cargo xtask build-cuda` adds the runtime-library wheels and a
//! link-time stub of the driver to link an `rl` binary with CUDA. On the GPU machine that binary
//! loads the real driver (`libcuda.so.1`); where there is none, its launcher puts the stub on the
//! library path so CPU work still runs and `device = "cuda"` fails with a clear error. Both also
//! build the CUPTI kernel profiler (`scripts/cupti_profile.c`); the check runs its tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::venv::Venv;

/// The compiler, pinned to CUDA 13.0, the oldest 13.x: candle's kernels ship as PTX that the
/// driver compiles when it loads them, and a driver JITs PTX no newer than its own CUDA version
/// (13.4's PTX fails on the r580 drivers that carry CUDA 13.0). Built with 13.0, the binary runs on
/// every CUDA 13 driver. CCCL supplies `<nv/target>`, which `cuda_fp16.h` includes; CUPTI the
/// headers and library of the kernel profiler (`scripts/cupti_profile.c`).
const COMPILER: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cuda-cupti==13.0.85",
];

/// The libraries candle links (cudarc's `dynamic-linking`), besides the driver: 13.0 builds, which
/// the newer 13.x drivers also run.
const RUNTIME: &[&str] = &["nvidia-cublas==13.0.2.14", "nvidia-curand==10.4.0.35", "nvidia-cuda-nvrtc==13.0.88"];

/// Every crate's `cuda` feature: the workspace's whole GPU surface.
pub(crate) const FEATURES: &str = "rl-kernels/cuda,rl-model/cuda,rl-trainer/cuda,rl-inference/cuda,rl-cli/cuda";

/// The toolkit's venv and the linked GPU build live here, so building that binary never replaces
/// the CPU build's `rl`.
const TARGET_DIR: &str = "target/cuda";

/// Compute capability the PTX is built for unless `CUDA_COMPUTE_CAP` says otherwise (H100/H200).
const DEFAULT_COMPUTE_CAP: &str = "90";

/// The toolkit's venv holding `packages`.
fn toolkit_venv(packages: &[&str]) -> Venv {
    Venv {
        dir: crate::workspace::project_root().join(TARGET_DIR).join("toolkit"),
        packages: packages.iter().map(|p| String::from(*p)).collect(),
        purpose: "the CUDA toolchain",
    }
}

/// The venv the clippy check of the `cuda` features uses (the compiler alone).
pub(crate) fn compiler_venv() -> Venv {
    toolkit_venv(COMPILER)
}

/// An installed toolkit: the wheels' `nvidia/cu13` directory.
struct Toolkit {
    root: PathBuf,
}

impl Toolkit {
    /// Installs `packages` (once) and finds the toolkit they form.
    fn install(packages: &[&str]) -> anyhow::Result<Self> {
        let venv = toolkit_venv(packages);
        venv.ensure()?;
        let lib = venv.dir.join("lib");
        let root = std::fs::read_dir(&lib)
            .with_context(|| format!("cannot read {}", lib.display()))?
            .flatten()
            .map(|e| e.path().join("site-packages/nvidia/cu13"))
            .find(|p| p.join("bin/nvcc").exists())
            .with_context(|| format!("no nvidia/cu13/bin/nvcc under {} after installing the wheels", lib.display()))?;
        Ok(Toolkit { root })
    }

    /// `cargo` with the toolkit's nvcc on PATH and CUDA_ROOT/CUDA_PATH at it.
    fn cargo(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| String::from("cargo")));
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.root.join("bin")];
        dirs.extend(std::env::split_paths(&path));
        cmd.args(args)
            .env("PATH", std::env::join_paths(dirs).unwrap_or(path))
            .env("CUDA_ROOT", &self.root)
            .env("CUDA_PATH", &self.root)
            .env("CUDA_COMPUTE_CAP", std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| DEFAULT_COMPUTE_CAP.into()));
        // candle-kernels' build script compiles its kernels with cudaforge, which uses half the
        // cores unless told (one nvcc at a time on a 2-core machine).
        if std::env::var_os("CUDAFORGE_THREADS").is_none() {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            cmd.env("CUDAFORGE_THREADS", cores.to_string());
        }
        cmd
    }
}

fn run(mut cmd: Command, what: &str) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("cannot run {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// `cargo clippy -D warnings` over the `cuda` feature of every crate (compiles, does not link).
/// A check, not a build: nothing here runs, and checking the dependencies costs less than the
/// candle kernels' nvcc compile that this step waits on anyway (their check runs beside it).
pub(crate) fn clippy() -> anyhow::Result<()> {
    let tk = Toolkit::install(COMPILER)?;
    let args = ["clippy", "--workspace", "--all-targets", "--locked", "--features", FEATURES, "--", "-D", "warnings"];
    let mut cmd = tk.cargo(&args);
    // Even a check runs candle-kernels' build script, which compiles its quantized and MoE kernels
    // to machine code for the GPU: at full optimisation most of this step on a 2-core machine
    // (~70 s a file, one file at a time). Nothing built here runs, so NVVM does not optimise and
    // the kernels stay PTX, never assembled to machine code (21 -> 9 s a file): only for this
    // check, `build-cuda` compiles as candle ships. The cargo fingerprint sees neither variable,
    // but this build only ever feeds clippy.
    cmd.env("NVCC_APPEND_FLAGS", "-Xcicc -O0").env("NVCC", check_nvcc(&tk)?);
    run(cmd, "cargo clippy on the cuda feature")?;
    check_kernel_sources(&tk)?;
    check_profiler(&tk)
}

/// `nvcc-check` beside the toolkit's nvcc (cudaforge finds the headers from where nvcc is): nvcc
/// with every `code=sm_XX` target turned into `code=compute_XX`, i.e. PTX, so ptxas never runs.
fn check_nvcc(tk: &Toolkit) -> anyhow::Result<PathBuf> {
    let nvcc = tk.root.join("bin/nvcc");
    if nvcc.to_string_lossy().contains('\'') {
        bail!("{}: a path with a single quote cannot go into the nvcc-check script", nvcc.display());
    }
    let script = format!(
        "#!/bin/sh\n# nvcc for a check whose device code never runs (cargo xtask clippy-cuda): PTX, not machine code.\n\
         for a in \"$@\"; do\n  shift\n  case \"$a\" in *code=sm_*) a=$(printf '%s' \"$a\" | sed 's/code=sm_/code=compute_/') ;; esac\n  \
         set -- \"$@\" \"$a\"\ndone\nexec '{}' \"$@\"\n",
        nvcc.display()
    );
    let path = tk.root.join("bin/nvcc-check");
    let tmp = tk.root.join("bin/.nvcc-check.tmp");
    std::fs::write(&tmp, script).with_context(|| format!("cannot write {}", tmp.display()))?;
    let mut perms = std::fs::metadata(&tmp)?.permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&tmp, perms)?;
    std::fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The CUDA sources our crates compile at run time (NVRTC, on the GPU machine), compiled here to
/// PTX with nvcc so a kernel that does not compile fails CI rather than its first GPU run.
const KERNEL_SOURCES: &[&str] = &["crates/rl-kernels/src/ops/softmax_rows/kernels.cu"];

fn check_kernel_sources(tk: &Toolkit) -> anyhow::Result<()> {
    let root = crate::workspace::project_root();
    let out = root.join(TARGET_DIR).join("ptx-check");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    for src in KERNEL_SOURCES {
        let ptx = out.join(Path::new(src).with_extension("ptx").file_name().unwrap_or_default());
        let mut cmd = Command::new(tk.root.join("bin/nvcc"));
        // Warnings are errors, as in clippy; compute_75 is NVRTC 13's default target.
        cmd.args(["-ptx", "-arch=compute_75", "-Werror", "all-warnings", "-o"]).arg(&ptx).arg(root.join(src));
        run(cmd, &format!("nvcc -ptx {src}"))?;
    }
    Ok(())
}

/// The kernel profiler's source: a CUPTI injection library (docs/gpu.md, "A device session").
const PROFILER: &str = "scripts/cupti_profile.c";
/// Its tests, which include the source and run without a GPU.
const PROFILER_TEST: &str = "scripts/cupti_profile_test.c";
/// The CUPTI library of the wheel, which the profiler finds beside itself (rpath `$ORIGIN`).
const CUPTI_LIB: &str = "libcupti.so.13";
/// What `build_profiler` names the library (`CUDA_INJECTION64_PATH` takes its path).
const PROFILER_LIB: &str = "libcupti_profile.so";

/// `gcc` with warnings as errors and the toolkit's headers and CUPTI library.
fn gcc_cupti(tk: &Toolkit) -> Command {
    let mut cmd = Command::new("gcc");
    cmd.args(["-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(tk.root.join("include"))
        .arg("-L")
        .arg(tk.root.join("lib"));
    cmd
}

/// Builds the profiler into `out`, with the wheel's libcupti beside it.
fn build_profiler(tk: &Toolkit, out: &Path) -> anyhow::Result<PathBuf> {
    let root = crate::workspace::project_root();
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let lib = out.join(PROFILER_LIB);
    let mut cmd = gcc_cupti(tk);
    cmd.args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(root.join(PROFILER))
        .arg(format!("-l:{CUPTI_LIB}"))
        .arg("-Wl,-rpath,$ORIGIN");
    run(cmd, &format!("gcc {PROFILER}"))?;
    copy(&tk.root.join("lib").join(CUPTI_LIB), &out.join(CUPTI_LIB))?;
    Ok(lib)
}

/// Builds the profiler (so CI catches one that does not compile) and runs its tests.
fn check_profiler(tk: &Toolkit) -> anyhow::Result<()> {
    let root = crate::workspace::project_root();
    let out = root.join(TARGET_DIR).join("profiler-check");
    build_profiler(tk, &out)?;
    let test = out.join("cupti_profile_test");
    let mut cmd = gcc_cupti(tk);
    cmd.arg("-I")
        .arg(root.join("scripts"))
        .arg("-o")
        .arg(&test)
        .arg(root.join(PROFILER_TEST))
        .arg(format!("-l:{CUPTI_LIB}"))
        .arg(format!("-Wl,-rpath,{}", out.display()));
    run(cmd, &format!("gcc {PROFILER_TEST}"))?;
    run(Command::new(&test), PROFILER_TEST)
}

/// The libraries the binary needs at run time, as (link name, file in the toolkit's lib dir).
const LIBS: &[(&str, &str)] = &[
    ("cublas", "libcublas.so.13"),
    ("cublasLt", "libcublasLt.so.13"),
    ("curand", "libcurand.so.10"),
    ("nvrtc", "libnvrtc.so.13"),
    ("cudart", "libcudart.so.13"),
];

/// Builds `target/cuda/dist`: `bin/rl` linked with CUDA, `lib/` the runtime libraries it finds
/// through its rpath and the kernel profiler (`libcupti_profile.so`), `stub/libcuda.so.1`, and
/// `rl`, the launcher to run.
pub(crate) fn build() -> anyhow::Result<()> {
    let packages: Vec<&str> = COMPILER.iter().chain(RUNTIME).copied().collect();
    let tk = Toolkit::install(&packages)?;
    let target = crate::workspace::project_root().join(TARGET_DIR);
    let link = target.join("link");
    std::fs::create_dir_all(&link).with_context(|| format!("cannot create {}", link.display()))?;
    driver_stub(&tk, &link)?;
    let lib_dir = tk.root.join("lib");
    for (name, file) in LIBS {
        let src = lib_dir.join(file);
        if !src.exists() {
            bail!("{} is missing: the {name} wheel did not install it", src.display());
        }
        let dst = link.join(format!("lib{name}.so"));
        let _ = std::fs::remove_file(&dst);
        std::os::unix::fs::symlink(&src, &dst).with_context(|| format!("cannot link {}", dst.display()))?;
    }
    let mut cmd = tk.cargo(&[
        "build",
        "--release",
        "--locked",
        "-p",
        "rl-cli",
        "--features",
        "rl-cli/cuda",
        "--target-dir",
        TARGET_DIR,
    ]);
    let rustflags = format!("-L native={} -C link-arg=-Wl,-rpath,$ORIGIN/../lib", link.display());
    cmd.env("RUSTFLAGS", rustflags);
    run(cmd, "cargo build of rl with the cuda feature")?;
    let dist = target.join("dist");
    for sub in ["bin", "lib", "stub"] {
        std::fs::create_dir_all(dist.join(sub))
            .with_context(|| format!("cannot create {}", dist.join(sub).display()))?;
    }
    copy(&target.join("release/rl"), &dist.join("bin/rl"))?;
    for (_, file) in LIBS {
        copy(&lib_dir.join(file), &dist.join("lib").join(file))?;
    }
    // nvrtc loads its builtins library by name at run time.
    for e in std::fs::read_dir(&lib_dir).with_context(|| format!("cannot read {}", lib_dir.display()))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("libnvrtc-builtins.so") {
            copy(&e.path(), &dist.join("lib").join(&name))?;
        }
    }
    copy(&link.join("libcuda.so"), &dist.join("stub/libcuda.so.1"))?;
    build_profiler(&tk, &dist.join("lib"))?;
    let launcher = dist.join("rl");
    std::fs::write(&launcher, LAUNCHER).with_context(|| format!("cannot write {}", launcher.display()))?;
    let mut perms = std::fs::metadata(&launcher)?.permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&launcher, perms)?;
    crate::workspace::eprintln_flush(&format!(
        "xtask build-cuda: {} (run it; copy the whole {} directory to a GPU machine)",
        launcher.display(),
        dist.display()
    ));
    Ok(())
}

/// Runs the binary with the machine's NVIDIA driver, or with the stub where there is none (CPU
/// work runs; `device = "cuda"` then reports that no driver is present).
const LAUNCHER: &str = r#"#!/bin/sh
# rl with CUDA, made by `cargo xtask build-cuda`.
here=$(dirname "$(readlink -f "$0")")
found=no
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then found=yes; fi
for d in $(echo "${LD_LIBRARY_PATH:-}" | tr ':' ' '); do
  if [ -e "$d/libcuda.so.1" ]; then found=yes; fi
done
if [ "$found" = no ]; then
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$here/stub"
fi
exec "$here/bin/rl" "$@"
"#;

fn copy(src: &Path, dst: &Path) -> anyhow::Result<()> {
    std::fs::copy(src, dst).with_context(|| format!("cannot copy {} to {}", src.display(), dst.display()))?;
    Ok(())
}

/// `libcuda.so` whose every driver entry point (from the toolkit's `cuda.h`) returns
/// CUDA_ERROR_STUB_LIBRARY, with the driver's soname so the binary asks for the real one.
fn driver_stub(tk: &Toolkit, out: &Path) -> anyhow::Result<()> {
    let header = tk.root.join("include/cuda.h");
    let pre = Command::new("gcc")
        .args(["-E", "-P", "-x", "c"])
        .arg(&header)
        .output()
        .with_context(|| format!("cannot run gcc -E on {}", header.display()))?;
    if !pre.status.success() {
        bail!("gcc -E {} failed: {}", header.display(), String::from_utf8_lossy(&pre.stderr));
    }
    let text = String::from_utf8_lossy(&pre.stdout);
    // Declarations read `CUresult cuName(...)` once preprocessed (whatever attributes precede them).
    let mut names: Vec<&str> = Vec::new();
    for (at, _) in text.match_indices("CUresult") {
        let rest = text[at + "CUresult".len()..].trim_start();
        let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        let (name, after) = rest.split_at(end);
        if name.starts_with("cu") && after.trim_start().starts_with('(') {
            names.push(name);
        }
    }
    names.sort_unstable();
    names.dedup();
    if names.len() < 100 {
        bail!("found only {} driver functions in {}", names.len(), header.display());
    }
    // 34 = CUDA_ERROR_STUB_LIBRARY.
    let source: String = names.iter().map(|n| format!("int {n}(void) {{ return 34; }}\n")).collect();
    let c = out.join("libcuda_stub.c");
    std::fs::write(&c, source).with_context(|| format!("cannot write {}", c.display()))?;
    let so = out.join("libcuda.so");
    let status = Command::new("gcc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&so)
        .arg(&c)
        .status()
        .context("cannot run gcc")?;
    if !status.success() {
        bail!("gcc could not build the driver stub ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvcc_check_turns_machine_code_targets_into_ptx_and_keeps_every_other_argument() {
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let root = std::env::temp_dir().join(format!("xtask-nvcc-check-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(root.join("bin")).unwrap();
        // A stand-in nvcc that prints the arguments it was given, one a line.
        let fake = root.join("bin/nvcc");
        std::fs::write(&fake, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").unwrap();
        let mut perms = std::fs::metadata(&fake).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&fake, perms).unwrap();
        let wrapper = check_nvcc(&Toolkit { root: root.clone() }).unwrap();
        let args = ["-gencode=arch=compute_90a,code=sm_90a", "-c", "a file.cu", "--gpu-architecture=sm_90a", ""];
        let out = Command::new(&wrapper).args(args).output().unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert!(out.status.success());
        let got: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
        // `--gpu-architecture` is left alone: candle's PTX build passes it with `-ptx`, which
        // never runs ptxas anyway.
        assert_eq!(
            got,
            ["-gencode=arch=compute_90a,code=compute_90a", "-c", "a file.cu", "--gpu-architecture=sm_90a", ""]
        );
    }
}
