//! TLS 1.3 as a transport of iSCSI connections: certificates and keys read from PEM files into
//! rustls configurations (ring, TLS 1.3 only), and [`Stream`], plain TCP or TLS, for the drivers.
//!
//! The protocol cores above never see which one they run over: the target's and the initiator's
//! connection drivers accept or connect, then read and write the same PDUs through a [`Stream`].

#![forbid(unsafe_code)]

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// What a TLS-serving target needs: its certificate chain and key, and for mutual TLS the CA
/// that signs its clients' certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerOptions {
    /// The certificate chain in PEM, the target's own certificate first.
    pub cert: PathBuf,
    /// The private key of that certificate in PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, only clients presenting a certificate this CA signed are admitted.
    pub client_ca: Option<PathBuf>,
}

/// What a TLS client needs: the CA to trust, the name to expect in the target's certificate,
/// and for mutual TLS its own certificate and key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientOptions {
    /// The CA certificates (PEM) that the target's certificate must chain to.
    pub ca: PathBuf,
    /// The name the target's certificate must carry; the URL's host when unset.
    pub name: Option<String>,
    /// A client certificate chain (PEM), for targets that verify their clients.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key: Option<PathBuf>,
}

/// Errors of setting TLS up and of the handshake.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read the {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A PEM file holds nothing of the kind asked for.
    #[error("the {what} {path} holds no PEM {kind}")]
    Empty { what: &'static str, path: PathBuf, kind: &'static str },
    /// A PEM file is malformed.
    #[error("the {what} {path} is not valid PEM: {reason}")]
    Pem { what: &'static str, path: PathBuf, reason: String },
    /// The certificates and keys do not make a configuration (a key that does not match, a CA
    /// that is not one).
    #[error("TLS configuration: {0}")]
    Config(String),
    /// The name to check the target's certificate against is not a DNS name or an address.
    #[error("bad TLS server name {0:?}")]
    Name(String),
    /// The handshake failed; the hint says what usually causes it.
    #[error("TLS handshake with {peer} failed: {source}{hint}")]
    Handshake {
        peer: String,
        hint: &'static str,
        #[source]
        source: io::Error,
    },
}

impl TlsError {
    /// The underlying I/O error of a failed handshake, for callers that classify errors by kind.
    pub fn into_io(self) -> io::Error {
        match self {
            TlsError::Handshake { source, .. } => source,
            e => io::Error::new(io::ErrorKind::InvalidInput, e),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_error(what: &'static str, path: &Path, kind: &'static str, e: pem::Error) -> TlsError {
    match e {
        pem::Error::Io(source) => TlsError::Read { what, path: path.to_owned(), source },
        pem::Error::NoItemsFound => TlsError::Empty { what, path: path.to_owned(), kind },
        e => TlsError::Pem { what, path: path.to_owned(), reason: e.to_string() },
    }
}

/// Every certificate in a PEM file; at least one.
fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    // Reading first gives a missing file its own error rather than an empty list.
    std::fs::metadata(path).map_err(|source| TlsError::Read { what, path: path.to_owned(), source })?;
    let v = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(what, path, "certificate", e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(what, path, "certificate", e))?;
    if v.is_empty() {
        return Err(TlsError::Empty { what, path: path.to_owned(), kind: "certificate" });
    }
    Ok(v)
}

fn key(what: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_error(what, path, "private key", e))
}

fn roots(what: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certs(what, path)? {
        roots.add(c).map_err(|e| TlsError::Config(format!("{what} {}: {e}", path.display())))?;
    }
    Ok(roots)
}

/// The target's side: a rustls acceptor made from [`ServerOptions`].
#[derive(Clone)]
pub struct Acceptor {
    inner: tokio_rustls::TlsAcceptor,
    mutual: bool,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor").field("mutual", &self.mutual).finish_non_exhaustive()
    }
}

impl Acceptor {
    /// Reads the PEM files and builds a TLS 1.3 server configuration.
    pub fn new(o: &ServerOptions) -> Result<Acceptor, TlsError> {
        let chain = certs("certificate chain", &o.cert)?;
        let key = key("private key", &o.key)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match &o.client_ca {
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots("client CA", ca)?),
                    provider(),
                )
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let cfg = builder.with_single_cert(chain, key).map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Acceptor { inner: tokio_rustls::TlsAcceptor::from(Arc::new(cfg)), mutual: o.client_ca.is_some() })
    }

    /// Whether clients must present a certificate.
    pub fn is_mutual(&self) -> bool {
        self.mutual
    }

    /// Runs the server's handshake on an accepted connection.
    pub async fn accept(&self, tcp: TcpStream, peer: &str) -> Result<Stream, TlsError> {
        match self.inner.accept(tcp).await {
            Ok(s) => Ok(Stream::Tls(Box::new(s.into()))),
            Err(source) => {
                let hint = if is_not_tls(&source) {
                    " (the client does not speak TLS: a plain iSCSI initiator on a TLS port?)"
                } else {
                    ""
                };
                Err(TlsError::Handshake { peer: peer.to_owned(), hint, source })
            }
        }
    }
}

