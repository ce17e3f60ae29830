//! The pooled sessions of the API (and of the readiness probe): deadpool-postgres's client, with
//! the statements prepared on it kept beside it and found by their text's address, and the
//! settings it carries session-wide.
//!
//! deadpool-postgres's own statement cache keys each lookup by the statement's whole text and
//! parameter types, hashed with SipHash: for the claim statement (~2 kB) that was ~11 k of the
//! daemon's ~183 k user-space instructions per replay (BENCHMARKS.md, scenario 10). Every text
//! tombstoned prepares on a pooled session is `'static` and rendered once per schema
//! ([`super::sql::qualify`]), and a session prepares about a dozen of them, so [`Prepared`] is a
//! short list compared by address (by content only when two copies of one text differ in
//! address), behind a lock only one task at a time ever takes: a pooled session is checked out
//! by one request.
//!
//! **Session settings.** On a direct connection (or through a session pooler) the claim is one
//! statement sent alone, an implicit transaction, so what its transaction needs — READ COMMITTED
//! and the claim's lock timeout — is set on the session ([`SessionSettings`],
//! [`super::sql::SET_SESSION_SETTINGS`]): when the pool opens it, again at the first checkout
//! after the pool's settings changed (a reload: [`SessionManager::set_session_settings`]), and
//! by whoever needs others before its statement ([`PooledSession::carry`]). Each session
//! remembers what it carries, so in the usual case that is a comparison, not a round trip.
//! Through a transaction pooler nothing is set on a session: its next transaction may run on a
//! server connection shared with other clients.

use std::sync::{Mutex, PoisonError, RwLock};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use deadpool_postgres::ClientWrapper;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Error, Statement};

use super::sql::{duration_setting, SET_SESSION_SETTINGS};

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
    /// and settings included.
    recycling_discards: bool,
    /// What every session carries session-wide, applied when it opens and at its first checkout
    /// after a change; `None`: nothing (a transaction pooler, or a pool whose users set
    /// nothing).
    session_settings: Option<RwLock<SessionSettings>>,
}

impl SessionManager {
    pub(super) fn new(
        pg_config: tokio_postgres::Config,
        connect: impl deadpool_postgres::Connect + 'static,
        config: deadpool_postgres::ManagerConfig,
        session_settings: Option<SessionSettings>,
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
            session_settings: session_settings.map(RwLock::new),
        }
    }

    /// From now on every session carries `settings`: each session opened is given them, and
    /// each one already open — idle or in use — is given them at its next checkout, before its
    /// next statement. Nothing when the pool sets nothing on its sessions.
    pub fn set_session_settings(&self, settings: SessionSettings) {
        if let Some(slot) = &self.session_settings {
            *slot.write().unwrap_or_else(PoisonError::into_inner) = settings;
        }
    }

    /// What every session is to carry, if anything.
    pub fn session_settings(&self) -> Option<SessionSettings> {
        self.session_settings
            .as_ref()
            .map(|slot| *slot.read().unwrap_or_else(PoisonError::into_inner))
    }
}

impl managed::Manager for SessionManager {
    type Type = PooledSession;
    type Error = Error;

    async fn create(&self) -> Result<PooledSession, Error> {
        let session = PooledSession {
            client: self.manager.create().await?,
            prepared: Prepared::default(),
            carried: Mutex::new(None),
        };
        if let Some(settings) = self.session_settings() {
            session.carry(settings).await?;
        }
        Ok(session)
    }

    async fn recycle(
        &self,
        session: &mut PooledSession,
        metrics: &Metrics,
    ) -> RecycleResult<Error> {
        let recycled = self.manager.recycle(&mut session.client, metrics).await;
        if self.recycling_discards {
            session.prepared.clear();
            session.forget_settings();
        }
        recycled?;
        if let Some(settings) = self.session_settings() {
            session
                .carry(settings)
                .await
                .map_err(RecycleError::Backend)?;
        }
        Ok(())
    }

    fn detach(&self, session: &mut PooledSession) {
        self.manager.detach(&mut session.client);
    }
}

/// The settings a pooled session carries session-wide ([`super::sql::SET_SESSION_SETTINGS`]):
/// READ COMMITTED, and this lock timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSettings {
    /// `lock_timeout`.
    pub lock_timeout: Duration,
}

/// One pooled session: the driver's client, the statements prepared on it and the settings it
/// carries.
pub struct PooledSession {
    client: ClientWrapper,
    prepared: Prepared,
    /// What was set on the session, as the server confirmed it (`None`: nothing yet).
    carried: Mutex<Option<SessionSettings>>,
}

impl PooledSession {
    /// The statements prepared on this session.
    pub fn prepared(&self) -> &Prepared {
        &self.prepared
    }

    /// The settings this session carries, if it was given any.
    pub fn carried(&self) -> Option<SessionSettings> {
        *self.carried.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the session carry `settings`: nothing to do when it already does (the usual case),
    /// otherwise [`super::sql::SET_SESSION_SETTINGS`] sent alone, one round trip, and noted once
    /// the server has committed it. A session that does not answer is left as it was noted, so
    /// the next caller sends the settings again.
    pub async fn carry(&self, settings: SessionSettings) -> Result<(), Error> {
        if self.carried() == Some(settings) {
            return Ok(());
        }
        let lock_timeout = duration_setting(settings.lock_timeout);
        self.client
            .execute_typed(SET_SESSION_SETTINGS, &[(&lock_timeout, Type::TEXT)])
            .await?;
        *self.carried.lock().unwrap_or_else(PoisonError::into_inner) = Some(settings);
        Ok(())
    }

    fn forget_settings(&self) {
        *self.carried.lock().unwrap_or_else(PoisonError::into_inner) = None;
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
        if let Some(kept) = Self::matching(&statements, text, |kept| kept == types) {
            return Ok(kept);
        }
        statements.push((text, types.to_vec(), statement.clone()));
        Ok(statement)
    }

    /// The statement kept for `text` whose parameter types `same_types` accepts, if any.
    pub fn find_matching(
        &self,
        text: &'static str,
        same_types: impl Fn(&[Type]) -> bool,
    ) -> Option<Statement> {
        let statements = self
            .statements
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Self::matching(&statements, text, same_types)
    }

    fn find(&self, text: &'static str, types: &[Type]) -> Option<Statement> {
        self.find_matching(text, |kept| kept == types)
    }

    fn matching(
        statements: &[(&'static str, Vec<Type>, Statement)],
        text: &'static str,
        same_types: impl Fn(&[Type]) -> bool,
    ) -> Option<Statement> {
        statements
            .iter()
            .find(|(kept, kept_types, _)| {
                (std::ptr::eq(*kept, text) || *kept == text) && same_types(kept_types)
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
