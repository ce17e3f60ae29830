//! The official Python client, `clients/python` (issue 38): its pytest suite (every outcome and
//! SQLSTATE through the core, the runners, the commit whose acknowledgement is lost, the FastAPI
//! adapter under uvicorn and the Django adapter under waitress driven over HTTP, a stress run
//! with the daemon's cleaner, the wheel and sdist, the README samples) against a fresh database
//! migrated by the daemon with a service role that has only the documented grants
//! (`clients_support`), and `mypy --strict` over the package, its tests and the FastAPI example.
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
fn setup() -> PathBuf {
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
fn python_client_is_mypy_strict_clean() {
    let python = setup();
    let output = Command::new(&python)
        .args(["-m", "mypy"])
        .current_dir(project())
        .output()
        .unwrap_or_else(|e| panic!("cannot run mypy: {e}"));
    assert!(
        output.status.success(),
        "mypy --strict (clients/python/pyproject.toml) failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
