//! The forwarding rule relay sessions and peer-relay endpoints share: a
//! data datagram goes from one bound address of a pair to the other.

use std::net::SocketAddr;

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
