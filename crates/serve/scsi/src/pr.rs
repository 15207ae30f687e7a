//! Persistent reservations (SPC-4 5.9): registrations, the reservation and the conflict rules,
//! as a plain state machine that returns the unit attentions each change causes.

use stics_sam::sense::{asc, Sense};

pub use stics_sam::op::pr_out as sa;
pub use stics_sam::op::pr_type as ptype;

/// The identity of an I_T nexus as reservations see it: initiator port (name + ISID) and target
/// port group tag. A reinstated session with the same ISID is the same nexus.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NexusKey {
    pub initiator: String,
    pub isid: [u8; 6],
    pub tpgt: u16,
}

impl NexusKey {
    /// The iSCSI TransportID (SPC-4 7.6.4.6, format 01b: name plus ISID), padded to 4 bytes.
    pub fn transport_id(&self) -> Vec<u8> {
        let mut name = format!("{},i,0x", self.initiator).into_bytes();
        for b in self.isid {
            name.extend_from_slice(format!("{b:02x}").as_bytes());
        }
        name.push(0);
        while name.len() & 3 != 0 {
            name.push(0);
        }
        let mut v = Vec::with_capacity(4 + name.len());
        v.push(0x40 | 0x05);
        v.push(0);
        v.extend_from_slice(&(name.len() as u16).to_be_bytes());
        v.extend_from_slice(&name);
        v
    }
}

/// How a command is treated in the presence of a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Allowed under every reservation (INQUIRY, REPORT LUNS, PR IN/OUT, ...).
    Always,
    /// Reads the medium or the LU state: blocked by exclusive-access types only.
    Read,
    /// Changes the medium or the LU state: blocked by every type.
    Write,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Registration {
    key: u64,
    nexus: NexusKey,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Reservation {
    holder: NexusKey,
    ptype: u8,
}

/// A unit attention to queue for every session of a nexus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrUa {
    pub nexus: NexusKey,
    pub asc: u8,
    pub ascq: u8,
}

impl PrUa {
    fn new(nexus: &NexusKey, (asc, ascq): (u8, u8)) -> Self {
        PrUa { nexus: nexus.clone(), asc, ascq }
    }
}

/// Why a PERSISTENT RESERVE OUT failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrError {
    /// RESERVATION CONFLICT status.
    Conflict,
    /// CHECK CONDITION with this sense.
    Check(Sense),
}

/// The parameter list of PERSISTENT RESERVE OUT (basic 24-byte form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrOutParams {
    pub key: u64,
    pub sa_key: u64,
    pub spec_i_pt: bool,
    pub all_tg_pt: bool,
    pub aptpl: bool,
}

impl PrOutParams {
    /// Parses the 24-byte parameter list; `param_len` is the CDB's PARAMETER LIST LENGTH.
    pub fn parse(param_len: u32, data: &[u8]) -> Result<Self, Sense> {
        if param_len != 24 || data.len() < 24 {
            return Err(Sense::param_list_length_error());
        }
        let be64 = |at: usize| data.get(at..at + 8).map_or(0, |s| s.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b)));
        let flags = data.get(20).copied().unwrap_or(0);
        Ok(PrOutParams {
            key: be64(0),
            sa_key: be64(8),
            spec_i_pt: flags & 0x08 != 0,
            all_tg_pt: flags & 0x04 != 0,
            aptpl: flags & 0x01 != 0,
        })
    }
}

fn is_all_registrants(t: u8) -> bool {
    t == ptype::WRITE_EXCLUSIVE_AR || t == ptype::EXCLUSIVE_ACCESS_AR
}

fn is_registrants_only(t: u8) -> bool {
    t == ptype::WRITE_EXCLUSIVE_RO || t == ptype::EXCLUSIVE_ACCESS_RO
}

fn valid_type(t: u8) -> bool {
    matches!(t, 1 | 3 | 5 | 6 | 7 | 8)
}

/// Registrations and the persistent reservation of one logical unit.
#[derive(Debug, Default, Clone)]
pub struct PrState {
    generation: u32,
    regs: Vec<Registration>,
    resv: Option<Reservation>,
}

impl PrState {
    /// True when a persistent reservation exists (access checks are needed).
    pub fn reserved(&self) -> bool {
        self.resv.is_some()
    }

    /// True when any nexus is registered.
    pub fn has_registrations(&self) -> bool {
        !self.regs.is_empty()
    }

    fn key_of(&self, n: &NexusKey) -> Option<u64> {
        self.regs.iter().find(|r| &r.nexus == n).map(|r| r.key)
    }

