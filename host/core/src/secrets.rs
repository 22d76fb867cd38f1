//! At-rest encryption of secrets (webhook signing secrets, certificate private keys; DESIGN.md
//! §6): AES-256-GCM under a local, versioned keyring read from `CAPSTAN_SECRET_KEYS="1:<base64 of 32 bytes>,2:<...>"`.
//!
//! A sealed secret is stored as `(kms_key_id, sealed)`: `kms_key_id` is `local:<version>` and
//! `sealed` is `base64(nonce(12) || ciphertext || tag(16))`. The highest version encrypts; every
//! version still in the ring decrypts, so keys rotate by adding a new version and re-sealing at
//! leisure. Callers bind each secret to its owner with `aad` (the subscription id), so a sealed
//! value copied onto another row does not decrypt.

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use std::collections::BTreeMap;

/// The `kms_key_id` prefix of keys from the local keyring.
pub const LOCAL_PREFIX: &str = "local:";

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

/// The development key (version 1): the same bytes `just run` exports as
/// `CAPSTAN_SECRET_KEYS=1:ZGV2ZWxvcG1lbnQtb25seS1rZXktZG8tbm90LXVzZSE=`. Public knowledge: never
/// use it for anything real.
pub const DEVELOPMENT_KEY: &[u8; 32] = b"development-only-key-do-not-use!";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error(
        "the secret keyring is empty: give CAPSTAN_SECRET_KEYS as \"1:<base64 of 32 bytes>\" (e.g. \"1:$(head -c32 /dev/urandom | base64)\")"
    )]
    Empty,
    #[error("secret key entry {entry} is not of the form <version>:<base64 of 32 bytes>")]
    Malformed { entry: usize },
    #[error("secret key entry {entry}: `{version}` is not a key version (a whole number from 1)")]
    BadVersion { entry: usize, version: String },
    #[error("secret key version {0} is given more than once")]
    DuplicateVersion(u32),
    #[error("secret key version {0} is not valid base64")]
    BadBase64(u32),
    #[error("secret key version {version} decodes to {len} bytes; AES-256 needs exactly 32")]
    WrongLength { version: u32, len: usize },
    #[error("`{0}` is not a key id of the local keyring (expected local:<version>)")]
    UnknownKeyId(String),
    #[error("key {kms_key_id} is not in the keyring (it has versions {available})")]
    MissingKey {
        kms_key_id: String,
        available: String,
    },
    #[error("the sealed secret is malformed: {0}")]
    Sealed(&'static str),
    #[error(
        "the sealed secret does not authenticate under {0}: wrong key, wrong owner or tampered data"
    )]
    Decrypt(String),
}

/// Key versions and their 32-byte AES-256 keys. `Debug` names the versions only.
#[derive(Clone)]
pub struct Keyring {
    keys: BTreeMap<u32, [u8; 32]>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("versions", &self.keys.keys().collect::<Vec<_>>())
            .field("current", &self.kms_key_id())
            .finish_non_exhaustive()
    }
}

fn decode_key(text: &str) -> Option<Vec<u8>> {
    [STANDARD, URL_SAFE, STANDARD_NO_PAD, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(text).ok())
}

