//! API keys: `cap_` + 32 random base62 characters + a 6-character checksum. Only an HMAC-SHA256
//! of the key under a versioned pepper is stored; lookup is by the display prefix, comparison in
//! constant time. The highest pepper version signs new keys; older versions keep verifying.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// `cap_` + 8 characters: shown in listings, used to find the key.
pub const PREFIX_LEN: usize = 12;
const BODY_LEN: usize = 32;
const CHECK_LEN: usize = 6;

/// Versioned secrets for key hashing, from `CAPSTAN_PEPPERS="1:<secret>,2:<secret>"` or config.
#[derive(Clone, Default)]
pub struct Peppers(BTreeMap<i64, Vec<u8>>);

impl std::fmt::Debug for Peppers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Peppers")
            .field(&self.0.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error(
    "invalid peppers: {0} (expected `1:<secret>,2:<secret>`, each secret at least 16 characters)"
)]
pub struct InvalidPeppers(String);

impl Peppers {
    pub fn parse(text: &str) -> Result<Self, InvalidPeppers> {
        let mut map = BTreeMap::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (version, secret) = part
                .split_once(':')
                .ok_or_else(|| InvalidPeppers(format!("`{part}` has no version")))?;
            let version: i64 = version
                .trim()
                .parse()
                .map_err(|_| InvalidPeppers(format!("version `{version}` is not a number")))?;
            if secret.len() < 16 {
                return Err(InvalidPeppers(format!(
                    "the secret of version {version} is too short"
                )));
            }
            map.insert(version, secret.as_bytes().to_vec());
        }
        if map.is_empty() {
            return Err(InvalidPeppers("none given".to_owned()));
        }
        Ok(Self(map))
    }

    /// The version that signs new keys.
    pub fn current(&self) -> Option<i64> {
        self.0.keys().next_back().copied()
    }

    pub fn hash(&self, version: i64, key: &str) -> Option<String> {
        let pepper = self.0.get(&version)?;
        let mut mac = Hmac::<Sha256>::new_from_slice(pepper).ok()?;
        mac.update(key.as_bytes());
        Some(hex::encode(mac.finalize().into_bytes()))
    }

    /// Constant-time check of `key` against a stored hash.
    pub fn verify(&self, version: i64, key: &str, stored_hex: &str) -> bool {
        let (Some(pepper), Ok(stored)) = (self.0.get(&version), hex::decode(stored_hex)) else {
            return false;
        };
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(pepper) else {
            return false;
        };
        mac.update(key.as_bytes());
        mac.verify_slice(&stored).is_ok()
    }
}

fn checksum(body: &str) -> String {
    let digest = Sha256::digest(body.as_bytes());
    digest
        .iter()
        .take(CHECK_LEN)
        .map(|b| ALPHABET[(*b as usize) % 62] as char)
        .collect()
}

/// A new random key.
pub fn generate() -> String {
    let body = capstan_core::secrets::random_base62(BODY_LEN);
    format!("cap_{body}{}", checksum(&body))
}

/// Whether `key` has the shape of a Capstan key with a valid checksum (no database needed).
pub fn well_formed(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("cap_") else {
        return false;
    };
    if rest.len() != BODY_LEN + CHECK_LEN || !rest.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return false;
    }
    let (body, check) = rest.split_at(BODY_LEN);
    checksum(body) == check
}

pub fn prefix(key: &str) -> &str {
    &key[..PREFIX_LEN.min(key.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_well_formed_and_a_typo_breaks_the_checksum() {
        let key = generate();
        assert!(key.starts_with("cap_") && key.len() == 4 + BODY_LEN + CHECK_LEN);
        assert!(well_formed(&key));
        let mut typo = key.clone().into_bytes();
        typo[10] = if typo[10] == b'a' { b'b' } else { b'a' };
        assert!(!well_formed(&String::from_utf8(typo).unwrap()));
        assert!(!well_formed("Bearer nonsense"));
        assert_ne!(generate(), key);
    }

    #[test]
    fn peppers_hash_and_verify_by_version_and_rotation_keeps_old_hashes_valid() {
        let old = Peppers::parse("1:first-secret-0123456789").unwrap();
        let key = generate();
        let hash = old.hash(1, &key).unwrap();
        let rotated =
            Peppers::parse("1:first-secret-0123456789, 2:second-secret-012345678").unwrap();
        assert_eq!(rotated.current(), Some(2));
        assert!(rotated.verify(1, &key, &hash));
        assert!(!rotated.verify(2, &key, &hash));
        assert!(!rotated.verify(1, &generate(), &hash));
        assert!(Peppers::parse("").is_err());
        assert!(Peppers::parse("x:abcdefghijklmnopq").is_err());
        assert!(Peppers::parse("1:short").is_err());
    }
}
