//! Real servers for end-to-end tests of the DNS and ACME adapters: Knot DNS as the primary of a
//! test zone that accepts TSIG-signed dynamic updates (RFC 2136), Pebble as the ACME CA whose
//! DNS-01 validation asks that Knot, and `openssl` checks of the certificates Pebble issues.
//!
//! Tests look at the outside world with real clients (`kdig`, `knsupdate`, `openssl`, Pebble's
//! own API), never through the product's view of it. Every server binds 127.0.0.1 only, on ports
//! from [`free_port`], keeps its files in a temp dir of its own and sends its stdout and stderr
//! to a log file there (`log()`), so a failing test can print it.
//!
//! The tools come from the Debian packages `knot`, `knot-dnsutils`, `pebble` (2.4.0) and
//! `openssl`; none of them needs root. Knot and the `openssl`/`kdig` helpers are synchronous
//! (short child processes); Pebble's helpers that speak HTTPS are `async` (reqwest).

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// How long a server may take to answer after its spawn. Both usually answer in well under a
/// second; the margin is for a machine busy compiling.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A port free on 127.0.0.1 for TCP *and* UDP right now (Knot binds both on one port).
///
/// Nothing holds the port once this returns, so another process may take it before the server
/// binds it: [`Knot::start`] and [`Pebble::start`] retry on fresh ports when their server reports
/// "address already in use". Within one test binary ports are never handed out twice.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    for _ in 0..100 {
        let tcp = TcpListener::bind((LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let port = tcp.local_addr().expect("local address").port();
        if UdpSocket::bind((LOCALHOST, port)).is_ok()
            && GIVEN
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(port)
        {
            return port;
        }
    }
    panic!("no port free for both TCP and UDP on 127.0.0.1 after 100 tries");
}

// ---------------------------------------------------------------------------------------------
// Knot DNS
// ---------------------------------------------------------------------------------------------

/// `knotd` in the foreground, primary of one zone, on 127.0.0.1 (UDP and TCP on one port).
///
/// The zone starts with an SOA (serial 1), an NS `ns1.<zone>` and that name's A record
/// (127.0.0.1). One TSIG key ([`Knot::KEY_NAME`], hmac-sha256, a random secret) may update,
/// transfer and query the zone; updates without it are refused (NOTAUTH). Knot increments the
/// SOA serial on each update and writes the zone file at once, so [`Knot::restart`] serves the
/// same content on the same port.
///
/// knotd runs as whoever starts it: with no `user` in its configuration it changes no user or
/// group, and every path it writes (rundir, PID file, control socket, journal and timer
/// databases, zone file) is in the temp dir, but for a configuration database it makes in /tmp
/// (`knot-confdb.XXXXXX`, not `TMPDIR`) and deletes as soon as it has opened it.
pub struct Knot {
    dir: tempfile::TempDir,
    zone: String,
    port: u16,
    secret: String,
    child: Option<Child>,
}

impl Knot {
    /// The TSIG key's name (a domain name: Knot and `kdig` print it as `capstan.`).
    pub const KEY_NAME: &'static str = "capstan";
    /// The TSIG algorithm.
    pub const ALGORITHM: &'static str = "hmac-sha256";

    /// Starts knotd serving `zone` (with or without the final dot) and waits until it answers
    /// the zone's SOA.
    pub fn start(zone: &str) -> Self {
        let zone = fqdn(zone);
        let dir = tempfile::Builder::new()
            .prefix("knot-")
            .tempdir()
            .expect("temp dir for knotd");
        for sub in ["zones", "db"] {
            fs::create_dir(dir.path().join(sub)).expect("mkdir in the knotd temp dir");
        }
        fs::write(dir.path().join("zones/zone.db"), zone_file(&zone)).expect("write zone file");
        let mut knot = Self {
            dir,
            zone,
            port: 0,
            secret: base64(&random_bytes(32), false),
            child: None,
        };
        for attempt in 1..=3 {
            knot.port = free_port();
            fs::write(knot.dir.path().join("knot.conf"), knot.config()).expect("write knot.conf");
            match knot.spawn() {
                Ok(()) => return knot,
                Err(why) if why.contains("address already in use") && attempt < 3 => {}
                Err(why) => panic!("knotd did not start: {why}"),
            }
        }
        unreachable!("the last attempt returns or panics");
    }

    fn config(&self) -> String {
        let d = self.dir.path().display();
        let (zone, port, secret) = (&self.zone, self.port, &self.secret);
        let (key, algorithm) = (Self::KEY_NAME, Self::ALGORITHM);
        // Why each setting:
        // - no `user`: knotd then keeps the user that started it (root or not);
        // - rundir, pidfile, control socket and database storage in the temp dir: the defaults
        //   are /run/knot and /var/lib/knot (the socket path must stay under 108 bytes);
        // - one worker of each kind: tests run many servers side by side on few cores;
        // - log to stderr, which `spawn` sends to the log file;
        // - zonefile-sync 0: every update is written to the zone file at once, so what a
        //   restart loads is what kdig saw; the journal keeps the changes too (`changes`);
        // - serial-policy increment: each update bumps the SOA serial by one (soa_serial()).
        format!(
            r#"# Written by capstan-e2e (tests/src/realservers.rs).
server:
    rundir: "{d}"
    pidfile: "{d}/knotd.pid"
    listen: 127.0.0.1@{port}
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1

control:
    listen: "{d}/knot.sock"

log:
  - target: stderr
    any: info

database:
    storage: "{d}/db"

key:
  - id: {key}
    algorithm: {algorithm}
    secret: {secret}

acl:
  - id: {key}
    key: {key}
    action: [query, transfer, update]

zone:
  - domain: {zone}
    file: "{d}/zones/zone.db"
    acl: {key}
    zonefile-sync: 0
    zonefile-load: whole
    journal-content: changes
    serial-policy: increment
"#
        )
    }

