//! What the tests and the benchmark need on top of `tombstoned::pg_cluster` (which the demo
//! uses too): connection strings for the databases they create on a server.

/// A libpq key=value connection string for `server`'s host, port and credentials on database
/// `dbname` (tokio-postgres, libpq tools such as pgbench, and `TOMBSTONED_DATABASE_URL` all
/// accept it).
pub fn conninfo_for_database(server: &tokio_postgres::Config, dbname: &str) -> String {
    use tokio_postgres::config::Host;
    let mut parts = Vec::new();
    if let Some(host) = server.get_hosts().first() {
        match host {
            Host::Tcp(h) => parts.push(format!("host={h}")),
            Host::Unix(p) => parts.push(format!("host={}", p.display())),
        }
    }
    if let Some(port) = server.get_ports().first() {
        parts.push(format!("port={port}"));
    }
    if let Some(user) = server.get_user() {
        parts.push(format!("user={user}"));
    }
    if let Some(pw) = server.get_password() {
        parts.push(format!("password={}", String::from_utf8_lossy(pw)));
    }
    parts.push(format!("dbname={dbname}"));
    parts.join(" ")
}
