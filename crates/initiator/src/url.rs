//! iSCSI URLs as libiscsi writes them: `iscsi://[user[%secret]@]host[:port]/IQN/LUN`, with
//! optional `?target_user=U&target_password=P` for mutual CHAP.

use std::fmt;

/// The port iSCSI listens on when a URL names none (RFC 7143 §13.1 registers 3260).
pub const DEFAULT_PORT: u16 = 3260;

/// A URL that is not an iSCSI URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad iSCSI URL {url:?}: {reason}")]
pub struct UrlError {
    pub url: String,
    pub reason: &'static str,
}

/// CHAP credentials: the initiator's name and secret, and for mutual CHAP the target's.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Chap {
    pub user: String,
    pub secret: String,
    /// The target's name and secret: set for mutual CHAP, where the target proves itself too.
    pub mutual: Option<(String, String)>,
}

impl fmt::Debug for Chap {
    // Secrets must not end up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chap")
            .field("user", &self.user)
            .field("mutual", &self.mutual.as_ref().map(|(u, _)| u))
            .finish_non_exhaustive()
    }
}

/// A parsed iSCSI URL. The target name and LUN are optional so that discovery URLs
/// (`iscsi://host[:port]/`) parse too; [`IscsiUrl::require_lun`] checks a device URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    pub host: String,
    pub port: u16,
    pub target: Option<String>,
    pub lun: Option<u64>,
    pub chap: Option<Chap>,
}

