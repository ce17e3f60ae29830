//! Sending a statement: its text with the schema named ([`super::sql::qualify`]), its parameters
//! with their PostgreSQL types ([`Param`]), and — per `database.pooler` — as a named prepared
//! statement kept for the connection, or as an unnamed one.
//!
//! An unnamed statement is tokio-postgres's `query_typed`: Parse (unnamed), Bind, Describe,
//! Execute and Sync in one message, one round trip, nothing left on the server connection, so it
//! works through a transaction-mode pooler (PgBouncer 1.18 included, which keeps no prepared
//! statements in that mode). It needs every parameter's type up front: [`Param`] gives it from
//! the Rust type. The same types are given when a statement is prepared, so both ways mean the
//! same SQL.
//!
//! Named statements are used only where they pay, and never through a transaction pooler
//! ([`Pooler::keeps_prepared_statements`]): on the API's pooled connections, each statement
//! prepared once per connection and kept with it ([`Conn::pooled`], [`super::pooled`]); and where a caller keeps a
//! statement for many executions on its own session ([`Conn::prepare`]: a cleanup run's batch
//! statements). Anything else is sent unnamed — one round trip, where preparing a statement to
//! run it once costs two and a third message to close it.
//!
//! tokio-postgres prepares nothing behind our back: the only statement it prepares itself is its
//! type lookup, and only for a column or parameter type that is not built in. Every column and
//! parameter tombstoned uses is a built-in type (text, integers, bool, bytea, uuid, uuid[],
//! timestamptz, int4[], float8[], jsonb); the pooler tests check `pg_prepared_statements` on every server connection.

use super::pooled::{PooledSession, Prepared, SessionSettings};
use chrono::{DateTime, Utc};
use futures::TryStreamExt as _;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement};
use uuid::Uuid;

use super::pooler::Pooler;
use super::sql::qualify;

/// A Rust type's PostgreSQL type, as its parameters are sent (text for strings, jsonb for JSON).
pub trait PgType {
    /// The type.
    fn pg_type() -> Type;
}

macro_rules! pg_types {
    ($($rust:ty => $pg:ident),* $(,)?) => {
        $(impl PgType for $rust {
            fn pg_type() -> Type {
                Type::$pg
            }
        })*
    };
}

pg_types! {
    str => TEXT,
    String => TEXT,
    bool => BOOL,
    i16 => INT2,
    i32 => INT4,
    i64 => INT8,
    f64 => FLOAT8,
    Vec<i32> => INT4_ARRAY,
    Vec<f64> => FLOAT8_ARRAY,
    [u8] => BYTEA,
    Vec<u8> => BYTEA,
    Uuid => UUID,
    [Uuid] => UUID_ARRAY,
    Vec<Uuid> => UUID_ARRAY,
    DateTime<Utc> => TIMESTAMPTZ,
    serde_json::Value => JSONB,
}

impl<T: PgType + ?Sized> PgType for &T {
    fn pg_type() -> Type {
        T::pg_type()
    }
}

impl<T: PgType> PgType for Option<T> {
    fn pg_type() -> Type {
        T::pg_type()
    }
}

/// A statement parameter: a value that knows the PostgreSQL type it is sent as. Implemented for
/// every [`PgType`] that tokio-postgres can send.
pub trait Param: Sync {
    /// The type it is sent as.
    fn param_type(&self) -> Type;
    /// The value, for the driver.
    fn as_sql(&self) -> &(dyn ToSql + Sync);
}

impl<T: PgType + ToSql + Sync> Param for T {
    fn param_type(&self) -> Type {
        T::pg_type()
    }

    fn as_sql(&self) -> &(dyn ToSql + Sync) {
        self
    }
}

/// The types of `params`, in order.
pub fn types_of(params: &[&dyn Param]) -> Vec<Type> {
    params.iter().map(|p| p.param_type()).collect()
}

/// How statements are sent on one session.
#[derive(Clone, Copy)]
enum Naming<'a> {
    /// Every statement unnamed.
    Unnamed,
    /// Unnamed, except what the caller prepares to keep ([`Conn::prepare`]).
    PrepareOnRequest,
    /// Every statement prepared once per connection and kept with it.
    Cached(&'a Prepared),
}

/// A session, the schema its statements name, and how statements are sent on it (see the module
/// documentation). Cheap to copy.
#[derive(Clone, Copy)]
pub struct Conn<'a> {
    client: &'a Client,
    schema: &'a str,
    pooler: Pooler,
    naming: Naming<'a>,
    /// The pooled session, when it may carry settings session-wide (not through a transaction
    /// pooler).
    session: Option<&'a PooledSession>,
}

