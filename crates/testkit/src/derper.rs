//! Tailscale's `derper`, started as a child process on a loopback port:
//! the one launcher every test that checks Ferry against derper uses.
//!
//! The binary is looked for in `FERRY_DERPER_BIN`, then
//! `interop/bin/derper` (where `.ci/setup.d/10-derper.sh` and the interop
//! suite build it), then `~/go/bin/derper`. A test without it skips its
//! derper half through [`crate::skip!`], which fails under `CI=true`.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where derper is, or why it is not there.
pub fn bin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FERRY_DERPER_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("FERRY_DERPER_BIN={} is not a file", p.display()))
        };
    }
    let mut candidates =
        vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop/bin/derper")];
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(Path::new(&home).join("go/bin/derper"));
    }
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        format!(
            "no derper binary at {} (build it with .ci/setup.d/10-derper.sh, or set FERRY_DERPER_BIN)",
            candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        )
    })
}

/// A running derper, killed on drop.
#[derive(Debug)]
pub struct Derper {
    child: Child,
    log: PathBuf,
}

impl Derper {
    /// Starts derper on `addr` without STUN or a plain-HTTP port, its key
    /// in `state/derper.key` (kept across restarts, as a real one keeps
    /// its key file) and its log in `state/derper.log`; over TLS with the
    /// manual certificate in `certdir` for `localhost` when given.
    /// Returns once the port accepts connections (within 15 s).
    pub fn start(addr: SocketAddr, state: &Path, certdir: Option<&Path>) -> Derper {
        let bin = bin().unwrap_or_else(|why| panic!("derper: {why}"));
        Derper::start_bin(&bin, addr, state, certdir)
    }

    /// [`Derper::start`] with the derper binary at `bin` (a test that
    /// needs one version of it finds that itself).
    pub fn start_bin(bin: &Path, addr: SocketAddr, state: &Path, certdir: Option<&Path>) -> Derper {
        let mut args: Vec<String> = vec![
            "-a".into(),
            addr.to_string(),
            "--http-port".into(),
            "-1".into(),
            "--stun=false".into(),
            "-c".into(),
            state.join("derper.key").display().to_string(),
        ];
        if let Some(dir) = certdir {
            args.extend([
                "--certmode".into(),
                "manual".into(),
                "--certdir".into(),
                dir.display().to_string(),
                "--hostname".into(),
                "localhost".into(),
            ]);
        }
        let log = state.join("derper.log");
        let err = std::fs::File::create(&log).expect("derper's log file");
        let child = Command::new(bin)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut d = Derper { child, log };
        // Ready when the port accepts; bounded, and the process must live.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("derper exited at start ({status}): {}", d.log());
            }
            if TcpStream::connect(addr).is_ok() {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "derper not listening on {addr} after 15 s: {}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Derper {
    /// SIGKILL: derper says nothing to its clients when it goes.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
