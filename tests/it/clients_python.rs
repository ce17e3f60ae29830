//! The official Python client, `clients/python` (issue 38): its pytest suite (every outcome and
//! SQLSTATE through the core, the runners, the commit whose acknowledgement is lost, the FastAPI
//! adapter under uvicorn and the Django adapter under waitress driven over HTTP, a stress run
//! with the daemon's cleaner, the wheel and sdist, the README samples) against a fresh database
//! migrated by the daemon with a service role that has only the documented grants
//! (`clients_support`); and `mypy --strict`, `ruff check` and `ruff format --check` over the
//! package, its tests and the Python example's two sample apps (FastAPI, Django).
//!
//! `clients/setup python` makes the venv from the pinned requirements first (a no-op when made):
//! a missing interpreter or package fails the test, never skips it.

use std::path::PathBuf;
use std::process::Command;

use crate::clients_support::{run_suite, ClientEnv};
use crate::ops_support::repo_root;

/// The client's directory.
fn project() -> PathBuf {
    repo_root().join("clients/python")
}

/// `clients/setup python`; the venv's interpreter.
pub fn setup() -> PathBuf {
    let status = Command::new(repo_root().join("clients/setup"))
        .arg("python")
        .status()
        .unwrap_or_else(|e| panic!("cannot run clients/setup: {e}"));
    assert!(
        status.success(),
        "clients/setup python failed ({status}): the Python client's tests need python3 and PyPI"
    );
    project().join(".venv/bin/python")
}

#[tokio::test]
async fn python_client_suite() {
    let python = setup();
    let env = ClientEnv::new("py").await;
    run_suite(
        &env,
        &project(),
        &python,
        &["-m", "pytest", "-q", "-p", "no:cacheprovider"],
        &[],
    )
    .await;
}

#[test]
fn python_client_passes_mypy_strict_and_ruff() {
    let python = setup();
    let sources = ["src", "tests", "tools", "../../examples/python-payments"];
    let ruff = project().join(".venv/bin/ruff");
    let checks: [(&std::path::Path, Vec<&str>); 3] = [
        (&python, vec!["-m", "mypy"]),
        (&ruff, [&["check"][..], &sources].concat()),
        (&ruff, [&["format", "--check"][..], &sources].concat()),
    ];
    // The settings of each are in clients/python/pyproject.toml.
    for (program, args) in checks {
        let output = Command::new(program)
            .args(&args)
            .current_dir(project())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
        assert!(
            output.status.success(),
            "{} {args:?} failed in clients/python:\n{}{}",
            program.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
