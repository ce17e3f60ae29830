//! Who is acting, as other instances see it in the database: `<host>:<pid>:<8 random hex
//! digits>` — the outbox relay's `locked_by`, the cleanup lease's holder and the run history's
//! `instance`. The host and process say where to look; the random part tells apart two
//! identities of one process (two relays, or two cleanup runs in a row) and a restarted process
//! that got the same pid.

use uuid::Uuid;

/// A new identity: the host name, this process's id and a fresh random suffix.
pub fn instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    let suffix = Uuid::new_v4().simple().to_string();
    format!("{host}:{}:{}", std::process::id(), &suffix[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_identity_is_new_and_names_the_process() {
        let (a, b) = (instance_id(), instance_id());
        assert_ne!(a, b);
        assert!(a.contains(&format!(":{}:", std::process::id())), "{a}");
    }
}