impl IscsiUrl {
    /// Parses `iscsi://[user[%secret]@]host[:port][/IQN[/LUN]][?target_user=U&target_password=P]`.
    pub fn parse(url: &str) -> Result<IscsiUrl, UrlError> {
        let err = |reason| UrlError { url: redact(url), reason };
        let rest = url.strip_prefix("iscsi://").ok_or_else(|| err("must start with iscsi://"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, p),
            None => (rest, ""),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (host, port) = split_host_port(hostport).ok_or_else(|| err("bad host or port"))?;
        if host.is_empty() {
            return Err(err("missing host"));
        }
        let mut chap = match userinfo {
            Some(u) => {
                let (user, secret) = u.split_once('%').ok_or_else(|| err("user without %secret"))?;
                if user.is_empty() {
                    return Err(err("empty CHAP user name"));
                }
                Some(Chap { user: user.to_owned(), secret: secret.to_owned(), mutual: None })
            }
            None => None,
        };
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let target = parts.next().map(str::to_owned);
        let lun = match parts.next() {
            Some(l) => Some(
                l.parse::<u64>().ok().filter(|&l| l < 16384).ok_or_else(|| err("LUN must be a number below 16384"))?,
            ),
            None => None,
        };
        if parts.next().is_some() {
            return Err(err("path has more than IQN/LUN"));
        }
        if let Some(q) = query {
            let (mut tu, mut tp) = (None, None);
            for kv in q.split('&').filter(|s| !s.is_empty()) {
                match kv.split_once('=') {
                    Some(("target_user", v)) => tu = Some(v.to_owned()),
                    Some(("target_password", v)) => tp = Some(v.to_owned()),
                    _ => return Err(err("unknown query argument (known: target_user, target_password)")),
                }
            }
            match (tu, tp, chap.as_mut()) {
                (None, None, _) => {}
                (Some(u), Some(p), Some(c)) => c.mutual = Some((u, p)),
                (Some(_), Some(_), None) => return Err(err("mutual CHAP needs user%secret@ as well")),
                _ => return Err(err("target_user and target_password go together")),
            }
        }
        Ok(IscsiUrl { host: host.to_owned(), port, target, lun, chap })
    }

    /// `host:port` for connecting (IPv6 hosts in brackets).
    pub fn portal(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The target name and LUN of a device URL, or an error saying which is missing.
    pub fn require_lun(&self) -> Result<(&str, u64), UrlError> {
        let err = |reason| UrlError { url: self.to_string(), reason };
        let t = self.target.as_deref().ok_or_else(|| err("missing target name (iscsi://host/IQN/LUN)"))?;
        let l = self.lun.ok_or_else(|| err("missing LUN (iscsi://host/IQN/LUN)"))?;
        Ok((t, l))
    }

    /// The URL with its secrets, as [`IscsiUrl::parse`] reads it back (the `Display` form
    /// leaves them out). For configuration files, never for logs.
    pub fn unredacted(&self) -> String {
        let mut s = String::from("iscsi://");
        if let Some(c) = &self.chap {
            s += &format!("{}%{}@", c.user, c.secret);
        }
        s += &format!("{}/", self.portal());
        if let Some(t) = &self.target {
            s += t;
            if let Some(l) = self.lun {
                s += &format!("/{l}");
            }
        }
        if let Some((u, p)) = self.chap.as_ref().and_then(|c| c.mutual.as_ref()) {
            s += &format!("?target_user={u}&target_password={p}");
        }
        s
    }
}

impl fmt::Display for IscsiUrl {
    /// The URL with any secret left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "iscsi://")?;
        if let Some(c) = &self.chap {
            write!(f, "{}%***@", c.user)?;
        }
        write!(f, "{}/", self.portal())?;
        if let Some(t) = &self.target {
            write!(f, "{t}")?;
            if let Some(l) = self.lun {
                write!(f, "/{l}")?;
            }
        }
        Ok(())
    }
}

fn split_host_port(s: &str) -> Option<(&str, u16)> {
    if let Some(v6) = s.strip_prefix('[') {
        let (host, rest) = v6.split_once(']')?;
        return match rest.strip_prefix(':') {
            Some(p) => Some((host, p.parse().ok()?)),
            None if rest.is_empty() => Some((host, DEFAULT_PORT)),
            None => None,
        };
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Some((h, p.parse().ok()?)),
        None => Some((s, DEFAULT_PORT)),
    }
}

/// Hides the secret of a URL that failed to parse, for error messages.
fn redact(url: &str) -> String {
    match (url.find('%'), url.find('@')) {
        (Some(p), Some(a)) if p < a => format!("{}%***{}", &url[..p], &url[a..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_libiscsi_url_with_chap() {
        let u = IscsiUrl::parse("iscsi://alice%s3cret@10.0.0.1:3261/iqn.2024-01.org.example:disk/1").unwrap();
        assert_eq!(u.host, "10.0.0.1");
        assert_eq!(u.port, 3261);
        assert_eq!(u.target.as_deref(), Some("iqn.2024-01.org.example:disk"));
        assert_eq!(u.lun, Some(1));
        let c = u.chap.clone().unwrap();
        assert_eq!((c.user.as_str(), c.secret.as_str()), ("alice", "s3cret"));
        assert_eq!(u.require_lun().unwrap(), ("iqn.2024-01.org.example:disk", 1));
        assert!(!u.to_string().contains("s3cret"));
    }

    #[test]
    fn default_port_and_discovery_urls() {
        let u = IscsiUrl::parse("iscsi://127.0.0.1").unwrap();
        assert_eq!((u.port, u.target, u.lun), (3260, None, None));
        let u = IscsiUrl::parse("iscsi://host/").unwrap();
        assert_eq!(u.portal(), "host:3260");
        assert!(u.require_lun().is_err());
        let u = IscsiUrl::parse("iscsi://[::1]:4000/iqn.x/0").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.portal()), ("::1", 4000, "[::1]:4000".to_owned()));
    }

    #[test]
    fn unredacted_urls_parse_back_to_the_same_url() {
        for text in [
            "iscsi://alice%s3cret@10.0.0.1:3261/iqn.2024-01.org.example:disk/1",
            "iscsi://u%p@h/iqn.x/2?target_user=t&target_password=tp",
            "iscsi://[::1]:4000/iqn.x/0",
            "iscsi://host",
            "iscsi://host/iqn.x",
        ] {
            let u = IscsiUrl::parse(text).unwrap();
            assert_eq!(IscsiUrl::parse(&u.unredacted()).unwrap(), u, "{text}");
        }
        let u = IscsiUrl::parse("iscsi://u%p@h/iqn.x/2?target_user=t&target_password=tp").unwrap();
        assert_eq!(u.unredacted(), "iscsi://u%p@h:3260/iqn.x/2?target_user=t&target_password=tp");
    }

    #[test]
    fn mutual_chap_from_query() {
        let u = IscsiUrl::parse("iscsi://u%p@h/iqn.x/2?target_user=t&target_password=tp").unwrap();
        assert_eq!(u.chap.unwrap().mutual, Some(("t".into(), "tp".into())));
        assert!(IscsiUrl::parse("iscsi://h/iqn.x/2?target_user=t&target_password=tp").is_err());
        assert!(IscsiUrl::parse("iscsi://u%p@h/iqn.x/2?target_user=t").is_err());
    }

    #[test]
    fn malformed_urls_are_refused_without_leaking_secrets() {
        for bad in [
            "http://h/iqn/1",
            "iscsi://",
            "iscsi://h:port/iqn/1",
            "iscsi://h/iqn/x",
            "iscsi://h/iqn/1/2",
            "iscsi://u@h/i/1",
        ] {
            assert!(IscsiUrl::parse(bad).is_err(), "{bad}");
        }
        let e = IscsiUrl::parse("iscsi://u%topsecret@h/iqn/zz").unwrap_err();
        assert!(!e.to_string().contains("topsecret"), "{e}");
    }
}
