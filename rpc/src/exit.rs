//! How a service binary ends: status 0, 2 for a configuration it refuses (as clap does for a bad
//! flag: nothing was started, fix the flags), 1 for a failure while it ran (a backend it could
//! not reach, a port it could not bind, a server that stopped). Statuses a command documents on
//! its own (`selector-svc reencrypt`, docs/SECURITY.md) are given as one of these two.

use std::process::ExitCode;

/// Why a binary stops with an error; the message goes to stderr after the program's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Refused before anything ran: exit status 2.
    Config(String),
    /// Failed while running: exit status 1.
    Runtime(String),
}

impl Failure {
    pub fn code(&self) -> u8 {
        match self {
            Failure::Config(_) => 2,
            Failure::Runtime(_) => 1,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Failure::Config(message) | Failure::Runtime(message) => message,
        }
    }
}

/// The exit status of `result`, the error printed as `<program>: <message>`.
pub fn report(program: &str, result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{program}: {}", failure.message());
            ExitCode::from(failure.code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_configuration_is_2_and_a_runtime_failure_is_1() {
        assert_eq!(Failure::Config("--redis-url: bad".into()).code(), 2);
        assert_eq!(Failure::Runtime("postgres: refused".into()).code(), 1);
    }
}
