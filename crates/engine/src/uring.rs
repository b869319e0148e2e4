//! The io_uring back end.
//!
//! Not written yet: [`probe`] reports it as unavailable, so `--io auto`
//! selects epoll and `--io uring` fails with this reason.

/// Whether the io_uring back end can run here; the reason when not.
pub fn probe() -> Result<(), String> {
    Err("the io_uring back end is not part of this build yet".into())
}

/// Placeholder type so the server can name the back end; construction
/// always fails until the driver exists.
pub struct UringDriver;

impl UringDriver {
    /// Always fails: see [`probe`].
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> std::io::Result<crate::EpollDriver> {
        Err(std::io::Error::other(probe().unwrap_err()))
    }
}