    /// True when `n` holds the reservation (every registrant does for all-registrants types).
    pub fn is_holder(&self, n: &NexusKey) -> bool {
        match &self.resv {
            Some(r) if is_all_registrants(r.ptype) => self.key_of(n).is_some(),
            Some(r) => &r.holder == n,
            None => false,
        }
    }

    /// True when a command of class `access` from `n` must end in RESERVATION CONFLICT.
    pub fn conflicts(&self, n: &NexusKey, access: Access) -> bool {
        let Some(r) = &self.resv else { return false };
        if access == Access::Always || self.is_holder(n) {
            return false;
        }
        let registered = self.key_of(n).is_some();
        match r.ptype {
            ptype::WRITE_EXCLUSIVE => access == Access::Write,
            ptype::EXCLUSIVE_ACCESS => true,
            ptype::WRITE_EXCLUSIVE_RO | ptype::WRITE_EXCLUSIVE_AR => !registered && access == Access::Write,
            _ => !registered,
        }
    }

    /// Every registered nexus.
    pub fn registrants(&self) -> impl Iterator<Item = &NexusKey> {
        self.regs.iter().map(|r| &r.nexus)
    }

    /// Drops everything (a cold reset without APTPL).
    pub fn clear_all(&mut self) {
        self.regs.clear();
        self.resv = None;
        self.generation = self.generation.wrapping_add(1);
    }

    fn others(&self, n: &NexusKey, code: (u8, u8)) -> Vec<PrUa> {
        self.regs.iter().filter(|r| &r.nexus != n).map(|r| PrUa::new(&r.nexus, code)).collect()
    }

    /// Releases the reservation as a side effect of the holder leaving; RO/AR types tell the
    /// remaining registrants (RESERVATIONS RELEASED).
    fn release_by_unregister(&mut self, n: &NexusKey, uas: &mut Vec<PrUa>) {
        let Some(r) = &self.resv else { return };
        let ptype = r.ptype;
        let release = if is_all_registrants(ptype) { self.regs.is_empty() } else { &r.holder == n };
        if release {
            self.resv = None;
            if is_registrants_only(ptype) {
                uas.extend(self.others(n, asc::RESERVATIONS_RELEASED));
            }
        }
    }

