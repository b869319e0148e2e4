//! The state file: the node's keys and what it learned about its
//! registration, kept across restarts.
//!
//! JSON, mode 0600, replaced atomically (written to a temporary file in the
//! same directory, synced, renamed). A file made for another login server
//! is not reused: the node starts over with fresh keys.

use ferry_proto::key::{DiscoPrivate, MachinePrivate, NodePrivate};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The file format version.
const VERSION: u32 = 1;
/// Longest state file read.
const MAX_LEN: u64 = 64 * 1024;

/// What the node keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The login server the keys belong to.
    pub login_server: String,
    /// The machine key (Noise identity towards the control server).
    pub machine: MachinePrivate,
    /// The node key (WireGuard and DERP identity).
    pub node: NodePrivate,
    /// The node's disco private key.
    pub disco: DiscoPrivate,
    /// Whether the control server accepted the node key.
    pub registered: bool,
    /// The node ID the control server gave, once known.
    pub node_id: u64,
}

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    login_server: String,
    machine_private: String,
    node_private: String,
    disco_private: String,
    #[serde(default)]
    registered: bool,
    #[serde(default)]
    node_id: u64,
}

impl State {
    /// Fresh random keys for `login_server`.
    pub fn fresh(login_server: &str) -> State {
        let disco = DiscoPrivate::generate();
        State {
            login_server: login_server.to_owned(),
            machine: MachinePrivate::generate(),
            node: NodePrivate::generate(),
            disco,
            registered: false,
            node_id: 0,
        }
    }

    /// Reads the state at `path` for `login_server`: `Ok(None)` when there
    /// is no file or it belongs to another login server.
    pub fn load(path: &Path, login_server: &str) -> Result<Option<State>, String> {
        let text = match std::fs::File::open(path) {
            Ok(f) => {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_LEN), &mut s)
                    .map_err(|e| format!("reading {}: {e}", path.display()))?;
                s
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("opening {}: {e}", path.display())),
        };
        let f: File =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if f.version != VERSION {
            return Err(format!("{}: unknown version {}", path.display(), f.version));
        }
        if f.login_server != login_server {
            return Ok(None);
        }
        let bad =
            |what: &str, e: &dyn std::fmt::Display| format!("{}: {what}: {e}", path.display());
        let disco: DiscoPrivate = f
            .disco_private
            .parse()
            .map_err(|e| bad("disco_private", &e))?;
        Ok(Some(State {
            login_server: f.login_server,
            machine: f
                .machine_private
                .parse()
                .map_err(|e| bad("machine_private", &e))?,
            node: f
                .node_private
                .parse()
                .map_err(|e| bad("node_private", &e))?,
            disco,
            registered: f.registered,
            node_id: f.node_id,
        }))
    }

    /// Writes the state to `path` (0600, atomically).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let f = File {
            version: VERSION,
            login_server: self.login_server.clone(),
            machine_private: self.machine.to_string(),
            node_private: self.node.to_string(),
            disco_private: self.disco.to_string(),
            registered: self.registered,
            node_id: self.node_id,
        };
        let text = serde_json::to_vec_pretty(&f).map_err(std::io::Error::other)?;
        let name = path
            .file_name()
            .ok_or_else(|| std::io::Error::other("state path has no file name"))?;
        let mut tmp_name = name.to_owned();
        tmp_name.push(format!(".tmp{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        out.write_all(&text)?;
        out.sync_all()?;
        drop(out);
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn round_trip_mode_and_other_server() {
        let dir = std::env::temp_dir().join(format!("ferry-tailnet-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ferry-tailnet.json");
        let _ = std::fs::remove_file(&path);
        assert_eq!(State::load(&path, "http://a").unwrap(), None);
        let mut s = State::fresh("http://a");
        s.registered = true;
        s.node_id = 9;
        s.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let back = State::load(&path, "http://a").unwrap().unwrap();
        assert_eq!(back, s);
        assert_eq!(State::load(&path, "http://b").unwrap(), None);
        std::fs::write(&path, "{").unwrap();
        assert!(State::load(&path, "http://a").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
