//! verifiers v1 environments against this stack: a venv with `verifiers` (and `uv`, which its
//! subprocess runtime uses to run harness programs) from PyPI and the `rl-env` package, then the
//! tests in `python/rl-env/tests_verifiers` (the token route's contract with `renderers`, the
//! host's traces, failures, `vf-eval --client.type train`, and `rl rl` on each config of
//! `configs/verifiers`).

use anyhow::{Context, bail};

use crate::venv::Venv;

/// The verifiers release the host is tested against (its v1 API).
pub(crate) const VERIFIERS: &str = "verifiers==0.4.0";
/// The uv verifiers' subprocess runtime prepares harness programs with.
const UV: &str = "uv==0.13.9";

/// Where the tests live.
const TESTS: &str = "python/rl-env/tests_verifiers";

/// `target/verifiers-venv`: verifiers, uv, the SDK and the tests' own tasksets (installed as a user
/// installs an environment), all editable but the first two.
pub(crate) fn venv() -> Venv {
    let root = crate::workspace::project_root();
    let sdk = format!("--editable={}", root.join("python/rl-env").display());
    let tasksets = format!("--editable={}", root.join(TESTS).join("tasksets").display());
    Venv {
        dir: root.join("target/verifiers-venv"),
        packages: vec![VERIFIERS.into(), UV.into(), sdk, tasksets],
        purpose: "verifiers (the v1 host's tests)",
    }
}

/// Makes `target/verifiers-venv` and runs the verifiers tests with the workspace's `rl`.
pub(crate) fn test() -> anyhow::Result<()> {
    let root = crate::workspace::project_root();
    crate::workspace::build_rl_as_tested()?;
    let tests = root.join(TESTS);
    let venv = venv();
    let python = venv.ensure()?;
    // The venv's `uv` and `vf-eval` come first on PATH: harness programs are prepared with it.
    let mut path = vec![venv.dir.join("bin")];
    path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    let status = crate::venv::command(&python)
        .args(["-m", "unittest", "discover", "--start-directory"])
        .arg(&tests)
        .arg("--top-level-directory")
        .arg(&tests)
        .env("RL_BIN", root.join("target/debug/rl"))
        .env("PATH", std::env::join_paths(path).context("cannot form PATH")?)
        // uv installs the harness program's environment without bytecode by default; where
        // PYTHONDONTWRITEBYTECODE is set (CI images often set it) every episode's interpreter
        // would compile openai from source (~2 s of CPU each, hundreds of episodes).
        .env("UV_COMPILE_BYTECODE", "1")
        .env_remove("PYTHONPATH")
        .status()
        .context("cannot run the verifiers tests")?;
    if !status.success() {
        bail!("the verifiers tests failed ({status})");
    }
    Ok(())
}
