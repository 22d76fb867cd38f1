//! Outbound-request safety for webhook callbacks (DESIGN.md §6).
//!
//! A callback URL must be public HTTPS. Every address its host resolves to is vetted
//! ([`vet_ip`]): loopback, private, link-local (including cloud metadata), shared, reserved,
//! documentation, multicast and the IPv6 forms that smuggle such an IPv4 address are refused.
//! The request then goes to the vetted address only ([`pinned_client`]): a second, different DNS
//! answer (DNS rebinding) is never consulted, redirects are not followed and no proxy is used.
//!
//! The intended sequence for every delivery:
//!
//! ```ignore
//! let url = parse_callback(text, policy)?;
//! let addrs = resolve_vetted(&url, policy).await?;
//! let client = pinned_client(&url, addrs[0], timeout, extra_root_pem)?;
//! client.post(url).send().await
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// What callback URLs may point at. Both flags are `false` in production; tests opt in so they
/// can deliver to a local receiver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UrlPolicy {
    /// Accept loopback addresses (127.0.0.0/8, ::1 and their embedded IPv6 forms).
    pub allow_loopback: bool,
    /// Accept `http://` callback URLs besides `https://`.
    pub allow_http: bool,
}

/// The longest callback URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// How long resolving a callback host may take.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a callback URL (or one of its addresses) is refused. Every message names what is wrong
/// in terms the subscription's owner can act on.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum UrlError {
    #[error("the callback URL is not a valid absolute URL: {0}")]
    Invalid(String),
    #[error("the callback URL is longer than {MAX_URL_LEN} characters")]
    TooLong,
    #[error("callback URLs must use https (got `{0}:`)")]
    Scheme(String),
    #[error("callback URLs must use https or http (got `{0}:`)")]
    SchemeHttpAllowed(String),
    #[error("the callback URL has no host")]
    MissingHost,
    #[error("callback URLs must not contain a username or password")]
    Userinfo,
    #[error("callback URLs must not contain a fragment (`#...`)")]
    Fragment,
    /// An address (an IP-literal host, or one handed to [`vet_ip`]) is refused.
    #[error("{ip} is {reason}; callback URLs must point at a public address")]
    Address { ip: IpAddr, reason: String },
    /// A host name resolves to a refused address.
    #[error("{host} resolves to {ip}, {reason}; callback URLs must point at a public address")]
    Resolves {
        host: String,
        ip: IpAddr,
        reason: String,
    },
    #[error("{host} could not be resolved: {reason}")]
    Unresolvable { host: String, reason: String },
    #[error("{0} does not resolve to any address")]
    NoAddress(String),
    #[error("resolving {0} timed out")]
    ResolveTimeout(String),
    /// The address handed to [`pinned_client`] cannot serve the URL.
    #[error("cannot pin {url_host} to {addr}: {reason}")]
    Pin {
        url_host: String,
        addr: SocketAddr,
        reason: String,
    },
    #[error("the extra root certificate is unusable: {0}")]
    RootCertificate(String),
    #[error("the HTTP client could not be built: {0}")]
    Client(String),
}

/// Parses and checks a callback URL: `https` (or `http` when the policy allows it), a host, no
/// userinfo, no fragment. An IP-literal host is vetted here too; a host name is vetted when it
/// is resolved ([`resolve_vetted`]).
pub fn parse_callback(url: &str, policy: UrlPolicy) -> Result<reqwest::Url, UrlError> {
    let text = url.trim();
    if text.is_empty() {
        return Err(UrlError::Invalid("it is empty".to_owned()));
    }
    if text.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong);
    }
    let parsed = reqwest::Url::parse(text).map_err(|e| UrlError::Invalid(e.to_string()))?;
    match parsed.scheme() {
        "https" => {}
        "http" if policy.allow_http => {}
        other if policy.allow_http => return Err(UrlError::SchemeHttpAllowed(other.to_owned())),
        other => return Err(UrlError::Scheme(other.to_owned())),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(UrlError::Userinfo);
    }
    if parsed.fragment().is_some() {
        return Err(UrlError::Fragment);
    }
    match host_of(&parsed) {
        None => return Err(UrlError::MissingHost),
        Some(Host::Domain(d)) if d.is_empty() || d == "." => return Err(UrlError::MissingHost),
        Some(Host::Domain(_)) => {}
        Some(Host::Ip(ip)) => vet_ip(ip, policy)?,
    }
    Ok(parsed)
}

