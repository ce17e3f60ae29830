# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_tombstoned_global_optspecs
    string join \n config= log-format= h/help V/version
end

function __fish_tombstoned_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_tombstoned_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_tombstoned_using_subcommand
    set -l cmd (__fish_tombstoned_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c tombstoned -n "__fish_tombstoned_needs_command" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_needs_command" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -s V -l version -d 'Print version'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "serve" -d 'Run the daemon: cleanup scheduler, HTTP API and metrics'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "cleanup" -d 'Run one cleanup pass now, then exit'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "migrate" -d 'Apply pending schema migrations, or list applied and pending ones'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "check-config" -d 'Validate the configuration and print the next 5 cleanup fire times'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "status" -d 'Show the cleanup lease, the last runs, the backlog and replication lag; a monitoring check'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "demo" -d 'Start a throwaway PostgreSQL and the daemon, and walk through the protocol step by step'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "outbox" -d 'Deliver outbox events as webhooks now, list undelivered ones, requeue dead letters'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "keys" -d 'Inspect idempotency keys: why a key answers what it answers'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "conformance" -d 'Check that an HTTP endpoint keeps the idempotency contract: nine checks, one line each'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "operations" -d 'Grant operations of the SQL API to database roles, revoke them, list them and their history (with the configuration of the role that ran `migrate`)'
complete -c tombstoned -n "__fish_tombstoned_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand serve" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand serve" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand serve" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand cleanup" -l batch-size -d 'Rows per batch (overrides cleanup.batch_size)' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand cleanup" -l max-batches -d 'Stop after this many batches; the backlog left is reported' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand cleanup" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand cleanup" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand cleanup" -l dry-run -d 'Change nothing: report what a run would do, inside a READ ONLY transaction'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand cleanup" -l json -d 'Print the report as JSON'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand cleanup" -l explain -d 'With --dry-run: also print the plan of the batch query (EXPLAIN)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand cleanup" -l quiet -d 'No progress line on a terminal (there is none anyway when stderr is not a terminal, with --json, or under systemd)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand cleanup" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand migrate" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand migrate" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand migrate" -l status -d 'List applied and pending migrations; change nothing'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand migrate" -l quiet -d 'No progress line on a terminal while a migration runs (there is none anyway when stderr is not a terminal, or under systemd)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand migrate" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand check-config" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand check-config" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand check-config" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand status" -l max-age -d 'Exit 2 when the last successful cleanup run finished longer ago than this (or none is recorded), e.g. "2h"' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand status" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand status" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand status" -l json -d 'Print the status as JSON'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand demo" -l replay-window -d 'The daemon\'s replay window (retention.replay_window), 1s to 1h; the story waits that long for the record to expire. With --keep, e.g. 60s, long enough to follow the README\'s curl walkthrough by hand against the daemon left running' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand demo" -l config -d 'Refused (exit 64): the demo writes its own configuration' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand demo" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand demo" -l keep -d 'Leave the throwaway cluster and daemon running at the end (until Ctrl-C)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand demo" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and not __fish_seen_subcommand_from deliver list requeue help" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and not __fish_seen_subcommand_from deliver list requeue help" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and not __fish_seen_subcommand_from deliver list requeue help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and not __fish_seen_subcommand_from deliver list requeue help" -f -a "deliver" -d 'Deliver the events due now (each at most once), then exit. Works whether or not outbox.enabled is set; needs outbox.endpoint and outbox.secret_file'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and not __fish_seen_subcommand_from deliver list requeue help" -f -a "list" -d 'List undelivered events (pending and dead letters), oldest first'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and not __fish_seen_subcommand_from deliver list requeue help" -f -a "requeue" -d 'Put dead letters back into delivery (due now, attempts counted from zero)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and not __fish_seen_subcommand_from deliver list requeue help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from deliver" -l max-events -d 'Attempt at most this many events' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from deliver" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from deliver" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from deliver" -l dry-run -d 'Send nothing and change nothing: list what a run would send now'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from deliver" -l json -d 'Print the report as JSON'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from deliver" -l quiet -d 'No progress line on a terminal (there is none anyway when stderr is not a terminal, with --json, or under systemd)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from deliver" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from list" -l limit -d 'At most this many events' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from list" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from list" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from list" -l dead-letters -d 'Only dead letters'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from list" -l json -d 'Print JSON'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from requeue" -l event -d 'A dead letter\'s event id (the webhook-id); repeat for several' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from requeue" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from requeue" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from requeue" -l all-dead-letters -d 'Every dead letter'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from requeue" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from help" -f -a "deliver" -d 'Deliver the events due now (each at most once), then exit. Works whether or not outbox.enabled is set; needs outbox.endpoint and outbox.secret_file'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from help" -f -a "list" -d 'List undelivered events (pending and dead letters), oldest first'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from help" -f -a "requeue" -d 'Put dead letters back into delivery (due now, attempts counted from zero)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand outbox; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and not __fish_seen_subcommand_from explain help" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and not __fish_seen_subcommand_from explain help" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and not __fish_seen_subcommand_from explain help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and not __fish_seen_subcommand_from explain help" -f -a "explain" -d 'Why a key answers what it answers: its record and state, the stored status and resource, whether an intent matches it, and which open transaction holds it. Read-only: it takes no lock a claim or the cleaner could wait for. Exit 0 when the key has a record, 3 when it has none'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and not __fish_seen_subcommand_from explain help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from explain" -l tenant -d 'The scope\'s tenant' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from explain" -l principal -d 'The scope\'s principal' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from explain" -l operation -d 'The scope\'s operation (create-order is the endpoint\'s)' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from explain" -l key -d 'The idempotency key' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from explain" -l intent -d 'An intent to compare with the stored fingerprint: for create-order the order request body, for another operation the SQL API\'s intent (JSON)' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from explain" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from explain" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from explain" -l show-body -d 'Also print the stored response body (it says it is showing one)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from explain" -l json -d 'Print the explanation as JSON'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from explain" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from help" -f -a "explain" -d 'Why a key answers what it answers: its record and state, the stored status and resource, whether an intent matches it, and which open transaction holds it. Read-only: it takes no lock a claim or the cleaner could wait for. Exit 0 when the key has a record, 3 when it has none'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand keys; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l body -d 'The request (JSON). {{uuid}} in it is replaced by a fresh UUID per key, the same in every request with that key: give the business id that way, e.g. \'{"request_id": "{{uuid}}", ...}\'' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l other-body -d 'Another intent for the same endpoint (JSON, the same placeholders), e.g. the request with another amount' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l method -d 'The method of every request' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l header -d 'A header sent with every request, e.g. \'Authorization: Bearer ...\' (repeatable). Its value is a credential: [redacted] in --json' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l other-principal-header -d 'Credentials of another principal of the same tenant for scoped, replacing the --header of the same name (repeatable; [redacted] in --json). Without it, scoped is skipped' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l key-header -d 'The idempotency key\'s header' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l concurrency -d 'How many requests concurrent sends at once, 2 to 32' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l expiry -d 'How long after its first answer a key is answered 410 at the latest (the replay window plus the cleanup\'s delay), e.g. 30s, at most 1h; expired asks about once a second until then. Without it, expired is skipped' -r
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l key-optional -d 'The service answers requests without a key: missing_key is skipped, provided such a request gets a first answer'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -l json -d 'Print one JSON document instead: every check with its name, result, expected, got and requests (credentials [redacted]), and the summary'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand conformance" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and not __fish_seen_subcommand_from grant revoke list help" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and not __fish_seen_subcommand_from grant revoke list help" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and not __fish_seen_subcommand_from grant revoke list help" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and not __fish_seen_subcommand_from grant revoke list help" -f -a "grant" -d 'Let ROLE (and every role that is a member of it) claim, complete and look up keys in OPERATION, and enqueue events. Recorded with who and when'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and not __fish_seen_subcommand_from grant revoke list help" -f -a "revoke" -d 'Take OPERATION away from ROLE (\'*\': the transitional grant of every operation but create-order that the upgrade to schema V8 gave). Effective from the role\'s next transaction, on connections already open too. Recorded with who and when'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and not __fish_seen_subcommand_from grant revoke list help" -f -a "list" -d 'The grants in force and the history of every change'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and not __fish_seen_subcommand_from grant revoke list help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from grant" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from grant" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from grant" -l force -d 'Needed for create-order, the operation of tombstoned\'s own endpoint, reserved to the daemon\'s role'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from grant" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from revoke" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from revoke" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from revoke" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from list" -l config -d 'Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply' -r -F
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from list" -l log-format -d 'Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced request or run (`[tracing]`), a line also carries its trace_id and span_id' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from list" -l json -d 'Print JSON'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from help" -f -a "grant" -d 'Let ROLE (and every role that is a member of it) claim, complete and look up keys in OPERATION, and enqueue events. Recorded with who and when'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from help" -f -a "revoke" -d 'Take OPERATION away from ROLE (\'*\': the transitional grant of every operation but create-order that the upgrade to schema V8 gave). Effective from the role\'s next transaction, on connections already open too. Recorded with who and when'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from help" -f -a "list" -d 'The grants in force and the history of every change'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand operations; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "serve" -d 'Run the daemon: cleanup scheduler, HTTP API and metrics'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "cleanup" -d 'Run one cleanup pass now, then exit'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "migrate" -d 'Apply pending schema migrations, or list applied and pending ones'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "check-config" -d 'Validate the configuration and print the next 5 cleanup fire times'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "status" -d 'Show the cleanup lease, the last runs, the backlog and replication lag; a monitoring check'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "demo" -d 'Start a throwaway PostgreSQL and the daemon, and walk through the protocol step by step'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "outbox" -d 'Deliver outbox events as webhooks now, list undelivered ones, requeue dead letters'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "keys" -d 'Inspect idempotency keys: why a key answers what it answers'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "conformance" -d 'Check that an HTTP endpoint keeps the idempotency contract: nine checks, one line each'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "operations" -d 'Grant operations of the SQL API to database roles, revoke them, list them and their history (with the configuration of the role that ran `migrate`)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and not __fish_seen_subcommand_from serve cleanup migrate check-config status demo outbox keys conformance operations help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and __fish_seen_subcommand_from outbox" -f -a "deliver" -d 'Deliver the events due now (each at most once), then exit. Works whether or not outbox.enabled is set; needs outbox.endpoint and outbox.secret_file'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and __fish_seen_subcommand_from outbox" -f -a "list" -d 'List undelivered events (pending and dead letters), oldest first'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and __fish_seen_subcommand_from outbox" -f -a "requeue" -d 'Put dead letters back into delivery (due now, attempts counted from zero)'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and __fish_seen_subcommand_from keys" -f -a "explain" -d 'Why a key answers what it answers: its record and state, the stored status and resource, whether an intent matches it, and which open transaction holds it. Read-only: it takes no lock a claim or the cleaner could wait for. Exit 0 when the key has a record, 3 when it has none'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and __fish_seen_subcommand_from operations" -f -a "grant" -d 'Let ROLE (and every role that is a member of it) claim, complete and look up keys in OPERATION, and enqueue events. Recorded with who and when'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and __fish_seen_subcommand_from operations" -f -a "revoke" -d 'Take OPERATION away from ROLE (\'*\': the transitional grant of every operation but create-order that the upgrade to schema V8 gave). Effective from the role\'s next transaction, on connections already open too. Recorded with who and when'
complete -c tombstoned -n "__fish_tombstoned_using_subcommand help; and __fish_seen_subcommand_from operations" -f -a "list" -d 'The grants in force and the history of every change'
