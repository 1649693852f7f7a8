//! Operating the service: HTTP endpoints and the `check` command.

pub mod check;
pub mod http;
