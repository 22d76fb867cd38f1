//! The group writer's and the point readers' connections to PostgreSQL, speaking the wire
//! protocol itself (messages from `postgres-protocol`, the crate `tokio-postgres` is built on)
//! so that a whole group is one pipeline with one `Sync` at its end, and a read's statements
//! and rows cost no more than their messages ([`Wire::query`], `pg_reader.rs`).
//!
//! `tokio-postgres` pipelines too, but ends every statement with a `Sync`
//! (rust-postgres/rust-postgres#1213), and the server flushes its answers at each `Sync`: a
//! group of hundreds of statements cost the server as many `send` calls and their loopback
//! delivery: over a quarter of its CPU in the engine bench (`perf record -a`). Here the server
//! reads the group, runs it, and answers in a few large writes.
//!
//! Without `BEGIN`/`COMMIT` the statements up to the `Sync` are one implicit transaction, which
//! the `Sync` commits, or rolls back when a statement failed (the server then skips the rest
//! up to the `Sync`). The answers come in order, so the statement an error answers for is the
//! one whose answers were being read, and several such pipelines may be sent before the first
//! is answered ([`Wire::encode`] appends one, [`Wire::exchange`] moves bytes both ways,
//! [`Wire::answers`] reads the oldest one's outcome).

use crate::pg_writer::Target;
use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::sasl::{self, ChannelBinding, ScramSha256};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::types::{ToSql, Type};

/// What went wrong, as the writer tells its callers.
#[derive(Debug, Clone)]
pub(crate) enum WireError {
    /// The server refused a statement (or the commit): its SQLSTATE and message.
    Db { code: String, message: String },
    /// A value could not be encoded as its statement's parameter type.
    Encode(String),
    /// The connection failed, or the server said something out of order.
    Io(String),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Db { code, message } => write!(f, "{message} ({code})"),
            WireError::Encode(e) => write!(f, "a value could not be sent: {e}"),
            WireError::Io(e) => write!(f, "the PostgreSQL connection: {e}"),
        }
    }
}

fn io_error(e: impl std::fmt::Display) -> WireError {
    WireError::Io(e.to_string())
}

/// One statement of a pipeline: its text and parameter types (the cache key), and its values.
pub(crate) struct Request<'a> {
    pub(crate) text: &'a str,
    pub(crate) types: &'a [Type],
    pub(crate) values: &'a [&'a (dyn ToSql + Sync)],
    /// About how many bytes the values take, to size the pipeline's buffer.
    pub(crate) bytes: usize,
}

/// How a pipeline went: every statement ran and the transaction committed, or the first
/// failure and the index of the statement it answers for (`None`: the commit, or no statement
/// in particular). Either way the transaction is over.
pub(crate) type Outcome = Result<(), (Option<usize>, WireError)>;

/// Prepared statements kept per connection; past this the cache starts over.
const CACHED_STATEMENTS: usize = 1024;

pub(crate) struct Wire {
    stream: Stream,
    /// Answers read and not parsed yet.
    read: BytesMut,
    /// Statement text → its parameter types and the name it was prepared under with them
    /// (keyed by text alone so that a lookup borrows the request's text instead of copying it).
    prepared: HashMap<String, Vec<(Vec<Type>, String)>>,
    /// How many statements `prepared` holds.
    cached: usize,
    /// Names given so far (each statement gets a new one: a name is never reused).
    named: u64,
    /// Bytes written that a TLS session may hold until flushed.
    unflushed: bool,
}

