//! Operating the service: HTTP endpoints, the health they report, and the
//! `check` command.

pub mod check;
pub mod health;
pub mod http;
