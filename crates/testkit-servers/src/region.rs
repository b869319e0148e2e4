//! A region of two Ferry nodes with relay sessions, meshed both ways over
//! TLS with a test CA's certificate: what a client on one node and a
//! client on the other need to get a relay session hosted by one of them.
//!
//! The mesh links verify each other against the system roots, which
//! `SSL_CERT_FILE` replaces: a test that starts a region points it at the
//! CA's root ([`SessionRegion::trust`]) before any thread starts, in a
//! test binary of its own (the variable is the whole process's).

use std::net::{SocketAddr, TcpListener};
use std::panic::Location;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_derp::certs::{self, CertMode};
use ferry_derp::config::MeshPeer;
use ferry_derp::{DerpConfig, Server};
use ferry_proto::key::{MeshKey, NodePrivate, NodePublic};
use ferry_testkit::certs::TestCa;
use ferry_udp::session::Sessions;

use crate::start_with_sessions;

/// One node of a [`SessionRegion`]. Shut down on drop.
pub struct RegionNode {
    server: Option<Server>,
    /// The node's relay-session socket group.
    pub udp: ferry_udp::Relay,
    /// The node's DERP URL (`https://localhost:<port>/derp`).
    pub url: String,
    /// The node's session table.
    pub sessions: Arc<Sessions>,
    /// The node's server key.
    pub key: NodePublic,
}

impl RegionNode {
    /// The node's metrics, rendered.
    pub fn metrics(&self) -> String {
        self.server.as_ref().expect("running").metrics().render()
    }

    /// Shuts the node down; panics unless it stops cleanly.
    pub fn stop(mut self) {
        let s = self.server.take().expect("running");
        s.shutdown();
        if let Err(e) = s.wait() {
            panic!("node {} did not stop cleanly: {e}", self.url);
        }
    }
}

impl Drop for RegionNode {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
            let _ = s.wait();
        }
    }
}

/// Two Ferry nodes with relay sessions on loopback, one region.
pub struct SessionRegion {
    /// The nodes.
    pub nodes: [RegionNode; 2],
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl SessionRegion {
    /// Writes `ca`'s root where `SSL_CERT_FILE` then points. Call before
    /// any thread starts.
    pub fn trust(ca: &TestCa) {
        let file = ca.dir.path().join("ca.pem");
        std::fs::write(&file, &ca.root_pem).expect("writing the CA root");
        std::env::set_var("SSL_CERT_FILE", &file);
    }

    /// Starts both nodes (TLS with `ca`'s leaf for `localhost`) and waits
    /// (at most 20 s) until each one's link to the other is up and speaks
    /// the Ferry mesh extension.
    #[track_caller]
    pub fn start(ca: &TestCa) -> SessionRegion {
        let at = Location::caller();
        let ports = [free_port(), free_port()];
        let region = format!(
            "localhost:{}/127.0.0.1,localhost:{}/127.0.0.1",
            ports[0], ports[1]
        );
        let mesh_key = MeshKey([0x5e; 32]);
        let nodes = ports.map(|port| {
            let mut config = DerpConfig::new(NodePrivate::generate());
            let setup = certs::server_config(
                &CertMode::Manual {
                    certdir: ca.dir.path().to_owned(),
                    hostname: "localhost".to_owned(),
                },
                *config.public_key.as_bytes(),
            )
            .expect("TLS configuration");
            config.tls = Some(setup.config);
            config.mesh_key = Some(mesh_key.clone());
            config.mesh_with = MeshPeer::parse_list(&region).expect("mesh peers");
            let key = config.public_key;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let (server, udp, sessions) = start_with_sessions(at, config, addr);
            RegionNode {
                server: Some(server),
                udp,
                url: format!("https://localhost:{port}/derp"),
                sessions,
                key,
            }
        });
        let r = SessionRegion { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        for _ in 0..400 {
            let up = r.nodes.iter().all(|n| {
                let m = n.metrics();
                ferry_testkit::metrics::Scrape::parse(m).family("ferry_mesh_link_ferry") == 1.0
            });
            if up {
                return r;
            }
            assert!(Instant::now() < deadline, "the mesh links did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the mesh links did not come up");
    }
}