    /// Spawns knotd on `self.port` and waits for the zone's SOA; on failure the process is gone
    /// and the error has the part of the log written since the spawn.
    fn spawn(&mut self) -> Result<(), String> {
        let log_start = self.log().len();
        let mut child = spawn_logged(
            Command::new(tool("knotd"))
                .arg("-c")
                .arg(self.dir.path().join("knot.conf")),
            &self.log_path(),
        );
        let deadline = Instant::now() + START_TIMEOUT;
        let failure = loop {
            if let Some(status) = child.try_wait().expect("poll knotd") {
                break format!("knotd exited ({status})");
            }
            if self.probe() {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                terminate(&mut child, Duration::from_secs(5));
                break format!("no answer to SOA {} within {START_TIMEOUT:?}", self.zone);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Err(format!(
            "{failure} on port {}; knotd log:\n{}",
            self.port,
            log_since(&self.log(), log_start)
        ))
    }

    /// Whether knotd answers the zone's SOA. Over TCP: a refused connection fails at once,
    /// where a UDP query to a port nobody listens on waits out kdig's timeout (1 s at least).
    /// knotd binds UDP and TCP together and answers only once the zone is loaded.
    fn probe(&self) -> bool {
        let out = run(
            self.kdig()
                .args(["+tcp", "+time=1", "+retry=0", "+short", "SOA"])
                .arg(&self.zone),
            None,
        );
        out.status.success() && !out.stdout.is_empty()
    }

    fn kdig(&self) -> Command {
        let mut cmd = Command::new(tool("kdig"));
        cmd.arg("@127.0.0.1").arg("-p").arg(self.port.to_string());
        cmd
    }

    /// 127.0.0.1 and the DNS port (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((LOCALHOST, self.port))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The zone, with its final dot (`capstan.test.`).
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// `label` in the zone: `name("www")` is `www.capstan.test.`; `name("@")` is the apex.
    pub fn name(&self, label: &str) -> String {
        match label {
            "" | "@" => self.zone.clone(),
            _ => format!("{}.{}", label.trim_end_matches('.'), self.zone),
        }
    }

    /// `[providers.dns]` routing Capstan's `dns` to this server, its TSIG secret read from
    /// `secret_file` ([`Knot::write_secret_file`]).
    pub fn provider_table(&self, secret_file: &Path) -> String {
        format!(
            "[providers.dns]\nkind = \"rfc2136\"\nserver = \"{}\"\ntsig_key_name = \"{}\"\ntsig_secret_file = {:?}\nzones = [\"{}\"]\n",
            self.addr(),
            self.key_name(),
            secret_file.display().to_string(),
            self.zone().trim_end_matches('.')
        )
    }

    pub fn key_name(&self) -> &str {
        Self::KEY_NAME
    }

    /// The TSIG secret, standard base64 (with padding), as BIND and Knot configurations write it.
    pub fn secret_b64(&self) -> &str {
        &self.secret
    }

    /// `hmac-sha256:capstan:<secret>`: the `-y` argument of `kdig`, `knsupdate` and BIND's
    /// `nsupdate`.
    pub fn tsig_spec(&self) -> String {
        format!("{}:{}:{}", Self::ALGORITHM, Self::KEY_NAME, self.secret)
    }

    /// Writes the base64 secret alone (no newline) to `<dir>/capstan.tsig`, mode 0600, for a
    /// product configuration that reads its TSIG secret from a file.
    pub fn write_secret_file(&self, dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(format!("{}.tsig", Self::KEY_NAME));
        fs::write(&path, &self.secret).expect("write the TSIG secret file");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod 600");
        path
    }

    /// The record data of `name`'s `rtype` records (`kdig +short`, over UDP as resolvers and
    /// Pebble ask), in presentation format: a TXT record comes back with its quotes
    /// (`"abc"`). Names are absolute, with or without the final dot. Empty for NXDOMAIN and
    /// NODATA; see [`Knot::status`] to tell them apart.
    pub fn query(&self, name: &str, rtype: &str) -> Vec<String> {
        let out = run(
            self.kdig()
                .args(["+time=2", "+retry=2", "+short"])
                .arg(fqdn(name))
                .arg(rtype),
            None,
        );
        assert!(
            out.status.success(),
            "kdig {name} {rtype} on port {} failed: {}\nknotd log:\n{}",
            self.port,
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        lines(&out.stdout)
    }

    /// The response code of a query: `NOERROR`, `NXDOMAIN`, `REFUSED` (a name outside the zone)…
    pub fn status(&self, name: &str, rtype: &str) -> String {
        let out = run(
            self.kdig()
                .args(["+time=2", "+retry=2", "+noall", "+header"])
                .arg(fqdn(name))
                .arg(rtype),
            None,
        );
        let text = String::from_utf8_lossy(&out.stdout);
        // ";; ->>HEADER<<- opcode: QUERY; status: NXDOMAIN; id: 44359"
        text.split("status: ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|| {
                panic!(
                    "no status in kdig's answer for {name} {rtype}: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    }

    /// The zone's SOA serial (1 at the start, +1 per accepted update).
    pub fn soa_serial(&self) -> u32 {
        let soa = self.query(&self.zone, "SOA");
        // "ns1.capstan.test. hostmaster.capstan.test. 3 3600 600 86400 60"
        soa.first()
            .and_then(|rdata| rdata.split_whitespace().nth(2))
            .and_then(|serial| serial.parse().ok())
            .unwrap_or_else(|| panic!("no SOA serial in {soa:?}"))
    }

    /// Every record of the zone, by a TSIG-signed AXFR (over TCP), one per line as
    /// `owner ttl class type rdata` with single spaces between the fields; the SOA once.
    pub fn records(&self) -> Vec<String> {
        let out = run(
            self.kdig()
                .arg("-y")
                .arg(self.tsig_spec())
                .args(["+noall", "+answer", "AXFR"])
                .arg(&self.zone),
            None,
        );
        assert!(
            out.status.success(),
            "AXFR of {} failed: {}\nknotd log:\n{}",
            self.zone,
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        let mut records: Vec<String> = lines(&out.stdout)
            .iter()
            // kdig separates the fields with tabs and pads the owner with spaces.
            .map(|l| l.split('\t').map(str::trim).collect::<Vec<_>>().join(" "))
            .collect();
        // An AXFR ends with the SOA it starts with.
        if records.len() > 1 && records.first() == records.last() {
            records.pop();
        }
        records
    }

    /// Sends one TSIG-signed dynamic update made of `commands` (`knsupdate` syntax, e.g.
    /// `update add www.capstan.test. 60 A 192.0.2.1`, `update delete x.capstan.test. TXT`,
    /// `prereq nxdomain …`). The error has knsupdate's output (e.g. `NOTAUTH`, `NXRRSET`).
    /// Relative names in `commands` are relative to the zone.
    pub fn update(&self, commands: &[&str]) -> Result<(), String> {
        let mut script = format!(
            "server 127.0.0.1 {}\nzone {}\norigin {}\nkey {}:{} {}\n",
            self.port,
            self.zone,
            self.zone,
            Self::ALGORITHM,
            Self::KEY_NAME,
            self.secret
        );
        for command in commands {
            script.push_str(command);
            script.push('\n');
        }
        script.push_str("send\n");
        let out = run(
            &mut Command::new(tool("knsupdate")),
            Some(script.as_bytes()),
        );
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "knsupdate {commands:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Adds one record (names are absolute, with or without the final dot), e.g.
    /// `update_add("www.capstan.test", 60, "TXT", "\"hello\"")`.
    pub fn update_add(&self, name: &str, ttl: u32, rtype: &str, rdata: &str) {
        let command = format!("update add {} {ttl} {rtype} {rdata}", fqdn(name));
        self.update(&[&command])
            .unwrap_or_else(|e| panic!("{e}\nknotd log:\n{}", self.log()));
    }

    /// Deletes every `rtype` record of `name`.
    pub fn update_delete(&self, name: &str, rtype: &str) {
        let command = format!("update delete {} {rtype}", fqdn(name));
        self.update(&[&command])
            .unwrap_or_else(|e| panic!("{e}\nknotd log:\n{}", self.log()));
    }

    /// SIGTERM and wait (SIGKILL after 10 s). The zone file, journal and configuration stay, for
    /// [`Knot::restart`]. Does nothing when knotd is not running.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, Duration::from_secs(10));
        }
    }

    /// SIGKILL and wait: a crash. [`Knot::restart`] still brings the zone back (knotd ignores
    /// the stale PID file and control socket; updates are in the zone file and the journal).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops knotd if it runs, starts it again on the same port with the same zone content and
    /// waits for the SOA. Panics if the port was taken in between.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(why) = self.spawn() {
            panic!("knotd did not come back: {why}");
        }
    }

    /// Whether knotd is running (false after [`Knot::stop`] or if it died).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The temp dir: `knot.conf`, `zones/zone.db`, `db/` (journal, timers), `knotd.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("knotd.log")
    }

    /// knotd's stdout and stderr since the first start (restarts append).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for Knot {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The starting zone. The short TTLs and SOA minimum keep any caching resolver's view fresh.
fn zone_file(zone: &str) -> String {
    format!(
        "$ORIGIN {zone}\n$TTL 60\n\
         @    SOA ns1 hostmaster 1 3600 600 86400 60\n\
         @    NS  ns1\n\
         ns1  A   127.0.0.1\n"
    )
}

// ---------------------------------------------------------------------------------------------
// Pebble
// ---------------------------------------------------------------------------------------------

/// Pebble, Let's Encrypt's ACME test CA, on 127.0.0.1, validating DNS-01 challenges against a
/// DNS server of the test's choosing (a [`Knot`]).
///
/// Its HTTPS listeners use a certificate made here for `127.0.0.1` and `localhost`, issued by a
/// throwaway CA ([`Pebble::listener_ca_pem_path`]): a CA and a separate leaf because rustls
/// refuses a CA certificate as a server certificate. The CA that *issues* ACME certificates is
/// another one, made by Pebble at each start ([`Pebble::issuing_root_pem`]).
///
/// Pebble keeps everything in memory: a stopped Pebble is gone (no restart).
pub struct Pebble {
    dir: tempfile::TempDir,
    acme_port: u16,
    management_port: u16,
    child: Option<Child>,
    client: reqwest::Client,
}

impl Pebble {
    /// Starts Pebble with DNS-01 answers from `dns` (e.g. `knot.addr()`) and waits until its
    /// directory and management interface answer.
    pub async fn start(dns: SocketAddr) -> Self {
        Self::start_with_env(dns, &[]).await
    }

    /// [`Pebble::start`] with more environment (it wins over the defaults), e.g.
    /// `("PEBBLE_WFE_ORDERS_PER_PAGE", "50")`, `("PEBBLE_VA_ALWAYS_VALID", "1")`,
    /// `("PEBBLE_CHAIN_LENGTH", "2")`.
    ///
    /// The defaults make runs deterministic and fast: `PEBBLE_VA_NOSLEEP=1` (no random 0–15 s
    /// sleep before each validation), `PEBBLE_WFE_NONCEREJECT=0` (no 5 % of good nonces
    /// refused as badNonce), `PEBBLE_AUTHZREUSE=0` (each order gets fresh authorizations and so
    /// a fresh challenge, where Pebble reuses valid ones half of the time by default).
    pub async fn start_with_env(dns: SocketAddr, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("pebble-")
            .tempdir()
            .expect("temp dir for pebble");
        listener_certificate(dir.path());
        let ca = fs::read(dir.path().join("listener-ca.pem")).expect("read listener CA");
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("listener CA PEM"))
            .tls_built_in_root_certs(false)
            // An HTTPS_PROXY of the environment must not see 127.0.0.1.
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("HTTPS client trusting the listener CA");
        let mut pebble = Self {
            dir,
            acme_port: 0,
            management_port: 0,
            child: None,
            client,
        };
        for attempt in 1..=3 {
            pebble.acme_port = free_port();
            pebble.management_port = free_port();
            pebble.write_config();
            match pebble.spawn(dns, env).await {
                Ok(()) => return pebble,
                Err(why) if why.contains("address already in use") && attempt < 3 => {}
                Err(why) => panic!("pebble did not start: {why}"),
            }
        }
        unreachable!("the last attempt returns or panics");
    }

    /// `pebble.json`. httpPort and tlsPort are where Pebble's VA would connect for http-01 and
    /// tls-alpn-01 challenges: free ports nobody listens on, so those challenges fail and only
    /// DNS-01 can succeed.
    fn write_config(&self) {
        let d = self.dir.path();
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{}", self.acme_port),
                "managementListenAddress": format!("127.0.0.1:{}", self.management_port),
                "certificate": d.join("listener.pem"),
                "privateKey": d.join("listener.key"),
                "httpPort": free_port(),
                "tlsPort": free_port(),
                "ocspResponderURL": "",
                "externalAccountBindingRequired": false
            }
        });
        fs::write(
            d.join("pebble.json"),
            serde_json::to_string_pretty(&config).expect("JSON"),
        )
        .expect("write pebble.json");
    }

