//! Helpers shared by the UDP relay's in-process tests.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;

use ferry_sys::mmsg::{OutMsg, SendBatch, Span};

/// Sends `train` from `from` to `to` as one UDP GSO message of `segment`
/// bytes per datagram (the last may be shorter), so that a receiver with
/// GRO gets it as one slot.
pub(crate) fn send_gso_train(from: &UdpSocket, to: SocketAddr, train: &[u8], segment: u16) {
    let sent = SendBatch::new()
        .send(
            from.as_fd(),
            train,
            &[Span {
                start: 0,
                len: train.len(),
            }],
            &[OutMsg {
                dst: Some(to),
                first: 0,
                count: 1,
                segment,
            }],
        )
        .unwrap();
    assert_eq!(sent, 1, "one GSO message sent");
}