impl Wire {
    /// Connects, negotiates TLS as the target says, starts up and authenticates.
    pub(crate) async fn connect(target: &Target) -> Result<Self, WireError> {
        let config = &target.config;
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let host = config
            .get_hosts()
            .first()
            .cloned()
            .ok_or_else(|| WireError::Io("no host to connect to".to_owned()))?;
        let mut stream = match &host {
            Host::Tcp(name) => {
                let tcp = tokio::net::TcpStream::connect((name.as_str(), port))
                    .await
                    .map_err(io_error)?;
                tcp.set_nodelay(true).map_err(io_error)?;
                Stream::Tcp(tcp)
            }
            Host::Unix(directory) => Stream::Unix(
                tokio::net::UnixStream::connect(directory.join(format!(".s.PGSQL.{port}")))
                    .await
                    .map_err(io_error)?,
            ),
        };
        if let (Host::Tcp(name), Some(tls), Stream::Tcp(tcp)) = (&host, &target.tls, &mut stream)
            && config.get_ssl_mode() != SslMode::Disable
        {
            let mut request = BytesMut::new();
            frontend::ssl_request(&mut request);
            tcp.write_all(&request).await.map_err(io_error)?;
            let mut answer = [0u8; 1];
            tcp.read_exact(&mut answer).await.map_err(io_error)?;
            match (answer[0], config.get_ssl_mode()) {
                (b'S', _) => {
                    let Stream::Tcp(tcp) = std::mem::replace(&mut stream, Stream::Closed) else {
                        unreachable!("matched above")
                    };
                    let tls = tls.handshake(name, tcp).await.map_err(io_error)?;
                    stream = Stream::Tls(Box::new(tls));
                }
                (b'N', SslMode::Prefer) => {}
                (b'N', _) => {
                    return Err(WireError::Io(
                        "the server does not offer TLS, which sslmode requires".to_owned(),
                    ));
                }
                (other, _) => {
                    return Err(WireError::Io(format!(
                        "unexpected answer to the TLS request: {other:#x}"
                    )));
                }
            }
        }
        let mut wire = Wire {
            stream,
            read: BytesMut::with_capacity(8192),
            prepared: HashMap::new(),
            cached: 0,
            named: 0,
            unflushed: false,
        };
        wire.start_up(target).await?;
        Ok(wire)
    }

