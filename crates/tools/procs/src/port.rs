//! Loopback ports: a free one to listen on, and whether (or once) something listens.

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

/// A free loopback TCP port (free when asked: it binds it to check; another process may take it
/// afterwards).
///
/// Drawn above the well-known services and below the kernel's ephemeral range, so that no
/// outgoing connection holds it as its source port by the time a server binds it, and never
/// handed out twice by one process. When none is found there, one the kernel picks.
pub fn free_port() -> std::io::Result<u16> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let low = ephemeral_low().clamp(20000, 32768);
    let mut given = GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..1000 {
        let port = rand::Rng::gen_range(&mut rand::thread_rng(), 16384..low);
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The first port of net.ipv4.ip_local_port_range (32768, Linux's default, when unreadable).
fn ephemeral_low() -> u16 {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    range.split_whitespace().next().and_then(|l| l.parse().ok()).unwrap_or(32768)
}

/// True if `addr` accepts a TCP connection within 200 ms.
///
/// A connection to itself does not count: with nothing listening, a connect whose ephemeral
/// source port happens to be the one asked for opens simultaneously onto its own socket and
/// succeeds.
pub fn accepts(addr: impl ToSocketAddrs) -> bool {
    let Ok(addrs) = addr.to_socket_addrs() else { return false };
    addrs.into_iter().any(|a| {
        TcpStream::connect_timeout(&a, Duration::from_millis(200))
            .is_ok_and(|s| s.local_addr().ok() != s.peer_addr().ok())
    })
}

/// True once 127.0.0.1:`port` accepts a TCP connection ([`accepts`]), false if it did not
/// within `limit`.
pub fn wait_port(port: u16, limit: Duration) -> bool {
    crate::wait_for(limit, || accepts(("127.0.0.1", port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_port_sees_a_listener() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(wait_port(l.local_addr().unwrap().port(), Duration::from_secs(1)));
        let free = free_port().unwrap();
        assert!(!wait_port(free, Duration::from_millis(100)));
    }

    #[test]
    fn free_ports_lie_below_the_ephemeral_range_and_are_never_given_twice() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let low = ephemeral_low().clamp(20000, 32768);
        assert!(ports.iter().all(|p| (16384..low).contains(p)), "{ports:?}");
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        for p in ports {
            TcpListener::bind(("127.0.0.1", p)).unwrap();
        }
    }
}
