//! What `trapctl` and `trapd` share besides the operations themselves (`instr_manager::ops`,
//! which both run): trapd's request protocol ([`protocol`]) and its client side ([`client`]),
//! through which `trapctl` goes when a daemon is running.

pub mod client;
pub mod protocol;
