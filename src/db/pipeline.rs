//! The pipelined transaction, written once: `BEGIN; <settings>; <statement>; COMMIT` sent
//! together, one round trip, as every cleanup batch, every relay statement and the claim's rarer
//! transactions run it — and the transaction of one statement: [`alone`] (a statement that sets
//! its own settings) and [`in_session`] (a statement on a pooled session that carries them, the
//! claim's owner attempt on a direct connection).
//!
//! tokio-postgres sends a request when its future is first polled, and `join!(biased; ...)`
//! polls in the order written, so the order on the wire is the order here. Each request carries
//! its own Sync, so an error in one does not swallow the COMMIT behind it: when a statement fails,
//! the server skips the rest of the transaction up to the COMMIT, which then ends it as a
//! ROLLBACK. The transaction applies whole or not at all, nothing else runs on the session in
//! between, and the row locks its statement takes are released the moment the statement ends
//! (the COMMIT is already waiting at the server), not one client round trip later. The settings
//! are `set_config(..., true)`: they end with the transaction, so nothing is left on a session a
//! pooler hands to someone else.
//!
//! Through a transaction-mode pooler this is one transaction too: the server connection is the
//! client's from BEGIN until COMMIT's ReadyForQuery, and every statement is unnamed
//! ([`super::statement`]). The caller must be the only one sending on the session while a
//! pipeline is sent (a pooled connection it holds, or a session driven by one task).
//!
//! A cleanup batch adds one statement between the settings and its own: the lease renewal
//! ([`Guard`]), which fails when the run no longer holds the lease, so the batch behind it is
//! skipped and the COMMIT ends the transaction as a ROLLBACK: a batch commits only while its run
//! holds the lease, still in one round trip.
//!
//! The statements come ready ([`Ready`]): the caller chooses how (the claim from the statements
//! its pooled session keeps, [`prepare`]; a cleanup run once per run), so with named statements each
//! transaction is four Bind/Execute/Sync messages and no Parse.

use std::future::Future;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row};

use super::pooled::SessionSettings;
use super::sql;
use super::statement::{types_of, Conn, Param, Ready};

/// The four statements of one pipelined transaction.
#[derive(Debug, Clone, Copy)]
pub struct Pipelined<'s> {
    /// [`sql::BEGIN_READ_COMMITTED`] (or [`sql::BEGIN_READ_ONLY`]).
    pub begin: &'s Ready,
    /// The transaction's settings (`SELECT set_config(..., true)`), run before the statement.
    pub settings: &'s Ready,
    /// The statement whose rows the transaction returns.
    pub statement: &'s Ready,
    /// [`sql::COMMIT`].
    pub commit: &'s Ready,
}

/// A statement run after the settings and before the main one, whose failure rolls the whole
/// transaction back (the cleanup lease's renewal, `crate::cleanup::Lease`).
#[derive(Clone, Copy)]
pub struct Guard<'s> {
    /// The statement.
    pub statement: &'s Ready,
    /// Its parameters.
    pub params: &'s [&'s dyn Param],
}

/// A failed pipelined transaction: the first error in statement order (later statements only
/// report the aborted transaction).
#[derive(Debug)]
pub struct PipelineFailure {
    /// The error.
    pub error: tokio_postgres::Error,
    /// Whether the transaction, its COMMIT included, had been sent: when the connection is lost
    /// after that, it may have committed. False when preparing failed (nothing was sent).
    pub sent: bool,
}

impl PipelineFailure {
    fn sent(error: tokio_postgres::Error) -> Self {
        PipelineFailure { error, sent: true }
    }

    fn unsent(error: tokio_postgres::Error) -> Self {
        PipelineFailure { error, sent: false }
    }
}