    /// Runs one PERSISTENT RESERVE OUT service action for nexus `n`.
    pub fn out(&mut self, n: &NexusKey, sa: u8, scope: u8, ptype: u8, p: &PrOutParams) -> Result<Vec<PrUa>, PrError> {
        let mut uas = Vec::new();
        let mine = self.key_of(n);
        match sa {
            sa::REGISTER | sa::REGISTER_AND_IGNORE => {
                if p.spec_i_pt {
                    return Err(PrError::Check(Sense::invalid_param_field(20, Some(3))));
                }
                if p.all_tg_pt {
                    return Err(PrError::Check(Sense::invalid_param_field(20, Some(2))));
                }
                if p.aptpl {
                    // Persistence through power loss is not offered (PTPL_C = 0).
                    return Err(PrError::Check(Sense::invalid_param_field(20, Some(0))));
                }
                if sa == sa::REGISTER {
                    match mine {
                        None if p.key != 0 => return Err(PrError::Conflict),
                        Some(k) if k != p.key => return Err(PrError::Conflict),
                        _ => {}
                    }
                }
                match (mine, p.sa_key) {
                    (None, 0) => {}
                    (None, key) => self.regs.push(Registration { key, nexus: n.clone() }),
                    (Some(_), 0) => {
                        self.regs.retain(|r| &r.nexus != n);
                        self.release_by_unregister(n, &mut uas);
                    }
                    (Some(_), key) => {
                        if let Some(r) = self.regs.iter_mut().find(|r| &r.nexus == n) {
                            r.key = key;
                        }
                    }
                }
                self.generation = self.generation.wrapping_add(1);
            }
            sa::RESERVE => {
                if mine != Some(p.key) {
                    return Err(PrError::Conflict);
                }
                check_scope_type(scope, ptype)?;
                match &self.resv {
                    Some(r) if self.is_holder(n) && r.ptype == ptype => {}
                    Some(_) => return Err(PrError::Conflict),
                    None => self.resv = Some(Reservation { holder: n.clone(), ptype }),
                }
            }
            sa::RELEASE => {
                if mine != Some(p.key) {
                    return Err(PrError::Conflict);
                }
                let Some(r) = &self.resv else { return Ok(uas) };
                if !self.is_holder(n) {
                    return Ok(uas);
                }
                if r.ptype != ptype || scope != 0 {
                    return Err(PrError::Check(Sense::invalid_release_of_pr()));
                }
                let t = r.ptype;
                self.resv = None;
                if is_registrants_only(t) || is_all_registrants(t) {
                    uas.extend(self.others(n, asc::RESERVATIONS_RELEASED));
                }
            }
            sa::CLEAR => {
                if mine != Some(p.key) {
                    return Err(PrError::Conflict);
                }
                uas.extend(self.others(n, asc::RESERVATIONS_PREEMPTED));
                self.regs.clear();
                self.resv = None;
                self.generation = self.generation.wrapping_add(1);
            }
            sa::PREEMPT | sa::PREEMPT_AND_ABORT => {
                if mine != Some(p.key) {
                    return Err(PrError::Conflict);
                }
                check_scope_type(scope, ptype)?;
                let victim = p.sa_key;
                let resv = self.resv.clone();
                match resv {
                    Some(r) if is_all_registrants(r.ptype) && victim == 0 => {
                        // Preempting an all-registrants reservation with key 0 removes everyone else.
                        uas.extend(self.others(n, asc::REGISTRATIONS_PREEMPTED));
                        self.regs.retain(|x| &x.nexus == n);
                        self.resv = Some(Reservation { holder: n.clone(), ptype });
                    }
                    Some(r) if !is_all_registrants(r.ptype) && self.key_of(&r.holder) == Some(victim) => {
                        for x in self.regs.iter().filter(|x| x.key == victim && &x.nexus != n) {
                            uas.push(PrUa::new(&x.nexus, asc::REGISTRATIONS_PREEMPTED));
                        }
                        self.regs.retain(|x| x.key != victim || &x.nexus == n);
                        let changed = r.ptype != ptype;
                        self.resv = Some(Reservation { holder: n.clone(), ptype });
                        if changed {
                            let hit: Vec<NexusKey> = uas.iter().map(|u| u.nexus.clone()).collect();
                            for x in self.regs.iter().filter(|x| &x.nexus != n && !hit.contains(&x.nexus)) {
                                uas.push(PrUa::new(&x.nexus, asc::RESERVATIONS_PREEMPTED));
                            }
                        }
                    }
                    _ => {
                        if victim == 0 {
                            return Err(PrError::Check(Sense::invalid_param_field(8, None)));
                        }
                        let hit: Vec<NexusKey> =
                            self.regs.iter().filter(|x| x.key == victim).map(|x| x.nexus.clone()).collect();
                        if hit.is_empty() {
                            return Err(PrError::Conflict);
                        }
                        for h in &hit {
                            if h != n {
                                uas.push(PrUa::new(h, asc::REGISTRATIONS_PREEMPTED));
                            }
                        }
                        self.regs.retain(|x| x.key != victim || &x.nexus == n);
                        if let Some(r) = &self.resv {
                            if is_all_registrants(r.ptype) && self.regs.is_empty() {
                                self.resv = None;
                            }
                        }
                    }
                }
                self.generation = self.generation.wrapping_add(1);
            }
            _ => return Err(PrError::Check(Sense::invalid_cdb_field(1, Some(4)))),
        }
        Ok(uas)
    }

