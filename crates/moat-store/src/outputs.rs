//! The trusted output store: where files promoted at the export boundary
//! are kept, by content (`sha256/<first two hex digits>/<hash>`), apart from
//! everything else a run produced.
//!
//! Backends sit behind `object_store`'s `ObjectStore` trait: a local
//! directory (the default beside a SQLite database) or an S3-compatible
//! bucket. A third place, the database's own `blobs` table, is the default
//! over PostgreSQL: every control-plane replica sees it, where a directory
//! on one replica's disk would leave the others unable to serve a download.
//!
//! Which files are promoted is the database's business (`outputs` rows in
//! the transaction that records the artifact); this store holds only bytes.
//! A promoted file is written here *before* that transaction, so a row
//! never names bytes the store lacks; a transaction that then fails leaves
//! an object nothing names, of a file that passed every check.
//! Bytes read back are hashed by the caller before they leave.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path as Key;

/// What can go wrong with the output store.
#[derive(Debug, thiserror::Error)]
pub enum OutputsError {
    #[error(
        "output store {0:?}: expected `database`, a directory (absolute, or file:///DIR) or s3://BUCKET[/PREFIX]"
    )]
    Spec(String),
    #[error("output store directory {}: {source}", .path.display())]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("output store {store}: {source}")]
    Backend {
        store: String,
        source: object_store::Error,
    },
    #[error("output store {store}: the probe object read back different bytes")]
    Probe { store: String },
    #[error("output store: {0:?} is not a SHA-256")]
    Name(String),
}

/// Where promoted files go.
#[derive(Clone)]
pub struct Outputs {
    place: Place,
}

#[derive(Clone)]
enum Place {
    Database,
    Objects {
        store: Arc<dyn ObjectStore>,
        /// `file:///DIR` or `s3://BUCKET/PREFIX`, for messages.
        url: String,
    },
}

impl std::fmt::Debug for Outputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Where the probe `check` writes: a fixed name, so that a start-up leaves
/// one small object, whatever the number of starts.
const PROBE_KEY: &str = "moat/probe";
const PROBE_BYTES: &[u8] = b"moat output store probe\n";

impl Outputs {
    /// Promoted files in the database's `blobs` table.
    pub fn database() -> Self {
        Outputs {
            place: Place::Database,
        }
    }

