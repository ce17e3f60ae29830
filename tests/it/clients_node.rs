//! The Node client, `clients/node` (`@tombstoned/client`), under its own runner (issue 38):
//! `clients/setup node` (npm ci from the lock file, the TypeScript build), the type check
//! (`npm run typecheck`: the sources and a usage file against the real pg, Express and Fastify
//! types), then `npm test` (node:test) against a database the daemon migrated, as a service
//! role with only the documented grants (`clients_support`). The suite covers the core's
//! outcomes and SQLSTATEs, the runner's faults (commit lost behind a TCP proxy, a real deadlock,
//! a terminated session, a read-only server), the answers of `clients/answers.json`, both
//! adapters under their real servers beside the daemon's real cleaner, the README's samples, and
//! the packed tarball installed into a scratch project and loaded from ESM and CommonJS.

use std::path::Path;

use crate::clients_support::{run_suite, ClientEnv};
use crate::ops_support::repo_root;

/// `clients/setup node`: node_modules from the lock file and the build (a no-op when made).
pub fn setup() {
    let status = std::process::Command::new(repo_root().join("clients/setup"))
        .arg("node")
        .status()
        .unwrap_or_else(|e| panic!("cannot run clients/setup: {e}"));
    assert!(
        status.success(),
        "clients/setup node failed ({status}): the Node client needs node, npm and its packages"
    );
}

#[tokio::test]
async fn node_client_suite() {
    tokio::task::spawn_blocking(setup).await.unwrap();
    let env = ClientEnv::new("node").await;
    let dir = repo_root().join("clients/node");
    run_suite(
        &env,
        &dir,
        Path::new("npm"),
        &["run", "--silent", "typecheck"],
        &[],
    )
    .await;
    run_suite(&env, &dir, Path::new("npm"), &["test", "--silent"], &[]).await;
}
