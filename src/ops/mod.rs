//! Operating the running service: its HTTP endpoints and the health they
//! report. The operator's commands are in [`crate::admin`].

pub mod health;
pub mod http;
