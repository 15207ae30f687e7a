//! Loopback networking for tests: free ports, and a TCP proxy whose connections can be cut
//! (closed) or frozen (kept open but silent).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A free loopback TCP port below the ephemeral range ([`stics_procs::free_port`]); fails the
/// test when there is none.
pub fn free_port() -> u16 {
    stics_procs::free_port().unwrap_or_else(|e| panic!("no free loopback TCP port: {e}"))
}

/// A loopback TCP proxy to `127.0.0.1:upstream` whose connections can be cut or frozen.
pub struct Proxy {
    pub port: u16,
    open: Arc<Mutex<Vec<TcpStream>>>,
    frozen: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let frozen = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (o2, f2, s2) = (open.clone(), frozen.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) => {
                        if down.set_nonblocking(false).is_err() {
                            continue;
                        }
                        let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                        let _ = down.set_nodelay(true);
                        let _ = up.set_nodelay(true);
                        let clones = (down.try_clone(), up.try_clone(), down.try_clone(), up.try_clone());
                        let (Ok(d1), Ok(u1), Ok(d2), Ok(u2)) = clones else { continue };
                        o2.lock().unwrap().extend([d1, u1]);
                        pump(d2, u2, f2.clone());
                        pump(up, down, f2.clone());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy { port, open, frozen, stop }
    }

    /// Closes every connection open through the proxy now (new ones are still accepted).
    pub fn cut(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Stops forwarding without closing anything (a silent, dead link), or resumes.
    pub fn freeze(&self, on: bool) {
        self.frozen.store(on, Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, frozen: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // A frozen link swallows traffic, like a cable pulled without a reset.
            if frozen.load(Ordering::Relaxed) {
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_server() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b) {
                        if n == 0 || s.write_all(&b[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg)?;
        let mut b = vec![0u8; msg.len()];
        s.read_exact(&mut b)?;
        Ok(b)
    }

    #[test]
    fn forwards_then_cut_closes_and_new_connections_work() {
        let p = Proxy::start(echo_server());
        let mut s = TcpStream::connect(("127.0.0.1", p.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(roundtrip(&mut s, b"hello").unwrap(), b"hello");
        p.cut();
        let mut b = [0u8; 1];
        assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
        let mut s = TcpStream::connect(("127.0.0.1", p.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(roundtrip(&mut s, b"again").unwrap(), b"again");
    }

    #[test]
    fn frozen_link_stays_open_and_silent() {
        let p = Proxy::start(echo_server());
        let mut s = TcpStream::connect(("127.0.0.1", p.port)).unwrap();
        assert_eq!(roundtrip(&mut s, b"x").unwrap(), b"x");
        p.freeze(true);
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        s.write_all(b"lost").unwrap();
        let mut b = [0u8; 4];
        let e = s.read(&mut b).unwrap_err();
        assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{e}");
    }
}
