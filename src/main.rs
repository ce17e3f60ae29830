//! The `tombstoned` binary: everything lives in the library; see `tombstoned::cli`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    tombstoned::cli::main()
}
