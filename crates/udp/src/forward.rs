//! The forwarding rule relay sessions and peer-relay endpoints share: a
//! data datagram goes from one bound address of a pair to the other; and
//! the memory of a received train that lets its later datagrams skip the
//! lookup ([`Train`]).

use std::net::SocketAddr;

use ferry_proto::udp_header::Header;

/// Where a data datagram from `src` goes between two slots' addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// From slot `from` to the other slot's address `to`.
    To {
        /// The sender's slot.
        from: usize,
        /// The other slot's address.
        to: SocketAddr,
    },
    /// Not both slots are bound.
    Unbound,
    /// The source is neither slot's address, or both slots are bound to
    /// it (a datagram never goes back where it came from).
    WrongSource,
}

/// The route of a datagram from `src` (canonical) between `bound`.
pub(crate) fn between(bound: [Option<SocketAddr>; 2], src: SocketAddr) -> Route {
    let [Some(a), Some(b)] = bound else {
        return Route::Unbound;
    };
    let (from, to) = if src == a {
        (0, b)
    } else if src == b {
        (1, a)
    } else {
        return Route::WrongSource;
    };
    if to == src {
        return Route::WrongSource;
    }
    Route::To { from, to }
}

/// Where the last datagram of a received train (the datagrams of one
/// source that GRO glued into one receive) went, so that the next one for
/// the same VNI goes there without a table lookup. Start a new one for
/// every train: it holds for one source only. Sound because nothing a
/// datagram of the train does between two data datagrams of one VNI can
/// change their route: anything other than a forward ends the run
/// ([`Train::note`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Train {
    /// The VNI and destination of the last datagram, if it was forwarded.
    last: Option<(u32, SocketAddr)>,
}

impl Train {
    /// Where a datagram with header `h` goes without a lookup: a data
    /// datagram with the VNI of the one before it, which was forwarded.
    #[inline]
    pub(crate) fn hit(&self, h: &Header) -> Option<SocketAddr> {
        match self.last {
            Some((vni, to)) if !h.control && h.vni == vni => Some(to),
            _ => None,
        }
    }

    /// Records what became of a datagram of `vni` that was looked up:
    /// forwarded to `to`, or not (`None`: the run ends).
    #[inline]
    pub(crate) fn note(&mut self, vni: u32, to: Option<SocketAddr>) {
        self.last = to.map(|to| (vni, to));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let a: SocketAddr = "192.0.2.1:1".parse().unwrap();
        let b: SocketAddr = "192.0.2.2:2".parse().unwrap();
        let c: SocketAddr = "192.0.2.3:3".parse().unwrap();
        assert_eq!(between([Some(a), Some(b)], a), Route::To { from: 0, to: b });
        assert_eq!(between([Some(a), Some(b)], b), Route::To { from: 1, to: a });
        assert_eq!(between([Some(a), Some(b)], c), Route::WrongSource);
        assert_eq!(between([Some(a), None], a), Route::Unbound);
        assert_eq!(between([None, None], a), Route::Unbound);
        assert_eq!(between([Some(a), Some(a)], a), Route::WrongSource);
    }
}