/// Accepts only publicly routable unicast addresses (and loopback when the policy allows it).
pub fn vet_ip(ip: IpAddr, policy: UrlPolicy) -> Result<(), UrlError> {
    match refusal(ip, policy) {
        None => Ok(()),
        Some(reason) => Err(UrlError::Address { ip, reason }),
    }
}

/// Resolves the URL's host (`tokio::net::lookup_host`) and vets every address. The whole host is
/// refused when ANY address is refused (an attacker controls which one a client would pick) or
/// when none resolves. An IP-literal host is vetted and returned as is.
pub async fn resolve_vetted(
    url: &reqwest::Url,
    policy: UrlPolicy,
) -> Result<Vec<SocketAddr>, UrlError> {
    let port = url.port_or_known_default().ok_or(UrlError::MissingHost)?;
    let domain = match host_of(url) {
        None => return Err(UrlError::MissingHost),
        Some(Host::Ip(ip)) => {
            vet_ip(ip, policy)?;
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        Some(Host::Domain(d)) => d,
    };
    let outcome =
        tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((domain, port))).await;
    let resolved = match outcome {
        Err(_) => return Err(UrlError::ResolveTimeout(domain.to_owned())),
        Ok(Err(e)) => {
            return Err(UrlError::Unresolvable {
                host: domain.to_owned(),
                reason: e.to_string(),
            });
        }
        Ok(Ok(addrs)) => addrs,
    };
    let mut vetted: Vec<SocketAddr> = Vec::new();
    for addr in resolved {
        if let Some(reason) = refusal(addr.ip(), policy) {
            return Err(UrlError::Resolves {
                host: domain.to_owned(),
                ip: addr.ip(),
                reason,
            });
        }
        if !vetted.contains(&addr) {
            vetted.push(addr);
        }
    }
    if vetted.is_empty() {
        return Err(UrlError::NoAddress(domain.to_owned()));
    }
    Ok(vetted)
}

/// A client that sends requests for `url` to `addr` only (which must come from
/// [`resolve_vetted`]): the host name is pinned to the address (TLS still verifies the
/// certificate against the host name), redirects are not followed, no proxy is used and the
/// whole request is bounded by `timeout`. `extra_root_pem` (one or more PEM certificates) is
/// trusted besides the built-in web roots — for tests with their own CA.
pub fn pinned_client(
    url: &reqwest::Url,
    addr: SocketAddr,
    timeout: Duration,
    extra_root_pem: Option<&[u8]>,
) -> Result<reqwest::Client, UrlError> {
    let url_host = url.host_str().unwrap_or_default().to_owned();
    let pin_error = |reason: &str| UrlError::Pin {
        url_host: url_host.clone(),
        addr,
        reason: reason.to_owned(),
    };
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(timeout)
        .referer(false)
        .pool_max_idle_per_host(0)
        .https_only(url.scheme() == "https");
    match host_of(url) {
        None => return Err(UrlError::MissingHost),
        // An IP literal is connected to directly (no resolution happens): it must be the
        // address that was vetted.
        Some(Host::Ip(ip)) if ip != addr.ip() => {
            return Err(pin_error("the URL names a different address"));
        }
        Some(Host::Ip(_)) => {}
        Some(Host::Domain(domain)) => {
            builder = builder.resolve(domain, addr);
        }
    }
    if let Some(pem) = extra_root_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| UrlError::RootCertificate(e.to_string()))?;
        if certs.is_empty() {
            return Err(UrlError::RootCertificate(
                "the PEM text contains no CERTIFICATE block".to_owned(),
            ));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| UrlError::Client(e.to_string()))
}

enum Host<'a> {
    Domain(&'a str),
    Ip(IpAddr),
}

/// The URL's host: an IP literal (IPv6 without its brackets) or a domain name. The URL parser
/// already normalises every IPv4 spelling (hex, octal, shorthand) of special-scheme hosts to
/// dotted-quad form, so a domain is never an address in disguise.
fn host_of(url: &reqwest::Url) -> Option<Host<'_>> {
    let host = url.host_str()?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some(match bare.parse::<IpAddr>() {
        Ok(ip) => Host::Ip(ip),
        Err(_) => Host::Domain(host),
    })
}

