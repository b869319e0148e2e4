//! `/bootstrap-dns` (derper's `--bootstrap-dns-names` and
//! `--unpublished-bootstrap-dns-names`): addresses of a few names, for
//! clients whose own DNS does not work yet (Tailscale asks its DERP servers
//! for its control server's address this way).
//!
//! The names are resolved off the data path, by [`BootstrapDns::refresh`]
//! on a thread of their own every ten minutes; the shards only read the
//! last answer. The published names are served to every request as one
//! JSON object (`{"name": ["ip", ...]}`, tab-indented and with each name's
//! addresses shuffled at each refresh, as derper writes it). An unpublished
//! name is only told to a request that asks for it by name
//! (`/bootstrap-dns?q=name`), and then alone.
//!
//! derper can also roll an unpublished name out to a percentage of clients
//! by a TXT record (`name/txtname`); Ferry does not look up TXT records and
//! refuses such entries at start-up rather than serving them differently.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::config::BootstrapAnswers;
use ferry_proto::http::unescape_query as unescape;

/// How often the names are resolved again (derper's interval).
pub const REFRESH_EVERY: Duration = Duration::from_secs(10 * 60);
/// Distinct queried names remembered for the metric before starting over
/// (derper's bound).
const MAX_QUERIED: usize = 500;

/// A name list that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamesError {
    /// `name/txtname`: rollout by TXT record is not supported.
    #[error("{flag}: {entry:?} asks for a TXT-record rollout percentage, which Ferry does not support; list the name alone")]
    TxtRollout {
        /// The flag the list came from.
        flag: &'static str,
        /// The entry.
        entry: String,
    },
    /// An empty entry between commas.
    #[error("{flag}: empty name in {list:?}")]
    Empty {
        /// The flag the list came from.
        flag: &'static str,
        /// The whole list.
        list: String,
    },
}

/// Splits a comma-separated name list as derper does (no trimming), for
/// the named flag.
pub fn parse_names(flag: &'static str, list: &str) -> Result<Vec<String>, NamesError> {
    if list.is_empty() {
        return Ok(Vec::new());
    }
    list.split(',')
        .map(|entry| {
            if entry.is_empty() {
                Err(NamesError::Empty {
                    flag,
                    list: list.to_owned(),
                })
            } else if entry.contains('/') {
                Err(NamesError::TxtRollout {
                    flag,
                    entry: entry.to_owned(),
                })
            } else {
                Ok(entry.to_owned())
            }
        })
        .collect()
}

/// Counters of `/bootstrap-dns`, with derper's meanings.
#[derive(Debug, Default)]
pub struct BootstrapDnsStats {
    /// Requests served.
    pub requests: AtomicU64,
    /// `?q=` for a published name with addresses.
    pub published_hits: AtomicU64,
    /// `?q=` for a published name without addresses.
    pub published_misses: AtomicU64,
    /// `?q=` answered from the unpublished names.
    pub unpublished_hits: AtomicU64,
    /// `?q=` for a name in neither list (or unpublished without addresses).
    pub unpublished_misses: AtomicU64,
}

/// What the last refresh found.
#[derive(Default)]
struct Snapshot {
    /// The published answer; empty before the first refresh.
    published_json: Vec<u8>,
    /// Published names and whether each had addresses.
    published: HashMap<String, bool>,
    /// Unpublished names with their addresses.
    unpublished: HashMap<String, Vec<IpAddr>>,
}

/// The names, their last addresses and the counters.
pub struct BootstrapDns {
    published: Vec<String>,
    unpublished: Vec<String>,
    snapshot: ArcSwap<Snapshot>,
    queried: Mutex<HashSet<String>>,
    stats: BootstrapDnsStats,
}

impl BootstrapDns {
    /// For these published and unpublished names; nothing is resolved yet.
    pub fn new(published: Vec<String>, unpublished: Vec<String>) -> Arc<Self> {
        Arc::new(BootstrapDns {
            published,
            unpublished,
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            queried: Mutex::new(HashSet::new()),
            stats: BootstrapDnsStats::default(),
        })
    }

    /// Whether any name is configured (otherwise there is nothing to
    /// refresh, and the endpoint answers with an empty body, as derper's).
    pub fn has_names(&self) -> bool {
        !self.published.is_empty() || !self.unpublished.is_empty()
    }

    /// The counters.
    pub fn stats(&self) -> &BootstrapDnsStats {
        &self.stats
    }

    /// Distinct names asked for with `?q=` (derper's
    /// `counter_bootstrap_dns_queried_domains`).
    pub fn queried_domains(&self) -> usize {
        self.queried.lock().expect("queried lock").len()
    }

