//! What the commands that talk to a running page server share: where it is (`--endpoint`,
//! `--grpc-endpoint`), which timeline (`--tenant`, `--timeline`), as whom (`--token` or
//! `PAGECTL_TOKEN`), and at which LSN a read or a snapshot is taken.
//!
//! Every one of these is parsed by clap when the command line is read, so a malformed value is
//! a usage error (exit code 2) naming the option, before anything is sent: an id that is not 32
//! hex digits never reaches a URL, and an endpoint that pagectl cannot talk to (not `http://`,
//! with a path, without a host) is refused as written.
//!
//! An endpoint's host may be a name, an IPv4 address or a bracketed IPv6 address
//! (`http://[::1]:9898`): the brackets belong to the URL and the `Host` header, not to the
//! address connected to.

use std::fmt;
use std::str::FromStr;

use clap::Args;
use utils::{Lsn, TenantId, TimelineId};

/// An `http://host[:port]` endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The host to connect to: a name or an address, an IPv6 one without its brackets.
    host: String,
    port: u16,
    /// `host:port` as a URL and the `Host` header write it (an IPv6 address in brackets).
    authority: String,
}

impl Endpoint {
    /// Where to connect: `(host, port)`, which `ToSocketAddrs` resolves or parses.
    pub fn socket(&self) -> (&str, u16) {
        (&self.host, self.port)
    }

    /// The `Host` header's value.
    pub fn authority(&self) -> &str {
        &self.authority
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}", self.authority)
    }
}

impl FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let uri: hyper::Uri = s
            .parse()
            .map_err(|e| format!("not a URL ({e}); expected http://HOST:PORT"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!(
                    "{other}:// is not supported, only http:// (pagectl speaks plain HTTP)"
                ))
            }
            None => return Err("no scheme; expected http://HOST:PORT".to_owned()),
        }
        let authority = uri
            .authority()
            .map(|a| a.as_str())
            .filter(|a| !a.is_empty())
            .ok_or("no host; expected http://HOST:PORT")?;
        if authority.contains('@') {
            return Err("has user information; give only http://HOST:PORT".to_owned());
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err("has a path; give only http://HOST:PORT".to_owned());
        }
        // The port follows the last colon that is not inside an IPv6 literal's brackets.
        let (host, port) = match authority.rfind(':') {
            Some(at) if !authority[at..].contains(']') => {
                (&authority[..at], Some(&authority[at + 1..]))
            }
            _ => (authority, None),
        };
        let port = match port {
            None => 80,
            Some(text) => text
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("port {text:?} is not a port number (1 to 65535)"))?,
        };
        if host.is_empty() {
            return Err("no host; expected http://HOST:PORT".to_owned());
        }
        // A URL writes an IPv6 address in brackets; a socket address has none.
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.starts_with('[') && bare.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{host} is not an IPv6 address"));
        }
        Ok(Endpoint {
            host: bare.to_owned(),
            port,
            authority: format!("{host}:{port}"),
        })
    }
}

/// The timeline a command works on, and the credentials to do it with.
#[derive(Args)]
pub struct TimelineArgs {
    /// The tenant (32 hex digits).
    #[arg(long)]
    pub tenant: TenantId,
    /// The timeline (32 hex digits).
    #[arg(long)]
    pub timeline: TimelineId,
    /// `Authorization: Bearer` token, when the server checks them (or PAGECTL_TOKEN).
    #[arg(long)]
    token: Option<String>,
}

impl TimelineArgs {
    /// The token from `--token`, else from `PAGECTL_TOKEN`.
    pub fn token(&self) -> Option<String> {
        self.token
            .clone()
            .or_else(|| std::env::var("PAGECTL_TOKEN").ok())
            .filter(|t| !t.is_empty())
    }
}

/// An LSN to read at: `latest` (the newest ingested, as the server reads it) or `X/X` (or a
/// decimal number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadLsn {
    Latest,
    At(Lsn),
}

impl FromStr for ReadLsn {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "latest" {
            return Ok(ReadLsn::Latest);
        }
        let lsn: Lsn = s.parse().map_err(|e| format!("{e} (or `latest`)"))?;
        if !lsn.is_valid() {
            return Err("0/0 is no LSN to read at (`latest` reads the newest)".to_owned());
        }
        Ok(ReadLsn::At(lsn))
    }
}

impl fmt::Display for ReadLsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadLsn::Latest => f.write_str("latest"),
            ReadLsn::At(lsn) => write!(f, "{lsn}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_of_every_host_form_parse() {
        for (text, host, port, authority) in [
            ("http://127.0.0.1:9898", "127.0.0.1", 9898, "127.0.0.1:9898"),
            (
                "http://127.0.0.1:9898/",
                "127.0.0.1",
                9898,
                "127.0.0.1:9898",
            ),
            ("http://localhost", "localhost", 80, "localhost:80"),
            ("http://[::1]:9898", "::1", 9898, "[::1]:9898"),
            ("http://[fe80::1]", "fe80::1", 80, "[fe80::1]:80"),
        ] {
            let e: Endpoint = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(e.socket(), (host, port), "{text}");
            assert_eq!(e.authority(), authority, "{text}");
            assert_eq!(e.to_string(), format!("http://{authority}"));
        }
    }

    #[test]
    fn endpoints_pagectl_cannot_use_are_refused_by_name() {
        for (text, says) in [
            ("https://127.0.0.1:9898", "only http://"),
            ("127.0.0.1:9898", "no scheme"),
            ("http://127.0.0.1:9898/v1/status", "has a path"),
            ("http://127.0.0.1:9898?x=1", "has a path"),
            ("http://[::1", "not a URL"),
            ("http://[::zz]:9898", "is not an IPv6 address"),
            ("http://127.0.0.1:99999", "not a port number"),
            ("http://127.0.0.1:0", "not a port number"),
            ("http://user@127.0.0.1:9898", "user information"),
            ("", "not a URL"),
        ] {
            let e = text.parse::<Endpoint>().unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn read_lsns_are_latest_or_an_lsn() {
        assert_eq!("latest".parse(), Ok(ReadLsn::Latest));
        assert_eq!("0/10".parse(), Ok(ReadLsn::At(Lsn(0x10))));
        assert_eq!("16".parse(), Ok(ReadLsn::At(Lsn(0x10))));
        assert!("0/0".parse::<ReadLsn>().unwrap_err().contains("latest"));
        assert!("newest".parse::<ReadLsn>().unwrap_err().contains("latest"));
        assert_eq!(ReadLsn::At(Lsn(0x2dcd148)).to_string(), "0/2DCD148");
    }
}