    async fn spawn(&mut self, dns: SocketAddr, env: &[(&str, &str)]) -> Result<(), String> {
        let log_start = self.log().len();
        let mut cmd = Command::new(tool("pebble"));
        cmd.arg("-config")
            .arg(self.dir.path().join("pebble.json"))
            .arg("-dnsserver")
            .arg(dns.to_string())
            .arg("-strict=false");
        // The test's own environment must not change Pebble's behaviour.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("PEBBLE_") {
                cmd.env_remove(name);
            }
        }
        cmd.env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0");
        for (name, value) in env {
            cmd.env(name, value);
        }
        let mut child = spawn_logged(&mut cmd, &self.log_path());
        // The management listener starts in a goroutine of its own: wait for both.
        let urls = [self.directory_url(), self.management_url("/roots/0")];
        let deadline = Instant::now() + START_TIMEOUT;
        let failure = loop {
            if let Some(status) = child.try_wait().expect("poll pebble") {
                break format!("pebble exited ({status})");
            }
            let mut answered = 0;
            for url in &urls {
                if let Ok(r) = self.client.get(url).send().await
                    && r.status().is_success()
                {
                    answered += 1;
                }
            }
            if answered == urls.len() {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                terminate(&mut child, Duration::from_secs(5));
                break format!("{urls:?} did not answer within {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Err(format!(
            "{failure}; pebble log:\n{}",
            log_since(&self.log(), log_start)
        ))
    }

    /// `https://127.0.0.1:<port>/dir`.
    /// `[providers.certificates]` routing Capstan's `certificates` to this CA, checking
    /// challenge records on `knot` before answering them; the account is kept in `account`.
    pub fn provider_table(&self, knot: &Knot, account: &Path) -> String {
        format!(
            "[providers.certificates]\nkind = \"acme\"\ndirectory_url = \"{}\"\ncontact = \"mailto:ops@{}\"\naccount_key_file = {:?}\ndirectory_ca_file = {:?}\ncheck_dns_server = \"{}\"\n",
            self.directory_url(),
            knot.zone().trim_end_matches('.'),
            account.display().to_string(),
            self.listener_ca_pem_path().display().to_string(),
            knot.addr()
        )
    }

    pub fn directory_url(&self) -> String {
        format!("https://127.0.0.1:{}/dir", self.acme_port)
    }

    /// 127.0.0.1 and the ACME port.
    pub fn acme_addr(&self) -> SocketAddr {
        SocketAddr::from((LOCALHOST, self.acme_port))
    }

    fn management_url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.management_port)
    }

    /// The CA certificate (PEM) to trust for Pebble's HTTPS listeners (ACME and management).
    pub fn listener_ca_pem_path(&self) -> PathBuf {
        self.dir.path().join("listener-ca.pem")
    }

    /// An HTTPS client that trusts the listener CA and nothing else.
    pub fn client(&self) -> reqwest::Client {
        self.client.clone()
    }

    async fn management_get(&self, path: &str) -> reqwest::Response {
        let url = self.management_url(path);
        self.client
            .get(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}\npebble log:\n{}", self.log()))
    }

    async fn management_pem(&self, path: &str) -> String {
        let response = self.management_get(path).await;
        assert!(
            response.status().is_success(),
            "GET {path}: {}",
            response.status()
        );
        response.text().await.expect("PEM body")
    }

    /// The root that issued the ACME certificates (management `/roots/0`): new at each start.
    pub async fn issuing_root_pem(&self) -> String {
        self.management_pem("/roots/0").await
    }

    /// The intermediate under that root (management `/intermediates/0`), which Pebble also
    /// sends after the leaf in each certificate chain.
    pub async fn issuing_intermediate_pem(&self) -> String {
        self.management_pem("/intermediates/0").await
    }

    /// Management `/cert-status-by-serial/<hex>`: `{"Status": "Valid"|"Revoked", "Serial",
    /// "Certificate", "Reason", "RevokedAt"}`, or `None` if Pebble issued no such certificate.
    /// `serial` is hex in any case, as `openssl x509 -serial` or [`Pebble::issued_serials`]
    /// print it.
    pub async fn cert_status(&self, serial: &str) -> Option<serde_json::Value> {
        let response = self
            .management_get(&format!("/cert-status-by-serial/{serial}"))
            .await;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return None;
        }
        assert!(
            response.status().is_success(),
            "cert status of {serial}: {}",
            response.status()
        );
        Some(response.json().await.expect("cert status JSON"))
    }

    /// How many orders Pebble created since it started, over *all* accounts (invalid ones
    /// included), counted in its log ("Added order … to the db"). Needs no account key, unlike
    /// [`Pebble::orders_of`].
    pub fn orders_created(&self) -> usize {
        self.log().matches("Added order ").count()
    }

    /// The serials (lowercase hex) of the certificates Pebble issued, oldest first, from its log
    /// ("Issued certificate serial <hex> for order <id>").
    pub fn issued_serials(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter_map(|l| l.split("Issued certificate serial ").nth(1))
            .filter_map(|rest| rest.split_whitespace().next())
            .map(str::to_owned)
            .collect()
    }

    /// The order URLs of an account, by the RFC 8555 way (§7.1.2.1): POST-as-GET of the account
    /// URL gives its `orders` URL, POST-as-GET of that gives `{"orders": [...]}`, page by page
    /// following `Link: <…>;rel="next"` (Pebble pages by 3 by default).
    ///
    /// Pebble 2.4.0 has no other per-account view: its management interface serves only roots,
    /// intermediates, their keys and certificate status, and the orders list must be signed by
    /// the account's key. So the test must hold that key (`account_key`, a PEM private key:
    /// EC P-256/P-384/P-521 or RSA, signed ES256/ES384/ES512/RS256 with the `openssl` CLI),
    /// e.g. the product's saved account ([`Pebble::orders_of_credentials`]). Pebble leaves
    /// orders whose status is `invalid` out of the list. Without the key, see
    /// [`Pebble::orders_created`].
    pub async fn orders_of(&self, account_url: &str, account_key: &Path) -> Vec<String> {
        let key = AccountKey::load(account_key);
        let account = self.post_as_get(account_url, account_url, &key).await.1;
        let mut next = account["orders"].as_str().map(str::to_owned);
        assert!(next.is_some(), "no orders URL in account {account}");
        let mut orders = Vec::new();
        while let Some(url) = next.take() {
            let (headers, page) = self.post_as_get(&url, account_url, &key).await;
            let urls = page["orders"]
                .as_array()
                .unwrap_or_else(|| panic!("no orders array at {url}: {page}"));
            orders.extend(urls.iter().filter_map(|u| u.as_str()).map(str::to_owned));
            next = link_next(&headers);
        }
        orders
    }

    /// [`Pebble::orders_of`] for an account saved as instant-acme's `AccountCredentials` JSON,
    /// which is what the product's ACME adapter writes to its `account_key_file`:
    /// `{"id": "<account URL>", "key_pkcs8": "<base64url of the PKCS#8 DER key>", ...}`.
    pub async fn orders_of_credentials(&self, credentials_file: &Path) -> Vec<String> {
        let text = fs::read_to_string(credentials_file)
            .unwrap_or_else(|e| panic!("read {}: {e}", credentials_file.display()));
        let credentials: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", credentials_file.display()));
        let (Some(account_url), Some(key)) = (
            credentials["id"].as_str(),
            credentials["key_pkcs8"].as_str(),
        ) else {
            panic!(
                "{} has no `id` and `key_pkcs8`: {credentials}",
                credentials_file.display()
            );
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let pem = dir.path().join("account-key.pem");
        fs::write(&pem, pkcs8_pem(key)).expect("write the account key PEM");
        self.orders_of(account_url, &pem).await
    }

    /// A POST-as-GET (JWS with the account URL as `kid`, empty payload), retried on badNonce.
    async fn post_as_get(
        &self,
        url: &str,
        account_url: &str,
        key: &AccountKey,
    ) -> (reqwest::header::HeaderMap, serde_json::Value) {
        let directory: serde_json::Value = self
            .client
            .get(self.directory_url())
            .send()
            .await
            .expect("GET directory")
            .json()
            .await
            .expect("directory JSON");
        let new_nonce = directory["newNonce"]
            .as_str()
            .expect("newNonce in directory");
        let mut last = serde_json::Value::Null;
        for _ in 0..3 {
            let nonce = self
                .client
                .head(new_nonce)
                .send()
                .await
                .expect("HEAD newNonce")
                .headers()
                .get("replay-nonce")
                .and_then(|v| v.to_str().ok())
                .expect("Replay-Nonce")
                .to_owned();
            let protected = serde_json::json!({
                "alg": key.alg, "kid": account_url, "nonce": nonce, "url": url,
            });
            let protected = base64(protected.to_string().as_bytes(), true);
            let signature = base64(&key.sign(format!("{protected}.").as_bytes()), true);
            let body = serde_json::json!({
                "protected": protected, "payload": "", "signature": signature,
            });
            let response = self
                .client
                .post(url)
                .header("content-type", "application/jose+json")
                .body(body.to_string())
                .send()
                .await
                .unwrap_or_else(|e| panic!("POST-as-GET {url}: {e}"));
            let status = response.status();
            let headers = response.headers().clone();
            last = response.json().await.unwrap_or(serde_json::Value::Null);
            if status.is_success() {
                return (headers, last);
            }
            if last["type"] != "urn:ietf:params:acme:error:badNonce" {
                break;
            }
        }
        panic!(
            "POST-as-GET {url} failed: {last}\npebble log:\n{}",
            self.log()
        );
    }

    /// SIGTERM and wait (SIGKILL after 5 s). Does nothing when Pebble is not running.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, Duration::from_secs(5));
        }
    }

    /// The temp dir: `pebble.json`, the listener certificate and keys, `pebble.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("pebble.log")
    }

    /// Pebble's stdout and stderr (it logs every request and validation to stdout).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Writes `listener-ca.pem` (+ `.key`) and `listener.pem` + `listener.key` (CN localhost, SAN
