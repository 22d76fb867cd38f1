//! Slow and silent clients against a real `capstan serve`: connections that never finish their
//! headers (plain HTTP) or their TLS handshake are closed at the configured deadline, and the
//! server keeps answering everyone else meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capstan_e2e::{Server, home_with, self_signed_localhost};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const LIMITS: &str = "[connections]\nheader_read_ms = 1000\ntls_handshake_ms = 1000\n";

/// Opens `n` connections to `addr` and writes `partial` on each (the start of something never
/// finished).
fn half_open(addr: &str, n: usize, partial: &[u8]) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(partial).unwrap();
            s
        })
        .collect()
}

/// Waits until the server closed every connection (a read answers end of file or an error),
/// and returns how long that took.
fn until_all_closed(mut conns: Vec<TcpStream>, limit: Duration) -> Duration {
    let start = Instant::now();
    for s in &mut conns {
        s.set_read_timeout(Some(limit)).unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue, // a 408 or an alert before the close
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    panic!("a connection was still open after {limit:?}")
                }
                Err(_) => break, // reset
            }
        }
    }
    start.elapsed()
}

async fn assert_healthy(c: &reqwest::Client, base: &str) {
    let r = c
        .get(format!("{base}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn hundreds_of_half_sent_requests_are_closed_at_the_header_deadline_while_others_are_served()
{
    let home = home_with(&[], LIMITS);
    let server = Server::start(home.path());
    let addr = server.base.trim_start_matches("http://").to_owned();
    let opened = Instant::now();
    let conns = half_open(&addr, 300, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ");
    // Everyone else is still answered, at once.
    let c = reqwest::Client::new();
    for _ in 0..5 {
        assert_healthy(&c, &server.base).await;
    }
    let closed =
        tokio::task::spawn_blocking(move || until_all_closed(conns, Duration::from_secs(15)))
            .await
            .unwrap();
    assert!(
        opened.elapsed() >= Duration::from_millis(900),
        "closed at the deadline, not before: {closed:?}"
    );
    // An idle kept-alive connection is closed at the same deadline.
    let mut idle = TcpStream::connect(&addr).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    until_all_closed(vec![idle], Duration::from_secs(15));
}

#[tokio::test]
async fn silent_tls_clients_are_dropped_at_the_handshake_deadline_while_others_are_served() {
    let home = home_with(&[], LIMITS);
    let (cert, key) = self_signed_localhost(home.path());
    let server = Server::start_with(
        home.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    let addr = server.base.trim_start_matches("https://").to_owned();
    // A TLS record header that never gets its body: the handshake can only wait.
    let conns = half_open(&addr, 200, &[0x16, 0x03, 0x01, 0x02, 0x00]);
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&cert).unwrap()).unwrap();
    let c = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .unwrap();
    assert_healthy(&c, &server.base).await;
    tokio::task::spawn_blocking(move || until_all_closed(conns, Duration::from_secs(15)))
        .await
        .unwrap();
}
