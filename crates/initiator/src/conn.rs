//! The only module that touches sockets: connecting (over TLS where asked), reading and writing
//! framed PDUs, running a login exchange, and the per-connection reader and writer.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stics_tls::{Connector, ReadHalf, Stream, WriteHalf};
use stics_wire::{frame, Digests, FrameError, Header, Pdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::counters::Counters;
use crate::login::{Login, LoginConfig, Outcome, Step};
use crate::Error;

/// Largest data segment accepted during login, before limits are negotiated (RFC 7143 §13.12
/// lets login text run to 8192 per PDU; some targets send more).
const LOGIN_MAX_DATA: u32 = 65_536;

/// Opens a TCP connection with a time limit.
pub async fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, Error> {
    let s = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| Error::Timeout { addr: addr.to_owned(), during: "connect" })?
        .map_err(|source| Error::Connect { addr: addr.to_owned(), source })?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Wire bytes of a PDU.
pub fn encode(pdu: &Pdu, digests: Digests) -> Bytes {
    let mut out = BytesMut::with_capacity(48 + pdu.data.len() + 12);
    frame::encode(pdu, digests, &mut out);
    out.freeze()
}

/// Counts a PDU about to be sent.
pub fn count_sent(c: &Counters, pdu: &Pdu, wire_len: usize) {
    Counters::add(&c.pdus_sent, 1);
    Counters::add(&c.bytes_sent, wire_len as u64);
    match pdu.header {
        Header::ScsiCommand(_) => {
            Counters::add(&c.commands, 1);
            Counters::add(&c.round_trips, 1);
        }
        Header::LoginRequest(_) | Header::TextRequest(_) | Header::LogoutRequest(_) | Header::TaskMgmtRequest(_) => {
            Counters::add(&c.round_trips, 1);
        }
        Header::NopOut(n) if n.itt != stics_wire::RESERVED_TAG => Counters::add(&c.round_trips, 1),
        _ => {}
    }
}

fn count_received(c: &Counters, pdu: &Pdu, wire_len: usize) {
    Counters::add(&c.pdus_received, 1);
    Counters::add(&c.bytes_received, wire_len as u64);
    if let Header::R2t(_) = pdu.header {
        Counters::add(&c.round_trips, 1);
    }
}

/// Reads PDUs from a byte stream.
pub struct PduReader {
    rd: ReadHalf,
    buf: BytesMut,
    pub digests: Digests,
    pub max_data: u32,
    counters: Arc<Counters>,
    addr: String,
}

impl PduReader {
    pub fn new(rd: ReadHalf, counters: Arc<Counters>, addr: String) -> PduReader {
        PduReader {
            rd,
            buf: BytesMut::with_capacity(1 << 18),
            digests: Digests::default(),
            max_data: LOGIN_MAX_DATA,
            counters,
            addr,
        }
    }

    /// The next whole PDU.
    pub async fn next(&mut self) -> Result<Pdu, Error> {
        loop {
            match frame::check(&self.buf, self.digests, self.max_data) {
                Ok(n) => {
                    let f = self.buf.split_to(n).freeze();
                    let pdu = frame::parse(f, self.digests).map_err(|e| Error::Protocol(e.to_string()))?;
                    count_received(&self.counters, &pdu, n);
                    return Ok(pdu);
                }
                Err(FrameError::Incomplete(need)) => {
                    if self.buf.capacity() - self.buf.len() < need.saturating_sub(self.buf.len()).max(4096) {
                        self.buf.reserve(need.max(1 << 16));
                    }
                    let n = self
                        .rd
                        .read_buf(&mut self.buf)
                        .await
                        .map_err(|source| Error::Io { addr: self.addr.clone(), source })?;
                    if n == 0 {
                        return Err(Error::Io {
                            addr: self.addr.clone(),
                            source: std::io::ErrorKind::UnexpectedEof.into(),
                        });
                    }
                }
                Err(e) => return Err(Error::Protocol(e.to_string())),
            }
        }
    }
}

/// The writing side of a connection. Plain TCP is written from the session's own task, as
/// much as the socket takes at once; over TLS a task of its own writes and flushes, because
/// bytes a TLS session has taken may wait in it until the socket is writable again.
#[derive(Debug)]
pub enum Writer {
    Plain(OwnedWriteHalf),
    Tls { tx: mpsc::UnboundedSender<Bytes>, task: tokio::task::AbortHandle },
}

impl Drop for Writer {
    fn drop(&mut self) {
        // A dropped connection is given up, written or not, as a dropped socket is.
        if let Writer::Tls { task, .. } = self {
            task.abort();
        }
    }
}

fn gone() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the TLS writer stopped after a failed write")
}

