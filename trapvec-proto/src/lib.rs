//! trapvec-proto: what trapvec's front ends (`trapctl`, `trapd`) share, so that neither links
//! the other: the socket [`protocol`] (the reply envelope, the longest line; the request type
//! itself re-exported), the [`client`] (the other end of trapd's socket), the Prometheus
//! [`exposition`] both render (trapd's `GET /metrics`, `trapctl list --prometheus`), the
//! [`docs`] of both CLIs (completions, man pages), and trapd's socket [`server`] (trapctl's
//! tests run a fake daemon behind it).
//!
//! Layering: `Request` and the typed replies live in `instr_manager::ops` (the operations
//! layer), not here. Their fields are the operations layer's own types (a splice request, a
//! variable's value, the reports), and the one executor, `instr_manager::ops::execute`, must
//! see them; defining them here would make instr-manager depend on this crate and this crate
//! on instr-manager's types. So this crate depends on instr-manager and re-exports them. What
//! this crate must never do: run an operation, touch a target, or hold daemon state.

pub mod client;
pub mod docs;
pub mod exposition;
pub mod protocol;
pub mod server;

pub use protocol::{BadRequest, Reply, Request};
