//! Compile once. Components are content-addressed (sha256 of their bytes); compiled artifacts are
//! kept in memory for this process and on disk across restarts, keyed by the digest and by the
//! engine's compatibility hash so an upgraded wasmtime or changed settings never load a stale file.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use wasmtime::Engine;
use wasmtime::component::Component;

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileStats {
    /// Compiled now (false: loaded from the artifact cache).
    pub compiled: bool,
    pub elapsed: Duration,
}

pub(crate) struct ComponentCache {
    dir: Option<PathBuf>,
    engine_key: String,
    loaded: Mutex<HashMap<String, Component>>,
}

/// sha256 of `bytes`, lowercase hex.
pub(crate) fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl ComponentCache {
    pub fn new(engine: &Engine, dir: Option<PathBuf>) -> anyhow::Result<Self> {
        if let Some(dir) = &dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                anyhow::anyhow!("cannot create the component cache {}: {e}", dir.display())
            })?;
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = format!("{:016x}", hasher.finish());
        Ok(Self {
            dir,
            engine_key,
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// The compiled component of `bytes` whose digest is `digest`.
    pub fn get(
        &self,
        engine: &Engine,
        digest: &str,
        bytes: &[u8],
    ) -> anyhow::Result<(Component, CompileStats)> {
        let started = Instant::now();
        if let Some(component) = self
            .loaded
            .lock()
            .map_err(|_| anyhow::anyhow!("cache lock poisoned"))?
            .get(digest)
        {
            return Ok((
                component.clone(),
                CompileStats {
                    compiled: false,
                    elapsed: started.elapsed(),
                },
            ));
        }
        let artifact = self
            .dir
            .as_ref()
            .map(|d| d.join(format!("{digest}-{}.cwasm", self.engine_key)));
        let mut compiled = false;
        let component = match artifact.as_ref().filter(|p| p.is_file()) {
            Some(path) => match load_artifact(engine, path) {
                Ok(component) => component,
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "ignoring an unreadable cached artifact");
                    compiled = true;
                    Component::new(engine, bytes)?
                }
            },
            None => {
                compiled = true;
                Component::new(engine, bytes)?
            }
        };
        if compiled
            && let Some(path) = &artifact
            && let Err(error) = store_artifact(&component, path)
        {
            tracing::warn!(path = %path.display(), %error, "could not cache a compiled component");
        }
        self.loaded
            .lock()
            .map_err(|_| anyhow::anyhow!("cache lock poisoned"))?
            .insert(digest.to_owned(), component.clone());
        Ok((
            component,
            CompileStats {
                compiled,
                elapsed: started.elapsed(),
            },
        ))
    }
}

#[allow(unsafe_code)]
fn load_artifact(engine: &Engine, path: &std::path::Path) -> anyhow::Result<Component> {
    // SAFETY: the file was written by `store_artifact` of this same engine configuration (its name
    // carries the engine's compatibility hash) into the operator's private data directory, and
    // wasmtime checks its header and version before use. An unreadable file falls back to a compile.
    Ok(unsafe { Component::deserialize_file(engine, path) }?)
}

/// Written to a temporary file and renamed, so a crash never leaves a torn artifact.
fn store_artifact(component: &Component, path: &std::path::Path) -> anyhow::Result<()> {
    let bytes = component.serialize()?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
