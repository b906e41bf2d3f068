//! What a request answers: one [`Reply`] per request kind, typed on both sides. On trapd's socket
//! a reply is `{"ok": true, ...}` with the variant's fields (the variant itself is not written:
//! the asker knows what it asked, and reads the reply back with [`Reply::from_fields`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::request::Request;
use super::{
    ApplyReport, CheckReport, HitsReply, Listing, Loaded, PendingRow, SpliceRow, Switched,
    Unloaded, Unrecorded, Unspliced, UnsplicedAll, Var,
};

/// The answer to a [`Request`], one variant per request kind.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Reply {
    Status(Status),
    List(ListReply),
    Hits(HitsReply),
    Load(Loaded),
    Unload(Unloaded),
    Splice(SpliceReply),
    Unsplice(UnspliceReply),
    Apply(ApplyReport),
    /// `apply` with `check`.
    Check(CheckReport),
    Set(Var),
    Get(Var),
    Activate(Activated),
    Require(Required),
}

/// What `splice` made: the splice, or (trapd) a pending point in a module that is not loaded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SpliceReply {
    Pending(PendingSplice),
    /// Boxed: a row is several times a pending point's size.
    Made(Box<SpliceRow>),
}

/// A splice trapd holds until its module loads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingSplice {
    /// Always true: what tells this reply from a made splice's.
    pub pending: bool,
    pub at: String,
    pub module: String,
}

/// What `unsplice` removed: one splice, every splice, or (trapd) a pending point forgotten.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum UnspliceReply {
    Pending(ForgotPending),
    All(UnsplicedAll),
    One(Unspliced),
}

/// A pending point forgotten, with the hits of all its loads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForgotPending {
    pub at: String,
    /// Always true.
    pub pending: bool,
    pub hits: u64,
}

/// The listing, and what trapd adds to it when it answers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ListReply {
    #[serde(flatten)]
    pub listing: Listing,
    #[serde(flatten)]
    pub daemon: Option<DaemonListing>,
}

/// trapd's part of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonListing {
    /// The active profile.
    pub profile: Option<String>,
    /// Dispatch entries live in the module that no stored state describes.
    pub unrecorded: Vec<Unrecorded>,
    /// Points in kernel modules that are not loaded (or were armed when one came).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Vec<PendingRow>>,
}

/// trapd's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub pid: u32,
    pub uptime_s: u64,
    pub profile: Option<String>,
    pub profiles: Vec<String>,
    pub switches: u64,
    pub splices: usize,
    pub components: usize,
    pub generation: u64,
    pub journal: PathBuf,
    /// How many dispatch entries the module lists that no stored state describes.
    pub unrecorded: usize,
    pub metrics: BTreeMap<String, f64>,
}

/// A profile switch: the profiles, and the [`Switched`] figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activated {
    pub profile: String,
    pub previous: Option<String>,
    #[serde(flatten)]
    pub switched: Switched,
}

/// A module whose load is refused when one of its pending points cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Required {
    pub require: String,
}

impl Reply {
    /// Read the fields of a reply to `request` back (as trapd sent them).
    pub fn from_fields(request: &Request, fields: serde_json::Value) -> serde_json::Result<Reply> {
        use serde_json::from_value as v;
        Ok(match request {
            Request::Status => Reply::Status(v(fields)?),
            Request::List => Reply::List(v(fields)?),
            Request::Hits { .. } => Reply::Hits(v(fields)?),
            Request::Load { .. } => Reply::Load(v(fields)?),
            Request::Unload { .. } => Reply::Unload(v(fields)?),
            Request::Splice(_) => Reply::Splice(v(fields)?),
            Request::Unsplice { .. } | Request::Remove { .. } => Reply::Unsplice(v(fields)?),
            Request::Apply { check: true, .. } => Reply::Check(v(fields)?),
            Request::Apply { .. } => Reply::Apply(v(fields)?),
            Request::Set { .. } => Reply::Set(v(fields)?),
            Request::Get { .. } => Reply::Get(v(fields)?),
            Request::Activate { .. } => Reply::Activate(v(fields)?),
            Request::Require { .. } => Reply::Require(v(fields)?),
        })
    }

    /// The reply's fields, as written on the wire after `"ok": true`.
    pub fn to_fields(&self) -> serde_json::Value {
        serde_json::to_value(self)
            .unwrap_or_else(|e| serde_json::json!({ "report": format!("unserializable: {e}") }))
    }

    /// The request kind this answers (its `op`).
    pub fn op(&self) -> &'static str {
        match self {
            Reply::Status(_) => "status",
            Reply::List(_) => "list",
            Reply::Hits(_) => "hits",
            Reply::Load(_) => "load",
            Reply::Unload(_) => "unload",
            Reply::Splice(_) => "splice",
            Reply::Unsplice(_) => "unsplice",
            Reply::Apply(_) | Reply::Check(_) => "apply",
            Reply::Set(_) => "set",
            Reply::Get(_) => "get",
            Reply::Activate(_) => "activate",
            Reply::Require(_) => "require",
        }
    }
}