impl Keyring {
    /// Parses `"1:<base64 32 bytes>,2:<...>"`. Whitespace around entries is ignored, as are
    /// empty entries (a trailing comma). Base64 may be standard or URL-safe, padded or not.
    /// Errors never include key material.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let mut keys = BTreeMap::new();
        for (i, entry) in text.split(',').map(str::trim).enumerate() {
            let entry_no = i + 1;
            if entry.is_empty() {
                continue;
            }
            let Some((version, b64)) = entry.split_once(':') else {
                return Err(SecretError::Malformed { entry: entry_no });
            };
            let version_text = version.trim();
            let version = match version_text.parse::<u32>() {
                Ok(v) if v >= 1 && version_text.chars().all(|c| c.is_ascii_digit()) => v,
                _ => {
                    return Err(SecretError::BadVersion {
                        entry: entry_no,
                        version: version_text.chars().take(16).collect(),
                    });
                }
            };
            let b64 = b64.trim();
            if b64.is_empty() {
                return Err(SecretError::Malformed { entry: entry_no });
            }
            let bytes = decode_key(b64).ok_or(SecretError::BadBase64(version))?;
            let key: [u8; 32] =
                bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| SecretError::WrongLength {
                        version,
                        len: bytes.len(),
                    })?;
            if keys.insert(version, key).is_some() {
                return Err(SecretError::DuplicateVersion(version));
            }
        }
        if keys.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self { keys })
    }

    /// The fixed development keyring ([`DEVELOPMENT_KEY`] as version 1), for `just run` and
    /// tests. Never for production: the key is in the source.
    pub fn development() -> Self {
        Self {
            keys: BTreeMap::from([(1, *DEVELOPMENT_KEY)]),
        }
    }

    /// Whether this ring holds only the public development key.
    pub fn is_development(&self) -> bool {
        self.keys.len() == 1 && self.keys.get(&1) == Some(DEVELOPMENT_KEY)
    }

    /// The key versions in the ring, ascending.
    pub fn versions(&self) -> Vec<u32> {
        self.keys.keys().copied().collect()
    }

    fn current(&self) -> (u32, &[u8; 32]) {
        match self.keys.last_key_value() {
            Some((v, k)) => (*v, k),
            // A Keyring is only built by `parse` (which refuses an empty ring) or
            // `development`.
            None => (1, DEVELOPMENT_KEY),
        }
    }

    /// `local:<highest version>`: the key new secrets are sealed under.
    pub fn kms_key_id(&self) -> String {
        format!("{LOCAL_PREFIX}{}", self.current().0)
    }

    /// Seals `plaintext` under the highest version, bound to `aad`: returns
    /// `(kms_key_id, base64(nonce || ciphertext || tag))` with a fresh random 96-bit nonce.
    pub fn encrypt(&self, plaintext: &[u8], aad: &[u8]) -> (String, String) {
        let (version, key) = self.current();
        let cipher = Aes256Gcm::new(&Key::<Aes256Gcm>::from(*key));
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let sealed = match cipher.encrypt(
            &nonce,
            Payload {
                msg: plaintext,
                aad,
            },
        ) {
            Ok(ciphertext) => ciphertext,
            // AES-GCM refuses only plaintexts over 64 GiB; secrets and private keys are small.
            Err(_) => panic!("AES-256-GCM refused a {}-byte plaintext", plaintext.len()),
        };
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        (format!("{LOCAL_PREFIX}{version}"), STANDARD.encode(out))
    }

    /// Opens a value sealed by [`Keyring::encrypt`] under any version still in the ring. A wrong
    /// `aad`, a tampered value or a different key with the same version number is an error.
    pub fn decrypt(
        &self,
        kms_key_id: &str,
        sealed: &str,
        aad: &[u8],
    ) -> Result<Vec<u8>, SecretError> {
        let version = kms_key_id
            .strip_prefix(LOCAL_PREFIX)
            .filter(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| SecretError::UnknownKeyId(kms_key_id.chars().take(64).collect()))?;
        let key = self
            .keys
            .get(&version)
            .ok_or_else(|| SecretError::MissingKey {
                kms_key_id: kms_key_id.to_owned(),
                available: self
                    .keys
                    .keys()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let bytes = STANDARD
            .decode(sealed.trim())
            .map_err(|_| SecretError::Sealed("not valid base64"))?;
        if bytes.len() < NONCE_LEN + TAG_LEN {
            return Err(SecretError::Sealed("too short to hold a nonce and a tag"));
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce
            .try_into()
            .map_err(|_| SecretError::Sealed("too short to hold a nonce and a tag"))?;
        let cipher = Aes256Gcm::new(&Key::<Aes256Gcm>::from(*key));
        cipher
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad,
                },
            )
            .map_err(|_| SecretError::Decrypt(format!("{LOCAL_PREFIX}{version}")))
    }
}

/// `N` bytes from the operating system's CSPRNG: for keys, secrets and tokens (a UUID's bytes
/// carry fixed version and variant bits and come from a user-space generator).
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use aes_gcm::aead::rand_core::RngCore as _;
    let mut bytes = [0u8; N];
    OsRng.fill_bytes(&mut bytes);
    bytes
}

