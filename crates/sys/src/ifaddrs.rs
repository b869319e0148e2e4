//! The host's interface addresses (`getifaddrs`), with each interface's
//! name and whether it is a point-to-point link.
//!
//! The SDK's endpoint announces its host's addresses to peers as direct
//! candidates; an address on a point-to-point interface (a WireGuard or
//! other tun device, PPP) is left out there, because it is usually reached
//! only through that tunnel — possibly the very tunnel the endpoint
//! carries, which would make the "direct" path run inside itself.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address of one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// The interface's name (`eth0`, `wg0`).
    pub name: String,
    /// The address.
    pub addr: IpAddr,
    /// `IFF_POINTOPOINT`: a tunnel or PPP link.
    pub point_to_point: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
}

/// Every IPv4 and IPv6 address of every interface.
pub fn interface_addrs() -> io::Result<Vec<InterfaceAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid place for the list's address; on success
    // the C library owns the list until the `freeifaddrs` below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list `getifaddrs`
        // returned, which stays allocated until `freeifaddrs`.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points to a socket address
        // whose first field is its family.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: the family says it is a `sockaddr_in`.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says it is a `sockaddr_in6`.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: `ifa_name` is a non-null NUL-terminated string owned by
        // the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let flags = ifa.ifa_flags;
        out.push(InterfaceAddr {
            name,
            addr,
            point_to_point: flags & libc::IFF_POINTOPOINT as u32 != 0,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        });
    }
    // SAFETY: `head` came from a successful `getifaddrs` and is freed once;
    // no reference into the list outlives this call (names were copied).
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_as_loopback_and_not_point_to_point() {
        let all = interface_addrs().expect("getifaddrs");
        let lo = all
            .iter()
            .find(|a| a.addr == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .expect("127.0.0.1 is on some interface");
        assert!(lo.loopback, "{lo:?}");
        assert!(!lo.point_to_point, "{lo:?}");
        assert!(!lo.name.is_empty());
    }
}