    /// Writes the counters under derper's names.
    pub fn render_metrics(&self, w: &mut String) {
        use crate::metrics::write_counter;
        let s = &self.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        // derper types queried_domains a counter, though it falls when it
        // starts over; percent misses are always 0 (no TXT rollouts).
        let rows: [(&str, &str, u64); 7] = [
            ("requests", "Requests to /bootstrap-dns.", get(&s.requests)),
            (
                "published_hits",
                "Queries for a published name with addresses.",
                get(&s.published_hits),
            ),
            (
                "published_misses",
                "Queries for a published name without addresses.",
                get(&s.published_misses),
            ),
            (
                "unpublished_hits",
                "Queries answered from the unpublished names.",
                get(&s.unpublished_hits),
            ),
            (
                "unpublished_misses",
                "Queries for names in neither list.",
                get(&s.unpublished_misses),
            ),
            (
                "unpublished_percent_misses",
                "Queries outside a TXT rollout percentage.",
                0,
            ),
            (
                "queried_domains",
                "Distinct names queried (reset past 500).",
                self.queried_domains() as u64,
            ),
        ];
        for (name, help, v) in rows {
            write_counter(w, &format!("bootstrap_dns_{name}"), help, v);
        }
    }

    /// Resolves every name with `resolve` and swaps the answers in. A name
    /// that does not resolve is logged and left out; the others stand.
    pub fn refresh(&self, resolve: &dyn Fn(&str) -> io::Result<Vec<IpAddr>>, rng: &mut impl Rng) {
        let lookup = |name: &str| match resolve(name) {
            Ok(mut ips) => {
                let mut seen = HashSet::new();
                ips.retain(|ip| seen.insert(canonical(*ip)));
                Some(ips.into_iter().map(canonical).collect::<Vec<_>>())
            }
            Err(e) => {
                tracing::warn!(name, error = %e, "bootstrap DNS lookup failed");
                None
            }
        };
        let mut published = BTreeMap::new();
        for name in &self.published {
            if let Some(mut ips) = lookup(name) {
                ips.shuffle(rng);
                published.insert(name.clone(), ips);
            }
        }
        let mut unpublished = HashMap::new();
        for name in &self.unpublished {
            if let Some(ips) = lookup(name) {
                unpublished.insert(name.clone(), ips);
            }
        }
        let snapshot = Snapshot {
            published_json: if self.published.is_empty() {
                Vec::new()
            } else {
                indented_json(&published)
            },
            published: published
                .iter()
                .map(|(k, v)| (k.clone(), !v.is_empty()))
                .collect(),
            unpublished,
        };
        self.snapshot.store(Arc::new(snapshot));
    }

    /// Resolves the names now and then every [`REFRESH_EVERY`] with the
    /// system resolver, on a thread named `ferry-bootstrap-dns`, until the
    /// process ends. Does nothing without names.
    pub fn spawn_refresher(self: &Arc<Self>) -> io::Result<()> {
        if !self.has_names() {
            return Ok(());
        }
        let me = self.clone();
        std::thread::Builder::new()
            .name("ferry-bootstrap-dns".into())
            .spawn(move || {
                let mut rng = rand::thread_rng();
                loop {
                    me.refresh(&system_resolve, &mut rng);
                    std::thread::sleep(REFRESH_EVERY);
                }
            })
            .map(drop)
    }