/// A reply that is not the one its request asks for.
#[derive(Debug, thiserror::Error)]
#[error("a reply to `{got}` where `{wanted}` was expected")]
pub struct WrongReply {
    pub wanted: &'static str,
    pub got: &'static str,
}

/// `impl TryFrom<Reply> for T` for each report one variant carries.
macro_rules! reply_into {
    ($($t:ty => $want:literal: $($v:ident)|+;)*) => {$(
        impl TryFrom<Reply> for $t {
            type Error = WrongReply;
            fn try_from(r: Reply) -> Result<$t, WrongReply> {
                match r {
                    $(Reply::$v(x) => Ok(x),)+
                    other => Err(WrongReply { wanted: $want, got: other.op() }),
                }
            }
        }
    )*};
}

reply_into! {
    Status => "status": Status;
    ListReply => "list": List;
    HitsReply => "hits": Hits;
    Loaded => "load": Load;
    Unloaded => "unload": Unload;
    SpliceReply => "splice": Splice;
    UnspliceReply => "unsplice": Unsplice;
    ApplyReport => "apply": Apply;
    CheckReport => "apply (check)": Check;
    Var => "set or get": Set | Get;
    Activated => "activate": Activate;
    Required => "require": Require;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ops::{ComponentRow, Listing};
    use crate::{Action, Mechanism, SpliceRequest};

    fn unsplice(at: &str) -> Request {
        Request::Unsplice {
            at: Some(at.into()),
            all: false,
        }
    }

    #[test]
    fn pending_and_made_replies_are_told_apart_by_their_fields() {
        let splice = Request::Splice(SpliceRequest {
            at: "m:f".into(),
            action: Action::Count,
            mechanism: Mechanism::Trap,
            options: Default::default(),
        });
        let pending = json!({"pending": true, "at": "m:f", "module": "m"});
        let r = Reply::from_fields(&splice, pending.clone()).unwrap();
        assert!(matches!(&r, Reply::Splice(SpliceReply::Pending(p)) if p.module == "m"));
        assert_eq!(r.to_fields(), pending, "the wire form is unchanged");

        let forgot = json!({"at": "m:f", "pending": true, "hits": 4});
        let r = Reply::from_fields(&unsplice("m:f"), forgot.clone()).unwrap();
        assert!(matches!(&r, Reply::Unsplice(UnspliceReply::Pending(p)) if p.hits == 4));
        assert_eq!(r.to_fields(), forgot);
        let one = json!({"at": "f", "site": "0x10", "hits": 2, "missed": 0});
        let r = Reply::from_fields(&unsplice("f"), one.clone()).unwrap();
        assert!(matches!(&r, Reply::Unsplice(UnspliceReply::One(u)) if u.site == "0x10"));
        assert_eq!(r.to_fields(), one);
    }

    #[test]
    fn a_daemons_listing_keeps_its_fields_and_a_direct_one_has_none() {
        let listing = Listing {
            splices: Vec::new(),
            components: vec![ComponentRow {
                id: 1,
                name: "c".into(),
                path: None,
                crc32: "0x00000001".into(),
                code: "0x1000".into(),
                code_len: 16,
                data: "0x2000".into(),
                data_len: 8,
                imports: 0,
                refs: 0,
            }],
            retiring: Vec::new(),
        };
        let direct = Reply::List(ListReply {
            listing: listing.clone(),
            daemon: None,
        });
        let fields = direct.to_fields();
        assert!(fields.get("profile").is_none() && fields.get("unrecorded").is_none());
        assert_eq!(Reply::from_fields(&Request::List, fields).unwrap(), direct);

        let daemon = Reply::List(ListReply {
            listing,
            daemon: Some(DaemonListing {
                profile: None,
                unrecorded: Vec::new(),
                pending: None,
            }),
        });
        let fields = daemon.to_fields();
        assert_eq!(fields["profile"], json!(null));
        assert_eq!(fields["unrecorded"], json!([]));
        assert!(fields.get("pending").is_none());
        assert_eq!(Reply::from_fields(&Request::List, fields).unwrap(), daemon);
    }

    #[test]
    fn a_reply_of_another_kind_is_refused_naming_both() {
        let var = Reply::Get(Var {
            symbol: "v".into(),
            value: 3,
            size: 8,
        });
        assert_eq!(Var::try_from(var.clone()).unwrap().value, 3);
        let e = Loaded::try_from(var).unwrap_err();
        assert_eq!(e.to_string(), "a reply to `get` where `load` was expected");
    }
}
