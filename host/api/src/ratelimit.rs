//! Per-API-key rate limiting: a token bucket per key on the injected clock. A request that finds
//! its bucket empty is answered 429 `rate_limited` with `Retry-After` (whole seconds until a
//! token is back).

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Mutex;

/// `[rate_limit]` in the config.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Sustained requests per second per key; 0 disables the limit.
    pub requests_per_second: f64,
    /// Requests a key may make at once after being idle.
    pub burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self {
            requests_per_second: 100.0,
            burst: 200,
        }
    }
}

#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    /// Tokens left and when they were counted, per key id.
    buckets: Mutex<HashMap<String, (f64, i64)>>,
}

impl RateLimiter {
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token for `key` at `now_ms`; `Err(seconds)` when there is none, with the wait.
    pub fn check(&self, key: &str, now_ms: i64) -> Result<(), u64> {
        let rate = self.limit.requests_per_second;
        if rate <= 0.0 {
            return Ok(());
        }
        let burst = f64::from(self.limit.burst.max(1));
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(());
        };
        if buckets.len() > 100_000 {
            // Idle keys are full anyway: forgetting them changes no answer.
            buckets.retain(|_, (tokens, at)| *tokens < burst && now_ms - *at < 60_000);
        }
        let (tokens, at) = buckets.entry(key.to_owned()).or_insert((burst, now_ms));
        let elapsed = (now_ms - *at).max(0) as f64 / 1000.0;
        *tokens = (*tokens + elapsed * rate).min(burst);
        *at = now_ms;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / rate).ceil().max(1.0) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_gets_its_burst_then_the_sustained_rate_and_keys_are_independent() {
        let limiter = RateLimiter::new(RateLimit {
            requests_per_second: 2.0,
            burst: 3,
        });
        for _ in 0..3 {
            assert_eq!(limiter.check("a", 0), Ok(()));
        }
        assert_eq!(limiter.check("a", 0), Err(1));
        assert_eq!(
            limiter.check("b", 0),
            Ok(()),
            "another key has its own bucket"
        );
        assert_eq!(
            limiter.check("a", 499),
            Err(1),
            "half a token is not a token"
        );
        assert_eq!(limiter.check("a", 500), Ok(()));
        assert_eq!(limiter.check("a", 500), Err(1));
        assert_eq!(
            limiter.check("a", 10_000),
            Ok(()),
            "refills up to the burst"
        );
        let off = RateLimiter::new(RateLimit {
            requests_per_second: 0.0,
            burst: 1,
        });
        for _ in 0..1000 {
            assert_eq!(off.check("a", 0), Ok(()));
        }
    }
}