    /// PERSISTENT RESERVE IN, READ KEYS.
    pub fn read_keys(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 + 8 * self.regs.len());
        v.extend_from_slice(&self.generation.to_be_bytes());
        v.extend_from_slice(&((8 * self.regs.len()) as u32).to_be_bytes());
        for r in &self.regs {
            v.extend_from_slice(&r.key.to_be_bytes());
        }
        v
    }

    /// PERSISTENT RESERVE IN, READ RESERVATION.
    pub fn read_reservation(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24);
        v.extend_from_slice(&self.generation.to_be_bytes());
        match &self.resv {
            None => v.extend_from_slice(&0u32.to_be_bytes()),
            Some(r) => {
                v.extend_from_slice(&16u32.to_be_bytes());
                // All-registrants reservations report key 0 (SPC-4 6.15.3.3).
                let key = if is_all_registrants(r.ptype) { 0 } else { self.key_of(&r.holder).unwrap_or(0) };
                v.extend_from_slice(&key.to_be_bytes());
                v.extend_from_slice(&[0, 0, 0, 0, 0, r.ptype & 0x0f, 0, 0]);
            }
        }
        v
    }

    /// PERSISTENT RESERVE IN, REPORT CAPABILITIES.
    pub fn report_capabilities() -> Vec<u8> {
        // CRH=1 (RESERVE/RELEASE(6/10) defer to PR), TMV=1, ALLOW COMMANDS=000b, and every type.
        vec![0x00, 0x08, 0x10, 0x80, 0x80 | 0x40 | 0x20 | 0x08 | 0x02, 0x01, 0x00, 0x00]
    }

    /// PERSISTENT RESERVE IN, READ FULL STATUS.
    pub fn read_full_status(&self) -> Vec<u8> {
        let mut body = Vec::new();
        for r in &self.regs {
            let holder = self.is_holder(&r.nexus);
            body.extend_from_slice(&r.key.to_be_bytes());
            body.extend_from_slice(&[0, 0, 0, 0]);
            body.push(u8::from(holder));
            body.push(if holder { self.resv.as_ref().map_or(0, |x| x.ptype & 0x0f) } else { 0 });
            body.extend_from_slice(&[0, 0, 0, 0]);
            body.extend_from_slice(&r.nexus.tpgt.to_be_bytes());
            let tid = r.nexus.transport_id();
            body.extend_from_slice(&(tid.len() as u32).to_be_bytes());
            body.extend_from_slice(&tid);
        }
        let mut v = Vec::with_capacity(8 + body.len());
        v.extend_from_slice(&self.generation.to_be_bytes());
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&body);
        v
    }
}

