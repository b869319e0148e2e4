//! derper compatibility at the door: the variables derper images read,
//! and derper's flags that ferry does not implement, refused by name.

use std::ffi::OsString;

use anyhow::{bail, Result};

/// derper image conventions operators already use, and the flag each
/// means (same meaning as in those images).
pub(crate) const DERPER_IMAGE_ENV: &[(&str, &str)] = &[
    ("DERP_ADDR", "addr"),
    ("DERP_DOMAIN", "hostname"),
    ("DERP_HOSTNAME", "hostname"),
    ("DERP_CERT_MODE", "certmode"),
    ("DERP_CERT_DIR", "certdir"),
    ("DERP_STUN", "stun"),
    ("DERP_STUN_PORT", "stun-port"),
    ("DERP_HTTP_PORT", "http-port"),
    ("DERP_VERIFY_CLIENTS", "verify-clients"),
    ("DERP_VERIFY_CLIENT_URL", "verify-client-url"),
    (
        "DERP_VERIFY_CLIENT_URL_FAIL_OPEN",
        "verify-client-url-fail-open",
    ),
];

/// A derper flag that ferry does not implement yet.
struct Unsupported {
    /// Its name, without dashes.
    name: &'static str,
    /// It is a Go boolean flag (`-flag` or `-flag=false`, never a separate
    /// value).
    boolean: bool,
    /// derper's default, which changes nothing and is therefore accepted;
    /// `None` when no value is harmless.
    harmless: Option<&'static str>,
    /// What it does in derper.
    what: &'static str,
}

/// derper v1.104.7's flags that ferry does not implement (v1.102.5 has
/// the same set; v1.104 added `-disallow-app-names`, which ferry has).
/// Each is refused at start (unless given derper's own default, which
/// does nothing): a
/// flag accepted and ignored would leave an operator believing in a
/// behaviour the relay does not have.
const UNSUPPORTED_DERPER_FLAGS: &[Unsupported] = &[
    Unsupported {
        name: "secrets-url",
        boolean: false,
        harmless: Some(""),
        what: "the mesh key from a setec secrets server",
    },
    Unsupported {
        name: "secrets-path-prefix",
        boolean: false,
        harmless: None,
        what: "the mesh key from a setec secrets server",
    },
    Unsupported {
        name: "secrets-cache-dir",
        boolean: false,
        harmless: None,
        what: "the mesh key from a setec secrets server",
    },
    Unsupported {
        name: "acme-ip-certs",
        boolean: true,
        harmless: Some("false"),
        what: "Let's Encrypt certificates for IP addresses",
    },
    Unsupported {
        name: "ace",
        boolean: true,
        harmless: Some("false"),
        what: "the CONNECT proxy",
    },
];

/// Refuses derper flags that ferry does not implement, naming the flag,
/// before anything else happens, and drops those given derper's default
/// value (they change nothing). `args` are in clap's double-dash form
/// (after [`crate::flags::normalize_go_flags`]); what is returned goes to clap.
pub(crate) fn without_derper_defaults(args: Vec<OsString>) -> Result<Vec<OsString>> {
    let mut out = Vec::with_capacity(args.len());
    let mut it = args.into_iter();
    out.extend(it.next());
    while let Some(arg) = it.next() {
        let Some(body) = arg.to_str().and_then(|s| s.strip_prefix("--")) else {
            out.push(arg);
            continue;
        };
        if body.is_empty() {
            // "--": the rest are values.
            out.push(arg);
            out.extend(it);
            break;
        }
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let Some(flag) = UNSUPPORTED_DERPER_FLAGS.iter().find(|f| f.name == name) else {
            out.push(arg);
            continue;
        };
        let value = match (inline, flag.boolean) {
            (Some(v), _) => v,
            (None, true) => "true".to_string(),
            (None, false) => it
                .next()
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        let harmless = flag
            .harmless
            .is_some_and(|d| d == value || (d == "+Inf" && value.eq_ignore_ascii_case("inf")));
        if !harmless {
            bail!(
                "--{name}: derper's flag for {} is not supported by ferry yet (see \"Differences from derper\" in docs/operating.md)",
                flag.what
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derper_flags_without_ferry_support() {
        let argv = |list: &[&str]| -> Vec<OsString> {
            std::iter::once("ferry")
                .chain(list.iter().copied())
                .map(OsString::from)
                .collect()
        };
        let e = without_derper_defaults(argv(&["--secrets-url", "https://x"])).unwrap_err();
        assert!(e.to_string().starts_with("--secrets-url: "), "{e}");
        // A boolean flag never takes the next argument as its value.
        let e = without_derper_defaults(argv(&["--ace", "-a", ":1"])).unwrap_err();
        assert!(e.to_string().starts_with("--ace: "), "{e}");
        // derper's defaults are dropped; everything else is kept in order.
        let kept = without_derper_defaults(argv(&[
            "--acme-ip-certs=false",
            "-a",
            ":1",
            "--ace=false",
            "--secrets-url",
            "",
            "--dev",
        ]))
        .unwrap();
        assert_eq!(kept, argv(&["-a", ":1", "--dev"]));
        // After "--" nothing is a flag.
        let kept = without_derper_defaults(argv(&["--", "--ace"])).unwrap();
        assert_eq!(kept, argv(&["--", "--ace"]));
    }
}
