//! A network namespace a test makes for itself, with the MTU it needs.
//!
//! Loopback's MTU is 65,536 bytes, so on the host's loopback no UDP
//! datagram is ever larger than the path: what goes wrong on a real
//! 1,500-byte network (a GSO segment beyond the MTU, fragments) cannot be
//! seen there. [`Netns::new`] makes a fresh namespace (`ip netns add`,
//! named after the test and the process id), brings its loopback up with a
//! chosen MTU, and [`Netns::run`] runs a closure on a thread inside it:
//! every socket that closure makes, and every thread it starts (an
//! in-process relay's shards, a tokio runtime's workers, a child process),
//! lives in the namespace. It is deleted on drop, also when the test fails.
//!
//! Making namespaces needs root and `ip`; [`Netns::new`] returns `None`
//! after printing why it cannot, except under `CI=true`, where a machine
//! that should have them fails the test instead.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// A namespace deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

/// Why namespaces cannot be made here, if they cannot.
pub fn unavailable() -> Option<String> {
    if !ferry_sys::is_root() {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    let ip = Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !ip.is_ok_and(|s| s.success()) {
        return Some("no `ip` command (iproute2)".into());
    }
    None
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// A fresh namespace `ferry-<tag>-<pid>-<n>` whose loopback is up with
    /// an MTU of `lo_mtu` bytes. `None` (after saying why) where
    /// namespaces cannot be made; under `CI=true` that panics instead.
    pub fn new(tag: &str, lo_mtu: u32) -> Option<Netns> {
        if let Some(why) = unavailable() {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{tag}: network namespaces are required under CI=true: {why}");
            }
            eprintln!("SKIPPED {tag}: {why}");
            return None;
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "ferry-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // A leftover of an earlier run with this pid would make `add` fail.
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name]).unwrap_or_else(|e| panic!("{e}"));
        let ns = Netns { name };
        let mtu = lo_mtu.to_string();
        ip(&["-n", &ns.name, "link", "set", "lo", "mtu", &mtu, "up"])
            .unwrap_or_else(|e| panic!("{e}"));
        Some(ns)
    }

    /// The namespace's name (for `ip netns exec`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `f` on a new thread inside the namespace and returns what it
    /// returns; a panic in `f` is raised again here.
    pub fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let path = ferry_sys::netns::named(&self.name);
        let t = std::thread::Builder::new()
            .name(format!("in-{}", self.name))
            .spawn(move || {
                ferry_sys::netns::enter(&path).expect("entering the test's namespace");
                f()
            })
            .expect("a thread");
        match t.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}