/// IP:127.0.0.1 and DNS:localhost, serverAuth) in `dir`. The openssl configuration is our own
/// (`-config`) so the system's openssl.cnf adds no extensions of its own.
fn listener_certificate(dir: &Path) {
    let config = dir.join("openssl.cnf");
    fs::write(
        &config,
        "[req]\ndistinguished_name = dn\nprompt = no\n\
         [dn]\nCN = capstan-e2e listener CA\n\
         [ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\n\
         subjectKeyIdentifier = hash\n\
         [leaf]\nbasicConstraints = critical,CA:FALSE\nkeyUsage = critical,digitalSignature\n\
         extendedKeyUsage = serverAuth\nsubjectAltName = IP:127.0.0.1,DNS:localhost\n\
         subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n",
    )
    .expect("write openssl.cnf");
    let p = |name: &str| dir.join(name);
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        Command::new(tool("openssl"))
            .args([
                "req",
                "-x509",
                "-days",
                "30",
                "-extensions",
                "ca",
                "-config",
            ])
            .arg(&config)
            .args(ec)
            .arg("-keyout")
            .arg(p("listener-ca.key"))
            .arg("-out")
            .arg(p("listener-ca.pem")),
    );
    openssl(
        Command::new(tool("openssl"))
            .args(["req", "-new", "-subj", "/CN=localhost", "-config"])
            .arg(&config)
            .args(ec)
            .arg("-keyout")
            .arg(p("listener.key"))
            .arg("-out")
            .arg(p("listener.csr")),
    );
    openssl(
        Command::new(tool("openssl"))
            .args([
                "x509",
                "-req",
                "-days",
                "30",
                "-set_serial",
                "2",
                "-extensions",
                "leaf",
            ])
            .arg("-extfile")
            .arg(&config)
            .arg("-in")
            .arg(p("listener.csr"))
            .arg("-CA")
            .arg(p("listener-ca.pem"))
            .arg("-CAkey")
            .arg(p("listener-ca.key"))
            .arg("-out")
            .arg(p("listener.pem")),
    );
}