/// `len` characters drawn uniformly from `[0-9A-Za-z]` out of the OS CSPRNG.
pub fn random_base62(len: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = String::with_capacity(len);
    while out.len() < len {
        for b in random_bytes::<32>() {
            // Bytes from 248 up would favour the first eight characters (248 = 4 * 62).
            if b < 248 && out.len() < len {
                out.push(char::from(ALPHABET[usize::from(b) % 62]));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_bytes_have_no_fixed_bits() {
        let (mut or, mut and) = ([0u8; 32], [0xffu8; 32]);
        for _ in 0..64 {
            let b = super::random_bytes::<32>();
            for i in 0..32 {
                or[i] |= b[i];
                and[i] &= b[i];
            }
        }
        assert_eq!(or, [0xff; 32], "every bit is set somewhere");
        assert_eq!(and, [0; 32], "every bit is clear somewhere");
    }

    #[test]
    fn random_base62_uses_the_whole_alphabet_at_every_position() {
        let samples: Vec<String> = (0..400).map(|_| super::random_base62(8)).collect();
        for position in 0..8 {
            let distinct: std::collections::BTreeSet<u8> =
                samples.iter().map(|s| s.as_bytes()[position]).collect();
            assert!(
                distinct.len() > 50,
                "position {position}: {}",
                distinct.len()
            );
        }
        assert!(
            samples
                .iter()
                .all(|s| s.len() == 8 && s.bytes().all(|b| b.is_ascii_alphanumeric()))
        );
    }

    use super::*;

    fn b64(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    fn ring(text: &str) -> Keyring {
        match Keyring::parse(text) {
            Ok(k) => k,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    fn key1() -> String {
        format!("1:{}", b64(&[0x11; 32]))
    }

    fn key2() -> String {
        format!("2:{}", b64(&[0x22; 32]))
    }

    fn open(ring: &Keyring, id: &str, sealed: &str, aad: &[u8]) -> Vec<u8> {
        match ring.decrypt(id, sealed, aad) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn round_trip() {
        let ring = ring(&key1());
        let (id, sealed) = ring.encrypt(b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", b"sub_1");
        assert_eq!(id, "local:1");
        assert!(!sealed.contains("whsec"));
        assert_eq!(
            open(&ring, &id, &sealed, b"sub_1"),
            b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        );
        // Empty plaintext and empty aad work too.
        let (id, sealed) = ring.encrypt(b"", b"");
        assert_eq!(open(&ring, &id, &sealed, b""), b"");
        // Layout: 12-byte nonce + ciphertext + 16-byte tag.
        let (_, sealed) = ring.encrypt(b"abc", b"x");
        assert_eq!(
            STANDARD.decode(sealed).map(|b| b.len()).ok(),
            Some(12 + 3 + 16)
        );
    }

    #[test]
    fn every_encryption_uses_a_fresh_nonce() {
        let ring = Keyring::development();
        let (_, a) = ring.encrypt(b"same secret", b"sub");
        let (_, b) = ring.encrypt(b"same secret", b"sub");
        assert_ne!(a, b);
        let nonce = |s: &str| {
            STANDARD
                .decode(s)
                .map(|b| b[..12].to_vec())
                .unwrap_or_default()
        };
        assert_ne!(nonce(&a), nonce(&b));
    }

    #[test]
    fn rotation_keeps_old_versions_readable_and_seals_with_the_newest() {
        let old = ring(&key1());
        let (id, sealed) = old.encrypt(b"secret-1", b"sub_1");
        assert_eq!(id, "local:1");

        let rotated = ring(&format!("{},{}", key1(), key2()));
        assert_eq!(rotated.kms_key_id(), "local:2");
        assert_eq!(open(&rotated, &id, &sealed, b"sub_1"), b"secret-1");
        let (new_id, new_sealed) = rotated.encrypt(b"secret-2", b"sub_1");
        assert_eq!(new_id, "local:2");
        assert_eq!(open(&rotated, &new_id, &new_sealed, b"sub_1"), b"secret-2");
        // The old ring cannot read what the new version sealed.
        assert!(matches!(
            old.decrypt(&new_id, &new_sealed, b"sub_1"),
            Err(SecretError::MissingKey { .. })
        ));
        // Order in the variable does not matter; the highest version encrypts.
        let reversed = ring(&format!("{},{}", key2(), key1()));
        assert_eq!(reversed.kms_key_id(), "local:2");
        assert_eq!(open(&reversed, &id, &sealed, b"sub_1"), b"secret-1");
        // Retiring version 1 makes its values unreadable, with a clear error.
        let retired = ring(&key2());
        let err = retired
            .decrypt(&id, &sealed, b"sub_1")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("key local:1 is not in the keyring (it has versions 2)")
        );
    }

    #[test]
    fn a_different_key_under_the_same_version_fails() {
        let (id, sealed) = ring(&key1()).encrypt(b"secret", b"sub");
        let other = ring(&format!("1:{}", b64(&[0x33; 32])));
        assert!(matches!(
            other.decrypt(&id, &sealed, b"sub"),
            Err(SecretError::Decrypt(_))
        ));
    }

    #[test]
    fn tampering_is_detected() {
        let ring = ring(&key1());
        let (id, sealed) = ring.encrypt(b"a webhook secret", b"sub_1");
        let bytes = STANDARD.decode(&sealed).unwrap_or_default();
        // Flip every bit position class: nonce, ciphertext, tag.
        for index in [0, 5, 11, 12, 20, bytes.len() - 16, bytes.len() - 1] {
            let mut tampered = bytes.clone();
            tampered[index] ^= 0x01;
            assert!(
                matches!(
                    ring.decrypt(&id, &b64(&tampered), b"sub_1"),
                    Err(SecretError::Decrypt(_))
                ),
                "flipping byte {index} went unnoticed"
            );
        }
        // Truncated, extended, garbage.
        assert!(
            ring.decrypt(&id, &b64(&bytes[..bytes.len() - 1]), b"sub_1")
                .is_err()
        );
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(ring.decrypt(&id, &b64(&longer), b"sub_1").is_err());
        assert!(matches!(
            ring.decrypt(&id, &b64(&bytes[..27]), b"sub_1"),
            Err(SecretError::Sealed(_))
        ));
        assert!(matches!(
            ring.decrypt(&id, "not base64!!", b"sub_1"),
            Err(SecretError::Sealed(_))
        ));
        assert!(matches!(
            ring.decrypt(&id, "", b"sub_1"),
            Err(SecretError::Sealed(_))
        ));
    }

    #[test]
    fn aad_binds_the_secret_to_its_owner() {
        let ring = ring(&key1());
        let (id, sealed) = ring.encrypt(b"secret", b"sub_1");
        assert!(matches!(
            ring.decrypt(&id, &sealed, b"sub_2"),
            Err(SecretError::Decrypt(_))
        ));
        assert!(matches!(
            ring.decrypt(&id, &sealed, b""),
            Err(SecretError::Decrypt(_))
        ));
        assert_eq!(open(&ring, &id, &sealed, b"sub_1"), b"secret");
    }

    #[test]
    fn key_ids_are_checked() {
        let ring = ring(&key1());
        let (_, sealed) = ring.encrypt(b"secret", b"sub");
        for bad in [
            "",
            "local:",
            "local:x",
            "local:-1",
            "local:+1",
            "aws-kms:1",
            "1",
            "LOCAL:1",
            "local: 1",
        ] {
            assert!(
                matches!(
                    ring.decrypt(bad, &sealed, b"sub"),
                    Err(SecretError::UnknownKeyId(_))
                ),
                "`{bad}`"
            );
        }
        assert!(matches!(
            ring.decrypt("local:7", &sealed, b"sub"),
            Err(SecretError::MissingKey { .. })
        ));
        assert_eq!(open(&ring, "local:01", &sealed, b"sub"), b"secret");
    }

    #[test]
    fn parse_accepts_the_documented_forms() {
        let text = format!(" {} , {} ,", key1(), key2());
        assert_eq!(ring(&text).versions(), vec![1, 2]);
        // What `head -c32 /dev/urandom | base64` prints, and URL-safe / unpadded variants.
        let bytes: Vec<u8> = (0..32).map(|i| 250 - i as u8).collect();
        for engine in [STANDARD, URL_SAFE, STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
            let parsed = ring(&format!("3:{}", engine.encode(&bytes)));
            assert_eq!(parsed.kms_key_id(), "local:3");
            let (id, sealed) = parsed.encrypt(b"x", b"y");
            assert_eq!(open(&parsed, &id, &sealed, b"y"), b"x");
        }
        // The values used by `just run` and the end-to-end tests.
        assert!(ring("1:ZGV2ZWxvcG1lbnQtb25seS1rZXktZG8tbm90LXVzZSE=").is_development());
        assert!(!ring("1:dGVzdC1zZWNyZXQta2V5LTAxMjM0NTY3ODlhYmNkZWY=").is_development());
        assert_eq!(
            ring("10:dGVzdC1zZWNyZXQta2V5LTAxMjM0NTY3ODlhYmNkZWY=").kms_key_id(),
            "local:10"
        );
    }

    #[test]
    fn parse_errors_are_clear() {
        let b = b64(&[0x11; 32]);
        let cases: Vec<(String, SecretError)> = vec![
            (String::new(), SecretError::Empty),
            ("  ".to_owned(), SecretError::Empty),
            (",,".to_owned(), SecretError::Empty),
            (b.clone(), SecretError::Malformed { entry: 1 }),
            (
                format!("{},2:", key1()),
                SecretError::Malformed { entry: 2 },
            ),
            (
                format!("x:{b}"),
                SecretError::BadVersion {
                    entry: 1,
                    version: "x".to_owned(),
                },
            ),
            (
                format!("0:{b}"),
                SecretError::BadVersion {
                    entry: 1,
                    version: "0".to_owned(),
                },
            ),
            (
                format!("-1:{b}"),
                SecretError::BadVersion {
                    entry: 1,
                    version: "-1".to_owned(),
                },
            ),
            (
                format!("+1:{b}"),
                SecretError::BadVersion {
                    entry: 1,
                    version: "+1".to_owned(),
                },
            ),
            (
                format!(":{b}"),
                SecretError::BadVersion {
                    entry: 1,
                    version: String::new(),
                },
            ),
            (
                format!("99999999999:{b}"),
                SecretError::BadVersion {
                    entry: 1,
                    version: "99999999999".to_owned(),
                },
            ),
            (
                format!("{},1:{b}", key1()),
                SecretError::DuplicateVersion(1),
            ),
            ("1:not*base64".to_owned(), SecretError::BadBase64(1)),
            (
                format!("1:{}", b64(&[1; 16])),
                SecretError::WrongLength {
                    version: 1,
                    len: 16,
                },
            ),
            (
                format!("2:{}", b64(&[1; 33])),
                SecretError::WrongLength {
                    version: 2,
                    len: 33,
                },
            ),
            (
                "1:c2hvcnQ=".to_owned(),
                SecretError::WrongLength { version: 1, len: 5 },
            ),
        ];
        for (text, expected) in cases {
            match Keyring::parse(&text) {
                Ok(_) => panic!("`{text}` parsed"),
                Err(e) => assert_eq!(e, expected, "`{text}`"),
            }
        }
        assert_eq!(
            SecretError::WrongLength {
                version: 1,
                len: 16
            }
            .to_string(),
            "secret key version 1 decodes to 16 bytes; AES-256 needs exactly 32"
        );
        assert!(
            SecretError::Empty
                .to_string()
                .contains("CAPSTAN_SECRET_KEYS")
        );
    }

    #[test]
    fn errors_and_debug_never_show_key_material() {
        let secret = b64(&[0x5a; 32]);
        let ring = ring(&format!("1:{secret},7:{}", b64(&[0x11; 32])));
        let debug = format!("{ring:?}");
        assert_eq!(
            debug,
            "Keyring { versions: [1, 7], current: \"local:7\", .. }"
        );
        assert!(!debug.contains(&secret));
        let bad = "1:WlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpa*";
        let message = Keyring::parse(bad)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!message.contains("WlpaWlpa"), "{message}");
        let dev = format!("{:?}", Keyring::development());
        assert!(!dev.contains("development-only"), "{dev}");
    }

    #[test]
    fn development_ring_is_version_one() {
        let dev = Keyring::development();
        assert_eq!(dev.kms_key_id(), "local:1");
        assert!(dev.is_development());
        let (id, sealed) = dev.encrypt(b"s", b"a");
        // Matches what `just run` exports.
        let from_env = ring("1:ZGV2ZWxvcG1lbnQtb25seS1rZXktZG8tbm90LXVzZSE=");
        assert_eq!(open(&from_env, &id, &sealed, b"a"), b"s");
    }
}
