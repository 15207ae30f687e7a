//! Live sessions of the target: TSIH allocation, the session limit and session reinstatement
//! (RFC 7143 §6.3.5: a leading login with the ISID and initiator name of an existing session
//! replaces it). Plain data with no I/O; the driver signals the replaced session to end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Lets one part of the target tell a session to end.
#[derive(Debug, Default)]
pub struct SessionCtl {
    killed: AtomicBool,
    notify: Notify,
}

impl SessionCtl {
    /// Asks the session to end (idempotent).
    pub fn kill(&self) {
        self.killed.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    /// True once [`SessionCtl::kill`] was called.
    pub fn is_killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }

    /// Resolves when the session is asked to end.
    pub async fn killed(&self) {
        while !self.is_killed() {
            self.notify.notified().await;
        }
    }
}

#[derive(Debug)]
struct Entry {
    initiator: String,
    isid: [u8; 6],
    target: Option<usize>,
    ctl: Arc<SessionCtl>,
}

/// Why a session could not be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The configured session limit is reached.
    #[error("session limit reached")]
    Full,
}

/// A session that was registered.
#[derive(Debug)]
pub struct Registered {
    pub tsih: u16,
    pub ctl: Arc<SessionCtl>,
    /// The session this one replaces (already told to end).
    pub replaced: Option<Arc<SessionCtl>>,
}

/// All sessions of the process.
#[derive(Debug)]
pub struct Registry {
    sessions: HashMap<u16, Entry>,
    next_tsih: u16,
    max: usize,
}

impl Registry {
    /// A registry allowing `max` sessions.
    pub fn new(max: usize) -> Registry {
        Registry { sessions: HashMap::new(), next_tsih: 1, max }
    }

    /// Number of live sessions.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// True with no live session.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Registers a new session; a normal session with the same initiator, ISID and target as a
    /// live one reinstates it: the old one is removed and told to end.
    pub fn register(
        &mut self,
        initiator: &str,
        isid: [u8; 6],
        target: Option<usize>,
    ) -> Result<Registered, RegistryError> {
        let initiator = initiator.to_ascii_lowercase();
        let old = if target.is_some() {
            self.sessions
                .iter()
                .find(|(_, e)| e.initiator == initiator && e.isid == isid && e.target == target)
                .map(|(&t, _)| t)
        } else {
            None
        };
        let replaced = old.and_then(|t| self.sessions.remove(&t)).map(|e| {
            e.ctl.kill();
            e.ctl
        });
        if self.sessions.len() >= self.max {
            return Err(RegistryError::Full);
        }
        // TSIH zero means "new session" on the wire, so it is never handed out.
        let mut tsih = self.next_tsih;
        while tsih == 0 || self.sessions.contains_key(&tsih) {
            tsih = tsih.wrapping_add(1);
        }
        self.next_tsih = tsih.wrapping_add(1);
        let ctl = Arc::new(SessionCtl::default());
        self.sessions.insert(tsih, Entry { initiator, isid, target, ctl: Arc::clone(&ctl) });
        Ok(Registered { tsih, ctl, replaced })
    }

    /// Removes a session that ended (no effect if it was already replaced).
    pub fn unregister(&mut self, tsih: u16, ctl: &Arc<SessionCtl>) {
        if self.sessions.get(&tsih).is_some_and(|e| Arc::ptr_eq(&e.ctl, ctl)) {
            self.sessions.remove(&tsih);
        }
    }

    /// Tells every session (of one target, or all) to end.
    pub fn kill_all(&self, target: Option<usize>) {
        for e in self.sessions.values() {
            if target.is_none() || e.target == target {
                e.ctl.kill();
            }
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn tsih_is_never_zero_and_never_reused_while_live() {
        let mut r = Registry::new(10);
        r.next_tsih = u16::MAX;
        let a = r.register("iqn.a", [1; 6], Some(0)).unwrap();
        let b = r.register("iqn.a", [2; 6], Some(0)).unwrap();
        assert_eq!(a.tsih, u16::MAX);
        assert_eq!(b.tsih, 1);
        r.next_tsih = u16::MAX;
        let c = r.register("iqn.a", [3; 6], Some(0)).unwrap();
        assert_eq!(c.tsih, 2);
    }

    #[test]
    fn same_isid_and_initiator_reinstates_the_session() {
        let mut r = Registry::new(10);
        let a = r.register("iqn.A", [1; 6], Some(0)).unwrap();
        let b = r.register("iqn.a", [1; 6], Some(0)).unwrap();
        assert!(a.ctl.is_killed());
        assert!(b.replaced.is_some_and(|c| Arc::ptr_eq(&c, &a.ctl)));
        assert_eq!(r.len(), 1);
        r.unregister(a.tsih, &a.ctl);
        assert_eq!(r.len(), 1, "the replaced session's exit leaves the new one alone");
        let c = r.register("iqn.a", [2; 6], Some(0)).unwrap();
        assert!(c.replaced.is_none());
        assert!(!b.ctl.is_killed());
    }

    #[test]
    fn session_limit_is_enforced_but_reinstatement_still_works() {
        let mut r = Registry::new(1);
        r.register("iqn.a", [1; 6], Some(0)).unwrap();
        assert_eq!(r.register("iqn.b", [1; 6], Some(0)).unwrap_err(), RegistryError::Full);
        assert!(r.register("iqn.a", [1; 6], Some(0)).is_ok());
    }

    #[test]
    fn discovery_sessions_are_never_reinstated() {
        let mut r = Registry::new(10);
        let a = r.register("iqn.a", [1; 6], None).unwrap();
        r.register("iqn.a", [1; 6], None).unwrap();
        assert!(!a.ctl.is_killed());
    }
}
