//! A remote LUN that fails on demand: its medium a [`FaultDev`] in the test process (a disk
//! with a volatile write cache), served by `stics target` in process or by tgt over a FUSE
//! file, reached through a [`Proxy`]; the link is cut, the storage host loses power, writes are
//! refused with a chosen error, commands are slowed.
//!
//! ```text
//!  gateway ──► Proxy (cut, outage) ──► stics target (in process) ──► FaultDev
//!                                  └─► tgtd ──► FUSE file (in process) ──┘
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stics_block::BlockDev;
use stics_fuse::{ExportOptions, Mounted};
use stics_initiator::{Data, IscsiUrl, Lun, LunOptions};
use stics_sam::op::{pr_in, pr_out, pr_type};
use stics_sam::sense::{asc, key};
use stics_sam::{cdb, data, status};
use stics_target::{Server as TargetServer, ServerConfig, Target};

use crate::faults::{ErrorKind, FaultDev, Op, Rule};
use crate::net::{free_port, Proxy};
use crate::peers::{InProcess, Tgt};
use crate::proc::wait_mounted;
use crate::IQN;

/// Which target serves the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// The stics target library in the test process, directly over the [`FaultDev`].
    Stics,
    /// Debian's tgtd, serving the [`FaultDev`] exported as a file through FUSE by the test
    /// process (direct I/O: the kernel caches nothing; tgt's fdatasync is the device's flush).
    Tgt,
}

impl Server {
    /// The LUN the data is on (tgt's LUN 0 is its controller).
    pub fn lun(self) -> u32 {
        match self {
            Server::Stics => 0,
            Server::Tgt => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Server::Stics => "stics target",
            Server::Tgt => "tgt",
        }
    }
}

/// What a remote answers to a refused command: its status and, with CHECK CONDITION, the
/// sense key and additional sense code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub status: u8,
    pub sense: Option<(u8, (u8, u8))>,
}

/// The reservation key [`FaultRemote::fail_writes`] takes tgt's LUN under, for a RESERVATION
/// CONFLICT that is real.
pub const INTRUDER_KEY: u64 = 0x5717_c5fa_0175_0001;

/// How long a restarted server may take to bind its port again (the old listener closes as
/// its task is dropped).
const REBIND: Duration = Duration::from_secs(10);

enum Serving {
    Stics { port: u16, server: Option<InProcess> },
    Tgt { tgt: Box<Tgt>, file: PathBuf, mount: Export },
}

/// A remote LUN over a [`FaultDev`] with faults on demand; every process, mount and task it
/// starts stops when it is dropped. Used from synchronous code: it owns the tokio runtime its
/// in-process parts run on.
pub struct FaultRemote {
    server: Server,
    dev: FaultDev,
    proxy: Proxy,
    serving: Serving,
    /// A plain initiator holding tgt's LUN under [`INTRUDER_KEY`] while writes are refused.
    intruder: Option<Lun>,
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl FaultRemote {
    /// A zeroed LUN of `size_mib` MiB in 512-byte blocks with a volatile write cache, served by
    /// `server`; the medium's random choices follow `seed`.
    pub fn start(server: Server, size_mib: u64, seed: u64) -> FaultRemote {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fault-remote")
            .enable_all()
            .build()
            .expect("a runtime for the fault remote");
        let dev = FaultDev::new(512, (size_mib << 20) / 512, seed);
        let dir = tempfile::tempdir().expect("a directory for the fault remote");
        let serving = match server {
            Server::Stics => Serving::Stics { port: free_port(), server: None },
            Server::Tgt => {
                let file = dir.path().join("lun.img");
                std::fs::File::create(&file).expect("the FUSE mount point");
                let mount = Export(Some(export(&dev, &rt, &file)));
                Serving::Tgt { tgt: Box::new(Tgt::serve(&file)), file, mount }
            }
        };
        let upstream = match &serving {
            Serving::Stics { port, .. } => *port,
            Serving::Tgt { tgt, .. } => tgt.port,
        };
        let mut r = FaultRemote { server, dev, proxy: Proxy::start(upstream), serving, intruder: None, _dir: dir, rt };
        if server == Server::Stics {
            r.power_on();
        }
        r
    }

    pub fn server(&self) -> Server {
        self.server
    }

    /// The LUN's URL through the proxy: what the gateway is given.
    pub fn url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{IQN}/{}", self.proxy.port, self.server.lun())
    }