/// Why `ip` is refused, or `None` when it is acceptable.
fn refusal(ip: IpAddr, policy: UrlPolicy) -> Option<String> {
    match ip {
        IpAddr::V4(v4) => refusal_v4(v4, policy).map(str::to_owned),
        IpAddr::V6(v6) => refusal_v6(v6, policy),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    (u32::from(ip) & mask) == (u32::from(Ipv4Addr::from(net)) & mask)
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    (u128::from(ip) & mask) == (u128::from(net) & mask)
}

fn refusal_v4(ip: Ipv4Addr, policy: UrlPolicy) -> Option<&'static str> {
    // Most specific first, so the message names the real reason.
    const RULES: &[([u8; 4], u32, &str)] = &[
        ([169, 254, 169, 254], 32, "the cloud metadata address"),
        ([255, 255, 255, 255], 32, "the broadcast address"),
        ([0, 0, 0, 0], 32, "the unspecified address"),
        ([0, 0, 0, 0], 8, "in 0.0.0.0/8 (\"this network\")"),
        ([10, 0, 0, 0], 8, "a private address"),
        ([172, 16, 0, 0], 12, "a private address"),
        ([192, 168, 0, 0], 16, "a private address"),
        ([100, 64, 0, 0], 10, "a shared (carrier-grade NAT) address"),
        ([169, 254, 0, 0], 16, "a link-local address"),
        ([192, 0, 0, 0], 24, "an IETF protocol-assignment address"),
        ([192, 0, 2, 0], 24, "a documentation address"),
        ([198, 51, 100, 0], 24, "a documentation address"),
        ([203, 0, 113, 0], 24, "a documentation address"),
        ([198, 18, 0, 0], 15, "a benchmarking address"),
        ([192, 88, 99, 0], 24, "a 6to4 relay anycast address"),
        ([224, 0, 0, 0], 4, "a multicast address"),
        ([240, 0, 0, 0], 4, "a reserved address"),
    ];
    if ip.is_loopback() {
        return if policy.allow_loopback {
            None
        } else {
            Some("a loopback address")
        };
    }
    RULES
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map(|(_, _, reason)| *reason)
}

/// Parses a constant network address; a typo would read as `::` and is caught by the tests.
fn v6(text: &str) -> Ipv6Addr {
    text.parse().unwrap_or(Ipv6Addr::UNSPECIFIED)
}

fn refusal_v6(ip: Ipv6Addr, policy: UrlPolicy) -> Option<String> {
    let bits = u128::from(ip);
    if ip.is_unspecified() {
        return Some("the unspecified address".to_owned());
    }
    if ip.is_loopback() {
        return if policy.allow_loopback {
            None
        } else {
            Some("a loopback address".to_owned())
        };
    }
    // Forms that carry an IPv4 address: the embedded address decides.
    let embedded = |kind: &str, v4: Ipv4Addr| -> Option<String> {
        refusal_v4(v4, policy).map(|why| format!("{kind} embedding {v4}, {why}"))
    };
    // ::ffff:a.b.c.d
    if in_v6(ip, v6("::ffff:0:0"), 96) {
        return embedded("an IPv4-mapped address", Ipv4Addr::from(bits as u32));
    }
    // ::a.b.c.d (deprecated IPv4-compatible; :: and ::1 handled above)
    if in_v6(ip, Ipv6Addr::UNSPECIFIED, 96) {
        return embedded("an IPv4-compatible address", Ipv4Addr::from(bits as u32));
    }
    // 64:ff9b::a.b.c.d (NAT64 well-known prefix, RFC 6052)
    if in_v6(ip, v6("64:ff9b::"), 96) {
        return embedded("a NAT64 address", Ipv4Addr::from(bits as u32));
    }
    // 64:ff9b:1::/48 (local-use NAT64, RFC 8215): where the IPv4 address sits is
    // network-specific, so it cannot be vetted.
    if in_v6(ip, v6("64:ff9b:1::"), 48) {
        return Some("a local-use NAT64 address (64:ff9b:1::/48)".to_owned());
    }
    // 2002:AABB:CCDD::/48 (6to4, RFC 3056)
    if in_v6(ip, v6("2002::"), 16) {
        return embedded("a 6to4 address", Ipv4Addr::from((bits >> 80) as u32));
    }
    if let Some((_, _, reason)) = V6_RULES
        .iter()
        .find(|(net, prefix, _)| in_v6(ip, v6(net), *prefix))
    {
        return Some((*reason).to_owned());
    }
    // Everything else outside global unicast (2000::/3) is reserved.
    if !in_v6(ip, v6("2000::"), 3) {
        return Some("a reserved address (not global unicast)".to_owned());
    }
    None
}

