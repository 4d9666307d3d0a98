//! The primary's connection string, in libpq's `key=value` form (`host=127.0.0.1 port=5432
//! user=replicator password='s3 cret'`): values bare or single-quoted with `\'` and `\\`
//! escapes. Known keys only; a misspelt one is refused, not ignored.

use std::fmt;

/// libpq's `sslmode` (what each asks and checks: `tls.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(text: &str) -> Option<SslMode> {
        Some(match text {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        })
    }
}

/// Where the primary is and who we are to it.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnString {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub dbname: Option<String>,
    pub sslmode: SslMode,
    /// A PEM file of the CA certificates `verify-ca` and `verify-full` (and `require`, when
    /// given) check the primary's certificate against, on the pageserver's machine.
    pub sslrootcert: Option<String>,
    pub connect_timeout_secs: Option<u64>,
}

impl ConnString {
    pub fn parse(text: &str) -> Result<ConnString, String> {
        let mut conn = ConnString {
            host: String::new(),
            port: 5432,
            user: String::new(),
            password: None,
            dbname: None,
            sslmode: SslMode::Prefer,
            sslrootcert: None,
            connect_timeout_secs: None,
        };
        let mut chars = text.chars().peekable();
        loop {
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            if chars.peek().is_none() {
                break;
            }
            let key: String =
                std::iter::from_fn(|| chars.next_if(|c| *c != '=' && !c.is_whitespace())).collect();
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            if chars.next() != Some('=') {
                return Err(format!("`{key}` has no `=value`"));
            }
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
            let mut value = String::new();
            if chars.peek() == Some(&'\'') {
                chars.next();
                loop {
                    match chars.next() {
                        Some('\\') => match chars.next() {
                            Some(c) => value.push(c),
                            None => {
                                return Err(format!("the value of `{key}` ends in a backslash"))
                            }
                        },
                        Some('\'') => break,
                        Some(c) => value.push(c),
                        None => return Err(format!("the quoted value of `{key}` is not closed")),
                    }
                }
            } else {
                value = std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace())).collect();
            }
            match key.as_str() {
                "host" | "hostaddr" => conn.host = value,
                "port" => {
                    conn.port = value
                        .parse()
                        .map_err(|_| format!("port `{value}` is not a port number"))?
                }
                "user" => conn.user = value,
                "password" => conn.password = Some(value),
                "dbname" => conn.dbname = Some(value),
                "sslmode" => {
                    conn.sslmode = SslMode::parse(&value)
                        .ok_or_else(|| format!("sslmode `{value}` is not one of libpq's"))?
                }
                "sslrootcert" => conn.sslrootcert = Some(value),
                "connect_timeout" => {
                    conn.connect_timeout_secs = Some(value.parse().map_err(|_| {
                        format!("connect_timeout `{value}` is not a number of seconds")
                    })?)
                }
                // Set by the receiver itself.
                "application_name" | "replication" => {
                    return Err(format!(
                        "`{key}` is set by the receiver, not the connection string"
                    ))
                }
                _ => return Err(format!("unknown connection option `{key}`")),
            }
        }
        if conn.host.is_empty() {
            return Err("the connection string needs host=".to_owned());
        }
        if conn.user.is_empty() {
            return Err("the connection string needs user=".to_owned());
        }
        if matches!(conn.sslmode, SslMode::VerifyCa | SslMode::VerifyFull)
            && conn.sslrootcert.is_none()
        {
            return Err(format!(
                "sslmode={} needs sslrootcert=<a PEM file of the CA certificates to trust>",
                conn.sslmode
            ));
        }
        Ok(conn)
    }
}

/// Without the password: what logs and the state API show.
impl fmt::Display for ConnString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "host={} port={} user={}",
            self.host, self.port, self.user
        )?;
        if let Some(db) = &self.dbname {
            write!(f, " dbname={db}")?;
        }
        write!(f, " sslmode={}", self.sslmode)?;
        if let Some(root) = &self.sslrootcert {
            write!(f, " sslrootcert={root}")?;
        }
        if self.password.is_some() {
            write!(f, " password=********")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ConnString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_strings_parse_and_print_without_the_password() {
        let c = ConnString::parse(
            r"host=127.0.0.1 port=5433 user=rep password='a b\'c\\' sslmode=disable",
        )
        .unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.user.as_str()),
            ("127.0.0.1", 5433, "rep")
        );
        assert_eq!(c.password.as_deref(), Some(r"a b'c\"));
        assert_eq!(
            c.to_string(),
            "host=127.0.0.1 port=5433 user=rep sslmode=disable password=********"
        );
        assert!(!format!("{c:?}").contains("a b"));
        let tls =
            ConnString::parse("host=db user=r sslmode=verify-ca sslrootcert=/etc/ca.pem").unwrap();
        assert_eq!(tls.sslmode, SslMode::VerifyCa);
        assert_eq!(
            tls.to_string(),
            "host=db port=5432 user=r sslmode=verify-ca sslrootcert=/etc/ca.pem"
        );
        assert_eq!(
            ConnString::parse("host=db user=r").unwrap().sslmode,
            SslMode::Prefer
        );
        for (bad, says) in [
            ("host=x", "user="),
            ("user=x", "host="),
            ("host=x user=y port=z", "not a port"),
            ("host=x user=y sslmode=verify-full", "needs sslrootcert"),
            ("host=x user=y sslmode=secure", "not one of libpq's"),
            ("host=x user=y hots=z", "unknown connection option `hots`"),
            ("host=x user=y password='open", "not closed"),
            ("host=x user=y application_name=z", "set by the receiver"),
        ] {
            let e = ConnString::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
