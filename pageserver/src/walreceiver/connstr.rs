//! The primary's connection string, in libpq's `key=value` form (`host=127.0.0.1 port=5432
//! user=replicator password='s3 cret'`): values bare or single-quoted with `\'` and `\\`
//! escapes. Known keys only; a misspelt one is refused, not ignored.

use std::fmt;

/// Where the primary is and who we are to it.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnString {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub dbname: Option<String>,
    /// `disable`, `allow` or `prefer` (TLS is not spoken yet, so these connect in the clear);
    /// `require` and stronger are refused rather than silently downgraded.
    pub sslmode: String,
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
            sslmode: "prefer".to_owned(),
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
                "sslmode" => match value.as_str() {
                    "disable" | "allow" | "prefer" => conn.sslmode = value,
                    "require" | "verify-ca" | "verify-full" => {
                        return Err(format!(
                            "sslmode={value}: TLS to the primary is not supported yet; use sslmode=disable on a trusted network"
                        ))
                    }
                    _ => return Err(format!("sslmode `{value}` is not one of libpq's")),
                },
                "connect_timeout" => {
                    conn.connect_timeout_secs = Some(
                        value
                            .parse()
                            .map_err(|_| format!("connect_timeout `{value}` is not a number of seconds"))?,
                    )
                }
                // Set by the receiver itself.
                "application_name" | "replication" => {
                    return Err(format!("`{key}` is set by the receiver, not the connection string"))
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
        for (bad, says) in [
            ("host=x", "user="),
            ("user=x", "host="),
            ("host=x user=y port=z", "not a port"),
            ("host=x user=y sslmode=require", "not supported yet"),
            ("host=x user=y hots=z", "unknown connection option `hots`"),
            ("host=x user=y password='open", "not closed"),
            ("host=x user=y application_name=z", "set by the receiver"),
        ] {
            let e = ConnString::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
