//! The ACME client behind `--certmode letsencrypt`: obtains a certificate
//! for `--hostname` from `--acme-directory` (Let's Encrypt by default; any
//! RFC 8555 CA), keeps it and the account in `--certdir`, renews it well
//! before it expires and swaps each new one into the running relay.
//!
//! It runs on a thread of its own with a small single-threaded tokio
//! runtime (the ACME protocol is `instant-acme`'s); the relay only reads
//! what it publishes in its `AcmeState`. Every failure is logged with the
//! CA's own problem text and retried with exponential back-off; while no
//! certificate exists, TLS handshakes fail cleanly and the log says what
//! the client is waiting for.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use ferry_derp::certs::AcmeState;
use ferry_sys::files::Existing;
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};

/// Let's Encrypt's production directory (derper's CA).
pub(crate) const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";
/// First wait after a failure; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// Longest sleep between checks of a valid certificate.
const MAX_CHECK: Duration = Duration::from_secs(12 * 3600);

/// Which challenge proves control of the hostname.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// TLS-ALPN-01, answered on the DERP TLS listener (it must be the
    /// name's port 443 as the CA sees it).
    TlsAlpn01,
    /// HTTP-01, answered on the `--http-port` listener (port 80 as the CA
    /// sees it).
    Http01,
}

impl std::str::FromStr for Challenge {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tls-alpn-01" => Ok(Challenge::TlsAlpn01),
            "http-01" => Ok(Challenge::Http01),
            other => bail!("--acme-challenge {other:?}: expected tls-alpn-01 or http-01"),
        }
    }
}

/// The client's settings.
#[derive(Clone, Debug)]
pub(crate) struct AcmeOptions {
    pub(crate) directory: String,
    pub(crate) email: Option<String>,
    pub(crate) certdir: PathBuf,
    pub(crate) challenge: Challenge,
}

/// Counters for the metrics page.
#[derive(Debug, Default)]
pub(crate) struct AcmeStats {
    not_after: AtomicI64,
    issued: AtomicU64,
    failures: AtomicU64,
}

impl AcmeStats {
    pub(crate) fn render(&self, w: &mut String) {
        use ferry_derp::metrics::{write_counter, write_gauge};
        write_gauge(
            w,
            "ferry_tls_cert_not_after_seconds",
            "Expiry of the served ACME certificate (Unix seconds; 0 while there is none).",
            self.not_after.load(Ordering::Relaxed),
        );
        write_counter(
            w,
            "ferry_acme_certificates_issued_total",
            "Certificates obtained from the ACME CA (first and renewals).",
            self.issued.load(Ordering::Relaxed),
        );
        write_counter(
            w,
            "ferry_acme_failures_total",
            "Failed attempts to obtain a certificate (each logged with the CA's message).",
            self.failures.load(Ordering::Relaxed),
        );
    }
}

/// Files in the certificate directory.
struct Files {
    account: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Files {
    fn new(dir: &Path, hostname: &str) -> Files {
        Files {
            account: dir.join("acme-account.json"),
            cert: dir.join(format!("{hostname}.acme.crt")),
            key: dir.join(format!("{hostname}.acme.key")),
        }
    }
}

/// Starts the client's thread. Returns at once; the first certificate
/// (stored or new) is installed as soon as it is at hand.
pub(crate) fn spawn(
    opts: AcmeOptions,
    state: Arc<AcmeState>,
    stats: Arc<AcmeStats>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(&opts.certdir)?;
    std::thread::Builder::new()
        .name("ferry-acme".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "ACME: cannot start its runtime; no certificates will be obtained");
                    return;
                }
            };
            runtime.block_on(run(opts, state, stats));
        })
        .map(drop)
}

