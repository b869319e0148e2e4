//! What of the admission controller's URL may be shown: its user
//! information, query values and fragment can be credentials, so logs,
//! errors and the configuration's debug form show [`redact_url`]'s form,
//! and messages built from errors are [`scrub`]bed of them.

/// The text that stands for a credential.
const REDACTED: &str = "[redacted]";
/// Query values shorter than this are shown (they are no secret, and
/// hiding them everywhere they occur would garble messages).
const SECRET_MIN_LEN: usize = 4;

/// The pieces of a URL that matter for hiding its credentials.
struct UrlParts<'a> {
    scheme: Option<&'a str>,
    userinfo: Option<&'a str>,
    host: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    fragment: bool,
}

impl<'a> UrlParts<'a> {
    fn of(url: &'a str) -> UrlParts<'a> {
        let (scheme, rest) = match url.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, url),
        };
        let (rest, fragment) = match rest.split_once('#') {
            Some((rest, _)) => (rest, true),
            None => (rest, false),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, authority),
        };
        UrlParts {
            scheme,
            userinfo,
            host,
            path,
            query,
            fragment,
        }
    }

    /// The query's items as (name, value); an item without `=` is all
    /// value.
    fn query_items(&self) -> impl Iterator<Item = (Option<&'a str>, &'a str)> {
        self.query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|item| !item.is_empty())
            .map(|item| match item.split_once('=') {
                Some((name, value)) => (Some(name), value),
                None => (None, item),
            })
    }
}

/// `url` as it may be shown: the user and password, every query value and
/// the fragment replaced by `[redacted]` (query names stay, to say what
/// was given).
pub fn redact_url(url: &str) -> String {
    let parts = UrlParts::of(url);
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = parts.scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    if parts.userinfo.is_some() {
        out.push_str(REDACTED);
        out.push('@');
    }
    out.push_str(parts.host);
    out.push_str(parts.path);
    if parts.query.is_some() {
        out.push('?');
        for (i, (name, _)) in parts.query_items().enumerate() {
            if i > 0 {
                out.push('&');
            }
            if let Some(name) = name {
                out.push_str(name);
                out.push('=');
            }
            out.push_str(REDACTED);
        }
    }
    if parts.fragment {
        out.push('#');
        out.push_str(REDACTED);
    }
    out
}

/// `text` with every credential of `url` in it (the URL itself, its user
/// information, password and query values) replaced, for messages built
/// from errors that may quote them.
pub(super) fn scrub(text: &str, url: &str) -> String {
    let parts = UrlParts::of(url);
    let mut text = text.replace(url, &redact_url(url));
    let password = parts
        .userinfo
        .and_then(|u| u.split_once(':'))
        .map(|(_, p)| p);
    let secrets = parts
        .userinfo
        .into_iter()
        .chain(password)
        .chain(parts.query_items().map(|(_, value)| value));
    for secret in secrets {
        if secret.len() >= SECRET_MIN_LEN {
            text = text.replace(secret, REDACTED);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::agent_for;
    use std::time::Duration;

    #[test]
    fn urls_lose_their_credentials() {
        for (url, shown) in [
            (
                "https://u:p4ss@ctl.example:8443/verify?token=t0ken&v=1#frag",
                "https://[redacted]@ctl.example:8443/verify?token=[redacted]&v=[redacted]#[redacted]",
            ),
            (
                "http://127.0.0.1:9/verify",
                "http://127.0.0.1:9/verify",
            ),
            ("http://user@h/?bare", "http://[redacted]@h/?[redacted]"),
            ("http://h?k=", "http://h?k=[redacted]"),
            ("ftp://a:b@h", "ftp://[redacted]@h"),
            ("a:b@h/x", "[redacted]@h/x"),
            // An @ in the path is not user information.
            ("http://h/a@b", "http://h/a@b"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn messages_lose_the_credentials_they_quote() {
        let url = "https://ferry:s3cret@ctl/verify?token=t0ken&n=1";
        let msg = format!("bad uri: {url}; user ferry:s3cret, password s3cret, token t0ken, 1");
        let clean = scrub(&msg, url);
        for secret in ["s3cret", "t0ken"] {
            assert!(!clean.contains(secret), "{clean}");
        }
        assert!(clean.contains("https://[redacted]@ctl/verify"), "{clean}");
        // Short values stay (they are no secret, and "1" is everywhere).
        assert!(clean.ends_with(", 1"), "{clean}");
        let e = agent_for("ftp://u:p4ss@h/", Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(!e.to_string().contains("p4ss"), "{e}");
    }
}
