//! What `trapctl` and `trapd` share: the operations on a running system ([`ops`], written once
//! and offered by both), trapd's request protocol ([`protocol`]) and its client side
//! ([`client`]), through which `trapctl` goes when a daemon is running; and the Prometheus
//! exposition both render ([`prometheus`]); their completions and man pages ([`docs`]).

pub mod client;
pub mod docs;
pub mod ops;
pub mod prometheus;
pub mod protocol;