/// Whether a handshake error says the other side sent something other than TLS records.
fn is_not_tls(e: &io::Error) -> bool {
    let text = e.to_string();
    text.contains("InvalidContentType") || text.contains("corrupt message") || text.contains("MessageTooLarge")
}

/// The initiator's side: a rustls connector made from [`ClientOptions`].
#[derive(Clone)]
pub struct Connector {
    inner: tokio_rustls::TlsConnector,
    name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").field("name", &self.name).finish_non_exhaustive()
    }
}

fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    // IPv6 hosts come from URLs in brackets.
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(bare.to_owned()).map_err(|_| TlsError::Name(name.to_owned()))
}

impl Connector {
    /// Reads the PEM files and builds a TLS 1.3 client configuration.
    pub fn new(o: &ClientOptions) -> Result<Connector, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots("CA", &o.ca)?);
        let cfg = match (&o.cert, &o.key) {
            (Some(c), Some(k)) => builder
                .with_client_auth_cert(certs("client certificate", c)?, key("client key", k)?)
                .map_err(|e| TlsError::Config(e.to_string()))?,
            (None, None) => builder.with_no_client_auth(),
            _ => return Err(TlsError::Config("a client certificate and its key go together".into())),
        };
        let name = o.name.as_deref().map(server_name).transpose()?;
        Ok(Connector { inner: tokio_rustls::TlsConnector::from(Arc::new(cfg)), name })
    }

    /// Runs the client's handshake on a connection to `host` (the name checked in the target's
    /// certificate unless the options name another).
    pub async fn connect(&self, host: &str, tcp: TcpStream) -> Result<Stream, TlsError> {
        let name = match &self.name {
            Some(n) => n.clone(),
            None => server_name(host)?,
        };
        match self.inner.connect(name, tcp).await {
            Ok(s) => Ok(Stream::Tls(Box::new(s.into()))),
            Err(source) => {
                let hint = if is_not_tls(&source) || source.kind() == io::ErrorKind::UnexpectedEof {
                    " (does the target serve plain iSCSI on this port, without TLS?)"
                } else {
                    ""
                };
                Err(TlsError::Handshake { peer: host.to_owned(), hint, source })
            }
        }
    }
}

/// A connection, plain or TLS.
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl Stream {
    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// Splits into halves that can live in different tasks. A plain stream splits without a
    /// lock, as before; a TLS stream shares its session between the halves.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            Stream::Tls(s) => {
                let (r, w) = tokio::io::split(s);
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        }
    }
}

type TlsBox = Box<tokio_rustls::TlsStream<TcpStream>>;

/// The reading half of a [`Stream`].
#[derive(Debug)]
pub enum ReadHalf {
    Plain(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<TlsBox>),
}

/// The writing half of a [`Stream`]. Over TLS, bytes may wait in the session after a write
/// returns: writers flush after each batch.
#[derive(Debug)]
pub enum WriteHalf {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<TlsBox>),
}

macro_rules! delegate_read {
    ($t:ty, $($v:ident),+) => {
        impl AsyncRead for $t {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_read(cx, buf),)+
                }
            }
        }
    };
}

macro_rules! delegate_write {
    ($t:ty, $($v:ident),+) => {
        impl AsyncWrite for $t {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_write(cx, buf),)+
                }
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_write_vectored(cx, bufs),)+
                }
            }
            fn is_write_vectored(&self) -> bool {
                match self {
                    $(Self::$v(s) => s.is_write_vectored(),)+
                }
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_flush(cx),)+
                }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_shutdown(cx),)+
                }
            }
        }
    };
}