    async fn start_up(&mut self, target: &Target) -> Result<(), WireError> {
        let config = &target.config;
        let user = config.get_user().unwrap_or("postgres");
        let mut params = vec![("client_encoding", "UTF8"), ("user", user)];
        if let Some(database) = config.get_dbname() {
            params.push(("database", database));
        }
        if let Some(options) = config.get_options() {
            params.push(("options", options));
        }
        if let Some(name) = config.get_application_name() {
            params.push(("application_name", name));
        }
        let mut out = BytesMut::new();
        frontend::startup_message(params, &mut out).map_err(io_error)?;
        self.send(&mut out).await?;
        let password = || {
            config
                .get_password()
                .ok_or_else(|| WireError::Io("the server asks for a password; none given".into()))
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            match self.next().await? {
                Message::AuthenticationOk => {}
                Message::AuthenticationCleartextPassword => {
                    frontend::password_message(password()?, &mut out).map_err(io_error)?;
                    self.send(&mut out).await?;
                }
                Message::AuthenticationMd5Password(body) => {
                    let hash = postgres_protocol::authentication::md5_hash(
                        user.as_bytes(),
                        password()?,
                        body.salt(),
                    );
                    frontend::password_message(hash.as_bytes(), &mut out).map_err(io_error)?;
                    self.send(&mut out).await?;
                }
                Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let mut offered = false;
                    while let Some(mechanism) = mechanisms.next().map_err(io_error)? {
                        offered |= mechanism == sasl::SCRAM_SHA_256;
                    }
                    if !offered {
                        return Err(WireError::Io("no SASL mechanism in common".to_owned()));
                    }
                    // No channel binding, as sqlx's connections.
                    let client = ScramSha256::new(password()?, ChannelBinding::unsupported());
                    frontend::sasl_initial_response(
                        sasl::SCRAM_SHA_256,
                        client.message(),
                        &mut out,
                    )
                    .map_err(io_error)?;
                    self.send(&mut out).await?;
                    scram = Some(client);
                }
                Message::AuthenticationSaslContinue(body) => {
                    let client = scram
                        .as_mut()
                        .ok_or_else(|| WireError::Io("SASL out of order".to_owned()))?;
                    client.update(body.data()).map_err(io_error)?;
                    frontend::sasl_response(client.message(), &mut out).map_err(io_error)?;
                    self.send(&mut out).await?;
                }
                Message::AuthenticationSaslFinal(body) => {
                    scram
                        .as_mut()
                        .ok_or_else(|| WireError::Io("SASL out of order".to_owned()))?
                        .finish(body.data())
                        .map_err(io_error)?;
                }
                Message::ErrorResponse(body) => return Err(db_error(&body)),
                Message::ReadyForQuery(_) => return Ok(()),
                // Parameter statuses, the cancel key, notices.
                _ => {}
            }
        }
    }

    async fn send(&mut self, out: &mut BytesMut) -> Result<(), WireError> {
        self.stream.write_all(out).await.map_err(io_error)?;
        out.clear();
        Ok(())
    }

    /// The next message from the server.
    async fn next(&mut self) -> Result<Message, WireError> {
        loop {
            if let Some(message) = Message::parse(&mut self.read).map_err(io_error)? {
                return Ok(message);
            }
            if self
                .stream
                .read_buf(&mut self.read)
                .await
                .map_err(io_error)?
                == 0
            {
                return Err(WireError::Io("the server closed the connection".to_owned()));
            }
        }
    }

    /// Whether the connection is still usable as far as can be told without waiting: the server
    /// has not closed it, nor sent an error (as it does before it terminates a connection).
    pub(crate) fn is_open(&mut self) -> bool {
        use futures_util::FutureExt;
        loop {
            match self.stream.read_buf(&mut self.read).now_or_never() {
                None => break,
                Some(Ok(0) | Err(_)) => return false,
                Some(Ok(_)) => {}
            }
        }
        loop {
            match Message::parse(&mut self.read) {
                Ok(None) => return true,
                Ok(Some(Message::ErrorResponse(_))) | Err(_) => return false,
                Ok(Some(_)) => {}
            }
        }
    }

    /// Appends `requests` to `out` as one transaction: each is parsed (unless this connection
    /// prepared it before), bound and executed, a `Sync` after the last. `out` may hold
    /// pipelines not yet written, sent on the same connection before this one: the server runs
    /// them in order. A value that cannot be encoded fails its request (its index), and nothing
    /// of this pipeline is appended.
    pub(crate) fn encode(
        &mut self,
        requests: &[Request<'_>],
        out: &mut BytesMut,
    ) -> Result<Sent, (usize, WireError)> {
        let start = out.len();
        let encoded = self.append(requests, out, false);
        if encoded.is_err() {
            // Nothing of this pipeline is sent: the statements it parsed are not cached, and
            // the pipelines before it are left whole.
            out.truncate(start);
        }
        encoded
    }

    /// [`Wire::encode`]'s work; on an error `out` holds part of the pipeline. `describe` asks
    /// for each statement's result columns (a `RowDescription`, or `NoData`) before its rows.
    fn append(
        &mut self,
        requests: &[Request<'_>],
        out: &mut BytesMut,
        describe: bool,
    ) -> Result<Sent, (usize, WireError)> {
        // Sized for the whole pipeline up front: a group of large values (journal chunks,
        // event payloads) otherwise grows the buffer, and copies it, several times.
        let size: usize = requests
            .iter()
            .map(|r| 32 + r.text.len() + r.values.len() * 12 + r.bytes)
            .sum();
        out.reserve(size);
        if self.cached >= CACHED_STATEMENTS {
            // Closing a statement that does not exist is no error; the answers are skipped.
            // Pipelines sent before this one still run with them: the server closes them after.
            for (_, name) in std::mem::take(&mut self.prepared).into_values().flatten() {
                frontend::close(b'S', &name, out).map_err(|e| (0, io_error(e)))?;
            }
            self.cached = 0;
        }
        // For each request, the name it is prepared under when it is new here. A statement an
        // earlier pipeline still in flight prepares is prepared again, under a name of its own:
        // that pipeline may fail before it gets there.
        let mut parsed: Vec<Option<Prepared>> = Vec::with_capacity(requests.len());
        let mut sent: HashMap<(&str, &[Type]), String> = HashMap::new();
        for (i, request) in requests.iter().enumerate() {
            let key = (request.text, request.types);
            let known = self
                .prepared
                .get(request.text)
                .and_then(|kinds| kinds.iter().find(|(types, _)| types == request.types))
                .map(|(_, name)| name)
                .or_else(|| sent.get(&key));
            let (name, new) = match known {
                Some(name) => (name.as_str(), None),
                None => {
                    self.named += 1;
                    let name = format!("capstan_{}", self.named);
                    frontend::parse(
                        &name,
                        request.text,
                        request.types.iter().map(Type::oid),
                        out,
                    )
                    .map_err(|e| (i, io_error(e)))?;
                    let name: &str = sent.entry(key).or_insert(name);
                    let prepared = Prepared {
                        text: request.text.to_owned(),
                        types: request.types.to_vec(),
                        name: name.to_owned(),
                    };
                    (name, Some(prepared))
                }
            };
            parsed.push(new);
            let bound = frontend::bind(
                "",
                name,
                std::iter::repeat_n(1, request.values.len()),
                request.values.iter().zip(request.types),
                |(value, ty), buf| {
                    value.to_sql_checked(ty, buf).map(|null| match null {
                        tokio_postgres::types::IsNull::Yes => postgres_protocol::IsNull::Yes,
                        tokio_postgres::types::IsNull::No => postgres_protocol::IsNull::No,
                    })
                },
                Some(1),
                out,
            );
            if let Err(e) = bound {
                let e = match e {
                    frontend::BindError::Conversion(e) => e.to_string(),
                    frontend::BindError::Serialization(e) => e.to_string(),
                };
                return Err((i, WireError::Encode(e)));
            }
            if describe {
                frontend::describe(b'P', "", out).map_err(|e| (i, io_error(e)))?;
            }
            frontend::execute("", 0, out).map_err(|e| (i, io_error(e)))?;
        }
        frontend::sync(out);
        Ok(Sent {
            parsed,
            at: 0,
            failed: None,
        })
    }

    /// Writes some of `out` (the pipelines encoded and not yet written) or reads some of the
    /// server's answers, whichever can go on first; the answers are parsed by
    /// [`Wire::answers`]. Cancel-safe: what was written left `out`, what was read is kept.
    /// Writing and reading go on together so that a pipeline larger than the sockets' buffers
    /// cannot stall with both sides writing.
    pub(crate) async fn exchange(&mut self, out: &mut BytesMut) -> Result<(), WireError> {
        let (mut reader, mut writer) = tokio::io::split(&mut self.stream);
        let sending = !out.is_empty() || self.unflushed;
        // Writes while there is something to write, then flushes (TLS keeps what it could not
        // send yet until flushed): whether more is unflushed.
        let send = async {
            if out.is_empty() {
                writer.flush().await.map(|()| false)
            } else {
                writer.write_buf(out).await.map(|_| true)
            }
        };
        tokio::select! {
            read = reader.read_buf(&mut self.read) => match read.map_err(io_error)? {
                0 => Err(WireError::Io("the server closed the connection".to_owned())),
                _ => Ok(()),
            },
            sent = send, if sending => {
                self.unflushed = sent.map_err(io_error)?;
                Ok(())
            }
        }
    }

    /// Parses the answers read so far for `head`, the oldest pipeline whose answers are not
    /// all read: its outcome once its `ReadyForQuery` is read, `None` until then.
    pub(crate) fn answers(&mut self, head: &mut Sent) -> Result<Option<Outcome>, WireError> {
        self.answers_with(head, &mut |_, _| Ok(()))
    }

    /// [`Wire::answers`], handing each statement's `RowDescription` and `DataRow`s to `rows`
    /// with the statement's index. An error `rows` returns ends the parse there, with the
    /// pipeline's answers half read: the connection is fit only to be dropped.
    fn answers_with<E: From<WireError>>(
        &mut self,
        head: &mut Sent,
        rows: &mut impl FnMut(usize, Message) -> Result<(), E>,
    ) -> Result<Option<Outcome>, E> {
        while let Some(message) = Message::parse(&mut self.read).map_err(io_error)? {
            match message {
                Message::ParseComplete => {
                    if let Some(Some(new)) = head.parsed.get_mut(head.at).map(Option::take) {
                        self.prepared
                            .entry(new.text)
                            .or_default()
                            .push((new.types, new.name));
                        self.cached += 1;
                    }
                }
                Message::CommandComplete(_) | Message::EmptyQueryResponse => head.at += 1,
                Message::ErrorResponse(body) => {
                    let error = db_error(&body);
                    // The first error decides; the server skips the rest up to the `Sync`.
                    if head.failed.is_none() {
                        head.failed =
                            Some(((head.at < head.parsed.len()).then_some(head.at), error));
                    }
                }
                Message::ReadyForQuery(_) => {
                    return Ok(Some(match head.failed.take() {
                        None if head.at == head.parsed.len() => Ok(()),
                        None => Err((
                            None,
                            WireError::Io("the server answered fewer statements than sent".into()),
                        )),
                        Some(failure) => Err(failure),
                    }));
                }
                message @ (Message::RowDescription(_) | Message::DataRow(_)) => {
                    rows(head.at, message)?;
                }
                // Bind and close completions, `NoData`, notices, parameter statuses.
                _ => {}
            }
        }
        Ok(None)
    }

    /// Runs `requests` as one pipeline, as [`Wire::encode`] does, and hands each statement's
    /// result columns and rows to `rows` as they are read (with the statement's index). The
    /// statements are one implicit transaction (under `READ COMMITTED` each still reads its own
    /// snapshot); none at all is a round trip that only checks the connection answers.
    ///
    /// Cancelling it midway, or any error, leaves the session halfway through an exchange: the
    /// connection is then fit only to be dropped.
    pub(crate) async fn query<E: From<WireError>>(
        &mut self,
        requests: &[Request<'_>],
        mut rows: impl FnMut(usize, Message) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut out = BytesMut::new();
        let mut head = self
            .append(requests, &mut out, true)
            .map_err(|(_, e)| E::from(e))?;
        loop {
            if let Some(outcome) = self.answers_with(&mut head, &mut rows)? {
                return outcome.map_err(|(_, e)| E::from(e));
            }
            self.exchange(&mut out).await?;
        }
    }

    /// Sends what is left of `out` and reads `head`'s answers, `head` being the oldest
    /// pipeline unanswered.
    pub(crate) async fn complete(
        &mut self,
        out: &mut BytesMut,
        head: &mut Sent,
    ) -> Result<Outcome, WireError> {
        loop {
            if let Some(outcome) = self.answers(head)? {
                return Ok(outcome);
            }
            self.exchange(out).await?;
        }
    }
}

/// A statement a pipeline prepares: its cache key and name, cached when the server confirms it.
struct Prepared {
    text: String,
    types: Vec<Type>,
    name: String,
}

/// A pipeline sent, or being sent, whose answers are not all read ([`Wire::answers`]).
pub(crate) struct Sent {
    /// Per request, what it prepares when it is new on this connection.
    parsed: Vec<Option<Prepared>>,
    /// The request whose answers come next.
    at: usize,
    /// The first failure answered.
    failed: Option<(Option<usize>, WireError)>,
}

fn db_error(body: &postgres_protocol::message::backend::ErrorResponseBody) -> WireError {
    let mut code = String::new();
    let mut message = String::new();
    let mut fields = body.fields();
    while let Ok(Some(field)) = fields.next() {
        match field.type_() {
            b'C' => code = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            _ => {}
        }
    }
    WireError::Db { code, message }
}

/// The connection: TCP, a Unix socket, or TLS over TCP.
enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
    /// Between a TCP stream and its TLS session.
    Closed,
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Closed => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Closed => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Closed => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Closed => Poll::Ready(Ok(())),
        }
    }
}
