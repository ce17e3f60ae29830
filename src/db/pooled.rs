//! The pooled sessions of the API (and of the readiness probe): deadpool-postgres's client, with
//! the statements prepared on it kept beside it and found by their text's address.
//!
//! deadpool-postgres's own statement cache keys each lookup by the statement's whole text and
//! parameter types, hashed with SipHash: for the claim statement (~2 kB) that was ~11 k of the
//! daemon's ~183 k user-space instructions per replay (BENCHMARKS.md, scenario 10). Every text
//! tombstoned prepares on a pooled session is `'static` and rendered once per schema
//! ([`super::sql::qualify`]), and a session prepares about a dozen of them, so [`Prepared`] is a
//! short list compared by address (by content only when two copies of one text differ in
//! address), behind a lock only one task at a time ever takes: a pooled session is checked out
//! by one request.

use std::sync::{Mutex, PoisonError};

use deadpool::managed::{self, Metrics, RecycleResult};
use deadpool_postgres::ClientWrapper;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Error, Statement};

/// A pool of [`PooledSession`]s.
pub type Pool = managed::Pool<SessionManager>;

/// A session checked out of a [`Pool`].
pub type Object = managed::Object<SessionManager>;

/// Opens and recycles [`PooledSession`]s through deadpool-postgres's manager (connecting,
/// `RecyclingMethod`, the closed-connection check), adding the statement list.
#[derive(Debug)]
pub struct SessionManager {
    manager: deadpool_postgres::Manager,
    /// The recycling method discards the session's state (`DISCARD ALL`), prepared statements
    /// included.
    recycling_discards: bool,
}

impl SessionManager {
    pub(super) fn new(
        pg_config: tokio_postgres::Config,
        connect: impl deadpool_postgres::Connect + 'static,
        config: deadpool_postgres::ManagerConfig,
    ) -> Self {
        // A custom recycling statement may discard too: forget ours then, to be safe (they are
        // prepared again under new names).
        let recycling_discards = matches!(
            config.recycling_method,
            deadpool_postgres::RecyclingMethod::Clean
                | deadpool_postgres::RecyclingMethod::Custom(_)
        );
        SessionManager {
            manager: deadpool_postgres::Manager::from_connect(pg_config, connect, config),
            recycling_discards,
        }
    }
}

impl managed::Manager for SessionManager {
    type Type = PooledSession;
    type Error = Error;

    async fn create(&self) -> Result<PooledSession, Error> {
        Ok(PooledSession {
            client: self.manager.create().await?,
            prepared: Prepared::default(),
        })
    }

    async fn recycle(
        &self,
        session: &mut PooledSession,
        metrics: &Metrics,
    ) -> RecycleResult<Error> {
        let recycled = self.manager.recycle(&mut session.client, metrics).await;
        if self.recycling_discards {
            session.prepared.clear();
        }
        recycled
    }

    fn detach(&self, session: &mut PooledSession) {
        self.manager.detach(&mut session.client);
    }
}

/// One pooled session: the driver's client and the statements prepared on it.
pub struct PooledSession {
    client: ClientWrapper,
    prepared: Prepared,
}

impl PooledSession {
    /// The statements prepared on this session.
    pub fn prepared(&self) -> &Prepared {
        &self.prepared
    }
}

impl std::ops::Deref for PooledSession {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        &self.client
    }
}

impl std::ops::DerefMut for PooledSession {
    fn deref_mut(&mut self) -> &mut ClientWrapper {
        &mut self.client
    }
}

/// The statements prepared on one session, each with its text and parameter types.
#[derive(Default)]
pub struct Prepared {
    statements: Mutex<Vec<(&'static str, Vec<Type>, Statement)>>,
}

impl Prepared {
    /// `text` prepared with `types` on `client` (the session this list belongs to): the kept
    /// statement, or prepared now and kept.
    pub async fn get_or_prepare(
        &self,
        client: &Client,
        text: &'static str,
        types: &[Type],
    ) -> Result<Statement, Error> {
        if let Some(statement) = self.find(text, types) {
            return Ok(statement);
        }
        let statement = client.prepare_typed(text, types).await?;
        let mut statements = self
            .statements
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Two futures of one request may have prepared the same text side by side: keep the
        // first (the other is closed on the server when dropped).
        if let Some(kept) = Self::matching(&statements, text, types) {
            return Ok(kept);
        }
        statements.push((text, types.to_vec(), statement.clone()));
        Ok(statement)
    }

    fn find(&self, text: &'static str, types: &[Type]) -> Option<Statement> {
        let statements = self
            .statements
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Self::matching(&statements, text, types)
    }

    fn matching(
        statements: &[(&'static str, Vec<Type>, Statement)],
        text: &'static str,
        types: &[Type],
    ) -> Option<Statement> {
        statements
            .iter()
            .find(|(kept, kept_types, _)| {
                (std::ptr::eq(*kept, text) || *kept == text) && kept_types.as_slice() == types
            })
            .map(|(_, _, statement)| statement.clone())
    }

    fn clear(&self) {
        self.statements
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// How many statements are kept.
    pub fn len(&self) -> usize {
        self.statements
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
