//! What both doors, the HTTP API and the page service, stand on.

pub mod auth;
