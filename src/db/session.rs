//! A dedicated session outside any pool (migrations, the cleanup lease and run, readiness):
//! the client and the task that drives its connection.

use tokio::task::JoinHandle;
use tokio_postgres::Client;

use super::DbError;

/// A dedicated session. The connection task ends when the client is dropped; dropping the
/// session is how a session that failed is discarded.
pub struct Session {
    /// The client.
    pub client: Client,
    task: JoinHandle<()>,
}

impl Session {
    /// A session of `client`, whose connection is driven by `task`.
    pub(super) fn new(client: Client, task: JoinHandle<()>) -> Self {
        Session { client, task }
    }

    /// Whether the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed() || self.task.is_finished()
    }

    /// The server process id of this session (`pg_backend_pid()`), for `pg_stat_activity`.
    pub async fn backend_pid(&self) -> Result<i32, DbError> {
        Ok(self
            .client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Closing the client ends the task; aborting covers a task stuck on a dead socket.
        self.task.abort();
    }
}
