//! Watchers (mesh peers' watchConns): presence changes fanned out to
//! every watcher, on this shard or another.

use super::control_queue::Origin;
use super::*;

impl Shard {
    pub(super) fn broadcast_watch(&mut self, ev: WatchEvent) {
        // By index: a watcher closed for its full queue leaves the list
        // (and its own key's departure is broadcast) while this runs.
        let mut i = 0;
        while let Some(&w) = self.watchers.get(i) {
            self.watch_event(w, ev);
            if self.watchers.get(i) == Some(&w) {
                i += 1;
            }
        }
    }

    /// Queues a presence change to watcher `w` (mailed to its shard if it
    /// is another's), within the watcher's cap (see `control_queue`).
    pub(super) fn watch_event(&mut self, w: ConnRef, ev: WatchEvent) {
        if w.shard != self.id {
            self.mail(w.shard, Mail::Watch(w, ev));
            return;
        }
        let Some(slot) = self.live(w) else { return };
        self.queue_control(slot, Origin::Presence, |q| match ev {
            WatchEvent::Present {
                key,
                addr,
                flags,
                app_name,
            } => {
                let name = app_name.as_ref().map_or("", AppName::as_str);
                frame::put_peer_present(q, &key, Some(addr), flags, name)
            }
            WatchEvent::Gone(key) => frame::put_peer_gone(q, &key, PeerGoneReason::Disconnected),
        });
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
                    app_name: c.app_name(),
                }
            })
            .collect();
        for ev in present {
            self.watch_event(w, ev);
        }
    }
}