impl<'a> Conn<'a> {
    /// A connection of the API's pool: statements prepared once per connection and kept with it,
    /// or, through a transaction pooler, unnamed.
    pub fn pooled(session: &'a PooledSession, schema: &'a str, pooler: Pooler) -> Self {
        let naming = if pooler.keeps_prepared_statements() {
            Naming::Cached(session.prepared())
        } else {
            Naming::Unnamed
        };
        Conn {
            client: session,
            schema,
            pooler,
            naming,
            session: pooler.keeps_session_state().then_some(session),
        }
    }

    /// A dedicated session: statements unnamed, except those the caller prepares to keep for
    /// the session ([`Conn::prepare`]), which are named unless the pooler forbids it.
    pub fn dedicated(client: &'a Client, schema: &'a str, pooler: Pooler) -> Self {
        let naming = if pooler.keeps_prepared_statements() {
            Naming::PrepareOnRequest
        } else {
            Naming::Unnamed
        };
        Conn {
            client,
            schema,
            pooler,
            naming,
            session: None,
        }
    }

    /// The driver's client.
    pub fn client(&self) -> &'a Client {
        self.client
    }

    /// The schema statements name.
    pub fn schema(&self) -> &'a str {
        self.schema
    }

    /// What sits between this session and PostgreSQL (a caller that has a choice of statement
    /// texts picks by it: the claim, `crate::claim::sql::claim_and_create`).
    pub fn pooler(&self) -> Pooler {
        self.pooler
    }

    /// Makes the session carry `settings` session-wide ([`PooledSession::carry`]: usually a
    /// comparison). `false`: this session carries nothing between statements — a dedicated
    /// session, or any through a transaction pooler — and the caller sets what it needs inside
    /// its transaction instead.
    pub async fn carry(&self, settings: SessionSettings) -> Result<bool, tokio_postgres::Error> {
        match self.session {
            Some(session) => session.carry(settings).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// `template` with the schema named: the text sent.
    pub fn text(&self, template: &'static str) -> &'static str {
        qualify(template, self.schema)
    }

    /// `template` ready to run once or a few times on this connection: from the connection's
    /// cache (prepared on first use), or unnamed.
    pub async fn ready(
        &self,
        template: &'static str,
        types: &[Type],
    ) -> Result<Ready, tokio_postgres::Error> {
        let text = self.text(template);
        match self.naming {
            Naming::Cached(prepared) => Ok(Ready::named(
                text,
                prepared.get_or_prepare(self.client, text, types).await?,
            )),
            Naming::Unnamed | Naming::PrepareOnRequest => Ok(Ready::unnamed(text, types)),
        }
    }

    /// [`Conn::ready`] for these parameters' types: on a session that keeps its statements, a
    /// statement already prepared is found without collecting the types (every claim's case).
    async fn ready_for(
        &self,
        template: &'static str,
        params: &[&dyn Param],
    ) -> Result<Ready, tokio_postgres::Error> {
        if let Naming::Cached(prepared) = self.naming {
            let text = self.text(template);
            let same_types = |kept: &[Type]| {
                kept.len() == params.len()
                    && kept.iter().zip(params).all(|(t, p)| *t == p.param_type())
            };
            if let Some(statement) = prepared.find_matching(text, same_types) {
                return Ok(Ready::named(text, statement));
            }
        }
        self.ready(template, &types_of(params)).await
    }

    /// `template` prepared to be run many times on this session (the caller keeps it): a named
    /// statement, or through a transaction pooler an unnamed one sent whole each time.
    pub async fn prepare(
        &self,
        template: &'static str,
        types: &[Type],
    ) -> Result<Ready, tokio_postgres::Error> {
        let text = self.text(template);
        match self.naming {
            Naming::PrepareOnRequest => Ok(Ready::named(
                text,
                self.client.prepare_typed(text, types).await?,
            )),
            Naming::Cached(_) | Naming::Unnamed => self.ready(template, types).await,
        }
    }

    /// Runs `text`, already rendered (no `{schema}` marker left), with `params`, always as an
    /// unnamed statement: for text built at run time (`EXPLAIN <statement>`).
    pub async fn query_rendered(
        &self,
        text: &str,
        params: &[&dyn Param],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let typed: Vec<_> = params
            .iter()
            .map(|p| (p.as_sql(), p.param_type()))
            .collect();
        self.client.query_typed(text, &typed).await
    }

    /// Runs `template` with `params`; its rows.
    pub async fn query(
        &self,
        template: &'static str,
        params: &[&dyn Param],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let ready = self.ready_for(template, params).await?;
        ready.query(self.client, params).await
    }

    /// Runs `template`; its one row (any other count is an error).
    pub async fn query_one(
        &self,
        template: &'static str,
        params: &[&dyn Param],
    ) -> Result<Row, tokio_postgres::Error> {
        let ready = self.ready_for(template, params).await?;
        ready.query_one(self.client, params).await
    }

    /// Runs `template`; its row, if any (more than one is an error).
    pub async fn query_opt(
        &self,
        template: &'static str,
        params: &[&dyn Param],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        let ready = self.ready_for(template, params).await?;
        ready.query_opt(self.client, params).await
    }

    /// Runs `template`; the number of rows it changed.
    pub async fn execute(
        &self,
        template: &'static str,
        params: &[&dyn Param],
    ) -> Result<u64, tokio_postgres::Error> {
        let ready = self.ready_for(template, params).await?;
        ready.execute(self.client, params).await
    }
}

/// A statement ready to send: prepared (named) on its session, or its text and parameter types
/// sent unnamed each time. Each method sends its messages when first polled, which is what
/// pipelining relies on ([`super::pipeline`]).
#[derive(Debug, Clone)]
pub struct Ready {
    text: &'static str,
    form: Form,
}

/// How a [`Ready`] statement is sent.
#[derive(Debug, Clone)]
enum Form {
    /// Prepared on its session (it knows its parameter types).
    Named(Statement),
    /// Sent whole each time, with these parameter types.
    Unnamed(Vec<Type>),
}

impl Ready {
    fn named(text: &'static str, statement: Statement) -> Self {
        Ready {
            text,
            form: Form::Named(statement),
        }
    }

    fn unnamed(text: &'static str, types: &[Type]) -> Self {
        Ready {
            text,
            form: Form::Unnamed(types.to_vec()),
        }
    }

    /// The text sent (or prepared).
    pub fn text(&self) -> &'static str {
        self.text
    }

    /// Whether this is a named prepared statement.
    pub fn is_named(&self) -> bool {
        matches!(self.form, Form::Named(_))
    }

    /// The parameters as the driver takes them for an unnamed statement, each with its type (the
    /// declared one; the value's own for any beyond, which the server then refuses by count).
    fn typed<'p>(types: &[Type], params: &[&'p dyn Param]) -> Vec<(&'p (dyn ToSql + Sync), Type)> {
        params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let ty = types.get(i).cloned().unwrap_or_else(|| p.param_type());
                (p.as_sql(), ty)
            })
            .collect()
    }

    fn values<'p>(params: &[&'p dyn Param]) -> Vec<&'p (dyn ToSql + Sync)> {
        params.iter().map(|p| p.as_sql()).collect()
    }

    /// Runs it; its rows.
    pub async fn query(
        &self,
        client: &Client,
        params: &[&dyn Param],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match &self.form {
            // The values straight from `params`: the driver's `query` would want them collected.
            Form::Named(statement) => {
                client
                    .query_raw(statement, params.iter().map(|p| p.as_sql()))
                    .await?
                    .try_collect()
                    .await
            }
            Form::Unnamed(types) => {
                client
                    .query_typed(self.text, &Self::typed(types, params))
                    .await
            }
        }
    }

    /// Runs it; its one row.
    pub async fn query_one(
        &self,
        client: &Client,
        params: &[&dyn Param],
    ) -> Result<Row, tokio_postgres::Error> {
        match &self.form {
            Form::Named(statement) => client.query_one(statement, &Self::values(params)).await,
            Form::Unnamed(types) => {
                client
                    .query_typed_one(self.text, &Self::typed(types, params))
                    .await
            }
        }
    }

    /// Runs it; its row, if any.
    pub async fn query_opt(
        &self,
        client: &Client,
        params: &[&dyn Param],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        match &self.form {
            Form::Named(statement) => client.query_opt(statement, &Self::values(params)).await,
            Form::Unnamed(types) => {
                client
                    .query_typed_opt(self.text, &Self::typed(types, params))
                    .await
            }
        }
    }

    /// Runs it; the number of rows it changed.
    pub async fn execute(
        &self,
        client: &Client,
        params: &[&dyn Param],
    ) -> Result<u64, tokio_postgres::Error> {
        match &self.form {
            Form::Named(statement) => {
                client
                    .execute_raw(statement, params.iter().map(|p| p.as_sql()))
                    .await
            }
            Form::Unnamed(types) => {
                client
                    .execute_typed(self.text, &Self::typed(types, params))
                    .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_carry_the_type_their_rust_type_maps_to() {
        let text = "k";
        let owned = String::from("k");
        let bytes: &[u8] = &[1, 2];
        let none: Option<DateTime<Utc>> = None;
        let ids = vec![Uuid::nil()];
        let params: [&dyn Param; 8] = [
            &text,
            &owned,
            &1_i64,
            &2_i32,
            &bytes,
            &none,
            &ids,
            &Some(serde_json::json!({})),
        ];
        assert_eq!(
            types_of(&params),
            [
                Type::TEXT,
                Type::TEXT,
                Type::INT8,
                Type::INT4,
                Type::BYTEA,
                Type::TIMESTAMPTZ,
                Type::UUID_ARRAY,
                Type::JSONB
            ]
        );
    }
}
