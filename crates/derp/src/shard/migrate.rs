//! Moving a connection to the shard that owns its key once its
//! handshake is done, and taking one in.

use super::*;

impl Shard {
    pub(super) fn migrate_in(&mut self, mut conn: Box<Conn>) {
        let Some(stream) = conn.take_stream() else {
            return;
        };
        // Arrived: the move no longer holds its input.
        conn.release(Hold::Migrating);
        self.next_gen = self.next_gen.wrapping_add(1);
        conn.arrive(self.next_gen);
        let m = &self.m;
        m.migrations_in.inc();
        m.open_sockets.add(1);
        m.queued_bytes.add(conn.regauge());
        count_transport(m, &conn, 1);
        let ktls = conn.transport().is_kernel();
        let slot = self.conns.insert(*conn);
        self.ops.push(Op::Attach(slot, stream));
        if ktls {
            self.ops.push(Op::KtlsRx(slot));
        }
        self.register(slot);
        self.resume_input(slot);
    }

    pub(super) fn finish_migrations(&mut self, driver: &mut dyn DriverOps) {
        let mut i = 0;
        while i < self.migrating.len() {
            let slot = self.migrating[i];
            let Some(conn) = self.conns.get(slot) else {
                self.migrating.swap_remove(i);
                continue;
            };
            if conn.is_closed() {
                self.migrating.swap_remove(i);
                continue;
            }
            // The socket moves once everything queued here (the 101 and
            // serverKey) is written.
            if conn.derp().sending_since().is_some() || conn.has_output() {
                i += 1;
                continue;
            }
            let Some(stream) = driver.detach(slot) else {
                i += 1;
                continue;
            };
            self.migrating.swap_remove(i);
            let mut conn = self.conns.remove(slot);
            conn.detach(stream);
            let gauged = conn.leave();
            let m = &self.m;
            m.open_sockets.add(-1);
            m.queued_bytes.add(-(gauged as i64));
            count_transport(m, &conn, -1);
            let owner = self.shared.owner_of(&conn.key(), self.shards);
            self.mail(owner, Mail::Migrate(Box::new(conn)));
        }
    }
}