fn check_scope_type(scope: u8, ptype: u8) -> Result<(), PrError> {
    if scope != 0 {
        return Err(PrError::Check(Sense::invalid_cdb_field(2, Some(7))));
    }
    if !valid_type(ptype) {
        return Err(PrError::Check(Sense::invalid_cdb_field(2, Some(3))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nx(i: u8) -> NexusKey {
        NexusKey { initiator: format!("iqn.2024-01.test:i{i}"), isid: [0x80, 0, 0, 0, 0, i], tpgt: 1 }
    }

    fn p(key: u64, sa_key: u64) -> PrOutParams {
        PrOutParams { key, sa_key, spec_i_pt: false, all_tg_pt: false, aptpl: false }
    }

    fn reg(s: &mut PrState, n: &NexusKey, key: u64) {
        s.out(n, sa::REGISTER_AND_IGNORE, 0, 0, &p(0, key)).unwrap();
    }

    /// (type, registered-read, registered-write, unregistered-read, unregistered-write) per SPC-4.
    #[test]
    fn access_table_for_each_type_matches_spc4() {
        let table = [
            (ptype::WRITE_EXCLUSIVE, true, false, true, false),
            (ptype::EXCLUSIVE_ACCESS, false, false, false, false),
            (ptype::WRITE_EXCLUSIVE_RO, true, true, true, false),
            (ptype::EXCLUSIVE_ACCESS_RO, true, true, false, false),
            (ptype::WRITE_EXCLUSIVE_AR, true, true, true, false),
            (ptype::EXCLUSIVE_ACCESS_AR, true, true, false, false),
        ];
        for (t, rr, rw, ur, uw) in table {
            let mut s = PrState::default();
            let (a, b, c) = (nx(1), nx(2), nx(3));
            reg(&mut s, &a, 0xa);
            reg(&mut s, &b, 0xb);
            s.out(&a, sa::RESERVE, 0, t, &p(0xa, 0)).unwrap();
            assert!(!s.conflicts(&a, Access::Write), "type {t} holder");
            assert_eq!(!s.conflicts(&b, Access::Read), rr, "type {t} registered read");
            assert_eq!(!s.conflicts(&b, Access::Write), rw, "type {t} registered write");
            assert_eq!(!s.conflicts(&c, Access::Read), ur, "type {t} unregistered read");
            assert_eq!(!s.conflicts(&c, Access::Write), uw, "type {t} unregistered write");
            assert!(!s.conflicts(&c, Access::Always));
        }
    }

    #[test]
    fn register_with_wrong_key_conflicts() {
        let mut s = PrState::default();
        let a = nx(1);
        assert_eq!(s.out(&a, sa::REGISTER, 0, 0, &p(5, 6)), Err(PrError::Conflict));
        s.out(&a, sa::REGISTER, 0, 0, &p(0, 6)).unwrap();
        assert_eq!(s.out(&a, sa::REGISTER, 0, 0, &p(7, 8)), Err(PrError::Conflict));
        s.out(&a, sa::REGISTER, 0, 0, &p(6, 8)).unwrap();
        assert_eq!(&s.read_keys()[8..], &8u64.to_be_bytes());
    }

    #[test]
    fn reserve_by_unregistered_or_second_nexus_conflicts() {
        let mut s = PrState::default();
        let (a, b) = (nx(1), nx(2));
        assert_eq!(s.out(&a, sa::RESERVE, 0, 1, &p(1, 0)), Err(PrError::Conflict));
        reg(&mut s, &a, 1);
        reg(&mut s, &b, 2);
        s.out(&a, sa::RESERVE, 0, 1, &p(1, 0)).unwrap();
        s.out(&a, sa::RESERVE, 0, 1, &p(1, 0)).unwrap();
        assert_eq!(s.out(&b, sa::RESERVE, 0, 1, &p(2, 0)), Err(PrError::Conflict));
        assert_eq!(s.out(&a, sa::RESERVE, 0, 3, &p(1, 0)), Err(PrError::Conflict));
    }

    #[test]
    fn release_with_wrong_type_is_invalid_release() {
        let mut s = PrState::default();
        let a = nx(1);
        reg(&mut s, &a, 1);
        s.out(&a, sa::RESERVE, 0, 3, &p(1, 0)).unwrap();
        assert_eq!(s.out(&a, sa::RELEASE, 0, 1, &p(1, 0)), Err(PrError::Check(Sense::invalid_release_of_pr())));
        s.out(&a, sa::RELEASE, 0, 3, &p(1, 0)).unwrap();
        assert!(!s.reserved());
    }

    #[test]
    fn preempt_removes_holder_and_takes_reservation_with_ua() {
        let mut s = PrState::default();
        let (a, b) = (nx(1), nx(2));
        reg(&mut s, &a, 1);
        reg(&mut s, &b, 2);
        s.out(&a, sa::RESERVE, 0, 1, &p(1, 0)).unwrap();
        let uas = s.out(&b, sa::PREEMPT, 0, 3, &p(2, 1)).unwrap();
        assert_eq!(uas, vec![PrUa { nexus: a.clone(), asc: 0x2a, ascq: 0x05 }]);
        assert!(s.is_holder(&b));
        assert!(s.conflicts(&a, Access::Read));
        assert_eq!(s.read_keys().len(), 16);
    }

    #[test]
    fn preempt_of_unknown_key_conflicts_and_zero_key_is_invalid() {
        let mut s = PrState::default();
        let a = nx(1);
        reg(&mut s, &a, 1);
        assert_eq!(s.out(&a, sa::PREEMPT, 0, 1, &p(1, 99)), Err(PrError::Conflict));
        assert!(matches!(s.out(&a, sa::PREEMPT, 0, 1, &p(1, 0)), Err(PrError::Check(_))));
    }

    #[test]
    fn clear_drops_everything_and_tells_others() {
        let mut s = PrState::default();
        let (a, b) = (nx(1), nx(2));
        reg(&mut s, &a, 1);
        reg(&mut s, &b, 2);
        s.out(&a, sa::RESERVE, 0, 5, &p(1, 0)).unwrap();
        let uas = s.out(&a, sa::CLEAR, 0, 0, &p(1, 0)).unwrap();
        assert_eq!(uas, vec![PrUa { nexus: b, asc: 0x2a, ascq: 0x03 }]);
        assert!(!s.reserved() && !s.has_registrations());
    }

    #[test]
    fn all_registrants_reservation_reports_key_zero_and_survives_holder_unregister() {
        let mut s = PrState::default();
        let (a, b) = (nx(1), nx(2));
        reg(&mut s, &a, 1);
        reg(&mut s, &b, 2);
        s.out(&a, sa::RESERVE, 0, 7, &p(1, 0)).unwrap();
        assert_eq!(&s.read_reservation()[8..16], &[0u8; 8]);
        s.out(&a, sa::REGISTER, 0, 0, &p(1, 0)).unwrap();
        assert!(s.reserved());
        assert!(s.is_holder(&b));
        s.out(&b, sa::REGISTER, 0, 0, &p(2, 0)).unwrap();
        assert!(!s.reserved());
    }

    #[test]
    fn transport_id_is_padded_iscsi_format() {
        let t = nx(1).transport_id();
        assert_eq!(t[0], 0x45);
        assert_eq!(t.len() % 4, 0);
        assert_eq!(u16::from_be_bytes([t[2], t[3]]) as usize, t.len() - 4);
        assert!(String::from_utf8_lossy(&t[4..]).starts_with("iqn.2024-01.test:i1,i,0x800000000001"));
    }
}
