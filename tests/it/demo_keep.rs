//! `demo --keep --replay-window D` leaves a daemon whose replay window is D, and says how to
//! point the README's curl walkthrough at it (issue 27, friction: the walkthrough needs a window
//! long enough to follow by hand): a line a shell takes whole, as soon as the daemon is up
//! (issue 42); its last line says what was timed.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

#[tokio::test]
async fn demo_keep_runs_the_daemon_with_the_replay_window_asked_for() {
    // Up to the keep notice's last line: the story ran through.
    let (child, printed, stdout) =
        crate::demo::demo_until(&["--keep", "--replay-window", "3s"], "Press Ctrl-C").await;
    assert!(
        printed.contains("(3s replay window, cleanup every 2 s)"),
        "{printed}"
    );
    assert!(printed.contains("replay_window = \"3s\""), "{printed}");
    // The `export API=` line comes as soon as the daemon is up, before the story's first request
    // (issue 42), and again in the keep notice; each is a line a shell takes whole.
    let exports: Vec<(usize, &str)> = printed
        .lines()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with("export API="))
        .collect();
    let story_starts = printed
        .lines()
        .position(|l| l.starts_with("[3/10]"))
        .unwrap_or_else(|| panic!("no step 3:\n{printed}"));
    assert!(
        exports.len() == 2 && exports[0].0 < story_starts && exports[1].0 > story_starts,
        "one `export API=` line before step 3 and one in the notice:\n{printed}"
    );
    let pasted = |line: &str| {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("{line}\nprintf %s \"$API\""))
            .env_clear()
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{line}: {out:?}"
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let api = pasted(exports[0].1);
    assert!(api.starts_with("http://127.0.0.1:"), "{api}");
    assert_eq!(pasted(exports[1].1), api);

    // The walkthrough's first step, with a key of its own, against the kept daemon.
    let key = format!("demo-keep-{}", std::process::id());
    let http = reqwest::Client::new();
    let created = http
        .post(format!("{api}/v1/orders"))
        .bearer_auth("example-acme-alice-token")
        .header("Idempotency-Key", &key)
        .json(&serde_json::json!({
            "request_id": key, "amount": "100.00", "item": "SKU-42", "recipient": "Li Wei"
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let status: Value = http
        .get(format!("{api}/v1/idempotency-keys/{key}"))
        .bearer_auth("example-acme-alice-token")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let at = |field: &str| {
        chrono::DateTime::parse_from_rfc3339(status[field].as_str().unwrap()).unwrap()
    };
    assert_eq!(
        (at("replay_deadline") - at("created_at")).num_milliseconds(),
        3000,
        "{status}"
    );

    let (code, rest, stderr) = crate::demo::signal_and_wait(child, stdout, &[Signal::SIGINT]).await;
    assert_eq!(code, Some(0), "{rest}\n{stderr}");
    // What was timed: the story, then the time the daemon stayed up, each named.
    assert!(
        rest.contains("Done: the story took ")
            && rest.contains(" s, then the daemon stayed up ")
            && rest.contains(" s until the signal."),
        "{rest}"
    );
    // Gone with the demo.
    assert!(
        tokio::time::timeout(
            Duration::from_secs(2),
            http.get(format!("{api}/v1/orders/x")).send()
        )
        .await
        .map_or(true, |r| r.is_err()),
        "the API still answers after the demo ended"
    );
}