fn openssl(cmd: &mut Command) -> Vec<u8> {
    let out = run(cmd, None);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// An ACME account key on disk, signing with `openssl dgst` (no crypto crate needed).
struct AccountKey {
    path: PathBuf,
    alg: &'static str,
    digest: &'static str,
    /// The size of an EC coordinate: JWS wants `r || s` at that size each, where openssl
    /// gives a DER `SEQUENCE { INTEGER r, INTEGER s }`. None for RSA.
    ec_size: Option<usize>,
}

impl AccountKey {
    fn load(path: &Path) -> Self {
        let text = String::from_utf8_lossy(&openssl(
            Command::new(tool("openssl"))
                .args(["pkey", "-noout", "-text_pub", "-in"])
                .arg(path),
        ))
        .into_owned();
        let (alg, digest, ec_size) = if text.contains("NIST CURVE: P-256") {
            ("ES256", "-sha256", Some(32))
        } else if text.contains("NIST CURVE: P-384") {
            ("ES384", "-sha384", Some(48))
        } else if text.contains("NIST CURVE: P-521") {
            ("ES512", "-sha512", Some(66))
        } else if text.contains("Modulus:") {
            ("RS256", "-sha256", None)
        } else {
            panic!(
                "{}: not a P-256, P-384, P-521 or RSA key (Pebble 2.4.0 takes no other): {text}",
                path.display()
            )
        };
        Self {
            path: path.to_owned(),
            alg,
            digest,
            ec_size,
        }
    }

    fn sign(&self, data: &[u8]) -> Vec<u8> {
        let out = run(
            Command::new(tool("openssl"))
                .args(["dgst", self.digest, "-sign"])
                .arg(&self.path),
            Some(data),
        );
        assert!(
            out.status.success(),
            "openssl dgst -sign: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        match self.ec_size {
            Some(size) => ecdsa_der_to_raw(&out.stdout, size)
                .unwrap_or_else(|| panic!("not a DER ECDSA signature: {:02x?}", out.stdout)),
            None => out.stdout,
        }
    }
}

/// The PEM of a PKCS#8 key given as the base64url of its DER (padded or not). A PEM body is the
/// same bytes in standard base64, so only the alphabet, the padding and the line breaks change.
fn pkcs8_pem(base64url: &str) -> String {
    let mut body: String = base64url
        .trim()
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    while !body.len().is_multiple_of(4) {
        body.push('=');
    }
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    pem
}

/// DER `SEQUENCE { INTEGER r, INTEGER s }` → `r || s`, each left-padded to `size` bytes; None
/// if `der` is not that.
fn ecdsa_der_to_raw(der: &[u8], size: usize) -> Option<Vec<u8>> {
    if *der.first()? != 0x30 {
        return None;
    }
    // The SEQUENCE length takes one more byte (0x81 nn) above 127 bytes (P-521).
    let long_form = *der.get(1)? & 0x80 != 0;
    let mut at = if long_form {
        2 + usize::from(der[1] & 0x7f)
    } else {
        2
    };
    let mut raw = Vec::with_capacity(2 * size);
    for _ in 0..2 {
        if *der.get(at)? != 0x02 {
            return None;
        }
        let len = usize::from(*der.get(at + 1)?);
        let int = der.get(at + 2..at + 2 + len)?;
        // DER puts a 0x00 before a high first bit; JWS wants the bare unsigned value.
        let start = int.iter().position(|b| *b != 0).unwrap_or(int.len());
        let int = &int[start..];
        raw.resize(raw.len() + size.checked_sub(int.len())?, 0);
        raw.extend_from_slice(int);
        at += 2 + len;
    }
    Some(raw)
}

/// The target of a `Link: <url>;rel="next"` header, if any.
fn link_next(headers: &reqwest::header::HeaderMap) -> Option<String> {
    headers
        .get_all("link")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find(|link| link.contains("rel=\"next\""))
        .and_then(|link| Some(link.split('<').nth(1)?.split('>').next()?.to_owned()))
}

// ---------------------------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------------------------

/// Verifies a certificate chain against a root with `openssl verify`: `chain_pem` is the leaf
/// followed by any intermediates (as an ACME certificate URL serves it; concatenate them if you
/// hold them apart), `root_pem` the only trusted certificate (e.g. from
/// [`Pebble::issuing_root_pem`]). Checks the leaf is fit for a TLS server (`-purpose
/// sslserver`) and valid now. The error has openssl's words.
pub fn verify_chain(chain_pem: &str, root_pem: &str) -> Result<(), String> {
    let certs = pem_certs(chain_pem);
    let Some(leaf) = certs.first() else {
        return Err(format!("no certificate in {chain_pem:?}"));
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let file = |name: &str, content: &str| {
        let path = dir.path().join(name);
        fs::write(&path, content).expect("write PEM");
        path
    };
    let (leaf, chain, root) = (
        file("leaf.pem", leaf),
        file("chain.pem", &certs.concat()),
        file("root.pem", root_pem),
    );
    let out = run(
        Command::new(tool("openssl"))
            .args(["verify", "-purpose", "sslserver", "-CAfile"])
            .arg(root)
            .arg("-untrusted")
            .arg(chain)
            .arg(leaf),
        None,
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.contains(": OK") {
        Ok(())
    } else {
        Err(said)
    }
}

/// The certificates of a PEM text, each as its own PEM block, in order.
pub fn pem_certs(pem: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    pem.split(BEGIN)
        .skip(1)
        .filter_map(|rest| rest.split(END).next())
        .map(|body| format!("{BEGIN}\n{}\n{END}\n", body.trim()))
        .collect()
}

/// The subjectAltName entries of a certificate (the first of a chain), bare: DNS names as
/// `www.capstan.test`, IP addresses as `127.0.0.1`, others as openssl prints them
/// (`email:…`, `URI:…`). Empty when it has no SAN.
pub fn san_names(cert_pem: &str) -> Vec<String> {
    let leaf = pem_certs(cert_pem)
        .into_iter()
        .next()
        .expect("a certificate");
    let mut cmd = Command::new(tool("openssl"));
    cmd.args(["x509", "-noout", "-ext", "subjectAltName"]);
    let out = run(&mut cmd, Some(leaf.as_bytes()));
    assert!(
        out.status.success(),
        "openssl x509 -ext subjectAltName: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "X509v3 Subject Alternative Name: \n    DNS:a.test, IP Address:127.0.0.1\n"
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .flat_map(|l| l.split(", "))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.strip_prefix("DNS:")
                .or_else(|| s.strip_prefix("IP Address:"))
                .unwrap_or(s)
                .to_owned()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Processes and small helpers
// ---------------------------------------------------------------------------------------------

/// A tool's path: `PATH` first, then `/usr/sbin` and `/sbin`, where Debian puts `knotd` and which
/// an ordinary user's `PATH` often lacks.
fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH nor in /usr/sbin: install the Debian packages knot, \
                 knot-dnsutils, pebble and openssl"
            )
        })
}

/// Runs a short-lived command to its end, with `input` on its stdin (small: written before the
/// output is read).
fn run(cmd: &mut Command, input: Option<&[u8]>) -> Output {
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if let Some(input) = input {
        // Dropped at the end of the statement, which closes the child's stdin.
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .unwrap_or_else(|e| panic!("write to {cmd:?}: {e}"));
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait for {cmd:?}: {e}"))
}

/// Spawns a server with its stdout and stderr appended to `log`.
fn spawn_logged(cmd: &mut Command, log: &Path) -> Child {
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the server log");
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file handle"))
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// SIGTERM, then SIGKILL if the process outlives `grace`; returns how it ended. SIGTERM goes
/// through kill(1): the workspace denies `unsafe`, so no `libc::kill`. The child is not reaped
/// before this waits for it, so its pid cannot name another process meanwhile.
fn terminate(child: &mut Child, grace: Duration) -> ExitStatus {
    if let Ok(Some(status)) = child.try_wait() {
        return status;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    child.wait().expect("wait for a killed server")
}

/// The status of the HTTP answer to `GET path` on 127.0.0.1:`port`, if one comes. A socket that
/// connected to itself reads back its own request, which is not an answer.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut tcp = std::net::TcpStream::connect((LOCALHOST, port)).ok()?;
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    tcp.write_all(request.as_bytes()).ok()?;
    // `HTTP/1.x NNN`
    let mut head = [0u8; 12];
    tcp.read_exact(&mut head).ok()?;
    let head = std::str::from_utf8(&head).ok()?;
    head.strip_prefix("HTTP/")?.get(4..7)?.parse().ok()
}

/// What a log file got after it was `start` bytes long.
fn log_since(log: &str, start: usize) -> &str {
    log.get(start..).unwrap_or(log)
}

/// A domain name with its final dot.
fn fqdn(name: &str) -> String {
    if name.ends_with('.') {
        name.to_owned()
    } else {
        format!("{name}.")
    }
}

fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut bytes = vec![0; n];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("read /dev/urandom");
    bytes
}

/// Base64 of RFC 4648: standard with `=` padding (TSIG secrets), or URL-safe without padding
/// (JWS). Written here to spare the crate a dependency for two uses.
fn base64(bytes: &[u8], url_safe: bool) -> String {
    let alphabet: &[u8; 64] = if url_safe {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(alphabet[((n >> (18 - 6 * i)) & 63) as usize]));
            } else if !url_safe {
                out.push('=');
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// moto
// ---------------------------------------------------------------------------------------------

/// moto's server (PyPI `moto[server]`, in the virtual environment `just setup` makes at
/// `target/venv-moto`): the AWS APIs on 127.0.0.1, state in memory. The tests look at it with
/// boto3 (`tests/clients/aws_state.py`), the AWS SDK for Python, never through Capstan.
pub struct Moto {
    /// Behind a lock so that `boto`, which takes `&self`, can say whether moto is still running.
    child: Mutex<Child>,
    dir: tempfile::TempDir,
    port: u16,
}

impl Moto {
    /// The virtual environment's interpreter and `moto_server`.
    fn venv(program: &str) -> PathBuf {
        let path = crate::repo().join("target/venv-moto/bin").join(program);
        assert!(
            path.is_file(),
            "{} is missing: run `just setup` (it makes the moto virtual environment)",
            path.display()
        );
        path
    }

    /// Starts moto on a free port. A port handed out by `free_port` may be taken by another
    /// socket before moto binds it, so a moto that exits while starting is started again on
    /// another port; readiness is an HTTP answer, not a TCP connect (a connect to a closed
    /// port in the ephemeral range can connect to itself).
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let log_path = dir.path().join("moto.log");
        let mut failures = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let log = fs::File::create(&log_path).expect("moto log");
            // ACM issues a DNS-validated certificate this many seconds after its request (moto
            // does not look at DNS).
            let mut child = Command::new(Self::venv("moto_server"))
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .env("MOTO_ACM_VALIDATION_WAIT", "1")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("spawn moto_server");
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    failures.push(format!(
                        "port {port}: moto exited ({status}); log:\n{}",
                        fs::read_to_string(&log_path).unwrap_or_default()
                    ));
                    break;
                }
                // Moto's own answer, from the child still running: another server that took
                // the port first (a test's `capstan serve` on an ephemeral port) answers too,
                // while this moto exits on "address already in use".
                if http_status(port, "/moto-api/") == Some(200)
                    && matches!(child.try_wait(), Ok(None))
                {
                    return Self {
                        child: Mutex::new(child),
                        dir,
                        port,
                    };
                }
                if Instant::now() > deadline {
                    terminate(&mut child, Duration::from_secs(5));
                    panic!(
                        "moto did not answer on port {port} within {START_TIMEOUT:?}; log:\n{}",
                        fs::read_to_string(&log_path).unwrap_or_default()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("moto did not start:\n{}", failures.join("\n"));
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The credentials moto accepts (any), for boto3.
    pub fn env() -> [(&'static str, &'static str); 3] {
        [
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ]
    }

    /// `tests/clients/aws_state.py ARGS` against this moto: its JSON answer.
    pub fn boto(&self, args: &[&str]) -> serde_json::Value {
        let out = Command::new(Self::venv("python"))
            .arg(crate::repo().join("tests/clients/aws_state.py"))
            .arg(self.endpoint())
            .args(args)
            .envs(Self::env())
            .output()
            .expect("run aws_state.py");
        assert!(
            out.status.success(),
            "aws_state.py {args:?}: {}\nmoto on port {}: {}; moto log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.port,
            match self
                .child
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .try_wait()
            {
                Ok(Some(status)) => format!("exited ({status})"),
                Ok(None) => "running".to_owned(),
                Err(e) => format!("unknown ({e})"),
            },
            self.log()
        );
        serde_json::from_slice(&out.stdout).expect("aws_state.py answers JSON")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("moto.log")).unwrap_or_default()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(PoisonError::into_inner);
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        for (input, standard) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes(), false), standard);
        }
        assert_eq!(base64(&[0xfb, 0xff], true), "-_8");
    }

    #[test]
    fn der_signature_becomes_fixed_size_r_and_s() {
        // r = 0x00 0x80 (DER pads a high bit), s = 0x01.
        let der = [0x30, 0x07, 0x02, 0x02, 0x00, 0x80, 0x02, 0x01, 0x01];
        assert_eq!(
            ecdsa_der_to_raw(&der, 4),
            Some(vec![0, 0, 0, 0x80, 0, 0, 0, 1])
        );
        let wide = [0x30, 0x07, 0x02, 0x02, 0x01, 0x02, 0x02, 0x01, 0x01];
        assert_eq!(ecdsa_der_to_raw(&wide, 1), None, "r does not fit in 1 byte");
        assert_eq!(ecdsa_der_to_raw(&der[..5], 4), None, "truncated");
    }
}
