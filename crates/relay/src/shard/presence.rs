//! Watchers (mesh peers' watchConns): presence changes fanned out to
//! every watcher, on this shard or another.

use super::*;

impl Shard {
    pub(super) fn broadcast_watch(&mut self, ev: WatchEvent) {
        if self.watchers.is_empty() {
            return;
        }
        let watchers = std::mem::take(&mut self.watchers);
        for w in &watchers {
            self.watch_event(*w, ev);
        }
        self.watchers = watchers;
    }

    pub(super) fn watch_event(&mut self, w: ConnRef, ev: WatchEvent) {
        if w.shard != self.id {
            self.mail(w.shard, Mail::Watch(w, ev));
            return;
        }
        let Some(slot) = self.live(w) else { return };
        let conn = &mut self.conns[slot];
        match ev {
            WatchEvent::Present { key, addr, flags } => {
                frame::put_peer_present(conn.session_mut().control_mut(), &key, Some(addr), flags)
            }
            WatchEvent::Gone(key) => frame::put_peer_gone(
                conn.session_mut().control_mut(),
                &key,
                PeerGoneReason::Disconnected,
            ),
        }
        self.mark_dirty(slot);
    }

    pub(super) fn add_watcher(&mut self, w: ConnRef) {
        if !self.watchers.contains(&w) {
            self.watchers.push(w);
        }
        let present: Vec<WatchEvent> = self
            .keys
            .iter()
            .filter_map(|(key, e)| e.active.map(|s| (key, s)))
            .map(|(key, s)| {
                let c = &self.conns[s];
                WatchEvent::Present {
                    key: *key,
                    addr: c.peer(),
                    flags: c.presence_flags(),
                }
            })
            .collect();
        for ev in present {
            self.watch_event(w, ev);
        }
    }
}