impl Writer {
    fn new(wr: WriteHalf) -> Writer {
        match wr {
            WriteHalf::Plain(w) => Writer::Plain(w),
            tls @ WriteHalf::Tls(_) => {
                let (tx, rx) = mpsc::unbounded_channel();
                let task = tokio::spawn(tls_writer(tls, rx)).abort_handle();
                Writer::Tls { tx, task }
            }
        }
    }

    /// Writes as much of `out` as can go without waiting and takes it out of `out`.
    pub fn push(&self, out: &mut BytesMut) -> std::io::Result<()> {
        match self {
            Writer::Plain(w) => {
                while !out.is_empty() {
                    match w.try_write(out) {
                        Ok(n) => {
                            let _ = out.split_to(n);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Writer::Tls { tx, .. } => tx.send(out.split().freeze()).map_err(|_| gone()),
        }
    }

    /// Resolves when [`Writer::push`] can write more; never for TLS, whose pushes take all.
    pub async fn writable(&self) {
        match self {
            Writer::Plain(w) => {
                let _ = w.writable().await;
            }
            Writer::Tls { .. } => std::future::pending().await,
        }
    }

    async fn write_all(&mut self, b: Bytes) -> std::io::Result<()> {
        match self {
            Writer::Plain(w) => w.write_all(&b).await,
            Writer::Tls { tx, .. } => tx.send(b).map_err(|_| gone()),
        }
    }
}

/// Writes what the session queued, flushing after each batch; ends at the first error, which
/// the session then sees as a closed queue and its reader as a broken connection.
async fn tls_writer(mut wr: WriteHalf, mut rx: mpsc::UnboundedReceiver<Bytes>) {
    let mut batch = Vec::with_capacity(64);
    while rx.recv_many(&mut batch, 64).await > 0 {
        for b in batch.drain(..) {
            if wr.write_all(&b).await.is_err() {
                return;
            }
        }
        if wr.flush().await.is_err() {
            return;
        }
    }
    let _ = wr.shutdown().await;
}

/// Sends one PDU directly (login and discovery, where nothing else writes).
pub async fn send(wr: &mut Writer, pdu: &Pdu, digests: Digests, counters: &Counters, addr: &str) -> Result<(), Error> {
    let b = encode(pdu, digests);
    count_sent(counters, pdu, b.len());
    wr.write_all(b).await.map_err(|source| Error::Io { addr: addr.to_owned(), source })
}

/// A connection in full-feature phase, or about to be.
pub struct Connection {
    pub reader: PduReader,
    pub writer: Writer,
    pub addr: String,
}

/// The host part of `host:port` or `[v6]:port`, as a TLS server name.
fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_start_matches('[').trim_end_matches(']')
}

/// Connects (with a TLS handshake when `tls` is set) and logs in; the connection comes back
/// with digests and limits set. The handshake counts against the login's time limit.
pub async fn open(
    addr: &str,
    cfg: LoginConfig,
    counters: Arc<Counters>,
    timeout: Duration,
    tls: Option<&Connector>,
) -> Result<(Connection, Outcome), Error> {
    let tcp = connect(addr, timeout).await?;
    let stream = match tls {
        Some(c) => tokio::time::timeout(timeout, c.connect(host_of(addr), tcp))
            .await
            .map_err(|_| Error::Timeout { addr: addr.to_owned(), during: "TLS handshake" })??,
        None => Stream::Plain(tcp),
    };
    let (rd, wr) = stream.into_split();
    let mut wr = Writer::new(wr);
    let mut reader = PduReader::new(rd, counters.clone(), addr.to_owned());
    let run = async {
        let (mut login, first) = Login::start(cfg);
        send(&mut wr, &first, Digests::default(), &counters, addr).await?;
        loop {
            let resp = reader.next().await?;
            match login.step(&resp)? {
                Step::Send(p) => send(&mut wr, &p, Digests::default(), &counters, addr).await?,
                Step::Done(o) => return Ok::<Outcome, Error>(o),
            }
        }
    };
    let outcome = tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| Error::Timeout { addr: addr.to_owned(), during: "login" })??;
    reader.digests = Digests { header: outcome.params.header_digest, data: outcome.params.data_digest };
    reader.max_data = outcome.params.max_recv_data_segment_length;
    Ok((Connection { reader, writer: wr, addr: addr.to_owned() }, outcome))
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn tls_server_name_is_the_host_of_the_portal() {
        assert_eq!(host_of("127.0.0.1:3260"), "127.0.0.1");
        assert_eq!(host_of("[::1]:3260"), "::1");
        assert_eq!(host_of("sg.example:3261"), "sg.example");
    }
}
