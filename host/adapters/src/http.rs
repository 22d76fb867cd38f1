//! What the adapters of plain HTTPS APIs (Google's API Keys, Jira) share: a reqwest client with
//! the adapter's deadline, one reading of HTTP answers into capability errors, and the checks
//! that keep a caller's argument from becoming another path than the one meant.

use crate::SettingsError;
use capstan_core::{Capability, CapabilityError};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use std::time::Duration;

/// A client whose every request ends within `timeout_ms`, or the key that stops start-up.
pub(crate) fn client(
    capability: Capability,
    timeout_ms: u64,
) -> Result<reqwest::Client, SettingsError> {
    if timeout_ms == 0 {
        return Err(SettingsError::new(
            capability,
            "timeout_ms",
            "must be above 0",
        ));
    }
    reqwest::Client::builder()
        .timeout(Duration::from_millis(timeout_ms))
        .connect_timeout(Duration::from_millis(timeout_ms.min(10_000)))
        .user_agent(concat!("capstan/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| SettingsError::new(capability, "kind", format!("no HTTP client: {e}")))
}

/// `url` without a trailing slash, if it is an http(s) URL.
pub(crate) fn base_url(
    capability: Capability,
    key: &str,
    url: &str,
) -> Result<String, SettingsError> {
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "https" | "http") && parsed.host().is_some() => {
            Ok(url.trim_end_matches('/').to_owned())
        }
        _ => Err(SettingsError::new(
            capability,
            key,
            format!("`{url}` is not an http(s) URL"),
        )),
    }
}

/// A request that got no answer (refused, reset, timed out): the call may be repeated.
pub(crate) fn unanswered(service: &str, error: &reqwest::Error) -> CapabilityError {
    let mut message = format!("{service} did not answer: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    let code = if error.is_timeout() {
        "timeout"
    } else {
        "unavailable"
    };
    CapabilityError::transient(code, message)
}

/// Sends `request`: the answer's status, headers and body as JSON (null when empty or not
/// JSON), or the transient error of a request that got no (complete) answer.
pub(crate) async fn exchange(
    service: &str,
    request: reqwest::RequestBuilder,
) -> Result<(StatusCode, HeaderMap, serde_json::Value), CapabilityError> {
    let answer = request.send().await.map_err(|e| unanswered(service, &e))?;
    let status = answer.status();
    let headers = answer.headers().clone();
    let body = answer.bytes().await.map_err(|e| unanswered(service, &e))?;
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    Ok((status, headers, json))
}

/// An answer's JSON as `T`, or the permanent `invalid-response` naming `service`.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    service: &str,
    value: serde_json::Value,
) -> Result<T, CapabilityError> {
    serde_json::from_value(value).map_err(|e| {
        CapabilityError::permanent(
            "invalid-response",
            format!("{service} answered an unexpected shape: {e}"),
        )
    })
}

/// The wait an answer's `Retry-After` asks for, in milliseconds (the delta-seconds form; an
/// HTTP date is left to the retry policy's own backoff).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<u64> {
    let seconds: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(seconds.saturating_mul(1000))
}

/// A non-2xx answer as a capability error: the service's own words in the message, the
/// engine's codes for what a caller decides on (`not-found`, `rate-limited`, ...). Rate limits,
/// timeouts and 5xx are transient and carry the service's `Retry-After`; the rest permanent.
pub(crate) fn status_error(
    service: &str,
    status: StatusCode,
    headers: &HeaderMap,
    detail: &str,
) -> CapabilityError {
    let message = if detail.is_empty() {
        format!("{service} answered {status}")
    } else {
        format!("{service} answered {status}: {detail}")
    };
    let transient = |code: &str| {
        CapabilityError::transient(code, message.clone()).retry_after(retry_after(headers))
    };
    match status.as_u16() {
        401 => CapabilityError::permanent("unauthorized", message),
        403 => CapabilityError::permanent("forbidden", message),
        404 => CapabilityError::permanent("not-found", message),
        409 => CapabilityError::permanent("conflict", message),
        408 => transient("timeout"),
        429 => transient("rate-limited"),
        500..=599 => transient("unavailable"),
        _ => CapabilityError::permanent("invalid-request", message),
    }
}

/// `value` when it is a single path segment of letters, digits, `-`, `_` and `.` (a key id, an
/// issue key): a caller's argument must never reach another resource than the one it names.
pub(crate) fn segment<'a>(what: &str, value: &'a str) -> Result<&'a str, CapabilityError> {
    let fine = !value.is_empty()
        && value.len() <= 255
        && value != "."
        && value != ".."
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if fine {
        Ok(value)
    } else {
        Err(CapabilityError::permanent(
            "invalid-request",
            format!("{what} `{value}` is not a valid identifier"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_become_the_engine_s_codes_and_rate_limits_carry_their_wait() {
        let mut headers = HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, "7".parse().unwrap());
        let limited = status_error("Jira", StatusCode::TOO_MANY_REQUESTS, &headers, "slow down");
        assert!(limited.is_transient());
        assert_eq!(limited.code, "rate-limited");
        assert_eq!(limited.retry_after_ms, Some(7_000));
        assert!(limited.message.contains("slow down"));
        let none = HeaderMap::new();
        for (status, code, transient) in [
            (401, "unauthorized", false),
            (403, "forbidden", false),
            (404, "not-found", false),
            (400, "invalid-request", false),
            (503, "unavailable", true),
        ] {
            let e = status_error("X", StatusCode::from_u16(status).unwrap(), &none, "");
            assert_eq!((e.code.as_str(), e.is_transient()), (code, transient));
        }
        headers.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn only_plain_identifiers_become_path_segments() {
        assert!(segment("key", "b7ff1f9f-8275-410a").is_ok());
        assert!(segment("ticket", "OPS-12").is_ok());
        for bad in ["", "..", "a/b", "a?b", "OPS 1", "%2e%2e"] {
            assert!(segment("key", bad).is_err(), "{bad}");
        }
    }
}