delegate_read!(Stream, Plain, Tls);
delegate_write!(Stream, Plain, Tls);
delegate_read!(ReadHalf, Plain, Tls);
delegate_write!(WriteHalf, Plain, Tls);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Pki {
        dir: tempfile::TempDir,
    }

    impl Pki {
        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }
    }

    /// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it.
    fn pki() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).expect("ca");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write");
        for (name, san) in [("server", "127.0.0.1"), ("client", "client.example")] {
            let k = rcgen::KeyPair::generate().expect("key");
            let c = rcgen::CertificateParams::new(vec![san.to_owned()])
                .expect("params")
                .signed_by(&k, &issuer)
                .expect("sign");
            std::fs::write(dir.path().join(format!("{name}.pem")), c.pem()).expect("write");
            std::fs::write(dir.path().join(format!("{name}.key")), k.serialize_pem()).expect("write");
        }
        Pki { dir }
    }

    async fn pair(
        server: &ServerOptions,
        client: &ClientOptions,
    ) -> (Result<Stream, TlsError>, Result<Stream, TlsError>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let acceptor = Acceptor::new(server).expect("acceptor");
        let connector = Connector::new(client).expect("connector");
        let s = async {
            let (tcp, _) = l.accept().await.expect("accept");
            acceptor.accept(tcp, "client").await
        };
        let c = async {
            let tcp = TcpStream::connect(addr).await.expect("connect");
            connector.connect("127.0.0.1", tcp).await
        };
        tokio::join!(s, c)
    }

    fn server_opts(p: &Pki, mutual: bool) -> ServerOptions {
        ServerOptions {
            cert: p.path("server.pem"),
            key: p.path("server.key"),
            client_ca: mutual.then(|| p.path("ca.pem")),
        }
    }

    #[tokio::test]
    async fn bytes_cross_a_tls_connection_both_ways_and_split() {
        let p = pki();
        let (s, c) = pair(&server_opts(&p, false), &ClientOptions { ca: p.path("ca.pem"), ..Default::default() }).await;
        let (mut s, c) = (s.expect("server"), c.expect("client"));
        assert!(s.is_tls() && c.is_tls());
        let (mut rd, mut wr) = c.into_split();
        wr.write_all(b"hello").await.expect("write");
        wr.flush().await.expect("flush");
        let mut got = [0u8; 5];
        s.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"hello");
        s.write_all(b"back").await.expect("write");
        s.flush().await.expect("flush");
        let mut got = [0u8; 4];
        rd.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"back");
    }

    #[tokio::test]
    async fn a_client_that_does_not_trust_the_ca_is_refused() {
        let p = pki();
        // The client trusts its own certificate's issuer only by accident of name: give it the
        // server's leaf as its CA, which signed nothing.
        let (_, c) =
            pair(&server_opts(&p, false), &ClientOptions { ca: p.path("client.pem"), ..Default::default() }).await;
        let e = c.expect_err("untrusted");
        assert!(e.to_string().contains("certificate"), "{e}");
    }

    #[tokio::test]
    async fn mutual_tls_refuses_a_client_without_a_certificate_and_admits_one_with() {
        let p = pki();
        let (s, _) = pair(&server_opts(&p, true), &ClientOptions { ca: p.path("ca.pem"), ..Default::default() }).await;
        assert!(s.is_err());
        let with = ClientOptions {
            ca: p.path("ca.pem"),
            cert: Some(p.path("client.pem")),
            key: Some(p.path("client.key")),
            ..Default::default()
        };
        let (s, c) = pair(&server_opts(&p, true), &with).await;
        assert!(s.is_ok() && c.is_ok());
    }

    #[tokio::test]
    async fn a_wrong_server_name_is_refused() {
        let p = pki();
        let o = ClientOptions { ca: p.path("ca.pem"), name: Some("other.example".into()), ..Default::default() };
        let (_, c) = pair(&server_opts(&p, false), &o).await;
        assert!(c.is_err());
    }

    #[test]
    fn missing_and_bad_pem_files_say_which_file_and_what() {
        let p = pki();
        let missing = ServerOptions { cert: p.path("nope.pem"), key: p.path("server.key"), client_ca: None };
        let e = Acceptor::new(&missing).expect_err("missing");
        assert!(matches!(e, TlsError::Read { .. }) && e.to_string().contains("nope.pem"), "{e}");
        std::fs::write(p.path("junk.pem"), "not pem at all\n").expect("write");
        let junk = ServerOptions { cert: p.path("junk.pem"), key: p.path("server.key"), client_ca: None };
        let e = Acceptor::new(&junk).expect_err("junk");
        assert!(e.to_string().contains("junk.pem"), "{e}");
        let no_key = ServerOptions { cert: p.path("server.pem"), key: p.path("server.pem"), client_ca: None };
        let e = Acceptor::new(&no_key).expect_err("no key");
        assert!(e.to_string().contains("private key"), "{e}");
        let e = Connector::new(&ClientOptions { ca: p.path("junk.pem"), ..Default::default() }).expect_err("junk CA");
        assert!(e.to_string().contains("junk.pem"), "{e}");
    }

    #[tokio::test]
    async fn a_plain_client_on_a_tls_port_gets_a_hint() {
        let p = pki();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let acceptor = Acceptor::new(&server_opts(&p, false)).expect("acceptor");
        let client = async {
            let mut tcp = TcpStream::connect(addr).await.expect("connect");
            // A login request's first bytes: opcode 0x43, not a TLS record type.
            tcp.write_all(&[0x43u8; 48]).await.expect("write");
            tcp
        };
        let server = async {
            let (tcp, _) = l.accept().await.expect("accept");
            acceptor.accept(tcp, "plain").await
        };
        let (_c, s) = tokio::join!(client, server);
        let e = s.expect_err("plain");
        assert!(e.to_string().contains("plain iSCSI"), "{e}");
    }
}
