//! A dedicated session outside any pool (migrations, the cleanup lease and run, readiness, the
//! outbox relay): the client, the task that drives its connection, and what its statements need
//! ([`Session::conn`]: the schema they name, and how they are sent per `database.pooler`).

use tokio::task::JoinHandle;
use tokio_postgres::Client;

use super::{Conn, DbError, Pooler};

/// A dedicated session. The connection task ends when the client is dropped; dropping the
/// session is how a session that failed is discarded.
pub struct Session {
    /// The client.
    pub client: Client,
    task: JoinHandle<()>,
    schema: String,
    pooler: Pooler,
}

impl Session {
    /// A session of `client`, whose connection is driven by `task`.
    pub(super) fn new(
        client: Client,
        task: JoinHandle<()>,
        schema: String,
        pooler: Pooler,
    ) -> Self {
        Session {
            client,
            task,
            schema,
            pooler,
        }
    }

    /// The session with the schema its statements name and how they are sent
    /// ([`Conn::dedicated`]).
    pub fn conn(&self) -> Conn<'_> {
        Conn::dedicated(&self.client, &self.schema, self.pooler)
    }

    /// Whether the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed() || self.task.is_finished()
    }

    /// The server process id of this session (`pg_backend_pid()`), for `pg_stat_activity`.
    /// (Through a transaction pooler, the server connection of this one statement.)
    pub async fn backend_pid(&self) -> Result<i32, DbError> {
        Ok(self
            .conn()
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .try_get(0)?)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Closing the client ends the task; aborting covers a task stuck on a dead socket.
        self.task.abort();
    }
}