    /// The LUN's URL past the proxy, for a reader that must not see the link's faults.
    pub fn direct_url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{IQN}/{}", self.port(), self.server.lun())
    }

    fn port(&self) -> u16 {
        match &self.serving {
            Serving::Stics { port, .. } => *port,
            Serving::Tgt { tgt, .. } => tgt.port,
        }
    }

    /// The medium now (a power loss replaces it with the one that survived).
    pub fn dev(&self) -> &FaultDev {
        &self.dev
    }

    pub fn num_blocks(&self) -> u64 {
        self.dev.geometry().num_blocks
    }

    /// What the medium holds for good: what a power loss now would leave.
    pub fn read_durable(&self, lba: u64, blocks: u64) -> Vec<u8> {
        self.dev.read_durable(lba, blocks)
    }

    /// What a reader of the LUN sees now: the medium with the volatile cache over it.
    pub fn read_volatile(&self, lba: u64, blocks: u64) -> Vec<u8> {
        self.dev.read_volatile(lba, blocks)
    }

    /// Resets every connection through the proxy; new ones get through at once.
    pub fn cut(&self) {
        self.proxy.cut();
    }

    /// The link goes dead: connections are reset and new ones reach nothing (they open, and
    /// nothing they send is answered) until [`FaultRemote::restore`].
    pub fn outage(&self) {
        self.proxy.freeze(true);
        self.proxy.cut();
    }

    /// Ends an [`FaultRemote::outage`]: new connections get through again.
    pub fn restore(&self) {
        self.proxy.freeze(false);
    }

    /// The storage host loses power, stays off for `off`, and comes back on the same port over
    /// what its medium made durable.
    pub fn power_loss(&mut self, off: Duration) {
        self.power_off();
        std::thread::sleep(off);
        self.power_on();
    }

    /// The storage host loses power: the target stops without a word (tgtd SIGKILLed, the
    /// in-process server dropped), every connection is reset and the medium loses its
    /// volatile cache. Faults injected so far go with it.
    pub fn power_off(&mut self) {
        match &mut self.serving {
            Serving::Stics { server, .. } => {
                if let Some(s) = server.take() {
                    self.rt.block_on(s.kill());
                }
            }
            Serving::Tgt { tgt, .. } => tgt.kill(),
        }
        self.proxy.cut();
        self.dev.crash();
        // Its registration went with the power, as every other initiator's did.
        self.intruder = None;
        if let Serving::Tgt { mount, .. } = &mut self.serving {
            mount.unmount().unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Power comes back: the target starts again on the same port over the medium's durable
    /// content; for tgt the target and its LUN are made again (its reservations are gone, as
    /// after a real power cycle; the in-process target forgets them too).
    pub fn power_on(&mut self) {
        if self.dev.is_down() {
            self.dev = self.dev.reopen();
        }
        match &mut self.serving {
            Serving::Stics { port, server } => {
                if server.is_none() {
                    *server = Some(self.rt.block_on(serve_stics(*port, &self.dev)));
                }
            }
            Serving::Tgt { tgt, file, mount } => {
                if mount.0.is_none() {
                    mount.0 = Some(export(&self.dev, &self.rt, file));
                }
                tgt.restart();
            }
        }
    }

    /// Refuses every write (and zeroing and unmapping, and SYNCHRONIZE CACHE when `flushes`)
    /// with `kind` until [`FaultRemote::repair`]; what the remote answers is
    /// [`FaultRemote::refusal`].
    ///
    /// The in-process target answers each kind with its own status and sense. tgt sees a file
    /// that fails with EIO, ENOSPC or EROFS, and answers each with MEDIUM ERROR; its
    /// RESERVATION CONFLICT is real instead: a plain initiator registers [`INTRUDER_KEY`] and
    /// preempts the holder's reservation (or reserves the LUN, Write Exclusive, when no one
    /// holds it), which refuses writes and flushes alike until repaired.
    pub fn fail_writes(&mut self, kind: ErrorKind, flushes: bool) {
        if self.server == Server::Tgt && kind == ErrorKind::Reserved {
            self.intrude();
            return;
        }
        for op in [Op::Write, Op::WriteZeros, Op::Discard] {
            self.dev.add_rule(Rule::error(op, kind));
        }
        if flushes {
            self.dev.add_rule(Rule::error(Op::Flush, kind));
        }
    }

    /// What the remote answers to a write while [`FaultRemote::fail_writes`] with `kind` lasts.
    pub fn refusal(&self, kind: ErrorKind) -> Refusal {
        let check = |k, c| Refusal { status: status::CHECK_CONDITION, sense: Some((k, c)) };
        match (self.server, kind) {
            (_, ErrorKind::Reserved) => Refusal { status: status::RESERVATION_CONFLICT, sense: None },
            // tgt's file backing store answers any failed write so, whatever errno it got.
            (Server::Tgt, _) => check(key::MEDIUM_ERROR, asc::UNRECOVERED_READ_ERROR),
            (Server::Stics, ErrorKind::Io) => check(key::MEDIUM_ERROR, asc::WRITE_ERROR),
            (Server::Stics, ErrorKind::NoSpace) => check(key::DATA_PROTECT, asc::SPACE_ALLOCATION_FAILED),
            (Server::Stics, ErrorKind::WriteProtected) => check(key::DATA_PROTECT, asc::WRITE_PROTECTED),
            // The SCSI layer answers BUSY for an unreachable device as for a busy one.
            (Server::Stics, ErrorKind::Busy | ErrorKind::Unreachable) => Refusal { status: status::BUSY, sense: None },
        }
    }

    /// Every command waits `by` more before the medium takes it (until [`FaultRemote::repair`]).
    pub fn delay(&self, by: Duration) {
        for op in [Op::Read, Op::Write, Op::Flush, Op::WriteZeros, Op::Discard] {
            self.dev.add_rule(Rule::delay(op, by));
        }
    }

    /// Ends [`FaultRemote::fail_writes`] and [`FaultRemote::delay`]: the medium takes every
    /// command again, and tgt's LUN is released and its intruder unregistered.
    pub fn repair(&mut self) {
        self.dev.clear_rules();
        if let Some(lun) = self.intruder.take() {
            self.rt.block_on(async {
                pr(&lun, pr_out::RELEASE, pr_type::WRITE_EXCLUSIVE, INTRUDER_KEY, 0).await;
                pr(&lun, pr_out::REGISTER, 0, INTRUDER_KEY, 0).await;
                lun.close().await;
            });
        }
    }

    /// A plain initiator takes tgt's LUN under [`INTRUDER_KEY`] (see [`FaultRemote::fail_writes`]).
    fn intrude(&mut self) {
        let url = IscsiUrl::parse(&self.direct_url()).expect("the remote's own URL");
        let lun = self.rt.block_on(async {
            let lun = Lun::open(&url, &LunOptions::default())
                .await
                .unwrap_or_else(|e| panic!("the intruder cannot log in to {url:?}: {e}"));
            pr(&lun, pr_out::REGISTER_AND_IGNORE, 0, 0, INTRUDER_KEY).await;
            let req = Data::Read(24);
            let o = lun
                .execute(cdb::pr_in(pr_in::READ_RESERVATION, 24), req)
                .await
                .unwrap_or_else(|e| panic!("READ RESERVATION: {e}"));
            let held = data::parse_read_reservation(&o.data).and_then(|(_, r)| r);
            match held {
                Some(r) => pr(&lun, pr_out::PREEMPT, pr_type::WRITE_EXCLUSIVE, INTRUDER_KEY, r.key).await,
                None => pr(&lun, pr_out::RESERVE, pr_type::WRITE_EXCLUSIVE, INTRUDER_KEY, 0).await,
            }
            lun
        });
        self.intruder = Some(lun);
    }
}

impl Drop for FaultRemote {
    fn drop(&mut self) {
        // tgtd first, so that nothing holds the FUSE file when it is unmounted.
        if let Serving::Tgt { tgt, mount, .. } = &mut self.serving {
            tgt.kill();
            let _ = mount.unmount();
        }
        self.proxy.cut();
    }
}

/// One PERSISTENT RESERVE OUT with the basic parameter list; a refusal fails the test.
async fn pr(lun: &Lun, sa: u8, ptype: u8, key: u64, sa_key: u64) {
    let params = Bytes::from(data::pr_out_parameters(key, sa_key));
    if let Err(e) = lun.execute(cdb::pr_out(sa, ptype), Data::Write(params)).await {
        panic!("PERSISTENT RESERVE OUT service action {sa} (key {key:#x}, {sa_key:#x}): {e}");
    }
}

/// The in-process target over `dev` on 127.0.0.1:`port`, bound again until the old listener
/// has let the port go.
async fn serve_stics(port: u16, dev: &FaultDev) -> InProcess {
    let deadline = Instant::now() + REBIND;
    loop {
        let devs: Vec<Arc<dyn BlockDev>> = vec![Arc::new(dev.clone())];
        let target = Target { alias: Some("fault remote".into()), ..Target::new(IQN, devs) };
        let config = ServerConfig::new(vec![std::net::SocketAddr::from(([127, 0, 0, 1], port))], vec![target]);
        match TargetServer::bind(config).await {
            Ok(server) => return InProcess::serve(server),
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("the fault remote's target cannot start again on port {port}: {e}"),
        }
    }
}

/// `dev` as the regular file `file` through FUSE, requests handled on `rt`.
fn export(dev: &FaultDev, rt: &tokio::runtime::Runtime, file: &std::path::Path) -> Mounted {
    let opts = ExportOptions { fsname: "stics-fault-remote".into(), ..ExportOptions::default() };
    let m = stics_fuse::mount(Arc::new(dev.clone()), rt.handle().clone(), file, &opts)
        .unwrap_or_else(|e| panic!("FUSE export of the fault remote (root and /dev/fuse needed): {e}"));
    assert!(wait_mounted(file, true, Duration::from_secs(10)), "the FUSE export of {} never mounted", file.display());
    m
}

/// A FUSE export of the medium, unmounted when dropped (also when starting tgtd over it fails).
struct Export(Option<Mounted>);

impl Export {
    /// Unmounts the export, if mounted, and waits for its request loop to end.
    fn unmount(&mut self) -> Result<(), String> {
        let Some(mut m) = self.0.take() else { return Ok(()) };
        let path = m.path().to_owned();
        m.unmount().map_err(|e| format!("unmounting the fault remote's FUSE file {}: {e}", path.display()))?;
        let _ = m.join();
        wait_mounted(&path, false, Duration::from_secs(10));
        Ok(())
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        let _ = self.unmount();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::{check, stamp_run};
    use crate::workload::fault_options;
    use stics_block::BlockError;
    use stics_initiator::Error;

    /// A client of the remote on a runtime of its own.
    struct Client {
        rt: tokio::runtime::Runtime,
        lun: Lun,
    }

    impl Client {
        fn open(url: &str) -> Client {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            let lun = rt.block_on(Lun::open(&IscsiUrl::parse(url).unwrap(), &fault_options())).unwrap();
            Client { rt, lun }
        }

        fn write(&self, lba: u64, version: u64, fua: bool) -> Result<(), BlockError> {
            self.rt.block_on(self.lun.write(lba, stamp_run(lba, 8, version, 512), fua))
        }

        /// WRITE(16) of 8 blocks, with the SCSI status and sense of a refusal.
        fn write_scsi(&self, lba: u64) -> Result<(), Refusal> {
            let data = Data::Write(stamp_run(lba, 8, 9, 512));
            match self.rt.block_on(self.lun.execute(cdb::write16(lba, 8, false), data)) {
                Ok(_) => Ok(()),
                Err(Error::Scsi { status, sense, .. }) => {
                    Err(Refusal { status, sense: sense.map(|s| (s.key, (s.asc, s.ascq))) })
                }
                Err(e) => panic!("WRITE(16) at {lba}: {e}"),
            }
        }
    }

    fn versions(image: &[u8]) -> Vec<Option<u64>> {
        image.chunks(512).map(|b| check(b).ok().map(|(_, v)| v)).collect()
    }

    fn power_loss_keeps_exactly_what_was_made_durable(server: Server) {
        let mut remote = FaultRemote::start(server, 16, 1);
        assert_eq!(remote.num_blocks(), 32768);
        let c = Client::open(&remote.url());
        c.write(0, 1, false).unwrap();
        c.rt.block_on(c.lun.flush()).unwrap();
        c.write(8, 1, true).unwrap();
        c.write(16, 1, false).unwrap();
        c.write(0, 2, false).unwrap();
        assert_eq!(versions(&remote.read_volatile(0, 24)), [[Some(2); 8], [Some(1); 8], [Some(1); 8]].concat());
        let durable = [[Some(1); 8], [Some(1); 8], [None; 8]].concat();
        assert_eq!(versions(&remote.read_durable(0, 24)), durable, "flushed and FUA writes only");
        remote.power_loss(Duration::from_millis(200));
        assert_eq!(versions(&remote.read_volatile(0, 24)), durable);
        // The client's session comes back on its own and reads what survived.
        let back = c.rt.block_on(c.lun.read(0, 24)).unwrap();
        assert_eq!(versions(&back), durable, "{}: what a reader sees after the power loss", server.name());
        c.write(16, 3, false).unwrap();
        assert_eq!(versions(&remote.read_volatile(16, 1)), [Some(3)]);
    }

    #[test]
    fn power_loss_keeps_flushed_and_fua_writes_and_drops_the_rest_stics() {
        power_loss_keeps_exactly_what_was_made_durable(Server::Stics);
    }

    #[test]
    fn power_loss_keeps_flushed_and_fua_writes_and_drops_the_rest_tgt() {
        power_loss_keeps_exactly_what_was_made_durable(Server::Tgt);
    }

    fn refused_writes_answer_as_said(server: Server, kinds: &[ErrorKind]) {
        let mut remote = FaultRemote::start(server, 16, 2);
        let c = Client::open(&remote.direct_url());
        for &kind in kinds {
            remote.fail_writes(kind, false);
            let got = c.write_scsi(64).unwrap_err();
            assert_eq!(got, remote.refusal(kind), "{}: {kind:?}", server.name());
            // Through the initiator's block device: a reservation is told apart today, the
            // others are I/O errors until the initiator maps their sense.
            let e = c.write(64, 1, false).unwrap_err();
            match kind {
                ErrorKind::Reserved => assert!(matches!(e, BlockError::Reserved { .. }), "{e:?}"),
                _ => assert!(!e.is_transient() || kind == ErrorKind::Busy, "{kind:?}: {e:?}"),
            }
            c.rt.block_on(c.lun.read(64, 8)).expect("reads go on");
            remote.repair();
            c.write_scsi(64).unwrap_or_else(|r| panic!("{}: after repairing {kind:?}: {r:?}", server.name()));
        }
    }

    #[test]
    fn refused_writes_answer_with_the_kind_asked_stics() {
        use ErrorKind::{Busy, Io, NoSpace, Reserved, WriteProtected};
        refused_writes_answer_as_said(Server::Stics, &[Io, NoSpace, WriteProtected, Reserved, Busy]);
    }

    #[test]
    fn refused_writes_answer_with_medium_error_or_a_real_reservation_conflict_tgt() {
        use ErrorKind::{Io, NoSpace, Reserved, WriteProtected};
        refused_writes_answer_as_said(Server::Tgt, &[Io, NoSpace, WriteProtected, Reserved]);
    }

    #[test]
    fn a_reservation_conflict_through_tgt_preempts_the_holder_and_repair_frees_the_lun() {
        let mut remote = FaultRemote::start(Server::Tgt, 16, 3);
        let c = Client::open(&remote.url());
        assert_eq!(c.rt.block_on(c.lun.claim(0x77)).unwrap(), stics_block::Claim::Held);
        c.write(0, 1, false).unwrap();
        remote.fail_writes(ErrorKind::Reserved, true);
        assert!(matches!(c.write(0, 2, false), Err(BlockError::Reserved { .. })));
        assert!(c.rt.block_on(c.lun.flush()).is_err(), "a flush is refused too");
        remote.repair();
        c.write(0, 3, false).unwrap();
        assert_eq!(versions(&remote.read_volatile(0, 1)), [Some(3)]);
    }

    #[test]
    fn an_outage_holds_commands_until_restored_and_a_cut_is_healed_at_once() {
        for server in [Server::Stics, Server::Tgt] {
            let remote = FaultRemote::start(server, 16, 4);
            let c = Client::open(&remote.url());
            c.write(0, 1, false).unwrap();
            remote.outage();
            let lun = &c.lun;
            let started = Instant::now();
            let done = std::thread::scope(|s| {
                let w = s.spawn(|| c.rt.block_on(lun.write(8, stamp_run(8, 8, 1, 512), false)));
                std::thread::sleep(Duration::from_secs(2));
                let early = w.is_finished();
                remote.restore();
                let r = w.join().unwrap();
                (early, r)
            });
            assert!(!done.0, "{}: a write finished during the outage", server.name());
            done.1.unwrap_or_else(|e| panic!("{}: the write after the outage: {e}", server.name()));
            assert!(started.elapsed() >= Duration::from_secs(2));
            remote.cut();
            c.write(16, 1, false).unwrap();
            assert_eq!(versions(&remote.read_volatile(0, 24)), vec![Some(1); 24], "{}", server.name());
        }
    }

    #[test]
    fn delay_slows_every_command_until_repaired() {
        let mut remote = FaultRemote::start(Server::Stics, 16, 5);
        let c = Client::open(&remote.direct_url());
        remote.delay(Duration::from_millis(300));
        let t = Instant::now();
        c.rt.block_on(c.lun.read(0, 8)).unwrap();
        c.write(0, 1, false).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(600), "{:?}", t.elapsed());
        remote.repair();
        let t = Instant::now();
        c.write(0, 2, false).unwrap();
        assert!(t.elapsed() < Duration::from_millis(300), "{:?}", t.elapsed());
    }
}