impl Pipelined<'_> {
    /// Runs the transaction; the statement's rows.
    pub async fn query(
        self,
        client: &Client,
        settings: &[&dyn Param],
        params: &[&dyn Param],
    ) -> Result<Vec<Row>, PipelineFailure> {
        self.run(client, settings, None, self.statement.query(client, params))
            .await
    }

    /// Runs the transaction; the statement's one row (any other count is an error, and the
    /// transaction was still committed or rolled back whole).
    pub async fn query_one(
        self,
        client: &Client,
        settings: &[&dyn Param],
        params: &[&dyn Param],
    ) -> Result<Row, PipelineFailure> {
        self.run(
            client,
            settings,
            None,
            self.statement.query_one(client, params),
        )
        .await
    }

    /// Runs the transaction; the number of rows the statement changed.
    pub async fn execute(
        self,
        client: &Client,
        settings: &[&dyn Param],
        params: &[&dyn Param],
    ) -> Result<u64, PipelineFailure> {
        self.run(
            client,
            settings,
            None,
            self.statement.execute(client, params),
        )
        .await
    }

    /// [`Pipelined::query_one`] with `guard` run between the settings and the statement: when
    /// the guard fails, that is the error, and nothing of the transaction applied.
    pub async fn query_one_guarded(
        self,
        client: &Client,
        settings: &[&dyn Param],
        guard: Guard<'_>,
        params: &[&dyn Param],
    ) -> Result<Row, PipelineFailure> {
        self.run(
            client,
            settings,
            Some(guard),
            self.statement.query_one(client, params),
        )
        .await
    }

    /// `statement` is the main statement's request, not yet polled (so not yet sent).
    async fn run<T>(
        self,
        client: &Client,
        settings: &[&dyn Param],
        guard: Option<Guard<'_>>,
        statement: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, PipelineFailure> {
        // Polled (so sent) in its place, right after the settings; nothing without a guard.
        let guarded = async {
            match guard {
                Some(g) => g.statement.execute(client, g.params).await.map(Some),
                None => Ok(None),
            }
        };
        let (begin, set, guarded, main, commit) = tokio::join!(
            biased;
            self.begin.execute(client, &[]),
            self.settings.execute(client, settings),
            guarded,
            statement,
            self.commit.execute(client, &[]),
        );
        // The first failure in statement order is the cause.
        begin.map_err(PipelineFailure::sent)?;
        set.map_err(PipelineFailure::sent)?;
        guarded.map_err(PipelineFailure::sent)?;
        let out = main.map_err(PipelineFailure::sent)?;
        commit.map_err(PipelineFailure::sent)?;
        Ok(out)
    }
}