async fn run(opts: AcmeOptions, state: Arc<AcmeState>, stats: Arc<AcmeStats>) {
    let files = Files::new(&opts.certdir, state.hostname());
    let mut backoff = FIRST_BACKOFF;
    loop {
        let wait = match cycle(&opts, &state, &stats, &files).await {
            Ok(next) => {
                backoff = FIRST_BACKOFF;
                next
            }
            Err(e) => {
                stats.failures.fetch_add(1, Ordering::Relaxed);
                let waiting = if state.has_certificate() {
                    "the current certificate stays in use"
                } else {
                    "TLS handshakes fail until a certificate is obtained"
                };
                tracing::warn!(
                    hostname = state.hostname(),
                    directory = %opts.directory,
                    error = format!("{e:#}"),
                    retry_in = ?backoff,
                    "ACME: could not obtain a certificate; {waiting}"
                );
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Uses the stored certificate while it is good, else orders one.
/// Returns how long until the next check.
async fn cycle(
    opts: &AcmeOptions,
    state: &AcmeState,
    stats: &AcmeStats,
    files: &Files,
) -> Result<Duration> {
    if let Some(stored) = load_stored(files, state.hostname())? {
        let now = SystemTime::now();
        if now < stored.renew_at {
            if !state.has_certificate()
                || stats.not_after.load(Ordering::Relaxed) != unix(stored.not_after)
            {
                state
                    .install(stored.chain, stored.key)
                    .context("installing the stored certificate")?;
                stats
                    .not_after
                    .store(unix(stored.not_after), Ordering::Relaxed);
                tracing::info!(
                    hostname = state.hostname(),
                    cert = %files.cert.display(),
                    expires = unix(stored.not_after),
                    "ACME: using the stored certificate"
                );
            }
            let until = stored.renew_at.duration_since(now).unwrap_or_default();
            return Ok(until.min(MAX_CHECK));
        }
        tracing::info!(
            hostname = state.hostname(),
            "ACME: certificate due for renewal"
        );
    } else {
        tracing::info!(
            hostname = state.hostname(),
            directory = %opts.directory,
            "ACME: no certificate yet; ordering one (TLS handshakes fail until it arrives)"
        );
    }
    order(opts, state, files).await?;
    stats.issued.fetch_add(1, Ordering::Relaxed);
    // Install it through the same path as a stored one.
    let stored = load_stored(files, state.hostname())?
        .ok_or_else(|| anyhow!("the new certificate was not stored"))?;
    state
        .install(stored.chain, stored.key)
        .context("installing the new certificate")?;
    stats
        .not_after
        .store(unix(stored.not_after), Ordering::Relaxed);
    tracing::info!(
        hostname = state.hostname(),
        expires = unix(stored.not_after),
        "ACME: new certificate in use"
    );
    Ok(stored
        .renew_at
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        .min(MAX_CHECK))
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

struct Stored {
    chain: Vec<CertificateDer<'static>>,
    key: PrivatePkcs8KeyDer<'static>,
    not_after: SystemTime,
    renew_at: SystemTime,
}

/// The stored certificate, if there is one for `hostname`.
fn load_stored(files: &Files, hostname: &str) -> Result<Option<Stored>> {
    if !files.cert.exists() || !files.key.exists() {
        return Ok(None);
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .with_context(|| format!("reading {}", files.cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing {}", files.cert.display()))?;
    let key = PrivatePkcs8KeyDer::from_pem_file(&files.key)
        .with_context(|| format!("reading {}", files.key.display()))?;
    let leaf = chain
        .first()
        .ok_or_else(|| anyhow!("{}: no certificate", files.cert.display()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| anyhow!("{}: {e}", files.cert.display()))?;
    let names_it = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .is_some_and(|san| {
            san.value.general_names.iter().any(|n| {
                matches!(n, x509_parser::extensions::GeneralName::DNSName(d) if d.eq_ignore_ascii_case(hostname))
            })
        });
    if !names_it {
        tracing::info!(cert = %files.cert.display(), hostname, "ACME: the stored certificate is for another name");
        return Ok(None);
    }
    let from = cert.validity().not_before.timestamp();
    let until = cert.validity().not_after.timestamp();
    let at = |s: i64| UNIX_EPOCH + Duration::from_secs(s.max(0) as u64);
    Ok(Some(Stored {
        chain,
        key,
        not_after: at(until),
        renew_at: at(renew_at(from, until)),
    }))
}

/// When to renew a certificate valid from `from` until `until` (Unix
/// seconds): at two thirds of its lifetime, or 30 days before it ends if
/// that comes first and still leaves it a useful life (Let's Encrypt's
/// 90-day certificates: both rules agree on day 60).
fn renew_at(from: i64, until: i64) -> i64 {
    let lifetime = (until - from).max(0);
    let by_fraction = from + lifetime * 2 / 3;
    let by_margin = until - 30 * 86_400;
    if by_margin > from + lifetime / 3 {
        by_fraction.min(by_margin)
    } else {
        by_fraction
    }
}

/// One order: account, challenge, finalize, store.
async fn order(opts: &AcmeOptions, state: &AcmeState, files: &Files) -> Result<()> {
    let account = account(opts, files).await?;
    let ids = [Identifier::Dns(state.hostname().to_owned())];
    let mut order = account
        .new_order(&NewOrder::new(&ids))
        .await
        .context("creating an order")?;
    let mut pending_http = Vec::new();
    {
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.context("fetching an authorization")?;
            match authz.status {
                AuthorizationStatus::Valid => continue,
                AuthorizationStatus::Pending => {}
                other => bail!("authorization for {} is {other:?}", state.hostname()),
            }
            let kind = match opts.challenge {
                Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
                Challenge::Http01 => ChallengeType::Http01,
            };
            let mut challenge = authz
                .challenge(kind.clone())
                .ok_or_else(|| anyhow!("the CA offers no {kind:?} challenge"))?;
            let key_auth = challenge.key_authorization();
            match opts.challenge {
                Challenge::TlsAlpn01 => state
                    .set_tls_alpn_challenge(Some(key_auth.digest().as_ref()))
                    .context("making the TLS-ALPN-01 certificate")?,
                Challenge::Http01 => {
                    state.set_http_challenge(&challenge.token, Some(key_auth.as_str()));
                    pending_http.push(challenge.token.clone());
                }
            }
            tracing::info!(
                hostname = state.hostname(),
                challenge = ?kind,
                "ACME: answering the CA's challenge"
            );
            challenge
                .set_ready()
                .await
                .context("accepting the challenge")?;
        }
    }
    let status = order
        .poll_ready(&RetryPolicy::new().timeout(Duration::from_secs(90)))
        .await;
    // The answers are only needed while the CA validates.
    let clear = || {
        let _ = state.set_tls_alpn_challenge(None);
        for token in &pending_http {
            state.set_http_challenge(token, None);
        }
    };
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            clear();
            return Err(anyhow!(e).context("waiting for the CA to validate"));
        }
    };
    clear();
    if status != OrderStatus::Ready {
        // Say why, in the CA's words.
        let mut why = Vec::new();
        let mut authorizations = order.authorizations();
        while let Some(Ok(authz)) = authorizations.next().await {
            for c in &authz.challenges {
                if let Some(e) = &c.error {
                    why.push(format!("{:?}: {}", c.r#type, e));
                }
            }
        }
        bail!("order is {status:?}: {}", why.join("; "));
    }
    let key_pem = order.finalize().await.context("finalizing the order")?;
    let chain_pem = order
        .poll_certificate(&RetryPolicy::new().timeout(Duration::from_secs(90)))
        .await
        .context("downloading the certificate")?;
    write_private(&files.key, key_pem.as_bytes())?;
    ferry_sys::files::write_file(&files.cert, chain_pem.as_bytes(), 0o644, Existing::Replace)
        .with_context(|| format!("writing {}", files.cert.display()))?;
    Ok(())
}

/// The stored account for this directory, or a new one.
async fn account(opts: &AcmeOptions, files: &Files) -> Result<Account> {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Saved {
        directory: String,
        credentials: AccountCredentials,
    }
    if let Ok(text) = std::fs::read_to_string(&files.account) {
        match serde_json::from_str::<Saved>(&text) {
            Ok(saved) if saved.directory == opts.directory => {
                return Account::builder()
                    .context("building the HTTP client")?
                    .from_credentials(saved.credentials)
                    .await
                    .context("restoring the ACME account");
            }
            Ok(_) => tracing::info!(
                file = %files.account.display(),
                "ACME: the stored account is for another directory; creating one"
            ),
            Err(e) => {
                tracing::warn!(file = %files.account.display(), error = %e, "ACME: unreadable account file; creating a new account")
            }
        }
    }
    let contact = opts.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (account, credentials) = Account::builder()
        .context("building the HTTP client")?
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            opts.directory.clone(),
            None,
        )
        .await
        .context("creating an ACME account")?;
    let saved = serde_json::to_vec(&Saved {
        directory: opts.directory.clone(),
        credentials,
    })?;
    write_private(&files.account, &saved)?;
    tracing::info!(file = %files.account.display(), "ACME: account created");
    Ok(account)
}

/// Writes a secret file readable by its owner only, replacing the old one
/// in one step.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    ferry_sys::files::write_file(path, bytes, 0o600, Existing::Replace)
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_times() {
        let day = 86_400;
        // Let's Encrypt: 90 days, renewed on day 60.
        assert_eq!(renew_at(0, 90 * day), 60 * day);
        // A year: two thirds comes first (day 243), before the last 30 days.
        assert_eq!(renew_at(0, 365 * day), 365 * day * 2 / 3);
        // 40 days: 30 days before the end would be day 10, too early to
        // be useful; two thirds it is.
        assert_eq!(renew_at(0, 40 * day), 40 * day * 2 / 3);
        // 120 days: 30 days before the end (day 90) is after two thirds
        // (day 80), so day 80.
        assert_eq!(renew_at(0, 120 * day), 80 * day);
        // Short-lived (6 days, or an hour): two thirds.
        assert_eq!(renew_at(0, 6 * day), 4 * day);
        assert_eq!(renew_at(1000, 4600), 3400);
    }

    /// The key and the account are written owner-only from the first
    /// byte, whatever lies in the directory: a leftover file at a
    /// temporary name keeps neither its mode nor its place, and a symlink
    /// planted there is not followed.
    #[test]
    fn secrets_are_owner_only_whatever_was_left_in_the_directory() {
        use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
        let dir = std::env::temp_dir().join(format!("ferry-acme-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let files = Files::new(&dir, "relay.example");
        // Plants at the temporary names each file had, and at a few more.
        let victim = dir.join("victim");
        std::fs::write(&victim, b"not yours").unwrap();
        for (i, f) in [&files.key, &files.account].into_iter().enumerate() {
            let stem = f.file_name().unwrap().to_string_lossy().into_owned();
            for name in [
                f.with_extension("tmp"),
                dir.join(format!("{stem}.tmp")),
                dir.join(format!(".{stem}.tmp")),
            ] {
                if i == 0 {
                    std::fs::write(&name, b"leftover").unwrap();
                    std::fs::set_permissions(&name, std::fs::Permissions::from_mode(0o644))
                        .unwrap();
                } else {
                    symlink(&victim, &name).unwrap();
                }
            }
        }
        write_private(&files.key, b"-----BEGIN PRIVATE KEY-----").unwrap();
        write_private(&files.account, b"{\"credentials\":1}").unwrap();
        for f in [&files.key, &files.account] {
            let meta = std::fs::symlink_metadata(f).unwrap();
            assert!(
                meta.file_type().is_file(),
                "{} is a plain file",
                f.display()
            );
            assert_eq!(meta.mode() & 0o777, 0o600, "{}", f.display());
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"not yours");
        assert_eq!(
            std::fs::read(&files.key).unwrap(),
            b"-----BEGIN PRIVATE KEY-----"
        );
        // Written again (a renewal): still owner-only, the new bytes.
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&files.key, b"renewed").unwrap();
        assert_eq!(std::fs::read(&files.key).unwrap(), b"renewed");
        let mode = std::fs::metadata(&files.key).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