    /// Promoted files under `dir`, created (mode 0700) if missing.
    pub fn directory(dir: &Path) -> Result<Self, OutputsError> {
        let fail = |source| OutputsError::Directory {
            path: dir.to_owned(),
            source,
        };
        if !dir.is_absolute() {
            return Err(fail(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not an absolute path",
            )));
        }
        {
            use std::os::unix::fs::DirBuilderExt;
            match std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
            {
                Ok(()) => {}
                Err(e) => return Err(fail(e)),
            }
        }
        let url = format!("file://{}", dir.display());
        let store =
            object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(|source| {
                OutputsError::Backend {
                    store: url.clone(),
                    source,
                }
            })?;
        Ok(Outputs {
            place: Place::Objects {
                store: Arc::new(store),
                url,
            },
        })
    }

    /// Promoted files in an S3-compatible bucket, under `prefix`. The
    /// credentials, region and endpoint come from the usual `AWS_*`
    /// variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT` for a server other than AWS, and
    /// `AWS_ALLOW_HTTP=true` for one without TLS), then from `settings`,
    /// by the same names in lower case (`aws_endpoint`, ...).
    pub fn s3(bucket: &str, prefix: &str, settings: &[(&str, &str)]) -> Result<Self, OutputsError> {
        let url = if prefix.is_empty() {
            format!("s3://{bucket}")
        } else {
            format!("s3://{bucket}/{prefix}")
        };
        let backend = |source| OutputsError::Backend {
            store: url.clone(),
            source,
        };
        // A few quick retries: a report whose file the store did not take
        // is refused with 503 and sent again by its runner, which keeps
        // trying; object_store's default would hold it for minutes.
        let retry = object_store::RetryConfig {
            max_retries: 3,
            retry_timeout: std::time::Duration::from_secs(15),
            ..object_store::RetryConfig::default()
        };
        let mut builder = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(retry);
        // Set one by one, and only where the environment says nothing:
        // client options as a whole would replace what it set
        // (AWS_ALLOW_HTTP among them).
        for (name, value) in [("aws_connect_timeout", "5s"), ("aws_timeout", "60s")] {
            if std::env::var_os(name.to_ascii_uppercase()).is_some() {
                continue;
            }
            let key = name
                .parse::<object_store::aws::AmazonS3ConfigKey>()
                .map_err(backend)?;
            builder = builder.with_config(key, value);
        }
        for (name, value) in settings {
            let key = name
                .parse::<object_store::aws::AmazonS3ConfigKey>()
                .map_err(backend)?;
            builder = builder.with_config(key, *value);
        }
        let s3 = builder.build().map_err(backend)?;
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            Arc::new(s3)
        } else {
            let prefix = Key::parse(prefix).map_err(|e| backend(e.into()))?;
            Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
        };
        Ok(Outputs {
            place: Place::Objects { store, url },
        })
    }

    /// An output store from its command-line form: `database`, a
    /// directory (an absolute path or `file:///DIR`) or
    /// `s3://BUCKET[/PREFIX]`.
    pub fn parse(spec: &str) -> Result<Self, OutputsError> {
        let bad = || OutputsError::Spec(spec.to_owned());
        if spec == "database" {
            return Ok(Self::database());
        }
        if let Some(rest) = spec.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let bucket_ok = (3..=63).contains(&bucket.len())
                && bucket.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                });
            if !bucket_ok {
                return Err(bad());
            }
            return Self::s3(bucket, prefix.trim_matches('/'), &[]);
        }
        let dir = spec.strip_prefix("file://").unwrap_or(spec);
        if spec.contains("://") && !spec.starts_with("file://") || !dir.starts_with('/') {
            return Err(bad());
        }
        Self::directory(Path::new(dir))
    }

    /// Whether promoted files stay in the database (no object store).
    pub fn in_database(&self) -> bool {
        matches!(self.place, Place::Database)
    }

    /// `database`, `file:///DIR` or `s3://BUCKET/PREFIX`.
    pub fn describe(&self) -> String {
        match &self.place {
            Place::Database => "database".to_owned(),
            Place::Objects { url, .. } => url.clone(),
        }
    }

    /// Writes and reads back a small probe object: at start-up, so that a
    /// store that cannot take promoted files (no such bucket, no
    /// credentials, a read-only directory) stops the control plane rather
    /// than every operation that promotes one.
    pub async fn check(&self) -> Result<(), OutputsError> {
        let Place::Objects { store, url } = &self.place else {
            return Ok(());
        };
        let key = Key::from(PROBE_KEY);
        let backend = |source| OutputsError::Backend {
            store: url.clone(),
            source,
        };
        store
            .put(&key, PROBE_BYTES.to_vec().into())
            .await
            .map_err(backend)?;
        let back = store
            .get(&key)
            .await
            .map_err(backend)?
            .bytes()
            .await
            .map_err(backend)?;
        if back.as_ref() != PROBE_BYTES {
            return Err(OutputsError::Probe { store: url.clone() });
        }
        Ok(())
    }

    /// Stores `bytes` under `sha256`, which the caller computed from them.
    /// Writing the same file twice is harmless (same name, same bytes).
    pub async fn put(&self, sha256: &str, bytes: &[u8]) -> Result<(), OutputsError> {
        self.put_in(Space::Outputs, sha256, bytes).await
    }

    /// The bytes stored under `sha256`, as the backend returns them (the
    /// caller hashes them: this store is trusted, not beyond tampering);
    /// `None` if it has none, or if promoted files are in the database.
    pub async fn get(&self, sha256: &str) -> Result<Option<Vec<u8>>, OutputsError> {
        self.get_in(Space::Outputs, sha256).await
    }

    /// [`Outputs::put`] of a volume's chunk or snapshot document: kept
    /// apart from promoted files (`volumes/ab/…`), which only the export
    /// boundary puts in this store.
    pub async fn put_volume_bytes(&self, sha256: &str, bytes: &[u8]) -> Result<(), OutputsError> {
        self.put_in(Space::Volumes, sha256, bytes).await
    }

    /// [`Outputs::get`] of a volume's chunk or snapshot document.
    pub async fn get_volume_bytes(&self, sha256: &str) -> Result<Option<Vec<u8>>, OutputsError> {
        self.get_in(Space::Volumes, sha256).await
    }

    async fn put_in(&self, space: Space, sha256: &str, bytes: &[u8]) -> Result<(), OutputsError> {
        let Place::Objects { store, url } = &self.place else {
            return Ok(());
        };
        store
            .put(&key(space, sha256)?, bytes.to_vec().into())
            .await
            .map_err(|source| OutputsError::Backend {
                store: url.clone(),
                source,
            })?;
        Ok(())
    }

    async fn get_in(&self, space: Space, sha256: &str) -> Result<Option<Vec<u8>>, OutputsError> {
        let Place::Objects { store, url } = &self.place else {
            return Ok(None);
        };
        let backend = |source| OutputsError::Backend {
            store: url.clone(),
            source,
        };
        match store.get(&key(space, sha256)?).await {
            Ok(found) => Ok(Some(found.bytes().await.map_err(backend)?.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(backend(e)),
        }
    }

    /// Removes the object of `sha256`, if any. The control plane itself
    /// never removes one (another promotion of the same bytes may be
    /// writing it); this is for an operator's clean-up and for tests.
    pub async fn remove(&self, sha256: &str) -> Result<(), OutputsError> {
        let Place::Objects { store, url } = &self.place else {
            return Ok(());
        };
        match store.delete(&key(Space::Outputs, sha256)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(OutputsError::Backend {
                store: url.clone(),
                source,
            }),
        }
    }
}

/// Which objects: promoted files, or volumes' chunks and snapshots.
#[derive(Debug, Clone, Copy)]
enum Space {
    Outputs,
    Volumes,
}

/// `sha256/ab/abcdef…` (`volumes/ab/abcdef…`): two hex digits of fan-out
/// keep a directory backend's directories small.
fn key(space: Space, sha256: &str) -> Result<Key, OutputsError> {
    let hex = sha256.len() == 64
        && sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex {
        return Err(OutputsError::Name(sha256.to_owned()));
    }
    let top = match space {
        Space::Outputs => "sha256",
        Space::Volumes => "volumes",
    };
    Ok(Key::from(format!("{top}/{}/{sha256}", &sha256[..2])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked() {
        for bad in [
            "",
            "relative/dir",
            "http://example.com/x",
            "s3://",
            "s3://A_Bucket",
            "s3://ab",
            "gs://bucket",
            "file://relative",
        ] {
            assert!(
                matches!(Outputs::parse(bad), Err(OutputsError::Spec(_))),
                "{bad:?} should be refused"
            );
        }
        assert!(Outputs::parse("database").unwrap().in_database());
    }

    #[test]
    fn keys_are_hashes_only() {
        assert!(key(Space::Outputs, "../../etc/passwd").is_err());
        assert!(key(Space::Volumes, &"A".repeat(64)).is_err());
        let k = key(Space::Outputs, &"ab".repeat(32)).unwrap();
        assert_eq!(k.as_ref(), format!("sha256/ab/{}", "ab".repeat(32)));
        let k = key(Space::Volumes, &"ab".repeat(32)).unwrap();
        assert_eq!(k.as_ref(), format!("volumes/ab/{}", "ab".repeat(32)));
    }
}
