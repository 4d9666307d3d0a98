//! What both doors, the HTTP API (`http`) and the page service (`grpc`), stand on, so that
//! each door only translates: its wire format in, a call here, its wire format out.
//!
//! - [`read`]: the read path, one recipe for every read either door serves (the timeline,
//!   the wait for the LSN, the read in place or on the blocking pool, its cost);
//! - [`work`]: where a request's storage work runs (the blocking pool, or a thread of its own);
//! - [`error`]: what went wrong, as a transport-neutral [`error::ErrorKind`] that each door
//!   maps once to its statuses;
//! - [`auth`]: the JWT verifier and the rule of what each scope grants;
//! - [`connections`]: the connection cap both doors' connections count against;
//! - [`socket`]: the forwarding that the doors' socket wrappers share.
//!
//! Nothing here knows HTTP or gRPC; neither door imports the other.

pub mod auth;
pub mod connections;
pub mod error;
pub mod read;
pub mod socket;
pub mod work;