/// Refused IPv6 ranges besides loopback, unspecified and the IPv4-embedding forms; most specific
/// first.
const V6_RULES: &[(&str, u32, &str)] = &[
    ("fd00:ec2::254", 128, "the cloud metadata address"),
    ("2001::", 32, "a Teredo tunnel address"),
    ("2001:db8::", 32, "a documentation address"),
    ("3fff::", 20, "a documentation address"),
    ("2001:2::", 48, "a benchmarking address"),
    ("2001:10::", 28, "an ORCHID address"),
    ("2001:20::", 28, "an ORCHIDv2 address"),
    ("2001::", 23, "an IETF protocol-assignment address"),
    ("100::", 64, "a discard-only address"),
    ("fe80::", 10, "a link-local address"),
    ("fec0::", 10, "a site-local address"),
    ("fc00::", 7, "a unique-local (private) address"),
    ("ff00::", 8, "a multicast address"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const PROD: UrlPolicy = UrlPolicy {
        allow_loopback: false,
        allow_http: false,
    };
    const LOOPBACK: UrlPolicy = UrlPolicy {
        allow_loopback: true,
        allow_http: false,
    };
    const TEST: UrlPolicy = UrlPolicy {
        allow_loopback: true,
        allow_http: true,
    };

    fn ip(text: &str) -> IpAddr {
        match text.parse() {
            Ok(ip) => ip,
            Err(e) => panic!("bad test address {text}: {e}"),
        }
    }

    fn refused(text: &str, policy: UrlPolicy) -> String {
        match vet_ip(ip(text), policy) {
            Ok(()) => panic!("{text} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    fn assert_refused(text: &str, policy: UrlPolicy, reason: &str) {
        let message = refused(text, policy);
        assert!(
            message.contains(reason),
            "{text}: expected `{reason}` in `{message}`"
        );
    }

    #[test]
    fn v6_rule_networks_parse() {
        for (net, prefix, _) in V6_RULES {
            assert!(net.parse::<Ipv6Addr>().is_ok(), "{net}");
            assert!((1..=128).contains(prefix), "{net}/{prefix}");
        }
    }

    #[test]
    fn public_addresses_are_accepted() {
        for text in [
            "93.184.216.34",
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",  // just below CGNAT
            "100.128.0.0",     // just above CGNAT
            "172.15.255.255",  // just below 172.16/12
            "172.32.0.0",      // just above
            "192.169.0.1",     // just above 192.168/16
            "198.17.255.255",  // just below 198.18/15
            "198.20.0.0",      // just above
            "223.255.255.255", // below multicast
            "169.253.255.255", // below link-local
            "2606:2800:220:1::1",
            "2a00:1450:4001:80b::200e",
            "2001:4860:4860::8888",
            "::ffff:93.184.216.34", // IPv4-mapped public
            "64:ff9b::5db8:d822",   // NAT64 of 93.184.216.34
            "2002:5db8:d822::1",    // 6to4 of 93.184.216.34
            "::93.184.216.34",      // IPv4-compatible public
        ] {
            assert_eq!(vet_ip(ip(text), PROD), Ok(()), "{text} should be accepted");
        }
    }

    #[test]
    fn loopback_only_with_allow_loopback() {
        for text in [
            "127.0.0.1",
            "127.255.255.254",
            "127.1.2.3",
            "::1",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
        ] {
            assert!(refused(text, PROD).contains("loopback"), "{text}");
            assert_eq!(
                vet_ip(ip(text), LOOPBACK),
                Ok(()),
                "{text} with allow_loopback"
            );
        }
        // allow_loopback opens loopback only, nothing else.
        for text in [
            "10.0.0.1",
            "169.254.169.254",
            "192.168.1.1",
            "fe80::1",
            "0.0.0.0",
            "::",
        ] {
            assert!(
                vet_ip(ip(text), TEST).is_err(),
                "{text} with the test policy"
            );
        }
    }

    #[test]
    fn ipv4_ranges_are_refused() {
        let cases = [
            ("10.0.0.5", "a private address"),
            ("10.255.255.255", "a private address"),
            ("172.16.0.1", "a private address"),
            ("172.31.255.255", "a private address"),
            ("192.168.0.1", "a private address"),
            ("192.168.255.255", "a private address"),
            ("169.254.169.254", "the cloud metadata address"),
            ("169.254.0.1", "a link-local address"),
            ("169.254.255.255", "a link-local address"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.127.255.255", "carrier-grade NAT"),
            ("100.100.100.200", "carrier-grade NAT"), // Alibaba metadata
            ("0.0.0.0", "the unspecified address"),
            ("0.1.2.3", "0.0.0.0/8"),
            ("255.255.255.255", "the broadcast address"),
            ("224.0.0.1", "a multicast address"),
            ("239.255.255.250", "a multicast address"),
            ("240.0.0.1", "a reserved address"),
            ("250.1.2.3", "a reserved address"),
            ("192.0.2.10", "a documentation address"),
            ("198.51.100.7", "a documentation address"),
            ("203.0.113.99", "a documentation address"),
            ("198.18.0.1", "a benchmarking address"),
            ("198.19.255.255", "a benchmarking address"),
            ("192.0.0.192", "IETF protocol-assignment"), // Oracle Cloud metadata
            ("192.88.99.1", "6to4 relay"),
            ("127.0.0.1", "a loopback address"),
        ];
        for (text, reason) in cases {
            assert_refused(text, PROD, reason);
        }
    }

    #[test]
    fn ipv6_ranges_are_refused() {
        let cases = [
            ("::", "the unspecified address"),
            ("::1", "a loopback address"),
            ("fe80::1", "a link-local address"),
            ("febf:ffff::1", "a link-local address"),
            ("fc00::1", "unique-local"),
            ("fd12:3456:789a::1", "unique-local"),
            ("fd00:ec2::254", "the cloud metadata address"),
            ("fec0::1", "site-local"),
            ("ff02::1", "a multicast address"),
            ("ff05::1:3", "a multicast address"),
            ("2001:db8::1", "a documentation address"),
            ("2001:db8:ffff::1", "a documentation address"),
            ("3fff::1", "a documentation address"),
            ("2001:2::1", "a benchmarking address"),
            ("2001::1", "Teredo"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
            ("2001:10::1", "ORCHID"),
            ("100::1", "discard-only"),
            ("64:ff9b:1::a00:1", "local-use NAT64"),
            ("64:ff9b:1:ffff::1", "local-use NAT64"),
            ("4000::1", "not global unicast"),
            ("::2:0:0:1", "not global unicast"),
        ];
        for (text, reason) in cases {
            assert_refused(text, PROD, reason);
        }
    }

    #[test]
    fn ipv6_forms_embedding_ipv4_are_vetted_by_the_ipv4_rules() {
        // Each embedding form with each class of refused IPv4 address.
        let embedded = [
            ("10.0.0.5", "a private address"),
            ("192.168.1.1", "a private address"),
            ("172.16.0.1", "a private address"),
            ("169.254.169.254", "the cloud metadata address"),
            ("169.254.1.1", "a link-local address"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("127.0.0.1", "a loopback address"),
            ("0.0.0.1", "0.0.0.0/8"),
            ("192.0.2.1", "a documentation address"),
            ("224.0.0.1", "a multicast address"),
            ("255.255.255.255", "the broadcast address"),
            ("240.0.0.1", "a reserved address"),
        ];
        for (v4text, reason) in embedded {
            let v4: Ipv4Addr = match v4text.parse() {
                Ok(v4) => v4,
                Err(e) => panic!("{e}"),
            };
            let [a, b, c, d] = v4.octets();
            let hi = u16::from_be_bytes([a, b]);
            let lo = u16::from_be_bytes([c, d]);
            let forms = [
                (format!("::ffff:{v4text}"), "IPv4-mapped"),
                (format!("::ffff:{hi:x}:{lo:x}"), "IPv4-mapped"),
                (format!("64:ff9b::{v4text}"), "NAT64"),
                (format!("64:ff9b::{hi:x}:{lo:x}"), "NAT64"),
                (format!("2002:{hi:x}:{lo:x}::"), "6to4"),
                (format!("2002:{hi:x}:{lo:x}:1234::abcd"), "6to4"),
            ];
            for (text, kind) in forms {
                let message = refused(&text, PROD);
                assert!(
                    message.contains(kind),
                    "{text}: `{message}` should name {kind}"
                );
                assert!(
                    message.contains(reason),
                    "{text}: `{message}` should say {reason}"
                );
                assert!(
                    message.contains(v4text),
                    "{text}: `{message}` should name {v4text}"
                );
            }
            // IPv4-compatible ::a.b.c.d (0.0.0.x would read as :: or ::1, tested elsewhere).
            if a != 0 {
                let text = format!("::{v4text}");
                let message = refused(&text, PROD);
                assert!(message.contains("IPv4-compatible"), "{text}: {message}");
                assert!(message.contains(reason), "{text}: {message}");
            }
        }
        // Teredo is refused whatever it carries.
        assert_refused("2001:0:5db8:d822::1", PROD, "Teredo");
        assert_refused("2001:0:4136:e378:8000:63bf:3fff:fdd2", TEST, "Teredo");
    }

    #[test]
    fn error_names_the_address_and_reason() {
        assert_eq!(
            vet_ip(ip("10.0.0.5"), PROD),
            Err(UrlError::Address {
                ip: ip("10.0.0.5"),
                reason: "a private address".to_owned()
            })
        );
        assert_eq!(
            refused("::ffff:10.0.0.5", PROD),
            "::ffff:10.0.0.5 is an IPv4-mapped address embedding 10.0.0.5, a private address; \
             callback URLs must point at a public address"
        );
        let e = UrlError::Resolves {
            host: "example.internal".to_owned(),
            ip: ip("10.0.0.5"),
            reason: "a private address".to_owned(),
        };
        assert!(
            e.to_string()
                .starts_with("example.internal resolves to 10.0.0.5, a private address")
        );
    }

    #[test]
    fn https_is_required_unless_http_is_allowed() {
        assert!(parse_callback("https://example.com/hook", PROD).is_ok());
        assert_eq!(
            parse_callback("http://example.com/hook", PROD),
            Err(UrlError::Scheme("http".to_owned()))
        );
        assert_eq!(
            parse_callback("http://example.com/hook", PROD)
                .err()
                .map(|e| e.to_string()),
            Some("callback URLs must use https (got `http:`)".to_owned())
        );
        assert!(parse_callback("http://example.com/hook", LOOPBACK).is_err());
        let allow_http = UrlPolicy {
            allow_loopback: false,
            allow_http: true,
        };
        assert!(parse_callback("http://example.com/hook", allow_http).is_ok());
        for text in [
            "ftp://example.com/",
            "file:///etc/passwd",
            "ws://example.com/",
            "gopher://x/",
        ] {
            assert!(parse_callback(text, PROD).is_err(), "{text}");
            assert!(parse_callback(text, TEST).is_err(), "{text}");
        }
        assert!(matches!(
            parse_callback("ftp://example.com/", TEST),
            Err(UrlError::SchemeHttpAllowed(_))
        ));
    }

    #[test]
    fn userinfo_and_fragments_are_refused() {
        for text in [
            "https://user@example.com/",
            "https://user:pass@example.com/",
            "https://:pass@example.com/",
            "https://example.com@10.0.0.1/",
        ] {
            assert_eq!(
                parse_callback(text, PROD),
                Err(UrlError::Userinfo),
                "{text}"
            );
        }
        assert_eq!(
            parse_callback("https://example.com/#frag", PROD),
            Err(UrlError::Fragment)
        );
        assert_eq!(
            parse_callback("https://example.com/#", PROD),
            Err(UrlError::Fragment)
        );
    }

    #[test]
    fn malformed_urls_are_refused() {
        for text in [
            "",
            "   ",
            "not a url",
            "/relative/path",
            "https://",
            "https:///",
            "https://exa mple.com/",
        ] {
            assert!(
                parse_callback(text, TEST).is_err(),
                "`{text}` should be refused"
            );
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(parse_callback(&long, PROD), Err(UrlError::TooLong));
    }

    #[test]
    fn ip_literal_hosts_are_vetted_when_parsed() {
        for text in [
            "https://127.0.0.1/",
            "https://10.0.0.5:8443/hook",
            "https://169.254.169.254/latest/meta-data/",
            "https://[::1]/",
            "https://[::ffff:169.254.169.254]/",
            "https://[::ffff:a9fe:a9fe]/",
            "https://[64:ff9b::a00:5]/",
            "https://[2002:a00:5::]/",
            "https://[fe80::1]/",
            "https://[fd00::1]/",
            "https://0x7f000001/", // 127.0.0.1 in hex
            "https://2130706433/", // 127.0.0.1 as a number
            "https://0177.0.0.1/", // 127.0.0.1 in octal
            "https://127.1/",      // shorthand
            "https://0/",
        ] {
            let result = parse_callback(text, PROD);
            assert!(
                matches!(result, Err(UrlError::Address { .. })),
                "{text} gave {result:?}"
            );
        }
        assert!(parse_callback("https://127.0.0.1:9000/hook", LOOPBACK).is_ok());
        assert!(parse_callback("https://[::1]:9000/hook", LOOPBACK).is_ok());
        assert!(parse_callback("https://93.184.216.34/hook", PROD).is_ok());
        assert!(parse_callback("https://[2606:2800:220:1::1]/hook", PROD).is_ok());
    }

    #[test]
    fn accepted_urls_keep_path_query_and_port() {
        let url = match parse_callback("  https://Hooks.Example.COM:8443/a/b?x=1&y=2  ", PROD) {
            Ok(url) => url,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(url.as_str(), "https://hooks.example.com:8443/a/b?x=1&y=2");
        assert_eq!(url.port_or_known_default(), Some(8443));
    }

    #[test]
    fn policy_defaults_to_production_and_serializes() {
        assert_eq!(UrlPolicy::default(), PROD);
        let json = serde_json::to_value(TEST).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({"allow_loopback": true, "allow_http": true})
        );
        let back: UrlPolicy = serde_json::from_value(json).unwrap_or_default();
        assert_eq!(back, TEST);
    }

    fn url(text: &str) -> reqwest::Url {
        match reqwest::Url::parse(text) {
            Ok(url) => url,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    #[tokio::test]
    async fn localhost_resolution_needs_allow_loopback() {
        let refused = resolve_vetted(&url("https://localhost/"), PROD).await;
        match refused {
            Err(UrlError::Resolves { host, ip, reason }) => {
                assert_eq!(host, "localhost");
                assert!(ip.is_loopback(), "{ip}");
                assert_eq!(reason, "a loopback address");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let addrs = match resolve_vetted(&url("https://localhost/"), LOOPBACK).await {
            Ok(addrs) => addrs,
            Err(e) => panic!("{e}"),
        };
        assert!(!addrs.is_empty());
        assert!(
            addrs
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 443),
            "{addrs:?}"
        );
        let addrs = resolve_vetted(&url("http://localhost:8080/x"), TEST).await;
        assert!(
            addrs.is_ok_and(|a| a.iter().all(|a| a.port() == 8080)),
            "explicit port is kept"
        );
    }

    #[tokio::test]
    async fn ip_literals_resolve_to_themselves_after_vetting() {
        assert_eq!(
            resolve_vetted(&url("https://93.184.216.34/"), PROD).await,
            Ok(vec![SocketAddr::new(ip("93.184.216.34"), 443)])
        );
        assert_eq!(
            resolve_vetted(&url("https://[2606:2800:220:1::1]:8443/"), PROD).await,
            Ok(vec![SocketAddr::new(ip("2606:2800:220:1::1"), 8443)])
        );
        assert!(matches!(
            resolve_vetted(&url("https://10.0.0.5/"), PROD).await,
            Err(UrlError::Address { .. })
        ));
        assert!(matches!(
            resolve_vetted(&url("https://127.0.0.1/"), PROD).await,
            Err(UrlError::Address { .. })
        ));
        assert!(
            resolve_vetted(&url("https://127.0.0.1/"), LOOPBACK)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn unresolvable_hosts_are_refused() {
        // `.invalid` never resolves (RFC 6761).
        let result = resolve_vetted(&url("https://no-such-host.invalid/"), TEST).await;
        assert!(
            matches!(
                result,
                Err(UrlError::Unresolvable { .. }
                    | UrlError::NoAddress(_)
                    | UrlError::ResolveTimeout(_))
            ),
            "{result:?}"
        );
    }

    /// A one-shot HTTP/1.1 server on 127.0.0.1 answering `response` to the first request; returns
    /// its port and a handle yielding the request head it received.
    async fn one_shot(response: &'static str) -> (u16, tokio::task::JoinHandle<String>) {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("{e}"),
        };
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        let handle = tokio::spawn(async move {
            let Ok((mut socket, _)) = listener.accept().await else {
                return String::new();
            };
            let mut buf = vec![0u8; 8192];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
            String::from_utf8_lossy(&got).into_owned()
        });
        (port, handle)
    }

    #[tokio::test]
    async fn pinned_client_connects_to_the_vetted_address_only() {
        let (port, server) =
            one_shot("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
        // The host name does not resolve at all: the request still reaches the pinned address,
        // so no second DNS lookup happens (a rebinding answer would never be consulted).
        let target = url(&format!("http://rebind.example.invalid:{port}/hook"));
        let addr = SocketAddr::new(ip("127.0.0.1"), port);
        let client = match pinned_client(&target, addr, Duration::from_secs(5), None) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let response = client.post(target).body("{}").send().await;
        assert_eq!(response.map(|r| r.status().as_u16()).ok(), Some(204));
        let head = server.await.unwrap_or_default();
        assert!(head.starts_with("POST /hook HTTP/1.1"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("host: rebind.example.invalid:{port}")),
            "the Host header keeps the callback's name: {head}"
        );
    }

    #[tokio::test]
    async fn pinned_client_does_not_follow_redirects() {
        let (port, server) = one_shot(
            "HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        let target = url(&format!("http://hooks.example.invalid:{port}/"));
        let addr = SocketAddr::new(ip("127.0.0.1"), port);
        let client = match pinned_client(&target, addr, Duration::from_secs(5), None) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let response = client.post(target).send().await;
        assert_eq!(response.map(|r| r.status().as_u16()).ok(), Some(302));
        let _ = server.await;
    }

    #[tokio::test]
    async fn pinned_client_times_out() {
        // Accepts and never answers.
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("{e}"),
        };
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        let server = tokio::spawn(async move {
            let held = listener.accept().await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(held);
        });
        let target = url(&format!("http://slow.example.invalid:{port}/"));
        let client = match pinned_client(
            &target,
            SocketAddr::new(ip("127.0.0.1"), port),
            Duration::from_millis(300),
            None,
        ) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let started = std::time::Instant::now();
        let result = client.post(target).send().await;
        assert!(result.is_err_and(|e| e.is_timeout()));
        assert!(started.elapsed() < Duration::from_secs(3));
        server.abort();
    }

    #[test]
    fn pinned_client_refuses_a_mismatched_ip_literal() {
        let target = url("https://93.184.216.34/");
        let other = SocketAddr::new(ip("10.0.0.5"), 443);
        assert!(matches!(
            pinned_client(&target, other, Duration::from_secs(1), None),
            Err(UrlError::Pin { .. })
        ));
        let same = SocketAddr::new(ip("93.184.216.34"), 443);
        assert!(pinned_client(&target, same, Duration::from_secs(1), None).is_ok());
    }

    #[test]
    fn pinned_client_checks_the_extra_root() {
        let target = url("https://hooks.example.com/");
        let addr = SocketAddr::new(ip("93.184.216.34"), 443);
        assert!(matches!(
            pinned_client(
                &target,
                addr,
                Duration::from_secs(1),
                Some(b"not a certificate")
            ),
            Err(UrlError::RootCertificate(_))
        ));
        assert!(matches!(
            pinned_client(
                &target,
                addr,
                Duration::from_secs(1),
                Some(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
            ),
            Err(UrlError::RootCertificate(_) | UrlError::Client(_))
        ));
    }
}