    /// The body for a request with this query string.
    pub fn answer(&self, query: Option<&str>) -> Vec<u8> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let snapshot = self.snapshot.load();
        if let Some(q) = query.and_then(query_q).filter(|q| !q.is_empty()) {
            {
                let mut queried = self.queried.lock().expect("queried lock");
                queried.insert(q.clone());
                if queried.len() > MAX_QUERIED {
                    queried.clear();
                }
            }
            if let Some(ips) = snapshot.unpublished.get(&q).filter(|ips| !ips.is_empty()) {
                self.stats.unpublished_hits.fetch_add(1, Ordering::Relaxed);
                let one = BTreeMap::from([(q, ips.clone())]);
                return indented_json(&one);
            }
            let counter = match snapshot.published.get(&q) {
                Some(true) => &self.stats.published_hits,
                Some(false) => &self.stats.published_misses,
                None => &self.stats.unpublished_misses,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        snapshot.published_json.clone()
    }
}

impl BootstrapAnswers for BootstrapDns {
    fn answer(&self, query: Option<&str>) -> Vec<u8> {
        BootstrapDns::answer(self, query)
    }
}

/// IPv4-mapped IPv6 as IPv4, as Go prints a 16-byte IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The system resolver (`getaddrinfo`: `/etc/hosts`, then DNS).
fn system_resolve(name: &str) -> io::Result<Vec<IpAddr>> {
    use std::net::ToSocketAddrs;
    Ok((name, 0).to_socket_addrs()?.map(|a| a.ip()).collect())
}

/// `json.MarshalIndent(map, "", "\t")` of a name → addresses map: keys in
/// order, `null` when empty, `[]` for a name without addresses.
fn indented_json(map: &BTreeMap<String, Vec<IpAddr>>) -> Vec<u8> {
    if map.is_empty() {
        return b"null".to_vec();
    }
    let mut out = String::from("{");
    for (i, (name, ips)) in map.iter().enumerate() {
        out.push_str(if i == 0 { "\n\t" } else { ",\n\t" });
        out.push_str(&serde_json::to_string(name).expect("a string serialises"));
        if ips.is_empty() {
            out.push_str(": []");
            continue;
        }
        out.push_str(": [");
        for (j, ip) in ips.iter().enumerate() {
            let _ = write!(out, "{}\n\t\t\"{ip}\"", if j == 0 { "" } else { "," });
        }
        out.push_str("\n\t]");
    }
    out.push_str("\n}");
    out.into_bytes()
}

/// The `q` parameter of a query string, decoded as Go's `url.ParseQuery`
/// does (`+` is a space, `%XX` a byte); `None` when absent or badly
/// escaped.
fn query_q(query: &str) -> Option<String> {
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if unescape(k).as_deref() == Some("q") {
            return unescape(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn fake(name: &str) -> io::Result<Vec<IpAddr>> {
        match name {
            "control.example" => Ok(vec![
                "192.0.2.1".parse().unwrap(),
                "2001:db8::1".parse().unwrap(),
            ]),
            "hidden.example" => Ok(vec!["::ffff:198.51.100.3".parse().unwrap()]),
            "empty.example" => Ok(vec![]),
            _ => Err(io::Error::new(io::ErrorKind::NotFound, "no such host")),
        }
    }

    fn dns(published: &[&str], unpublished: &[&str]) -> Arc<BootstrapDns> {
        let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        let d = BootstrapDns::new(own(published), own(unpublished));
        d.refresh(&fake, &mut rand::rngs::StdRng::seed_from_u64(1));
        d
    }

    #[test]
    fn lists_parse_as_derper_splits_them() {
        assert_eq!(parse_names("--x", "").unwrap(), Vec::<String>::new());
        assert_eq!(
            parse_names("--x", "a.example,b.example").unwrap(),
            ["a.example", "b.example"]
        );
        assert!(matches!(
            parse_names("--x", "a,,b"),
            Err(NamesError::Empty { .. })
        ));
        let e =
            parse_names("--unpublished-bootstrap-dns-names", "a.example/pct.example").unwrap_err();
        assert!(e.to_string().contains("TXT-record rollout"), "{e}");
    }

    #[test]
    fn published_answer_is_go_indented_json_with_every_address() {
        let d = dns(
            &["control.example", "missing.example", "empty.example"],
            &[],
        );
        let body = String::from_utf8(d.answer(None)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let mut ips: Vec<&str> = v["control.example"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        ips.sort();
        assert_eq!(ips, ["192.0.2.1", "2001:db8::1"]);
        assert_eq!(v["empty.example"], serde_json::json!([]));
        assert!(v.get("missing.example").is_none());
        assert!(
            body.starts_with("{\n\t\"control.example\": [\n\t\t\""),
            "{body}"
        );
        assert!(
            body.ends_with("\n\t],\n\t\"empty.example\": []\n}"),
            "{body}"
        );
    }

    #[test]
    fn unpublished_names_only_when_asked() {
        let d = dns(&["control.example"], &["hidden.example"]);
        let all = String::from_utf8(d.answer(None)).unwrap();
        assert!(!all.contains("hidden"));
        let one = String::from_utf8(d.answer(Some("q=hidden.example"))).unwrap();
        assert_eq!(
            one,
            "{\n\t\"hidden.example\": [\n\t\t\"198.51.100.3\"\n\t]\n}"
        );
        // A published name asked by name gets the whole published answer.
        assert_eq!(d.answer(Some("q=control.example")), all.as_bytes());
        assert_eq!(d.answer(Some("q=nothing.example")), all.as_bytes());
        let s = d.stats();
        assert_eq!(s.requests.load(Ordering::Relaxed), 4);
        assert_eq!(s.unpublished_hits.load(Ordering::Relaxed), 1);
        assert_eq!(s.published_hits.load(Ordering::Relaxed), 1);
        assert_eq!(s.unpublished_misses.load(Ordering::Relaxed), 1);
        assert_eq!(d.queried_domains(), 3);
    }

    #[test]
    fn before_the_first_refresh_and_without_names() {
        let d = BootstrapDns::new(vec!["control.example".into()], vec![]);
        assert_eq!(d.answer(None), b"");
        let none = dns(&[], &[]);
        assert!(!none.has_names());
        assert_eq!(none.answer(None), b"");
        let failed = dns(&["missing.example"], &[]);
        assert_eq!(failed.answer(None), b"null");
    }

    #[test]
    fn query_parameter_decoding() {
        assert_eq!(query_q("q=a.example").as_deref(), Some("a.example"));
        assert_eq!(
            query_q("x=1&q=a%2Eexample+b").as_deref(),
            Some("a.example b")
        );
        assert_eq!(query_q("x=1"), None);
        assert_eq!(query_q("q=%zz"), None);
    }
}