/// BEGIN, `settings`, `statement` and COMMIT made ready on `conn` ([`Conn::ready`]: kept by the
/// pooled session, those not kept yet prepared in one round trip; or unnamed),
/// in that order.
pub async fn prepare(
    conn: &Conn<'_>,
    settings: (&'static str, &[Type]),
    statement: (&'static str, &[Type]),
) -> Result<[Ready; 4], PipelineFailure> {
    prepare_with(conn, sql::BEGIN_READ_COMMITTED, settings, statement).await
}

/// [`prepare`] with another BEGIN (e.g. [`sql::BEGIN_READ_ONLY`]).
pub async fn prepare_with(
    conn: &Conn<'_>,
    begin: &'static str,
    settings: (&'static str, &[Type]),
    statement: (&'static str, &[Type]),
) -> Result<[Ready; 4], PipelineFailure> {
    let (begin, settings, statement, commit) = futures::try_join!(
        conn.ready(begin, &[]),
        conn.ready(settings.0, settings.1),
        conn.ready(statement.0, statement.1),
        conn.ready(sql::COMMIT, &[]),
    )
    .map_err(PipelineFailure::unsent)?;
    Ok([begin, settings, statement, commit])
}

/// The four statements of `BEGIN; settings; statement; COMMIT` made ready on `conn`, their
/// types taken from the parameters they will be sent with.
async fn ready_for(
    conn: &Conn<'_>,
    settings: &'static str,
    settings_params: &[&dyn Param],
    statement: &'static str,
    params: &[&dyn Param],
) -> Result<[Ready; 4], PipelineFailure> {
    prepare(
        conn,
        (settings, &types_of(settings_params)),
        (statement, &types_of(params)),
    )
    .await
}

impl<'s> Pipelined<'s> {
    fn of([begin, settings, statement, commit]: &'s [Ready; 4]) -> Self {
        Pipelined {
            begin,
            settings,
            statement,
            commit,
        }
    }
}

/// One pipelined transaction on `conn`: `BEGIN; settings(settings_params); statement(params);
/// COMMIT`; the statement's rows.
pub async fn query(
    conn: &Conn<'_>,
    settings: &'static str,
    settings_params: &[&dyn Param],
    statement: &'static str,
    params: &[&dyn Param],
) -> Result<Vec<Row>, PipelineFailure> {
    let ready = ready_for(conn, settings, settings_params, statement, params).await?;
    Pipelined::of(&ready)
        .query(conn.client(), settings_params, params)
        .await
}

/// A transaction of one statement, implicit (no BEGIN or COMMIT: the server commits it when the
/// statement ends and rolls it back when it fails), for a statement that makes its own
/// transaction-local settings and checks its own isolation level: the endpoint's claim functions
/// through a transaction pooler ([`crate::claim`]). Its rows. As with [`query`], a failure counts
/// as sent: once the statement has gone out, it may have committed.
pub async fn alone(
    conn: &Conn<'_>,
    statement: &'static str,
    params: &[&dyn Param],
) -> Result<Vec<Row>, PipelineFailure> {
    conn.query(statement, params)
        .await
        .map_err(PipelineFailure::sent)
}

/// A transaction of one statement, implicit, on a session that carries `settings` session-wide
/// (READ COMMITTED and the lock timeout, [`Conn::carry`]: given once, when the pool opened the
/// session or after they changed): the statement is sent alone, [`alone`] — one Bind, Execute
/// and Sync on a named statement, one round trip, and the server commits at that Sync. Its
/// rows; as with [`alone`], a failure once the statement has gone out counts as sent. On a
/// session that carries nothing between statements (a dedicated one, or any through a
/// transaction pooler, where no setting may stay on a session) the settings are made
/// transaction-local instead, in the pipelined transaction ([`query`]).
pub async fn in_session(
    conn: &Conn<'_>,
    settings: SessionSettings,
    statement: &'static str,
    params: &[&dyn Param],
) -> Result<Vec<Row>, PipelineFailure> {
    if conn
        .carry(settings)
        .await
        .map_err(PipelineFailure::unsent)?
    {
        return alone(conn, statement, params).await;
    }
    let lock_timeout = sql::duration_setting(settings.lock_timeout);
    // Boxed: the pipelined transaction's state is kilobytes, and the claim's future (which
    // holds this one) is allocated and moved whole at every request, though a session that
    // carries the settings never needs it.
    Box::pin(query(
        conn,
        sql::SET_LOCAL_LOCK_TIMEOUT,
        &[&lock_timeout],
        statement,
        params,
    ))
    .await
}

/// [`query`], for a statement that returns exactly one row.
pub async fn query_one(
    conn: &Conn<'_>,
    settings: &'static str,
    settings_params: &[&dyn Param],
    statement: &'static str,
    params: &[&dyn Param],
) -> Result<Row, PipelineFailure> {
    let ready = ready_for(conn, settings, settings_params, statement, params).await?;
    Pipelined::of(&ready)
        .query_one(conn.client(), settings_params, params)
        .await
}

/// [`query`], for a statement whose changed-row count is the result.
pub async fn execute(
    conn: &Conn<'_>,
    settings: &'static str,
    settings_params: &[&dyn Param],
    statement: &'static str,
    params: &[&dyn Param],
) -> Result<u64, PipelineFailure> {
    let ready = ready_for(conn, settings, settings_params, statement, params).await?;
    Pipelined::of(&ready)
        .execute(conn.client(), settings_params, params)
        .await
}
