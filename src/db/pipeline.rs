//! The pipelined transaction, written once: `BEGIN; <settings>; <statement>; COMMIT` sent
//! together, one round trip, as the claim and every cleanup batch run it.
//!
//! tokio-postgres sends a request when its future is first polled, and `join!(biased; ...)`
//! polls in the order written, so the order on the wire is the order here. Each request carries
//! its own Sync, so an error in one does not swallow the COMMIT behind it: when a statement fails,
//! the server skips the rest of the transaction up to the COMMIT, which then ends it as a
//! ROLLBACK. The transaction applies whole or not at all, nothing else runs on the session in
//! between, and the row locks its statement takes are released the moment the statement ends
//! (the COMMIT is already waiting at the server), not one client round trip later.
//!
//! A cleanup batch adds one statement between the settings and its own: the lease renewal
//! ([`Guard`]), which fails when the run no longer holds the lease, so the batch behind it is
//! skipped and the COMMIT ends the transaction as a ROLLBACK: a batch commits only while its run
//! holds the lease, still in one round trip.
//!
//! The statements come prepared: the caller chooses how (the claim through the pool's statement
//! cache, [`prepare_cached`]; a cleanup run once per run), so each transaction is four Bind/
//! Execute/Sync messages and no Parse.

use std::future::Future;

use deadpool_postgres::ClientWrapper;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

use super::sql;

/// The four prepared statements of one pipelined transaction.
#[derive(Debug, Clone, Copy)]
pub struct Pipelined<'s> {
    /// [`sql::BEGIN_READ_COMMITTED`], prepared.
    pub begin: &'s Statement,
    /// The transaction's settings (`SELECT set_config(..., true)`), run before the statement.
    pub settings: &'s Statement,
    /// The statement whose rows the transaction returns.
    pub statement: &'s Statement,
    /// [`sql::COMMIT`], prepared.
    pub commit: &'s Statement,
}

/// A statement run after the settings and before the main one, whose failure rolls the whole
/// transaction back (the cleanup lease's renewal, `crate::cleanup::Lease`).
#[derive(Clone, Copy)]
pub struct Guard<'s> {
    /// The prepared statement.
    pub statement: &'s Statement,
    /// Its parameters.
    pub params: &'s [&'s (dyn ToSql + Sync)],
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
}

impl Pipelined<'_> {
    /// Runs the transaction; the statement's rows.
    pub async fn query(
        self,
        client: &Client,
        settings: &[&(dyn ToSql + Sync)],
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, PipelineFailure> {
        self.run(client, settings, None, client.query(self.statement, params))
            .await
    }

    /// Runs the transaction; the statement's one row (any other count is an error, and the
    /// transaction was still committed or rolled back whole).
    pub async fn query_one(
        self,
        client: &Client,
        settings: &[&(dyn ToSql + Sync)],
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, PipelineFailure> {
        self.run(
            client,
            settings,
            None,
            client.query_one(self.statement, params),
        )
        .await
    }

    /// [`Pipelined::query_one`] with `guard` run between the settings and the statement: when
    /// the guard fails, that is the error, and nothing of the transaction applied.
    pub async fn query_one_guarded(
        self,
        client: &Client,
        settings: &[&(dyn ToSql + Sync)],
        guard: Guard<'_>,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, PipelineFailure> {
        self.run(
            client,
            settings,
            Some(guard),
            client.query_one(self.statement, params),
        )
        .await
    }

    /// `statement` is the main statement's request, not yet polled (so not yet sent).
    async fn run<T>(
        self,
        client: &Client,
        settings: &[&(dyn ToSql + Sync)],
        guard: Option<Guard<'_>>,
        statement: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, PipelineFailure> {
        // Polled (so sent) in its place, right after the settings; nothing without a guard.
        let guarded = async {
            match guard {
                Some(g) => client.execute(g.statement, g.params).await.map(Some),
                None => Ok(None),
            }
        };
        let (begin, set, guarded, main, commit) = tokio::join!(
            biased;
            client.execute(self.begin, &[]),
            client.execute(self.settings, settings),
            guarded,
            statement,
            client.execute(self.commit, &[]),
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

/// BEGIN, `settings`, `statement` and COMMIT prepared through the pool's statement cache (the
/// ones not cached yet in one round trip), in that order.
pub async fn prepare_cached(
    client: &ClientWrapper,
    settings: &str,
    statement: &str,
) -> Result<[Statement; 4], PipelineFailure> {
    let (begin, settings, statement, commit) = futures::try_join!(
        client.prepare_cached(sql::BEGIN_READ_COMMITTED),
        client.prepare_cached(settings),
        client.prepare_cached(statement),
        client.prepare_cached(sql::COMMIT),
    )
    .map_err(|error| PipelineFailure { error, sent: false })?;
    Ok([begin, settings, statement, commit])
}
